"""Privileged critic observations (asymmetric actor-critic): the env layout, agents, CLI, export."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import registry
from jaxrl.cli import main
from jaxrl.envs.jax_envs import make_jax_env

NOISY = "jax:pendulum?obs_noise=0.2&obs_delay=1&privileged=true"


def test_layout_policy_part_then_clean_observation():
    """obs = [noisy delayed obs, clean obs]; final_obs = [its own noisy part, clean final obs]."""
    env = make_jax_env(NOISY + "&episode_length=5", 4)
    plain = make_jax_env("jax:pendulum?episode_length=5", 4)
    assert (env.actor_observation_size, env.observation_size) == (3, 6)
    assert plain.actor_observation_size is None
    key = jax.random.key(0)
    state, ref = env.reset(key), plain.reset(key)
    np.testing.assert_allclose(state.obs[:, 3:], ref.obs, atol=1e-6)  # same physics, clean
    assert np.abs(np.asarray(state.obs[:, :3] - ref.obs)).max() > 0.05  # the noise is there
    step, ref_step = jax.jit(env.step), jax.jit(plain.step)
    actions = jnp.linspace(-1, 1, 4)[:, None]
    for t in range(7):
        state, ref = step(state, actions), ref_step(ref, actions)
        np.testing.assert_allclose(state.obs[:, 3:], ref.obs, atol=1e-5)
        np.testing.assert_allclose(state.info["final_obs"][:, 3:], ref.info["final_obs"], atol=1e-5)
        if t == 4:  # the time limit ended every episode: final_obs is the old episode's
            assert np.all(np.asarray(state.truncation) == 1)
            assert not np.allclose(state.info["final_obs"][:, 3:], state.obs[:, 3:])


def test_randomized_physics_follow_the_episode():
    """The drawn physics in the features change at an episode boundary, final_obs keeps the old."""
    # Brax's generalized backend reads every drawn field and compiles faster than MJX on CPU.
    query = "backend=generalized&randomize=true&privileged=true&episode_length=2"
    env = make_jax_env(f"brax:inverted_pendulum?{query}", 2)
    o = env.actor_observation_size
    assert env.observation_size == o + o + 3  # policy part, clean obs, 3 physics values
    state = jax.jit(env.reset)(jax.random.key(1))
    first = np.asarray(state.obs[:, 2 * o :])
    step = jax.jit(env.step)
    state = step(state, jnp.zeros((2, 1)))
    np.testing.assert_allclose(state.obs[:, 2 * o :], first)  # same episode, same physics
    state = step(state, jnp.zeros((2, 1)))  # the time limit: new episodes, new models
    np.testing.assert_allclose(state.info["final_obs"][:, 2 * o :], first)
    assert not np.allclose(state.obs[:, 2 * o :], first)


@pytest.mark.parametrize("name", ["sac", "td3", "ppo"])
def test_actor_ignores_privileged_features_critic_reads_them(name):
    spec = registry.get(name)
    config = dataclasses.replace(spec.config(), actor_observation_size=3)
    agent = spec.agent.create(config, jnp.zeros(6), jnp.zeros(2), 0)
    obs = jax.random.normal(jax.random.key(0), (5, 6))
    other = obs.at[:, 3:].set(100.0)
    np.testing.assert_array_equal(agent.eval_actions(obs), agent.eval_actions(other))
    if name == "ppo":
        value = lambda o: agent.value.apply_fn(agent.value.params, o)  # noqa: E731
        assert not np.allclose(value(obs), value(other))
    else:
        q = lambda o: agent.critic.apply_fn(agent.critic.params, o, jnp.zeros((5, 2)))  # noqa: E731
        assert not np.allclose(q(obs), q(other))


def test_cli_sets_the_actor_width_exports_the_policy_part(tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["train", "ppo", "--env", NOISY, "--num-envs", "8", "--total-steps", "80"]
    small = ["--batch-size", "8", "--num-minibatches", "1", "--num-updates-per-batch", "1"]
    nets = ["--policy-hidden-dims", "16", "--value-hidden-dims", "16"]
    main([*argv, *small, *nets, "--eval-episodes", "2", "--out", out, "--no-progress"])
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["agent_config"]["actor_observation_size"] == 3
    from jaxrl.export.policy import export_run, load_policy, source_from_run

    path = export_run(out, "numpy")
    policy = load_policy(path, obs_size=3)
    assert "privileged" in policy.contract["observation"]["layout"]
    sim2real = {"obs_noise": 0.2, "obs_delay": 1, "privileged": True}
    assert policy.contract["sim2real"] == sim2real
    assert policy.contract["decimation"] == 1
    src = source_from_run(out)
    obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    # The trained agent on the full layout (privileged part arbitrary), normalizer as in eval.
    from jaxrl.run.runs import load_run

    run = load_run(out)
    full = np.concatenate([obs, np.full((16, 3), 7.0, np.float32)], 1)
    normalized = (full - run.obs_stats.mean) / np.sqrt(run.obs_stats.var + 1e-8)
    expected = run.agent.eval_actions(jnp.clip(normalized, -10, 10))
    low, high = src.action_low, src.action_high
    expected = low + (np.clip(expected, -1, 1) + 1) / 2 * (high - low)
    np.testing.assert_allclose(policy(obs), expected, atol=1e-5)


def test_refusals(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "tdmpc2", "--env", NOISY, "--out", str(tmp_path / "a")])
    assert "cannot train on an env with privileged=true" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "a")
    with pytest.raises(SystemExit):
        argv = ["train", "sac", "--env", NOISY, "--actor-observation-size", "2"]
        main([*argv, "--out", str(tmp_path / "b")])
    assert "does not match the env" in capsys.readouterr().err
    with pytest.raises(ValueError, match="actor_observation_size must be >= 0"):
        spec = registry.get("sac")
        spec.agent.create(
            dataclasses.replace(spec.config(), actor_observation_size=-1),
            jnp.zeros(3),
            jnp.zeros(1),
            0,
        )


def test_contract_control_period_counts_decimation():
    from jaxrl.export.policy import _sim2real_options

    assert _sim2real_options("HalfCheetah-v5") == {}
    options = _sim2real_options("HalfCheetah-v5?decimation=2&obs_noise=0.1&episode_length=5")
    assert options == {"decimation": 2, "obs_noise": 0.1}
