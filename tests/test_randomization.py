"""Domain randomization: physics drawn again at every reset inside one compiled program, within
the stated ranges (Brax inverted_pendulum on the MJX backend)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.envs.jax_envs import BraxCore, VecEnv, make_jax_env
from jaxrl.envs.randomization import Ranges, randomize
from jaxrl.loops.harness import strongly_typed


@pytest.fixture(scope="module")
def core():
    return BraxCore("inverted_pendulum", randomize=True)


def test_draws_follow_the_stated_ranges(core):
    base = core.env.sys
    models = jax.jit(jax.vmap(lambda k: randomize(base, k, Ranges())))(
        jax.random.split(jax.random.key(0), 2000)
    )
    friction = np.asarray(models.geom_friction[..., 0])
    assert friction.min() >= 0.4 and friction.max() <= 1.0
    assert friction.min() < 0.42 and friction.max() > 0.98  # the whole range is used
    mass, base_mass = np.asarray(models.body_mass), np.asarray(base.body_mass)
    ratio = mass[:, 2:] / base_mass[2:]
    assert ratio.min() >= 0.9 - 1e-6 and ratio.max() <= 1.1 + 1e-6
    torso = mass[:, 1]
    assert torso.min() >= 0.9 * base_mass[1] - 1 - 1e-5 and torso.max() <= 1.1 * base_mass[1] + 1
    com = np.asarray(models.body_ipos[:, 1]) - np.asarray(base.body_ipos[1])
    assert np.abs(com).max() <= 0.05 + 1e-6 and np.abs(com).max() > 0.045
    ones = base.replace(dof_armature=jnp.ones_like(base.dof_armature))
    armature = np.asarray(randomize(ones, jax.random.key(1), Ranges()).dof_armature)
    assert armature.min() >= 1.0 and armature.max() <= 1.05 and armature.std() > 0
    # Its actuator is a motor (no Kp/Kd): the gains are left alone.
    np.testing.assert_array_equal(np.asarray(models.actuator_gainprm[0]), base.actuator_gainprm)
    with pytest.raises(ValueError, match="low <= high"):
        Ranges(friction=(1.0, 0.4))


def test_physics_change_between_episodes_of_one_slot_without_recompiling(core):
    env = VecEnv(core, 2, episode_length=3)
    traces = []

    @jax.jit
    def run(state):
        traces.append(1)

        def body(s, _):
            s = env.step(s, jnp.zeros((2, env.action_size)))
            return s, (s.sim[0].body_mass[:, 1], s.sim[0].geom_friction[:, 0, 0])

        return jax.lax.scan(body, state, None, length=6)

    # As the fused loop does: weak types from the reset would retrace once, resets or not.
    state = strongly_typed(jax.jit(env.reset)(jax.random.key(0)))
    state, (torso, friction) = run(state)
    state, (torso2, _) = run(state)  # two more episodes per slot, same program
    assert len(traces) == 1
    torso = np.concatenate([np.asarray(torso), np.asarray(torso2)])
    # Episodes of 3 steps: the model changes exactly after steps 3, 6, 9 (index 2, 5, 8).
    for t in range(1, 12):
        same = torso[t] == torso[t - 1]
        assert same.all() == ((t + 1) % 3 != 0), t
    assert (np.asarray(friction)[2] != np.asarray(friction)[1]).all()
    assert torso[0, 0] != torso[0, 1]  # and the slots draw independently


def test_randomization_needs_the_mjx_backend():
    with pytest.raises(ValueError, match="supports the mjx backend"):
        make_jax_env("brax:inverted_pendulum?backend=positional&randomize=true", 1)


def test_pushes_kick_the_root_at_the_drawn_intervals(core):
    from jaxrl.envs.pushes import Pushes

    plain = VecEnv(core, 3, episode_length=50)
    pushed = Pushes(plain, speed=(1.0, 1.0), interval=(4, 4), duration=1)

    def velocities(env):
        def run(key):
            def body(s, _):
                s = env.step(s, jnp.zeros((3, env.action_size)))
                return s, s.sim[1].pipeline_state.qvel[:, 0]

            return jax.lax.scan(body, env.reset(key), None, length=10)[1]

        return np.asarray(jax.jit(run)(jax.random.key(3)))

    a, b = velocities(plain), velocities(pushed)
    # The first push is applied before step 5 (countdown 4): identical until then.
    np.testing.assert_array_equal(a[:4], b[:4])
    assert (np.abs(b[4] - a[4]) > 1e-3).all()
    with pytest.raises(ValueError, match="interval >= 1 step"):
        Pushes(plain, interval=(0, 3))
