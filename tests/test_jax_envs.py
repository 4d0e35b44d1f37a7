"""JAX env protocol: auto-reset and final observations, wrappers, the Brax adapter."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.envs import EnvError
from jaxrl.envs.classic import Pendulum
from jaxrl.envs.jax_envs import VecEnv, make_core, make_jax_env, parse_env_id
from jaxrl.envs.wrappers import (
    NormalizeObservation,
    RecordEpisodeStatistics,
    RescaleAction,
    normalize,
    running_stats_init,
    running_stats_update,
)


class CountdownCore:
    """Deterministic core: obs = [counter, id]; terminates when the counter reaches 0."""

    name = "countdown"
    observation_size = 2
    action_size = 1
    action_low, action_high = -1.0, 1.0
    episode_length = 100

    def reset(self, key):
        start = jax.random.randint(key, (), 2, 6).astype(jnp.float32)
        return start, jnp.stack([start, start])

    def step(self, counter, action):
        counter = counter - 1.0
        obs = jnp.stack([counter, counter + action[0]])
        return counter, obs, jnp.float32(1.0), (counter <= 0).astype(jnp.float32)


def _rollout(env, key, actions):
    """Reset, then step through ``actions`` [T, N, A]; returns (pre-step obs, states)."""

    def body(state, action):
        new = env.step(state, action)
        return new, (state.obs, new)

    return jax.jit(lambda k, a: jax.lax.scan(body, env.reset(k), a))(key, actions)[1]


def test_auto_reset_keeps_final_obs_and_time_limit_truncates():
    env = RecordEpisodeStatistics(VecEnv(CountdownCore(), num_envs=3, episode_length=4))
    actions = jnp.zeros((12, 3, 1))
    obs, states = _rollout(env, jax.random.key(0), actions)
    obs, final = np.asarray(obs), np.asarray(states.info["final_obs"])
    done, trunc = np.asarray(states.terminated), np.asarray(states.truncation)
    ep_ret, ep_len = (
        np.asarray(states.info["episode_return"]),
        np.asarray(states.info["episode_length"]),
    )
    for i in range(3):
        steps = 0
        for t in range(12):
            steps += 1
            # The transition's true next obs is one tick after the obs it acted on.
            np.testing.assert_allclose(final[t, i, 0], obs[t, i, 0] - 1.0)
            ended = done[t, i] + trunc[t, i]
            assert done[t, i] == (final[t, i, 0] <= 0)
            assert trunc[t, i] == (steps == 4 and final[t, i, 0] > 0)
            if ended:
                assert ep_len[t, i] == steps and ep_ret[t, i] == steps
                # After an end the next observation is a fresh reset in [2, 6).
                if t + 1 < 12:
                    assert 2 <= obs[t + 1, i, 0] < 6 and obs[t + 1, i, 0] == obs[t + 1, i, 1]
                steps = 0
            else:
                assert ep_len[t, i] == 0 and ep_ret[t, i] == 0
                if t + 1 < 12:
                    np.testing.assert_allclose(obs[t + 1, i], final[t, i])
    assert done.sum() > 0 and trunc.sum() > 0


def test_resets_draw_new_initial_states():
    env = VecEnv(CountdownCore(), num_envs=64, episode_length=100)
    obs, states = _rollout(env, jax.random.key(1), jnp.zeros((20, 64, 1)))
    ended = np.asarray(states.terminated) > 0
    starts = np.asarray(obs[1:])[ended[:-1]][:, 0]
    assert len(np.unique(starts)) == 4  # every start value 2..5 appears again after resets


def test_running_stats_match_numpy_on_a_stream():
    rng = np.random.default_rng(0)
    stream = [rng.normal(3.0, 2.0, (n, 5)).astype(np.float32) for n in (1, 7, 64, 3, 200)]
    stats = running_stats_init(5)
    update = jax.jit(running_stats_update)
    for batch in stream:
        stats = update(stats, jnp.asarray(batch))
    data = np.concatenate(stream).astype(np.float64)
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-3)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    expected = np.clip((x - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(normalize(stats, jnp.asarray(x)), expected, rtol=1e-3, atol=1e-3)


def test_normalize_observation_updates_in_training_and_freezes_for_eval():
    core = Pendulum()
    train = NormalizeObservation(VecEnv(core, 16))
    state = jax.jit(train.reset)(jax.random.key(0))
    step = jax.jit(train.step)
    raws = [np.asarray(state.extras["raw_obs"])]
    for _ in range(30):
        state = step(state, jnp.ones((16, 1)))
        raws.append(np.asarray(state.extras["raw_obs"]))
    stats = state.extras["obs_stats"]
    data = np.concatenate(raws).astype(np.float64)
    np.testing.assert_allclose(stats.mean, data.mean(0), atol=1e-4)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(state.obs, normalize(stats, state.extras["raw_obs"]), atol=1e-6)

    frozen = NormalizeObservation(VecEnv(core, 4), update=False)
    eval_state = frozen.with_stats(frozen.reset(jax.random.key(1)), stats)
    eval_state = frozen.step(eval_state, jnp.zeros((4, 1)))
    np.testing.assert_array_equal(eval_state.extras["obs_stats"].mean, stats.mean)
    np.testing.assert_allclose(
        eval_state.obs, normalize(stats, eval_state.extras["raw_obs"]), atol=1e-6
    )


def test_rescale_action_maps_unit_box_to_bounds():
    class Probe(CountdownCore):
        """Its observation is the action it received."""

        action_size = 2

        def step(self, counter, action):
            return counter, action, jnp.float32(0.0), jnp.float32(0.0)

    env = RescaleAction(VecEnv(Probe(), 2), low=[-2.0, 0.0], high=[2.0, 10.0])
    state = env.step(env.reset(jax.random.key(0)), jnp.array([[-1.0, 0.5], [3.0, -7.0]]))
    np.testing.assert_allclose(state.obs, [[-2.0, 7.5], [2.0, 0.0]])  # second row clipped first
    with pytest.raises(ValueError, match="high > low"):
        RescaleAction(VecEnv(Probe(), 1), low=1.0, high=1.0)


def test_pendulum_episode_statistics_sum_rewards():
    env = make_jax_env("jax:pendulum", 2)
    assert env.episode_length == 200
    _, states = _rollout(env, jax.random.key(3), jnp.full((200, 2, 1), 0.3))
    rewards = np.asarray(states.reward)
    np.testing.assert_array_equal(np.asarray(states.truncation)[-1], [1.0, 1.0])
    np.testing.assert_allclose(states.info["episode_return"][-1], rewards.sum(0), rtol=1e-5)
    np.testing.assert_array_equal(states.info["episode_length"][-1], [200, 200])


def test_env_id_parsing_and_errors():
    assert parse_env_id("brax:ant?backend=positional&episode_length=500") == (
        "brax",
        "ant",
        {"backend": "positional", "episode_length": 500},
    )
    core, options = make_core("jax:pendulum?episode_length=50")
    assert isinstance(core, Pendulum) and options == {"episode_length": 50}
    assert make_jax_env("jax:pendulum?episode_length=50", 1).episode_length == 50
    with pytest.raises(EnvError, match="brax:ant"):
        make_core("brax:antt")
    with pytest.raises(EnvError, match="backend"):
        make_core("brax:ant?backend=warp9")
    with pytest.raises(EnvError, match="jax:pendulum"):
        make_core("jax:pendulm")
    with pytest.raises(EnvError, match="key=value"):
        make_core("jax:pendulum?oops")


# The adapter has no per-env code: these cover a model with contacts and a free body (ant), an
# env that terminates early (hopper, like walker2d) and two that never terminate (reacher,
# inverted_pendulum). Each cost 15-65 s on 2 loaded cores when Brax's reset still ran op by op
# as the env was built (humanoid, the largest, took 65 s); now most of it is compiling the step.
# The ones left out add nothing the adapter could get wrong. One Brax backend for all, chosen
# for compile and step speed on CPU (the adapter does not depend on the backend; MJX is the
# default and is covered by the CLI test).
ADAPTER_ENVS = ("ant", "hopper", "reacher", "inverted_pendulum")


@pytest.mark.parametrize("name", ADAPTER_ENVS)
def test_brax_adapter_steps_the_representative_envs(name):
    # episode_length=1: the first step hits the time limit, so one compiled program covers
    # reset, step, truncation and auto-reset (compiling Brax's step dominates this test).
    env = make_jax_env(f"brax:{name}?backend=spring&episode_length=1", 2)
    core = env.core

    def run(key):
        state = env.reset(key)
        a = jnp.linspace(-1, 1, 2 * env.action_size).reshape(2, env.action_size)
        direct = jax.vmap(core.step)(state.sim, a)  # the simulator stepped without the adapter
        return state, env.step(state, a), direct

    state, s1, direct = jax.jit(run)(jax.random.key(0))
    assert state.obs.shape == (2, core.observation_size)
    assert s1.reward.shape == (2,) and s1.reward.dtype == jnp.float32
    np.testing.assert_allclose(s1.reward, direct[2], rtol=1e-5, atol=1e-5)
    assert np.isfinite(np.asarray(s1.obs)).all()
    ended = np.asarray(s1.terminated + s1.truncation) > 0
    np.testing.assert_array_equal(ended, [True, True])
    # final_obs is the simulator's next observation; obs is a fresh reset one.
    np.testing.assert_allclose(s1.info["final_obs"], direct[1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(s1.obs, s1.info["final_obs"])
    np.testing.assert_array_equal(s1.time, [0, 0])
    np.testing.assert_array_equal(s1.info["episode_length"], [1, 1])
