"""Gymnasium sim-to-real wrappers: observation history, control decimation, host env-id options
(``HalfCheetah-v5?obs_noise=0.05&action_delay=1:3``), their saved state and a bit-identical resume
of the host loop with them."""

import json
import os
import signal

import gymnasium as gym
import numpy as np
import pytest

from jaxrl import registry
from jaxrl.envs import EnvError, HostEnv, episode_length, make_env
from jaxrl.envs import gym_sim2real as g
from jaxrl.loops import TrainConfig
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train


class Probe(gym.Env):
    """obs = [sim steps since reset, episode id, 0]; reward = the action's first component;
    terminates on the sim step ``terminate_at`` (never when 0)."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (3,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, terminate_at=0):
        self.terminate_at, self.episode, self.t = terminate_at, -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t, self.episode, 0.0])

    def step(self, action):
        self.t += 1
        return self._obs(), float(action[0]), self.t == self.terminate_at, False, {}


gym.register("JaxrlTest/Sim2RealProbe-v0", entry_point=Probe, max_episode_steps=6)
PROBE = "JaxrlTest/Sim2RealProbe-v0"


def _obs(t, episode=0):
    return [float(t), float(episode), 0.0]


def _chain(env):
    """Wrapper types from the outermost in, down to the first one ``gym.make`` added."""
    names = []
    while isinstance(env, gym.Wrapper) and not isinstance(env, gym.wrappers.TimeLimit):
        names.append(env)
        env = env.env
    return names


def test_observation_history_repeats_the_first_observation_then_slides():
    env = g.ObservationHistory(gym.wrappers.TimeLimit(Probe(), 6), 3)
    assert env.observation_space.shape == (9,)
    np.testing.assert_array_equal(env.observation_space.low, np.full(9, -100.0))
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, _obs(0) * 3)
    assert env.observation_space.contains(obs)
    shown = [env.step(np.zeros(2, np.float32))[0] for _ in range(4)]
    np.testing.assert_array_equal(shown[0], _obs(0) + _obs(0) + _obs(1))
    np.testing.assert_array_equal(shown[1], _obs(0) + _obs(1) + _obs(2))
    np.testing.assert_array_equal(shown[3], _obs(2) + _obs(3) + _obs(4))
    *_, truncated, _ = env.step(np.zeros(2, np.float32))
    last, _, _, truncated, _ = env.step(np.zeros(2, np.float32))
    assert truncated  # the episode's last observation ends its own history ...
    np.testing.assert_array_equal(last, _obs(4) + _obs(5) + _obs(6))
    obs, _ = env.reset()  # ... and the next episode starts a fresh one
    np.testing.assert_array_equal(obs, _obs(0, 1) * 3)


def test_observation_history_in_a_host_env_bootstraps_from_its_own_episode():
    env = make_env(f"{PROBE}?obs_history=2", num_envs=2)
    assert env.obs_dim == 6
    obs = env.reset(seed=0)
    np.testing.assert_array_equal(obs, [_obs(0) * 2] * 2)
    for _ in range(6):
        next_obs, obs, *_, truncated = env.step(np.zeros((2, 2), np.float32))
    assert truncated.all()
    np.testing.assert_array_equal(next_obs, [_obs(5) + _obs(6)] * 2)
    np.testing.assert_array_equal(obs, [_obs(0, 1) * 2] * 2)


def test_control_decimation_sums_rewards_and_stops_when_the_episode_ends():
    env = g.ControlDecimation(gym.wrappers.TimeLimit(Probe(terminate_at=4), 6), 3)
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(np.array([0.5, 0.0], np.float32))
    assert (reward, terminated, truncated) == (1.5, False, False)
    np.testing.assert_array_equal(obs, _obs(3))
    obs, reward, terminated, truncated, _ = env.step(np.array([0.25, 0.0], np.float32))
    assert (reward, terminated, truncated) == (0.25, True, False)  # one sub-step, then stop
    np.testing.assert_array_equal(obs, _obs(4))
    # The time limit counts sim steps: 6 = 4 + 2, truncated inside the second agent step.
    env = g.ControlDecimation(gym.wrappers.TimeLimit(Probe(), 6), 4)
    env.reset(seed=0)
    assert env.step(np.ones(2, np.float32))[1:4] == (4.0, False, False)
    obs, reward, terminated, truncated, _ = env.step(np.ones(2, np.float32))
    assert (reward, terminated, truncated) == (2.0, False, True)
    np.testing.assert_array_equal(obs, _obs(6))
    assert episode_length(f"{PROBE}?decimation=4") == 2 and episode_length(PROBE) == 6
    with pytest.raises(ValueError, match="k must be >= 1"):
        g.ControlDecimation(Probe(), 0)


FULL = "obs_noise=0.05&action_delay=1:3&obs_history=3&decimation=2&action_filter=0.5&obs_delay=1"


def test_env_id_options_build_the_wrappers_in_the_jax_order():
    env_id = f"HalfCheetah-v5?{FULL}"
    env = make_env(env_id, 2)
    chain = _chain(env.vec.envs[1])
    assert [type(w) for w in chain] == [
        g.ObservationHistory,
        g.ObservationNoise,
        g.ObservationDelay,
        g.ActionDelay,
        g.ActionFilter,
        g.ControlDecimation,
    ]
    history, noise, obs_delay, act_delay, act_filter, decimation = chain
    assert history.k == 3 and decimation.k == 2 and act_filter.alpha == 0.5
    assert (act_delay.low, act_delay.high) == (1, 3) and (obs_delay.low, obs_delay.high) == (1, 1)
    np.testing.assert_array_equal(noise.scale, np.full(17, 0.05))
    assert env.obs_dim == 3 * 17 and env.action_dim == 6
    assert env.env_id == env_id  # recorded in full; gym.make received the part before '?'
    assert env.vec.envs[0].unwrapped.spec.id == "HalfCheetah-v5"
    assert episode_length(env_id) == 500
    env.close()
    plain = make_env("HalfCheetah-v5")
    assert _chain(plain.vec.envs[0]) == [] and plain.obs_dim == 17
    plain.close()


@pytest.mark.parametrize(
    "query, message",
    [
        ("privileged=true", "exists for JAX envs"),
        ("push_speed=fast", "use LOW:HIGH in m/s"),
        ("obs_nois=0.1", "unknown option.*obs_nois.*Did you mean obs_noise.*obs_history"),
        ("decimation=abc", "decimation='abc': use a whole number"),
        ("obs_history=true", "obs_history=True: use a whole number"),
        ("action_delay=x", "action_delay='x': use a step count k or a range LOW:HIGH"),
        ("obs_noise=loud", "obs_noise='loud': use a number"),
        ("obs_delay", "'obs_delay' is not of the form key=value"),
        ("action_filter=2", r"action_filter: ActionFilter: alpha must be in \(0, 1\]"),
        ("obs_delay=3:1", "obs_delay: ObservationDelay: steps must be"),
        ("obs_noise=-1", "obs_noise: ObservationNoise: scale must be finite and >= 0"),
    ],
)
def test_bad_options_say_what_is_wrong(query, message):
    env_id = f"Pendulum-v1?{query}"
    with pytest.raises(EnvError, match=message) as err:
        make_env(env_id)
    assert repr(env_id) in str(err.value)


def test_unknown_base_id_with_options_names_the_base_id():
    with pytest.raises(EnvError, match="Unknown environment id 'Pendulumm-v1'.*'Pendulum-v1'"):
        make_env("Pendulumm-v1?obs_noise=0.1")
    with pytest.raises(EnvError, match="unknown option"):
        episode_length("Pendulum-v1?noise=0.1")


class JaxProbe:
    """``Probe`` as a JAX core (without the episode id): obs [t, 0, 0], reward action[0]."""

    observation_size, action_size, episode_length = 3, 2, 7

    def reset(self, key):
        import jax.numpy as jnp

        return jnp.int32(0), jnp.zeros(3, jnp.float32)

    def step(self, sim, action):
        import jax.numpy as jnp

        t = sim + 1
        return t, jnp.array([t, 0.0, 0.0], jnp.float32), action[0], t == 5


gym.register(
    "JaxrlTest/Sim2RealProbeTerm-v0",
    entry_point=Probe,
    max_episode_steps=7,
    kwargs={"terminate_at": 5},
)


@pytest.mark.parametrize(
    "query, k",
    [
        ("decimation=2&action_filter=0.5&action_delay=1", 1),
        ("decimation=3&action_delay=2&obs_delay=1", 1),
        ("action_filter=0.7&action_delay=2&obs_history=3", 3),
    ],
)
def test_host_options_give_the_same_transitions_as_the_jax_wrappers(query, k):
    # Everything but the random parts (noise, delays drawn from a range), on one probe in both
    # worlds: the same rewards, observations, next observations and episode ends, step by step.
    # Two known differences are left out: with obs_delay the JAX next observation (final_obs)
    # is the true one, the host's the delayed one the agent sees; and the JAX ControlDecimation
    # fails under an ObservationHistory (it carries the widened observation into its scan).
    import jax

    from jaxrl.envs import sim2real
    from jaxrl.envs.jax_envs import VecEnv, parse_env_id
    from jaxrl.envs.wrappers import RescaleAction

    options = parse_env_id(f"jax:probe?{query}")[2]
    jax_env = sim2real.wrap_actuation(VecEnv(JaxProbe(), 1), options)
    jax_env = sim2real.wrap_agent_side(RescaleAction(jax_env, -1.0, 1.0), options)
    host_env = make_env(f"JaxrlTest/Sim2RealProbeTerm-v0?{query}")
    actions = np.random.default_rng(0).uniform(-1, 1, (16, 1, 2)).astype(np.float32)

    state, got = jax_env.reset(jax.random.key(0)), []
    step = jax.jit(jax_env.step)
    for a in actions:
        state = step(state, a)
        ended = (state.terminated, state.truncation)
        got.append((state.info["final_obs"], state.obs, state.reward, *ended))
    jax_out = [np.concatenate([np.asarray(x[i]) for x in got]) for i in range(5)]

    host_env.reset(seed=0)
    host_out = _roll(host_env, actions)
    for obs in host_out[:2]:
        obs.reshape(len(actions), k, 3)[..., 1] = 0.0  # the host probe's episode id
    assert host_out[3].sum() >= 2  # episodes ended (terminated on sim step 5) inside the run
    names = ["next_obs", "obs", "reward", "terminated", "truncated"]
    for name, h, j in zip(names, host_out, jax_out, strict=True):
        if name != "next_obs" or "obs_delay" not in query:
            np.testing.assert_allclose(h.reshape(j.shape), j, rtol=1e-6, err_msg=name)


def _roll(env, actions):
    out = [env.step(a) for a in actions]
    return [np.stack([o[i] for o in out]) for i in range(5)]


def test_host_env_state_includes_the_wrappers_and_restores_bit_for_bit():
    env_id = "InvertedPendulum-v5?action_delay=1:3&action_filter=0.5&obs_delay=0:2&obs_history=2"
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (60, 2, 1)).astype(np.float32)
    a = make_env(env_id, 2)
    a.reset(seed=3)
    _roll(a, actions[:25])
    state = json.loads(json.dumps(a.get_state()))
    want = _roll(a, actions[25:])
    assert [len(s["wrappers"]) for s in state["envs"]] == [4, 4]
    assert want[3].any()  # episodes ended after the save: the wrappers reset after restoring
    b = make_env(env_id, 2)
    b.reset(seed=99)
    b.set_state(state)
    got = _roll(b, actions[25:])
    for w, x in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, x)
    # The state of another id's wrappers is refused before anything is restored.
    other = make_env("InvertedPendulum-v5?obs_history=2&action_filter=0.5&obs_delay=1", 2)
    other.reset(seed=0)
    before = json.dumps(b.get_state())
    with pytest.raises(EnvError, match="ActionDelay.*same --env id"):
        b.set_state(other.get_state())
    assert json.dumps(b.get_state()) == before


def _train(env_id, out, steps):
    cfg = registry.get("td3").config(hidden_dims=(32, 32), learning_starts=200, buffer_size=2000)
    run = TrainConfig(
        env=env_id,
        total_steps=steps,
        seed=0,
        out=str(out),
        progress=False,
        tensorboard=False,
        eval_every=300,
        eval_episodes=2,
        log_every=100,
        checkpoint_every=250,
    )
    return train("td3", run, cfg)


def _metrics(out):
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_host_loop_resume_with_wrappers_is_bit_identical(tmp_path, monkeypatch):
    # Pendulum-v1 (classic control) cannot save its simulator state; InvertedPendulum (MuJoCo)
    # can, so with the wrappers' state saved too the resumed run must equal the uninterrupted one.
    env_id = "InvertedPendulum-v5?action_delay=1&obs_noise=0.01&action_filter=0.7&obs_history=2"
    full, killed = tmp_path / "full", tmp_path / "killed"
    _train(env_id, full, 600)
    original, calls = HostEnv.step, {"n": 0}

    def step_and_interrupt(self, action):
        if self.num_envs == 1:
            calls["n"] += 1
            if calls["n"] == 413:  # between checkpoints, in the middle of an episode
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, action)

    monkeypatch.setattr(HostEnv, "step", step_and_interrupt)
    summary = _train(env_id, killed, 600)
    assert not summary["completed"] and summary["total_steps"] == 413
    monkeypatch.setattr(HostEnv, "step", original)
    _train(env_id, killed, 600)
    want = _metrics(full)
    assert len(want) == 6 and sum("eval_return" in r for r in want) == 2
    assert _metrics(killed) == want
    config = json.load(open(full / "config.json"))
    assert env_id in json.dumps(config)


def test_pushes_kick_the_mujoco_root_at_the_drawn_steps():
    from jaxrl.envs.gym_sim2real import Pushes

    pushed = Pushes(gym.make("InvertedPendulum-v5"), speed=(1.0, 1.0), interval=(3, 3))
    plain = gym.make("InvertedPendulum-v5")
    a, _ = pushed.reset(seed=0)
    b, _ = plain.reset(seed=0)
    np.testing.assert_array_equal(a, b)
    zero = np.zeros(1, np.float32)
    for t in range(1, 4):
        a, b = pushed.step(zero)[0], plain.step(zero)[0]
        assert np.array_equal(a, b) == (t < 3), t  # the first push lands on step 3
    assert np.linalg.norm(pushed.dv) == pytest.approx(1.0)  # a 1 m/s kick, spread over 1 step
    state = pushed.get_state()
    assert state["countdown"] == 3 and state["remaining"] == 0
    with pytest.raises(ValueError, match="MuJoCo"):
        Pushes(gym.make("Pendulum-v1"))
