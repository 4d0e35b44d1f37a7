"""Pure-JAX classic envs: Gymnasium parity, hand-computed steps, invariants, sanity controllers."""

import functools
import math

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.envs.classic import (
    CLASSIC_ENVS,
    CartPoleSwingUp,
    Pendulum,
    PointMass,
    angle_normalize,
    make_classic,
)

ENVS = [Pendulum(), CartPoleSwingUp(), PointMass()]
IDS = [env.name for env in ENVS]
NUM_ENVS, STEPS = 8, 1000


def pendulum_controller(state):
    th, w = angle_normalize(state[0]), state[1]
    energy = 0.5 * w**2 + 15.0 * jnp.cos(th)  # 15 = 3g/2l; upright at rest has energy 15
    pump = 2.0 * jnp.where(w == 0, 1.0, jnp.sign(w)) * jnp.sign(15.0 - energy)
    return jnp.clip(jnp.where(jnp.cos(th) > 0.85, -(10 * th + 2 * w), pump), -2, 2)[None]


def cartpole_controller(state):
    env = CartPoleSwingUp()
    x, th, xd, w = state[0], angle_normalize(state[1]), state[2], state[3]
    mgl = env.pole_mass * env.gravity * env.half_length
    inertia = 4 / 3 * env.pole_mass * env.half_length**2  # uniform rod about its hinge
    energy = 0.5 * inertia * w**2 + mgl * (jnp.cos(th) - 1)  # 0 upright at rest
    pump = 10 * energy * w * jnp.cos(th) / mgl - 0.5 * x - 0.5 * xd  # Astrom-Furuta energy control
    balance = 0.783 * x + 8.75 * th + 1.354 * xd + 2.284 * w  # discrete LQR, Q=diag(1,10,1,1)
    return jnp.clip(jnp.where(jnp.cos(th) > 0.8, balance, pump), -1, 1)[None]


def point_mass_controller(state):
    return jnp.clip(-3 * state[:2] - 2 * state[2:], -1, 1)


CONTROLLERS = {
    "pendulum": pendulum_controller,
    "cartpole_swingup": cartpole_controller,
    "point_mass": point_mass_controller,
}


POLICIES = ("random", "zero", "controller")


@functools.cache
def rollouts(env):
    """`NUM_ENVS` x `STEPS` steps (no resets) under random, zero and controller actions.

    One compiled scan over all three policies per env (compiling dominates this file's run time).
    Returns `{policy: (obs [T, N, obs_size], reward [T, N], terminated [T, N])}` and the reset obs.
    """
    controller = CONTROLLERS[env.name]

    def act(policy_id, state, noise):
        return jnp.where(policy_id == 0, noise, jnp.where(policy_id == 1, 0.0, controller(state)))

    def run(key, noise):
        state, obs0 = jax.vmap(env.reset)(jax.random.split(key, NUM_ENVS))
        state = jax.tree.map(lambda x: jnp.concatenate([x] * len(POLICIES)), state)
        policy_ids = jnp.repeat(jnp.arange(len(POLICIES)), NUM_ENVS)

        def body(state, u):
            state, obs, reward, done = jax.vmap(env.step)(
                state, jax.vmap(act)(policy_ids, state, u)
            )
            return state, (obs, reward, done)

        out = jax.lax.scan(body, state, noise)[1]
        split = [jnp.split(x, len(POLICIES), axis=1) for x in out]
        return {name: tuple(x[i] for x in split) for i, name in enumerate(POLICIES)}, obs0

    shape = (STEPS, len(POLICIES) * NUM_ENVS, env.action_size)
    noise = np.random.default_rng(0).uniform(env.action_low, env.action_high, shape)
    return jax.jit(run)(jax.random.key(0), noise.astype(np.float32))


def test_pendulum_matches_gymnasium_step_for_step():
    env, step = Pendulum(), jax.jit(Pendulum().step)
    gym_env = gymnasium.make("Pendulum-v1").unwrapped
    gym_env.reset(seed=0)
    rng = np.random.default_rng(0)
    for trial in range(3):
        state, obs = env.reset(jax.random.key(trial))
        gym_env.state = np.asarray(state, np.float64)
        np.testing.assert_allclose(obs, gym_env._get_obs(), atol=1e-6)
        for _ in range(100):
            u = rng.uniform(-2.5, 2.5, size=1).astype(np.float32)  # also beyond max_torque
            gym_env.state = np.asarray(state, np.float64)  # re-sync: no float32/64 drift
            state, obs, reward, done = step(state, jnp.asarray(u))
            gym_obs, gym_reward, gym_term, _, _ = gym_env.step(u)
            np.testing.assert_allclose(obs, gym_obs, atol=1e-5)
            np.testing.assert_allclose(reward, gym_reward, rtol=1e-5, atol=1e-5)
            assert float(done) == float(gym_term) == 0.0


