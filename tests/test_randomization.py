"""Domain randomization: physics drawn again at every reset inside one compiled program, within
the stated ranges (Brax inverted_pendulum on the MJX backend)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.envs import EnvError
from jaxrl.envs.jax_envs import BraxCore, VecEnv, make_core, make_jax_env, parse_env_id
from jaxrl.envs.randomization import Ranges, randomize, ranges_from_options
from jaxrl.loops.device import strongly_typed


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


def test_randomization_on_other_backends_writes_their_copies():
    # positional and spring do not simulate armature or damping: the defaults are refused.
    with pytest.raises(ValueError, match="positional backend does not simulate armature_scale"):
        make_jax_env("brax:inverted_pendulum?backend=positional&randomize=true", 1)
    from jaxrl.envs.randomization import Ranges, randomize

    core = BraxCore("inverted_pendulum", "generalized", randomize=True)
    ranges = dataclasses.replace(
        Ranges(), damping_scale=(0.5, 2.0), qpos0_offset=(-0.1, 0.1), motor_strength=(0.5, 2.0)
    )
    sys = randomize(core.env.sys, jax.random.key(3), ranges)
    # Brax's own copies (what generalized/positional/spring read) follow the MuJoCo fields.
    np.testing.assert_allclose(sys.link.inertia.mass, sys.body_mass[1:])
    np.testing.assert_allclose(sys.link.inertia.transform.pos, sys.body_ipos[1:])
    np.testing.assert_allclose(sys.dof.armature, sys.dof_armature)
    np.testing.assert_allclose(sys.dof.damping, sys.dof_damping)
    np.testing.assert_allclose(sys.actuator.gain, sys.actuator_gainprm[:, 0])
    np.testing.assert_allclose(sys.init_q, sys.qpos0)  # the reset pose moves with qpos0
    assert not np.allclose(sys.link.inertia.mass, core.env.sys.link.inertia.mass)
    assert not np.allclose(sys.actuator.gain, core.env.sys.actuator.gain)
    # A positional env steps on a drawn model, and the drawn mass changes what it does.
    env = BraxCore("inverted_pendulum", "positional", randomize=dataclasses.replace(
        Ranges(), armature_scale=None, mass_scale=(0.2, 5.0)))  # fmt: skip
    state, _ = jax.jit(env.reset)(jax.random.key(0))
    (model, inner), *_ = jax.jit(env.step)(state, jnp.ones(1))
    assert not np.allclose(model.link.inertia.mass, env.env.sys.link.inertia.mass)


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


# Ranges stated in the env id, and motor strength.

_MIXED_XML = """
<mujoco>
  <worldbody>
    <body name="torso">
      <joint name="a" type="hinge"/>
      <geom size="0.1" mass="1"/>
      <body pos="0 0 0.3">
        <joint name="b" type="hinge"/>
        <geom size="0.1" mass="1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="a" gear="50"/>
    <position joint="b" kp="20" kv="2"/>
    <motor joint="b" gear="10"/>
  </actuator>
