"""Environments: host (Gymnasium) vector envs and JAX envs (Brax / MJX, small pure-JAX envs)."""

from jaxrl.envs.classic import CLASSIC_ENVS, CartPoleSwingUp, Pendulum, PointMass, make_classic
from jaxrl.envs.gym import EnvError, HostEnv, episode_length, make_env
from jaxrl.envs.jax_envs import BRAX_ENVS, BraxCore, EnvState, VecEnv, is_jax_env, make_jax_env
from jaxrl.envs.wrappers import (
    NormalizeObservation,
    RecordEpisodeStatistics,
    RescaleAction,
    RunningStats,
    running_stats_init,
    running_stats_update,
)

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
    "episode_length",
    "is_jax_env",
    "make_classic",
    "make_env",
    "make_jax_env",
    "running_stats_init",
    "running_stats_update",
]