def test_pendulum_open_loop_tracks_gymnasium_over_short_horizon():
    env, step = Pendulum(), jax.jit(Pendulum().step)
    gym_env = gymnasium.make("Pendulum-v1").unwrapped
    gym_env.reset(seed=0)
    state, _ = env.reset(jax.random.key(7))
    gym_env.state = np.asarray(state, np.float64)
    for u in np.random.default_rng(1).uniform(-2, 2, size=(40, 1)).astype(np.float32):
        state, obs, reward, _ = step(state, jnp.asarray(u))
        gym_obs, gym_reward, *_ = gym_env.step(u)
        np.testing.assert_allclose(obs, gym_obs, atol=1e-4)
        np.testing.assert_allclose(reward, gym_reward, atol=1e-4)


def test_pendulum_one_step_by_hand():
    env = Pendulum()
    # th=1, thdot=0.5, u=1.5: thdot' = 0.5 + (15 sin 1 + 3 * 1.5) * 0.05 = 1.35610324,
    # th' = 1 + 1.35610324 * 0.05 = 1.06780516, cost = 1 + 0.1 * 0.25 + 0.001 * 2.25 = 1.02725.
    state, obs, reward, done = env.step(jnp.array([1.0, 0.5]), jnp.array([1.5]))
    np.testing.assert_allclose(state, [1.06780516, 1.35610324], rtol=1e-6)
    np.testing.assert_allclose(obs, [0.48204838, 0.87614460, 1.35610324], rtol=1e-6)
    np.testing.assert_allclose(reward, -1.02725, rtol=1e-6)
    assert float(done) == 0.0
    # th=4 wraps to 4 - 2 pi = -2.28318531 in the cost; torque 5 clips to 2; speed clips to 8:
    # thdot' = 7.9 + (15 sin 4 + 6) * 0.05 = 7.63239813 (no clip), cost = 5.21293 + 6.241 + 0.004.
    state, _, reward, _ = env.step(jnp.array([4.0, 7.9]), jnp.array([5.0]))
    np.testing.assert_allclose(reward, -(2.28318531**2 + 6.241 + 0.004), rtol=1e-6)
    np.testing.assert_allclose(
        state, [4.0 + 7.63239813 * 0.05 - 2 * math.pi, 7.63239813], rtol=1e-5
    )
    state, _, _, _ = env.step(jnp.array([math.pi / 2, 7.9]), jnp.array([2.0]))
    np.testing.assert_allclose(state, [math.pi / 2 + 8.0 * 0.05, 8.0], rtol=1e-6)


def test_pendulum_reset_distribution():
    states, obs = jax.jit(jax.vmap(Pendulum().reset))(jax.random.split(jax.random.key(0), 4000))
    assert np.all(np.abs(states[:, 0]) <= math.pi) and np.all(np.abs(states[:, 1]) <= 1.0)
    np.testing.assert_allclose(
        np.std(states, 0), [math.pi / math.sqrt(3), 1 / math.sqrt(3)], rtol=0.05
    )
    np.testing.assert_allclose(obs[:, 0], np.cos(states[:, 0]), atol=1e-6)


def test_cartpole_wall_impact_by_hand():
    # Gravity 0, pole still, cart at 1.79 moving at +1: one Euler step reaches x = 1.81 > 1.8, so
    # the wall zeroes xdot and the hinge gives the pole thdot = 3 cos(0.3) / (4 * 0.5) = 1.43300.
    env = CartPoleSwingUp(gravity=0.0, substeps=1)
    state, obs, _, _ = env.step(jnp.array([1.79, 0.3, 1.0, 0.0]), jnp.zeros(1))
    np.testing.assert_allclose(state, [1.8, 0.3, 0.0, 1.5 * math.cos(0.3)], rtol=1e-6)
    np.testing.assert_allclose(
        obs, [1.8, math.cos(0.3), math.sin(0.3), 0.0, 1.5 * math.cos(0.3)], rtol=1e-6
    )