</mujoco>
"""

_ONLY = {f: None for f in ("friction", "mass_scale", "torso_mass_add", "com_offset")}
_ONLY |= {"armature_scale": None, "gain_scale": None}
"""Every default range off: ``Ranges(**_ONLY, motor_strength=...)`` varies one thing."""


@pytest.fixture(scope="module")
def mixed():
    """An MJX model with two motors (actuators 0 and 2) and a position servo (actuator 1)."""
    import mujoco
    from mujoco import mjx

    return mjx.put_model(mujoco.MjModel.from_xml_string(_MIXED_XML))


def test_motor_strength_follows_its_range_and_leaves_position_actuators(mixed):
    assert list(np.asarray(mixed.actuator_biastype)) == [0, 1, 0]
    ranges = Ranges(**_ONLY, motor_strength=(0.4, 1.6))
    models = jax.jit(jax.vmap(lambda k: randomize(mixed, k, ranges)))(
        jax.random.split(jax.random.key(0), 2000)
    )
    gain, base = np.asarray(models.actuator_gainprm), np.asarray(mixed.actuator_gainprm)
    factor = gain[:, [0, 2], 0] / base[[0, 2], 0]
    assert factor.min() >= 0.4 - 1e-6 and factor.max() <= 1.6 + 1e-6
    assert factor.min() < 0.42 and factor.max() > 1.58  # the whole range is used
    assert abs(np.corrcoef(factor.T)[0, 1]) < 0.1  # each motor draws its own factor
    # The position servo keeps its Kp and Kd; the rest of every gain/bias row is untouched.
    np.testing.assert_array_equal(gain[:, 1], np.broadcast_to(base[1], gain[:, 1].shape))
    np.testing.assert_array_equal(
        gain[:, :, 1:], np.broadcast_to(base[:, 1:], gain[:, :, 1:].shape)
    )
    bias = np.asarray(models.actuator_biasprm)
    np.testing.assert_array_equal(bias, np.broadcast_to(mixed.actuator_biasprm, bias.shape))
    # And gain_scale moves only the servo: each field owns its kind of actuator.
    servo = jax.vmap(lambda k: randomize(mixed, k, Ranges(**{**_ONLY, "gain_scale": (2.0, 3.0)})))(
        jax.random.split(jax.random.key(1), 50)
    )
    kp = np.asarray(servo.actuator_gainprm[:, :, 0]) / base[:, 0]
    assert (kp[:, 1] >= 2.0 - 1e-6).all() and (kp[:, [0, 2]] == 1.0).all()
    assert Ranges().motor_strength is None  # off by default (Playground's ranges)


def test_the_simulator_feels_the_motor_strength(core):
    """Half the strength with action a moves the pendulum exactly as full strength with a / 2."""
    key = jax.random.key(4)
    (_, start), _ = jax.jit(core.reset)(key)  # op by op, an MJX reset takes ~15 s
    full = core.env.sys
    half = randomize(full, key, Ranges(**_ONLY, motor_strength=(0.5, 0.5)))
    np.testing.assert_allclose(half.actuator_gainprm[0, 0], 0.5 * full.actuator_gainprm[0, 0])

    @jax.jit
    def run(model, action):  # the step reads the model from the state: one program for all
        def body(s, _):
            s, obs, _, _ = core.step(s, action)
            return s, obs

        return jax.lax.scan(body, (model, start), None, length=5)[1]

    a = jnp.array([0.8])
    obs_weak, obs_half, obs_full = run(half, a), run(full, a / 2), run(full, a)
    np.testing.assert_allclose(obs_weak, obs_half, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(obs_weak - obs_full)).max() > 1e-3


def test_ranges_stated_in_the_env_id():
    def ranges(query):
        options = parse_env_id(f"brax:inverted_pendulum?{query}")[2]
        return ranges_from_options(options), options

    # randomize=true starts from the defaults; a stated field replaces its default, none drops it.
    got, rest = ranges("randomize=true&mass_scale=0.5:2&friction=none&episode_length=10")
    assert got == Ranges(mass_scale=(0.5, 2.0), friction=None)
    assert rest == {"episode_length": 10}  # the other options are left for the env
    # A range alone turns randomization on; K is the fixed value K:K.
    got, _ = ranges("motor_strength=0.4&damping_scale=1:3")
    assert got == Ranges(motor_strength=(0.4, 0.4), damping_scale=(1.0, 3.0))
    assert ranges("randomize=true")[0] == Ranges()
    assert ranges("")[0] is None and ranges("randomize=false")[0] is None
    # make_core hands them to BraxCore.
    core = make_core("brax:inverted_pendulum?mass_scale=0.5:2&friction=none")[0]
    assert core.ranges == Ranges(mass_scale=(0.5, 2.0), friction=None)
    with pytest.raises(EnvError, match="takes a jaxrl.envs.randomization.Ranges"):
        BraxCore("inverted_pendulum", randomize="mass_scale=1:2")


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("mass_scale=abc", "mass_scale=abc is not a range; write mass_scale=LOW:HIGH"),
        ("mass_scale=0.5:", "is not a range"),
        ("mass_scale=true", "is not a range"),
        ("mass_scale=1:inf", "is not a range"),
        ("mass_scale=2:0.5", r"low <= high, got \(2.0, 0.5\)"),
        ("motor_strength=-1:1", "must be >= 0"),
        ("randomize=false&mass_scale=1:2", "randomize=false, yet ranges are stated"),
        ("randomize=yes", "randomize=yes must be true or false"),
        ("mass_scal=1:2", r"Did you mean mass_scale \(not mass_scal\)"),
        ("backend=spring&motor_strength=1:2", "spring backend does not simulate armature_scale"),
    ],
)
def test_bad_ranges_in_the_env_id_name_the_problem(query, match):
    with pytest.raises(EnvError, match=match):
        make_core(f"brax:inverted_pendulum?{query}")
