"""The run layer: what ``jaxrl train`` calls.

It sets up envs, dataset and agent, picks the loop from the agent's registry entry and trains
the run's members (seeds x settings) as one program where it can.

- ``train``: ``train(agent, train_cfg, agent_cfg)``, the entry point of every training run
  (``train_job(TrainJob(...))`` in a worker process).
- ``runs``: read and load run directories; make JAX envs; carry an agent over to online training.
- ``offline``: load and check a dataset and make the offline agent.
- ``finetune``: offline-to-online, online with a dataset, fine-tuning a saved run.
- ``members`` / ``fields`` / ``programs``: members of seeds x settings, which config fields a
  vmapped program can vary, and the vmapped programs themselves.
- ``collect``: datasets rolled out from trained runs.
- ``devices``: joining several processes (hosts) with ``jax.distributed``.
- ``recipe``: D4RL's datasets in one call: train the SAC expert, pick the medium point, write
  the files and a manifest (``jaxrl dataset recipe``); ``recipe_files``: the manifest's file
  entries and the record a remade recipe follows.
- ``commands``: evaluating a saved run.

May import: ``jaxrl.loops``, ``jaxrl.registry`` and everything below; never ``tune``, ``export``,
``analysis`` or ``cli``.
"""

from jaxrl.run.runs import LoadedRun, load_run, read_config
from jaxrl.run.train import TrainJob, train, train_job

__all__ = ["LoadedRun", "TrainJob", "load_run", "read_config", "train", "train_job"]
