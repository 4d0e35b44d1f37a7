"""Environments: host (Gymnasium) vector envs."""

from jaxrl.envs.gym import EnvError, HostEnv, make_env

__all__ = ["EnvError", "HostEnv", "make_env"]
