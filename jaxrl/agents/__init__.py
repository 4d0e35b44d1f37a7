"""Online agents. ``AGENTS`` maps command-line names to (agent class, config class)."""

from jaxrl.agents.ppo import PPO, PPOConfig
from jaxrl.agents.sac import SAC, SACConfig
from jaxrl.agents.td3 import TD3, TD3Config

AGENTS = {
    "sac": (SAC, SACConfig),
    "td3": (TD3, TD3Config),
    "ppo": (PPO, PPOConfig),
}

__all__ = ["AGENTS", "PPO", "PPOConfig", "SAC", "SACConfig", "TD3", "TD3Config"]
