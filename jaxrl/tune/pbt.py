"""PBT's exploit step for Ray Tune sweeps (``jaxrl.tune.ray_search``).

Packs a trial's checkpoint, and starts a run from another run's training state with new
settings (``transplant``, ``with_settings``); ``check_pbt_search`` refuses the fields PBT
cannot mutate.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import closing
from typing import Any

from jaxrl.errors import ConfigError
from jaxrl.tune.space import SETTINGS_KEYS, apply_settings


def pack_run(run_dir: str, dest: str) -> None:
    """Copy ``run_dir``'s newest checkpoint, ``config.json`` and ``metrics.csv`` to ``dest``."""
    from jaxrl.loops.checkpoint import Checkpointer

    step = Checkpointer(os.path.join(run_dir, "checkpoints")).latest_step()
    for name in ("config.json", "metrics.csv"):
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.copy2(os.path.join(run_dir, name), os.path.join(dest, name))
    src = os.path.join(run_dir, "checkpoints", str(step))
    shutil.copytree(src, os.path.join(dest, "checkpoints", str(step)))
    with open(os.path.join(dest, "origin.json"), "w") as f:
        json.dump({"run_dir": run_dir, "step": step}, f)


def restore_packed(
    packed: str, trial_out: str, agent_name: str, agent_cfg: Any, budget: int
) -> tuple[str, dict[str, Any] | None]:
    """Where a restored trial continues (``pack_run`` wrote ``packed``); a final report or None.

    A trial restarted from its own checkpoint with its own settings continues in that run
    directory (which resumes from its checkpoints). One restarted from another trial's
    checkpoint, or with other settings (PBT's exploit), gets ``<trial_out>-s<step>`` seeded with
    the donor's state and the new settings (``transplant``), unless the donor had already
    finished its run: then nothing is left to train with the new settings, and the trial's
    final report is the donor's (its run directory and evaluation), so that the sweep's best
    run and settings are always ones that were trained.
    """
    from jaxrl.config import config_to_dict
    from jaxrl.loops.checkpoint import Checkpointer

    with open(os.path.join(packed, "origin.json")) as f:
        origin = json.load(f)
    with open(os.path.join(packed, "config.json")) as f:
        donor_settings = json.load(f)["agent_config"]
    src, step = origin["run_dir"], origin["step"]
    own = src == trial_out or src.startswith(f"{trial_out}-s")  # its own lineage
    if own and donor_settings == json.loads(json.dumps(config_to_dict(agent_cfg))):
        return src, None
    if step >= budget:
        last = Checkpointer(os.path.join(packed, "checkpoints")).meta(step)["last_eval"][0]
        return src, {"eval_return": last, "step": step, "nonfinite": 0, "run_dir": src}
    # Async PBT may restart a trial twice from checkpoints of the same step: a new directory each.
    out, k = f"{trial_out}-s{step}", 1
    while os.path.exists(out):
        k += 1
        out = f"{trial_out}-s{step}.{k}"
    transplant(packed, out, agent_name, agent_cfg, donor=src)
    return out, None


def _settings_path(path: tuple) -> bool:
    import jax

    return any(isinstance(k, jax.tree_util.GetAttrKey) and k.name in SETTINGS_KEYS for k in path)


def with_settings(trained: Any, fresh: Any) -> Any:
    """``trained`` (an agent) with the settings of ``fresh`` (the same agent, another config).

    The leaves under ``hparams`` and the injected optimizer ``hyperparams`` (learning rates and
    the other optimizer settings) come from ``fresh``, every other leaf (parameters, optimizer
    moments and counts, target networks, RNG, ...) from ``trained``; the static config is
    ``fresh``'s.

    Raises:
        ValueError: the two agents differ in structure or in a leaf's shape.
    """
    import jax
    import numpy as np

    flat_t, treedef_t = jax.tree_util.tree_flatten_with_path(trained)
    flat_f, treedef_f = jax.tree_util.tree_flatten_with_path(fresh)
    if [p for p, _ in flat_t] != [p for p, _ in flat_f]:
        raise ValueError("The agents differ in structure; settings cannot be carried over.")
    leaves = []
    for (path, t), (_, f) in zip(flat_t, flat_f, strict=True):
        if np.shape(t) != np.shape(f):
            raise ValueError(
                f"{jax.tree_util.keystr(path)} has shape {np.shape(t)} in the trained agent and "
                f"{np.shape(f)} in the new one."
            )
        leaves.append(f if _settings_path(path) else t)
    return jax.tree_util.tree_unflatten(treedef_f, leaves)


def _examples(env_id: str) -> tuple[Any, Any]:
    """An observation and an action example of ``env_id`` (what ``create`` takes)."""
    import jax.numpy as jnp

    from jaxrl.envs.jax_envs import is_jax_env, make_jax_env

    if is_jax_env(env_id):
        env = make_jax_env(env_id, 1)
        return jnp.zeros(env.observation_size, jnp.float32), jnp.zeros(env.action_size, jnp.float32)
    from jaxrl.envs import make_env

    with closing(make_env(env_id, 1)) as env:
        return env.obs_example, env.action_example


