"""Offline agents: BC, TD3+BC / ReBRAC, CQL / Cal-QL, IQL, IDQL, Diffusion-QL, FQL, PRDC, A2PR.

``jaxrl.registry`` names each agent with its config. TD3+BC and ReBRAC are one agent (``TD3BC``)
with two configs: ReBRAC is TD3+BC with LayerNorm and a critic penalty. IDQL, Diffusion-QL and
FQL use the diffusion and flow models of ``jaxrl.generative``. PRDC is TD3+BC whose BC target is
the nearest dataset row (it keeps the dataset's rows, ``DatasetRows``); A2PR is TD3+BC with an
advantage-guided target from a VAE. Cal-QL is CQL with a calibrated penalty (``CalQLConfig``);
FamO2O is IQL with a temperature chosen per state, for offline-to-online training. Datasets live
in ``jaxrl.data``; running these agents (offline, offline-to-online, fine-tuning) is
``jaxrl.run``'s job.

May import: the core modules at ``jaxrl``'s root and the pieces online agents share through
``jaxrl.agents`` (the SAC actor and TD3 target policy); never the registry, loops or run layer.
"""

from jaxrl.offline.a2pr import A2PR, A2PRConfig
from jaxrl.offline.bc import BC, BCConfig
from jaxrl.offline.common import DataNorm, DatasetRows
from jaxrl.offline.cql import CQL, CalQLConfig, CQLConfig
from jaxrl.offline.diffusion_ql import DiffusionQL, DiffusionQLConfig
from jaxrl.offline.famo2o import FamO2O, FamO2OConfig
from jaxrl.offline.fql import FQL, FQLConfig
from jaxrl.offline.idql import IDQL, IDQLConfig
from jaxrl.offline.iql import IQL, IQLConfig
from jaxrl.offline.prdc import PRDC, PRDCConfig
from jaxrl.offline.td3_bc import TD3BC, ReBRAC, ReBRACConfig, TD3BCConfig

__all__ = [
    "A2PR",
    "A2PRConfig",
    "BC",
    "BCConfig",
    "CQL",
    "CQLConfig",
    "CalQLConfig",
    "DataNorm",
    "DatasetRows",
    "DiffusionQL",
    "DiffusionQLConfig",
    "FamO2O",
    "FamO2OConfig",
    "FQL",
    "FQLConfig",
    "IDQL",
    "IDQLConfig",
    "IQL",
    "IQLConfig",
    "PRDC",
    "PRDCConfig",
    "ReBRAC",
    "ReBRACConfig",
    "TD3BC",
    "TD3BCConfig",
]
