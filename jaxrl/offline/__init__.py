"""Offline RL: datasets (D4RL HDF5, Minari, local collection) and offline agents.

``OFFLINE_AGENTS`` maps command-line names to (agent class, config class). TD3+BC and ReBRAC are
one agent (``TD3BC``) with two configs: ReBRAC is TD3+BC with LayerNorm and a critic penalty.
IDQL, Diffusion-QL and FQL use the diffusion and flow models of ``jaxrl.generative``. Cal-QL is
CQL with a calibrated penalty (``CalQLConfig``). ``finetune`` continues any of them online.
"""

from jaxrl.offline.bc import BC, BCConfig
from jaxrl.offline.collect import KINDS, collect
from jaxrl.offline.common import DataNorm
from jaxrl.offline.cql import CQL, CalQLConfig, CQLConfig
from jaxrl.offline.datasets import (
    D4RL_REF_RETURNS,
    Dataset,
    DatasetError,
    load_d4rl,
    load_dataset,
    load_minari,
    normalized_score,
    reference_returns,
    save_d4rl,
)
from jaxrl.offline.diffusion_ql import DiffusionQL, DiffusionQLConfig
from jaxrl.offline.fql import FQL, FQLConfig
from jaxrl.offline.idql import IDQL, IDQLConfig
from jaxrl.offline.iql import IQL, IQLConfig
from jaxrl.offline.td3_bc import TD3BC, ReBRAC, ReBRACConfig, TD3BCConfig

OFFLINE_AGENTS = {
    "bc": (BC, BCConfig),
    "td3-bc": (TD3BC, TD3BCConfig),
    "cql": (CQL, CQLConfig),
    "cal-ql": (CQL, CalQLConfig),
    "iql": (IQL, IQLConfig),
    "rebrac": (ReBRAC, ReBRACConfig),
    "idql": (IDQL, IDQLConfig),
    "diffusion-ql": (DiffusionQL, DiffusionQLConfig),
    "fql": (FQL, FQLConfig),
}

__all__ = [
    "BC",
    "BCConfig",
    "CQL",
    "CQLConfig",
    "CalQLConfig",
    "D4RL_REF_RETURNS",
    "DataNorm",
    "DiffusionQL",
    "DiffusionQLConfig",
    "FQL",
    "FQLConfig",
    "IDQL",
    "IDQLConfig",
    "Dataset",
    "DatasetError",
    "IQL",
    "IQLConfig",
    "KINDS",
    "OFFLINE_AGENTS",
    "ReBRAC",
    "ReBRACConfig",
    "TD3BC",
    "TD3BCConfig",
    "collect",
    "load_d4rl",
    "load_dataset",
    "load_minari",
    "normalized_score",
    "reference_returns",
    "save_d4rl",
]
