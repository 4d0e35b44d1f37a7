"""Sim-to-real wrappers on the JAX env protocol: exact delays, noise scales, filter, history,
decimation, and episode boundaries (a probe core whose reward is the action it received)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.envs.jax_envs import VecEnv
from jaxrl.envs.sim2real import (
    ActionDelay,
    ActionFilter,
    ControlDecimation,
    ObservationDelay,
    ObservationHistory,
    ObservationNoise,
)


class Probe:
    """Observation: [step in episode, 0, 0]; reward: the first action component it received."""

    observation_size, action_size, episode_length = 3, 2, 6

    def reset(self, key):
        return jnp.int32(0), jnp.zeros(3, jnp.float32)

    def step(self, sim, action):
        t = sim + 1
        return t, jnp.array([t, 0.0, 0.0], jnp.float32), action[0], jnp.bool_(False)


def _rollout(env, actions, seed=0):
    """Rewards, observations and ends of ``actions[t, env, dim]``, as one jitted scan."""

    @jax.jit
    def run(key, actions):
        def body(state, a):
            state = env.step(state, a)
            ended = state.terminated + state.truncation
            return state, (state.reward, state.obs, ended, state.info["final_obs"])

        return jax.lax.scan(body, env.reset(key), actions)[1]

    return jax.tree.map(np.asarray, run(jax.random.key(seed), actions))


def _actions(steps, n, a=2):
    x = np.arange(1, steps + 1, dtype=np.float32)[:, None, None] * np.ones((1, n, a), np.float32)
    return jnp.asarray(x + np.arange(n, dtype=np.float32)[None, :, None] * 100)


def test_action_delay_applies_each_action_exactly_k_steps_later():
    n, k, steps = 3, 2, 14
    actions = _actions(steps, n)
    rewards, _, ended, _ = _rollout(ActionDelay(VecEnv(Probe(), n), k), actions)
    a = np.asarray(actions)[..., 0]
    for e in range(n):
        start = 0
        for t in range(steps):
            expected = a[t - k, e] if t - k >= start else 0.0  # zeros until k actions were chosen
            assert rewards[t, e] == expected, (t, e)
            if ended[t, e]:
                start = t + 1  # a new episode starts with an empty queue
    assert ended[5].all() and ended[11].all()  # 6-step episodes: the queue restarted twice


def test_action_delay_drawn_per_episode_stays_in_range_and_is_applied():
    n, steps = 64, 18
    env = ActionDelay(VecEnv(Probe(), n), (1, 3))
    actions = _actions(steps, n)

    @jax.jit
    def run(key):
        def body(state, a):
            delay = state.extras["action_delay"]["steps"]
            state = env.step(state, a)
            return state, (state.reward, delay)

        return jax.lax.scan(body, env.reset(key), actions)[1]

    rewards, delays = map(np.asarray, run(jax.random.key(0)))
    assert delays.min() == 1 and delays.max() == 3
    assert (delays[0] != delays[6]).any()  # redrawn at the episode start (same env slot)
    a = np.asarray(actions)[..., 0]
    for t in range(steps):
        start = 6 * (t // 6)
        src = t - delays[t]
        expected = np.where(src >= start, a[np.maximum(src, 0), np.arange(n)], 0.0)
        np.testing.assert_array_equal(rewards[t], expected)


def test_observation_delay_shows_the_observation_of_k_steps_ago():
    n, k = 2, 3
    _, obs, ended, final = _rollout(ObservationDelay(VecEnv(Probe(), n), k), _actions(12, n))
    for t in range(12):
        start = 6 * (t // 6)
        shown = max(t - k, start - 1)  # never before the episode's first observation
        expected = 0.0 if shown < start else (shown % 6) + 1
        if (t % 6) == 5:
            expected = 0.0  # the step that ended the episode shows the new episode's first obs
        assert obs[t, 0, 0] == expected, t
    assert final[5, 0, 0] == 6  # final_obs is the true last observation, not delayed


def test_observation_noise_has_the_stated_scale_per_channel():
    n, steps = 256, 200
    scale = np.array([0.1, 0.5, 2.0], np.float32)
    env = ObservationNoise(VecEnv(Probe(), n), scale)
    _, obs, _, _ = _rollout(env, _actions(steps, n))
    _, clean, _, _ = _rollout(VecEnv(Probe(), n), _actions(steps, n))
    noise = (obs - clean).reshape(-1, 3)
    np.testing.assert_allclose(noise.std(0), scale, rtol=0.03)
    np.testing.assert_allclose(noise.mean(0), 0.0, atol=0.02 * scale.max())
    with pytest.raises(ValueError, match="scale must be finite and >= 0"):
        ObservationNoise(VecEnv(Probe(), 1), -1.0)


def test_action_filter_is_a_first_order_low_pass_restarted_per_episode():
    alpha = 0.25
    env = ActionFilter(VecEnv(Probe(), 1), alpha)
    rewards, _, _, _ = _rollout(env, jnp.ones((12, 1, 2)))
    t = np.arange(1, 7)
    expected = 1 - (1 - alpha) ** t
    np.testing.assert_allclose(rewards[:6, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(rewards[6:, 0], expected, rtol=1e-6)  # zero again at the reset


def test_observation_history_stacks_and_restarts():
    env = ObservationHistory(VecEnv(Probe(), 1), 3)
    assert env.observation_size == 9
    _, obs, _, final = _rollout(env, _actions(8, 1))
    steps = obs[:, 0, ::3]  # the step counter of each stacked observation, oldest first
    np.testing.assert_array_equal(steps[0], [0, 0, 1])
    np.testing.assert_array_equal(steps[3], [2, 3, 4])
    np.testing.assert_array_equal(final[5, 0, ::3], [4, 5, 6])  # the ended episode's history
    np.testing.assert_array_equal(steps[5], [0, 0, 0])  # a new episode: its first obs 3 times
    np.testing.assert_array_equal(steps[6], [0, 0, 1])


def test_control_decimation_sums_rewards_and_stops_at_the_episode_end():
    env = ControlDecimation(VecEnv(Probe(), 1), 4)
    assert env.episode_length == 2
    rewards, obs, ended, final = _rollout(env, _actions(3, 1))
    # Sub-steps 1-4 of action 1, then 5-6 of action 2 (the 6-step episode ends at sub-step 6).
    np.testing.assert_allclose(rewards[:, 0], [4 * 1.0, 2 * 2.0, 4 * 3.0])
    np.testing.assert_array_equal(ended[:, 0], [0, 1, 0])
    assert final[1, 0, 0] == 6 and obs[1, 0, 0] == 0  # frozen after the reset
    assert obs[2, 0, 0] == 4


def test_wrappers_compose_and_compile_once():
    env = ObservationNoise(ObservationHistory(ActionDelay(VecEnv(Probe(), 4), 1), 2), 0.1)
    traces = []

    @jax.jit
    def step(state, a):
        traces.append(1)
        return env.step(state, a)

    state = env.reset(jax.random.key(0))
    for t in range(15):  # two episode resets of every slot happen inside
        state = step(state, jnp.full((4, 2), float(t)))
    assert len(traces) == 1 and state.obs.shape == (4, 6)


def test_env_id_options_add_the_wrappers_and_train(tmp_path):
    from jaxrl.cli import main
    from jaxrl.envs.jax_envs import make_jax_env

    env = make_jax_env("jax:pendulum?obs_noise=0.1&action_delay=1:2&obs_history=2", 4)
    assert env.observation_size == 6 and env.action_size == 1
    state = jax.jit(env.step)(env.reset(jax.random.key(0)), jnp.zeros((4, 1)))
    assert state.obs.shape == (4, 6) and set(state.extras) >= {"action_delay", "obs_noise"}
    with pytest.raises(ValueError, match="action_delay='x'"):
        make_jax_env("jax:pendulum?action_delay=x", 1)
    out = str(tmp_path / "run")
    main(["train", "sac", "--env", "jax:pendulum?obs_noise=0.05&action_delay=1&decimation=2",
          "--num-envs", "2", "--hidden-dims", "16", "16", "--total-steps", "200",
          "--learning-starts", "100", "--eval-every", "200", "--eval-episodes", "2",
          "--batch-size", "16", "--buffer-size", "500", "--out", out, "--no-progress",
          "--no-tensorboard"])  # fmt: skip
    import json
    import os

    summary = json.load(open(os.path.join(out, "summary.json")))
    # Decimation 2: 100 agent steps per episode, so returns are those of 200 sim steps.
    assert summary["completed"] and np.isfinite(summary["final_eval_return_mean"])


class GymProbe(__import__("gymnasium").Env):
    """Observation: the step count; reward: the first action component received."""

    observation_space = __import__("gymnasium").spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = __import__("gymnasium").spaces.Box(-10.0, 10.0, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, 0.0, 0.0]), float(action[0]), False, self.t >= 6, {}


def test_gymnasium_equivalents():
    from jaxrl.envs import gym_sim2real as g

    env = g.ActionDelay(GymProbe(), 2)
    env.reset(seed=0)
    rewards = [env.step(np.array([t, 0.0], np.float32))[1] for t in range(1, 6)]
    assert rewards == [0.0, 0.0, 1.0, 2.0, 3.0]
    env = g.ObservationDelay(GymProbe(), 1)
    env.reset(seed=0)
    shown = [env.step(np.zeros(2, np.float32))[0][0] for _ in range(3)]
    assert shown == [0.0, 1.0, 2.0]
    env = g.ActionFilter(GymProbe(), 0.5)
    env.reset(seed=0)
    rewards = [env.step(np.ones(2, np.float32))[1] for _ in range(3)]
    np.testing.assert_allclose(rewards, [0.5, 0.75, 0.875])
    env = g.ObservationNoise(GymProbe(), [0.1, 1.0, 3.0])
    env.reset(seed=0)
    obs = np.array([env.step(np.zeros(2, np.float32))[0] - [env.unwrapped.t, 0, 0]
                    for _ in range(6)] + [env.reset()[0] for _ in range(3000)])  # fmt: skip
    np.testing.assert_allclose(obs[6:].std(0), [0.1, 1.0, 3.0], rtol=0.05)


def test_train_sim2real_script_evaluates_the_exported_policy(tmp_path):
    import runpy

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = runpy.run_path(os.path.join(root, "scripts", "train_sim2real.py"))
    args = script["Args"](
        agent="sac",
        train=__import__("jaxrl").TrainConfig(
            env="jax:pendulum", total_steps=200, num_envs=2, eval_every=200, eval_episodes=2,
            out=str(tmp_path / "run"), progress=False, tensorboard=False,
        ),
        sac=__import__("jaxrl").agents.SACConfig(
            hidden_dims=(16, 16), learning_starts=100, batch_size=16, buffer_size=500
        ),
        format="numpy",
        episodes=2,
    )  # fmt: skip
    result = script["main"](args)
    assert result["train_env"] == "jax:pendulum?obs_noise=0.01&action_delay=0:1"
    assert result["perturbed_env"] == "jax:pendulum?obs_noise=0.03&action_delay=1:2"
    assert os.path.exists(result["export"]) and np.isfinite(result["exported_return_mean"])
    # Pendulum's return per episode lies in [-16.3 * 200, 0]: the exported policy ran episodes.
    assert -16.3 * 200 <= result["exported_return_mean"] < 0


def test_decimation_under_history_and_privileged_features():
    """Decimation (innermost) composes with the observation-widening wrappers above it."""
    from jaxrl.envs.jax_envs import make_jax_env

    env = make_jax_env("jax:pendulum?decimation=2&obs_history=3&privileged=true", 2)
    plain = make_jax_env("jax:pendulum?decimation=2", 2)
    state, ref = env.reset(jax.random.key(0)), plain.reset(jax.random.key(0))
    step, ref_step = jax.jit(env.step), jax.jit(plain.step)
    for _ in range(3):
        state, ref = step(state, jnp.ones((2, 1))), ref_step(ref, jnp.ones((2, 1)))
    assert state.obs.shape == (2, 9 + 3)
    np.testing.assert_allclose(state.reward, ref.reward, rtol=1e-6)
    np.testing.assert_allclose(state.obs[:, 6:9], ref.obs, rtol=1e-6)  # newest in the history
    np.testing.assert_allclose(state.obs[:, 9:], ref.obs, rtol=1e-6)  # the clean observation