def transplant(
    src: str, out: str, agent_name: str, agent_cfg: Any, donor: str | None = None
) -> None:
    """Start run directory ``out`` from the newest checkpoint of run ``src`` with ``agent_cfg``.

    The checkpoint written to ``out/checkpoints`` is ``src``'s full training state (same step)
    with the agent's settings taken from ``agent_cfg`` (``with_settings``); ``config.json`` is
    ``src``'s with ``agent_config`` (and ``out``) replaced, and ``src``'s ``metrics.csv`` is
    copied. ``train`` with ``--out out`` and ``agent_cfg`` then resumes there. This is PBT's
    exploit step.

    Args:
        src: a run directory (or a packed copy: ``config.json`` and ``checkpoints/``).
        out: the new run directory (must not hold a checkpoint).
        agent_name: the agent of both runs.
        agent_cfg: the new settings (static fields must equal ``src``'s where they shape the
            state).
        donor: the run directory recorded as the origin (default ``src``).

    Raises:
        ValueError: ``out`` already holds a checkpoint, or the settings change the state's
            structure.
    """
    from jaxrl import registry
    from jaxrl.config import config_to_dict
    from jaxrl.loops.checkpoint import Checkpointer
    from jaxrl.loops.config import prepare_run_dir
    from jaxrl.run.runs import load_run

    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    if ckpt.latest_step() is not None:
        raise ConfigError(f"{out} already holds a checkpoint; transplant into a new directory.")
    spec = registry.get(agent_name)
    run = load_run(src)
    env_id = run.config["env"]
    agent_cfg = spec.for_env(agent_cfg, env_id)  # as ``train`` resolves it
    fresh = spec.agent.create(agent_cfg, *_examples(env_id), run.config["seed"])
    state = run.state.replace(agent=with_settings(run.agent, fresh))
    step = Checkpointer(os.path.join(src, "checkpoints")).latest_step()
    config = {**run.config, "agent_config": config_to_dict(agent_cfg)}
    prepare_run_dir(out, {**config, "train": {**run.config["train"], "out": out}})
    meta = {**run.meta, "pbt_donor": {"run_dir": donor or src, "step": step}}
    ckpt.save(step, state, meta)
    if os.path.exists(os.path.join(src, "metrics.csv")):
        shutil.copy2(os.path.join(src, "metrics.csv"), os.path.join(out, "metrics.csv"))


def _host(x: Any) -> Any:
    """``x`` as a NumPy array (typed PRNG keys as their key data)."""
    import jax
    import numpy as np

    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def check_pbt_search(agent_name: str, train_cfg: Any, agent_cfg: Any, search: dict) -> None:
    """Refuse searched fields PBT cannot mutate in a running trial (see ``ray_sweep``).

    A field qualifies when agents created with its different values (same seed) differ only
    in settings leaves (``with_settings``) and in the static config.

    Raises:
        ValueError: a run with ``--dataset``, ``buffer_size`` in the search, or a field whose
            values change the agent's arrays or learned values.
    """
    import jax
    import numpy as np

    from jaxrl import registry
    from jaxrl.envs.jax_envs import is_jax_env

    if train_cfg.dataset:
        raise ConfigError(
            "PBT restarts online runs only; with --dataset use --scheduler asha or fifo."
        )
    if "buffer_size" in search:
        raise ConfigError(
            "PBT cannot mutate buffer_size (it shapes the replay buffer a restarted trial "
            "inherits); search it with --scheduler asha or fifo."
        )
    spec = registry.get(agent_name)
    env_id = train_cfg.env
    obs, act = _examples(env_id) if is_jax_env(env_id) or env_id else (None, None)
    for name, p in search.items():
        values = list(p.choices) if p.kind == "choice" else [p.low, p.high]
        agents = [
            spec.agent.create(apply_settings(agent_cfg, {name: v}), obs, act, 0) for v in values
        ]
        ref = jax.tree_util.tree_flatten_with_path(agents[0])
        for other in agents[1:]:
            flat = jax.tree_util.tree_flatten_with_path(other)
            same = [p for p, _ in flat[0]] == [p for p, _ in ref[0]] and all(
                _settings_path(path)
                or (np.shape(a) == np.shape(b) and np.array_equal(_host(a), _host(b)))
                for (path, a), (_, b) in zip(flat[0], ref[0], strict=True)
            )
            if not same:
                raise ConfigError(
                    f"PBT cannot mutate {name}: its values change the agent's arrays or initial "
                    "learned values, which a restarted trial inherits from its donor. Search it "
                    "with --scheduler asha or fifo, or fix it for the PBT sweep."
                )


__all__ = [
    "check_pbt_search",
    "pack_run",
    "restore_packed",
    "transplant",
    "with_settings",
]
