"""Online agents: SAC (RLPD), TD3, PPO, CrossQ, EXPO, ReinFlow; planners: TD-MPC2, PETS.

RLPD and sac-fast are SAC with RLPD's configuration and a sample-efficient one; ReinFlow is
a flow policy cloned from a dataset, then fine-tuned by PPO.

One file per agent (``tdmpc2_model`` holds TD-MPC2's world model, ``pets_model`` PETS's
ensemble). EXPO keeps SAC's critic and update schedule and puts a
diffusion base policy and an edit policy in place of SAC's actor. ``jaxrl.registry`` names every
agent, online and offline, with its config and kind.

May import: the core modules at ``jaxrl``'s root only (networks, distributions, rl, planners,
buffers, normalization, config, types, errors); never envs, datasets, offline agents, the
registry, the loops or anything above them (the import-linter contracts in ``pyproject.toml``).
"""

from jaxrl.agents.crossq import CrossQ, CrossQConfig
from jaxrl.agents.expo import EXPO, EXPOConfig
from jaxrl.agents.h2o import H2O, H2OConfig
from jaxrl.agents.pets import PETS, PETSConfig
from jaxrl.agents.ppo import PPO, PPOConfig
from jaxrl.agents.reinflow import ReinFlow, ReinFlowConfig
from jaxrl.agents.sac import SAC, RLPDConfig, SACConfig, SACFastConfig
from jaxrl.agents.td3 import TD3, TD3Config
from jaxrl.agents.tdmpc2 import TDMPC2, TDMPC2Config

__all__ = [
    "CrossQ",
    "CrossQConfig",
    "EXPO",
    "EXPOConfig",
    "H2O",
    "H2OConfig",
    "PETS",
    "PETSConfig",
    "PPO",
    "PPOConfig",
    "RLPDConfig",
    "ReinFlow",
    "ReinFlowConfig",
    "SAC",
    "SACConfig",
    "SACFastConfig",
    "TD3",
    "TD3Config",
    "TDMPC2",
    "TDMPC2Config",
]
