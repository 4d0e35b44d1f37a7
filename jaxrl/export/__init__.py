"""Policy export: a run's deterministic policy as ONNX, a numpy program or serialized JAX.

- ``policy``: trace the policy with its normalizer and action scaling folded in, and write it.
- ``contract``: the ``FILE.contract.json`` beside each artifact, and ``load_policy`` to check it.
- ``onnx_graph``: jaxpr -> a small program -> an ONNX graph (no converter package).
- ``runtime_numpy``: the dependency-free numpy runtime of the exported program.

May import: ``jaxrl.run`` (to load a run) and everything below it. ``onnx`` and ``onnxruntime``
(the export extra) load only when an ONNX file is written or run.
"""

from jaxrl.export.contract import LoadedPolicy, PolicySource, load_policy
from jaxrl.export.policy import export_policy, export_run, policy_function, source_from_run

__all__ = [
    "LoadedPolicy",
    "PolicySource",
    "export_policy",
    "export_run",
    "load_policy",
    "policy_function",
    "source_from_run",
]
