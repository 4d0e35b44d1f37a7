"""Env ids and their options: one parser for Gymnasium and JAX ids, bad values refused clearly."""

from __future__ import annotations

import ast
import os

import pytest

from jaxrl.envs import EnvError, make_env, make_jax_env
from jaxrl.errors import JaxrlError

ENVS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxrl", "envs")


@pytest.mark.parametrize(
    "query, message",
    [
        ("obs_history=2.5", "obs_history=2.5: use a whole number of steps"),
        ("obs_history=true", "obs_history=True: use a whole number of steps"),
        ("decimation=true", "decimation=True: use a whole number of steps"),
        ("decimation=1.5", "decimation=1.5: use a whole number of steps"),
        ("decimation=abc", "decimation='abc': use a whole number of steps"),
        ("obs_noise=true", "obs_noise=True: use a number"),
        ("obs_noise=loud", "obs_noise='loud': use a number"),
        ("action_filter=yes", "action_filter='yes': use a number"),
        ("action_delay=1.5", "action_delay=1.5: use a step count k or a range LOW:HIGH"),
        ("obs_delay=true", "obs_delay=True: use a step count k or a range LOW:HIGH"),
        ("push_speed=fast", "push_speed='fast': use LOW:HIGH in m/s"),
        ("privileged=yes", "privileged='yes': use true or false"),
        ("privileged=1", "privileged=1: use true or false"),
        ("episode_length=2.5", "episode_length=2.5: use a whole number of steps"),
        ("episode_length=true", "episode_length=True: use a whole number of steps"),
    ],
)
def test_jax_id_options_with_bad_values_are_refused(query, message):
    env_id = f"jax:pendulum?{query}"
    with pytest.raises(EnvError, match=message) as err:
        make_jax_env(env_id, 1)
    assert repr(env_id) in str(err.value)
    assert isinstance(err.value, ValueError) and isinstance(err.value, JaxrlError)


@pytest.mark.parametrize(
    "query",
    ["decimation=0", "obs_history=0", "action_filter=2", "obs_delay=3:1", "obs_noise=-1"],
)
def test_jax_id_options_out_of_range_are_env_errors_naming_the_id(query):
    env_id = f"jax:pendulum?{query}"
    with pytest.raises(EnvError) as err:
        make_jax_env(env_id, 1)
    assert repr(env_id) in str(err.value) and query.split("=")[0] in str(err.value)


@pytest.mark.parametrize(
    "query",
    ["obs_history=2.5", "decimation=true", "obs_noise=loud", "action_delay=x", "push_speed=fast"],
)
def test_gym_and_jax_ids_share_one_value_parser(query):
    # The same option with the same bad value gets the same explanation on both kinds of id.
    with pytest.raises(EnvError) as host:
        make_env(f"Pendulum-v1?{query}")
    with pytest.raises(EnvError) as jax_:
        make_jax_env(f"jax:pendulum?{query}", 1)
    tail = str(host.value).split("': ", 1)[1]
    assert tail == str(jax_.value).split("': ", 1)[1]


def test_good_jax_options_still_build():
    env_id = "jax:pendulum?decimation=2&obs_history=3&action_delay=1:2&obs_noise=0.1"
    env = make_jax_env(env_id + "&action_filter=0.5&obs_delay=1&episode_length=50", 2)
    assert env.observation_size == 9 and env.episode_length == 25


def test_unknown_ids_and_classic_options_are_env_errors():
    from jaxrl.envs import VecEnv, make_classic

    with pytest.raises(EnvError, match="cartpole_swingup, pendulum, point_mass"):
        make_classic("acrobot")
    with pytest.raises(EnvError, match="Pendulum.m must be a number >= 0"):
        make_jax_env("jax:pendulum?m=-1", 1)
    with pytest.raises(EnvError, match="num_envs"):
        make_jax_env("jax:pendulum", 0)
    with pytest.raises(EnvError, match="num_envs"):
        VecEnv(make_classic("pendulum"), 0)


def _envs_imports(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("jaxrl.envs") or m.startswith("jaxrl.")}


def test_the_id_module_is_below_every_env_module():
    # jaxrl.envs.ids holds the parser and the option tables; the env modules import it, and it
    # imports none of them (lazy imports included), only jaxrl.errors.
    assert _envs_imports(os.path.join(ENVS, "ids.py")) <= {"jaxrl.errors"}
    users = [f for f in ("gym.py", "gym_sim2real.py", "jax_envs.py", "sim2real.py")]
    for f in users:
        assert "jaxrl.envs.ids" in _envs_imports(os.path.join(ENVS, f)), f


def test_public_names_stay_where_they_were():
    from jaxrl.envs import gym, gym_sim2real, ids, jax_envs, sim2real

    assert jax_envs.parse_env_id is ids.parse_env_id
    assert gym.split_env_id is ids.split_env_id
    assert gym_sim2real.check_options is ids.check_host_options
    assert gym_sim2real.HOST_OPTIONS is ids.HOST_OPTIONS
    assert sim2real.OPTIONS is ids.OPTIONS
    assert sim2real.steps_range is ids.steps_range
    assert jax_envs.parse_env_id("brax:ant?backend=positional&episode_length=500") == (
        "brax",
        "ant",
        {"backend": "positional", "episode_length": 500},
    )
