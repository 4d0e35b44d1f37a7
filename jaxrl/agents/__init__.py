"""Online agents. ``AGENTS`` maps command-line names to (agent class, config class)."""

from jaxrl.agents.ppo import PPO, PPOConfig
from jaxrl.agents.sac import SAC, RLPDConfig, SACConfig
from jaxrl.agents.td3 import TD3, TD3Config

AGENTS = {
    "sac": (SAC, SACConfig),
    "td3": (TD3, TD3Config),
    "ppo": (PPO, PPOConfig),
    "rlpd": (SAC, RLPDConfig),
}

__all__ = ["AGENTS", "PPO", "PPOConfig", "RLPDConfig", "SAC", "SACConfig", "TD3", "TD3Config"]
