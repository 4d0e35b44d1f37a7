"""Offline agents: BC, TD3+BC / ReBRAC, CQL / Cal-QL, IQL, IDQL, Diffusion-QL and FQL.

``jaxrl.registry`` names each agent with its config. TD3+BC and ReBRAC are one agent (``TD3BC``)
with two configs: ReBRAC is TD3+BC with LayerNorm and a critic penalty. IDQL, Diffusion-QL and
FQL use the diffusion and flow models of ``jaxrl.generative``. Cal-QL is CQL with a calibrated
penalty (``CalQLConfig``). Datasets live in ``jaxrl.data``; running these agents (offline,
offline-to-online, fine-tuning) is ``jaxrl.run``'s job.

May import: the core modules at ``jaxrl``'s root and the pieces online agents share through
``jaxrl.agents`` (the SAC actor and TD3 target policy); never the registry, loops or run layer.
"""

from jaxrl.offline.bc import BC, BCConfig
from jaxrl.offline.common import DataNorm
from jaxrl.offline.cql import CQL, CalQLConfig, CQLConfig
from jaxrl.offline.diffusion_ql import DiffusionQL, DiffusionQLConfig
from jaxrl.offline.fql import FQL, FQLConfig
from jaxrl.offline.idql import IDQL, IDQLConfig
from jaxrl.offline.iql import IQL, IQLConfig
from jaxrl.offline.td3_bc import TD3BC, ReBRAC, ReBRACConfig, TD3BCConfig

__all__ = [
    "BC",
    "BCConfig",
    "CQL",
    "CQLConfig",
    "CalQLConfig",
    "DataNorm",
    "DiffusionQL",
    "DiffusionQLConfig",
    "FQL",
    "FQLConfig",
    "IDQL",
    "IDQLConfig",
    "IQL",
    "IQLConfig",
    "ReBRAC",
    "ReBRACConfig",
    "TD3BC",
    "TD3BCConfig",
]
