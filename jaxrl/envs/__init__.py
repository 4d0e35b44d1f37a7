"""Environments: host (Gymnasium) vector envs and JAX envs (Brax / MJX, small pure-JAX envs).

What it holds: env ids and their options (``ids``: the parser and the option tables, the lowest
module, which imports no other one here), Gymnasium envs (``gym``) and their sim-to-real
wrappers (``gym_sim2real``), JAX envs (``jax_envs``: ``VecEnv`` and ``make_jax_env``; cores in
``classic`` and ``brax_core``), their state (``state``) and wrappers (``wrappers``, ``sim2real``,
``pushes``, ``privileged``), domain randomization (``randomization``), and rendering to frames
(``render``: MuJoCo scenes and the OpenGL backend; ``draw``: the classic envs in numpy).

What it may import: the core modules at the root of ``jaxrl`` (``errors``, ``normalization``,
...) and third-party simulators; not agents, datasets, loops or commands (the import-linter
contracts in ``pyproject.toml``). Inside, no module imports one that imports it back, lazily
included (``tests/test_layers.py``).
"""

from jaxrl.envs.classic import CLASSIC_ENVS, CartPoleSwingUp, Pendulum, PointMass, make_classic
from jaxrl.envs.gym import HostEnv, can_terminate, episode_length, make_env
from jaxrl.envs.jax_envs import BRAX_ENVS, BraxCore, EnvState, VecEnv, is_jax_env, make_jax_env
from jaxrl.envs.wrappers import (
    NormalizeObservation,
    RecordEpisodeStatistics,
    RescaleAction,
    RunningStats,
    running_stats_init,
    running_stats_update,
)
from jaxrl.errors import EnvError

__all__ = [
    "BRAX_ENVS",
    "CLASSIC_ENVS",
    "BraxCore",
    "CartPoleSwingUp",
    "EnvError",
    "EnvState",
    "HostEnv",
    "NormalizeObservation",
    "Pendulum",
    "PointMass",
    "RecordEpisodeStatistics",
    "RescaleAction",
    "RunningStats",
    "VecEnv",
    "can_terminate",
    "episode_length",
    "is_jax_env",
    "make_classic",
    "make_env",
    "make_jax_env",
    "running_stats_init",
    "running_stats_update",
]