def test_cartpole_conserves_momentum_and_energy_without_force():
    env = CartPoleSwingUp(substeps=10)
    m, half, total = env.pole_mass, env.half_length, env.cart_mass + env.pole_mass

    def invariants(s):
        th, xd, w = s[..., 1], s[..., 2], s[..., 3]
        momentum = total * xd + m * half * jnp.cos(th) * w  # dL/dxdot: no horizontal force acts
        kinetic = 0.5 * total * xd**2 + m * half * jnp.cos(th) * xd * w + 2 / 3 * m * half**2 * w**2
        return momentum, kinetic + m * env.gravity * half * jnp.cos(th)

    def body(state, _):
        state = env.step(state, jnp.zeros(1))[0]
        return state, state

    state0 = jnp.array([0.0, 2.0, 0.3, 1.0])  # swings through the bottom, cart stays in +-1.8
    states = jax.jit(lambda s: jax.lax.scan(body, s, None, 100)[1])(state0)
    assert float(jnp.abs(states[:, 0]).max()) < env.track_limit
    assert float(jnp.ptp(states[:, 1])) > 1.0  # really swinging
    (p0, e0), (p, e) = invariants(state0), invariants(states)
    np.testing.assert_allclose(p, p0, atol=5e-3)
    np.testing.assert_allclose(e, e0, atol=5e-3)


def test_cartpole_reward_upright_and_hanging():
    env = CartPoleSwingUp()
    _, _, up, _ = env.step(jnp.zeros(4), jnp.zeros(1))
    _, _, down, _ = env.step(jnp.array([0.0, math.pi, 0.0, 0.0]), jnp.zeros(1))
    _, _, pushed, _ = env.step(jnp.zeros(4), jnp.ones(1))
    np.testing.assert_allclose(up, 1.0, atol=1e-6)
    assert float(down) < 1e-6 and 0.7 < float(pushed) < 0.85  # control factor 4/5


@pytest.mark.parametrize("env", ENVS, ids=IDS)
def test_shapes_dtypes_jit_vmap_and_bounds(env):
    state, obs = jax.jit(env.reset)(jax.random.key(0))
    assert obs.shape == (env.observation_size,) and obs.dtype == jnp.float32
    state, obs, reward, done = jax.jit(env.step)(state, jnp.zeros(env.action_size))
    assert obs.shape == (env.observation_size,) and obs.dtype == jnp.float32
    assert reward.shape == done.shape == () and reward.dtype == done.dtype == jnp.float32
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state))

    (out, obs0) = rollouts(env)
    assert obs0.shape == (NUM_ENVS, env.observation_size) and obs0.dtype == jnp.float32
    for obs, rewards, dones in out.values():
        assert obs.shape == (STEPS, NUM_ENVS, env.observation_size) and obs.dtype == jnp.float32
        assert rewards.shape == dones.shape == (STEPS, NUM_ENVS)
        assert np.all(np.isfinite(obs)) and np.all(np.isfinite(rewards))
        low, high = env.reward_range
        assert low - 1e-5 <= float(rewards.min()) and float(rewards.max()) <= high + 1e-5
        assert np.all(dones == 0.0)  # none of these envs terminates
    assert len(np.unique(np.asarray(obs0[:, 0]))) == NUM_ENVS  # each key its own episode


@pytest.mark.parametrize(
    ("env", "min_return"), list(zip(ENVS, [-300.0, 350.0, -25.0], strict=True)), ids=IDS
)
def test_sensible_controller_beats_zero_and_random(env, min_return):
    out, _ = rollouts(env)
    returns = {k: float(r[: env.episode_length].sum(0).mean()) for k, (_, r, _) in out.items()}
    assert returns["controller"] > min_return, returns
    span = env.episode_length * (env.reward_range[1] - env.reward_range[0])
    assert returns["controller"] > max(returns["zero"], returns["random"]) + 0.1 * span, returns


def test_cartpole_controller_swings_up_and_holds():
    rewards = rollouts(CartPoleSwingUp())[0]["controller"][1]
    assert float(rewards[-500:].min()) > 0.95  # upright, centered and still for the last 10 s


def test_registry_and_errors():
    assert set(CLASSIC_ENVS) == {"pendulum", "cartpole_swingup", "point_mass"}
    env = make_classic("pendulum", g=9.81)
    assert isinstance(env, Pendulum) and env.g == 9.81 and hash(env) == hash(Pendulum(g=9.81))
    with pytest.raises(ValueError, match="cartpole_swingup, pendulum, point_mass"):
        make_classic("acrobot")
    with pytest.raises(ValueError, match="gravity"):
        make_classic("cartpole_swingup", g=9.81)
    with pytest.raises(ValueError, match="substeps"):
        make_classic("cartpole_swingup", substeps=2.5)
    with pytest.raises(ValueError, match="Pendulum.m must be a number >= 0"):
        Pendulum(m="1")
