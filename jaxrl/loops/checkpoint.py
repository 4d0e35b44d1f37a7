"""Atomic checkpoints of the full training state with orbax (no pickle).

Each checkpoint is a directory ``checkpoints/<step>/`` holding the array pytree and a JSON record
(step, host RNG and simulator state, episode statistics). Orbax writes into a temporary directory
and renames it only when complete, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl.errors import CheckpointError

logging.getLogger("absl").setLevel(logging.ERROR)


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_savable(tree: Any) -> Any:
    # Typed PRNG keys are stored as their raw uint32 key data. Zero-size arrays (e.g. MJX's
    # activation state of models without activations) hold no data and orbax refuses them, so
    # they are left out (None) and taken from the template on restore.
    def savable(x: Any) -> Any:
        if _is_key(x):
            return jax.random.key_data(x)
        return None if np.size(x) == 0 and hasattr(x, "shape") else x

    return jax.tree.map(savable, tree)


def _from_savable(restored: Any, template: Any) -> Any:
    leaves, treedef = jax.tree.flatten(template)
    saved = iter(jax.tree.leaves(restored))
    out = []
    for t in leaves:
        if _is_key(t):
            out.append(jax.random.wrap_key_data(next(saved), impl=jax.random.key_impl(t)))
        elif np.size(t) == 0 and hasattr(t, "shape"):
            out.append(t)
        else:
            out.append(next(saved))
    if next(saved, None) is not None:
        raise ValueError("the checkpoint holds more arrays than the template")
    return jax.tree.unflatten(treedef, out)


class Checkpointer:
    """Save and restore ``(state pytree, JSON metadata)`` pairs under ``directory``.

    Args:
        directory: where step directories are written (created if missing).
        max_to_keep: how many of the newest checkpoints to keep.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
        self.directory = os.path.abspath(os.fspath(directory))
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """Step of the newest complete checkpoint, or None."""
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def meta(self, step: int | None = None) -> dict[str, Any]:
        """The JSON record of the checkpoint at ``step`` (default: newest), without its arrays.

        Raises:
            CheckpointError: when there is no checkpoint or its record is unreadable.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"No checkpoint in {self.directory}.")
        try:
            args = ocp.args.Composite(meta=ocp.args.JsonRestore())
            return self._manager.restore(step, args=args).meta
        except Exception as err:  # orbax raises many types for damaged files
            raise self._corrupt(step, os.path.join(self.directory, str(step)), err) from err

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Write a checkpoint for ``step`` (overwrites nothing until the write is complete)."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_to_savable(state)), meta=ocp.args.JsonSave(meta)
        )
        try:  # before anything is written: orbax would fail mid-save, in a background thread
            json.dumps(meta)
        except (TypeError, ValueError) as err:
            raise CheckpointError(
                f"Could not write the checkpoint of step {step}: its metadata is not JSON ({err}). "
                f"Nothing was written; the newest complete checkpoint: step {self.latest_step()}."
            ) from err
        # orbax logs a failed write's traceback through absl before raising; the error below
        # says what happened instead.
        absl = logging.getLogger("absl")
        level = absl.level
        absl.setLevel(logging.CRITICAL)
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
        except Exception as err:  # a full disk surfaces as OSError or tensorstore's ValueError
            with contextlib.suppress(Exception):  # writes still in flight end before the cleanup
                self._manager.wait_until_finished()
            self._drop_partial(step)
            latest = self.latest_step()
            kept = f"step {latest}, intact" if latest is not None else "none yet"
            text = str(err).strip()
            reason = text.splitlines()[0][:200] if text else type(err).__name__
            if "No space left on device" in text:
                reason = "no space left on the device"
            raise CheckpointError(
                f"Could not write the checkpoint of step {step} to {self.directory} ({reason}). "
                f"The newest complete checkpoint: {kept}. Free disk space (or fix the "
                "directory) and rerun the same command to resume from it."
            ) from err
        finally:
            absl.setLevel(level)

    def _drop_partial(self, step: int, patience_s: float = 30.0) -> None:
        """Remove what a failed write of ``step`` left (orbax's temporary directories).

        A writer thread of orbax may still be creating files in them after the save has failed
        (seen on a loaded machine), which makes a single removal fail with "directory not
        empty"; so the removal is retried until the directories are gone or ``patience_s`` ends.
        """
        import shutil
        import time

        deadline = time.monotonic() + patience_s
        while os.path.isdir(self.directory):
            names = os.listdir(self.directory)
            left = [n for n in names if n.startswith(f"{step}.") and "tmp" in n]
            if not left or time.monotonic() > deadline:
                return
            for name in left:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            time.sleep(0.05)

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore the checkpoint at ``step`` (default: newest) into the structure of ``template``.

        Raises:
            CheckpointError: when there is no checkpoint, or it is corrupt or does not match the
                template (e.g. a different agent configuration).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"No checkpoint in {self.directory}.")
        path = os.path.join(self.directory, str(step))
        savable = _to_savable(template)
        try:
            saved = ocp.StandardCheckpointer().metadata(os.path.join(path, "state"))
            saved = getattr(saved, "item_metadata", saved)
            saved = getattr(saved, "tree", saved)
            saved_shapes = sorted(_shape(x) for x in jax.tree.leaves(saved))
            if not saved_shapes:
                raise ValueError("no arrays listed in the checkpoint's metadata")
        except Exception as err:  # unreadable metadata: the checkpoint is damaged
            raise self._corrupt(step, path, err) from err
        expected = sorted(_shape(x) for x in jax.tree.leaves(savable))
        if saved_shapes != expected:
            only_saved = [x for x in saved_shapes if x not in expected][:3]
            only_expected = [x for x in expected if x not in saved_shapes][:3]
            raise CheckpointError(
                f"Checkpoint {path} was written by a run with a different configuration: it holds "
                f"{len(saved_shapes)} arrays, this run expects {len(expected)}; saved "
                f"shapes {_fmt(only_saved)} vs expected {_fmt(only_expected)}. Resume "
                "with the same options as that run (see config.json beside it), or train into a "
                "new --out directory."
            )
        only_saved, only_expected = _paths(saved) - _paths(savable), _paths(savable) - _paths(saved)
        if only_saved or only_expected:  # intact, but laid out by other code
            extra, missing = _names(only_saved), _names(only_expected)
            raise self._other_layout(path, f"only in the checkpoint: {extra}; missing: {missing}")
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(savable), meta=ocp.args.JsonRestore()
                ),
            )
            state = _from_savable(restored.state, template)
            _check_same_structure(state, template)
        except Exception as err:  # orbax raises many types for damaged files
            message = str(err)
            if "tree structures do not match" in message:  # e.g. a field added since (None)
                fields = [ln.strip()[:-1] for ln in message.splitlines()[1:] if ln.endswith(":")]
                raise self._other_layout(path, f"fields {_names(set(fields))}") from err
            raise self._corrupt(step, path, err) from err
        return state, restored.meta

    def _other_layout(self, path: str, detail: str) -> CheckpointError:
        return CheckpointError(
            f"Checkpoint {path} is intact but holds a training state laid out differently from "
            f"what this jaxrl expects ({detail}): it was written by another version of jaxrl "
            "(config.json beside it names the version) or for another agent. Restore it with "
            "the version that wrote it, or train into a new --out directory."
        )

    def _corrupt(self, step: int, path: str, err: Exception) -> CheckpointError:
        older = [s for s in self.all_steps() if s < step]
        fallback = (
            f"delete {path} to resume from the previous checkpoint (step {older[-1]})"
            if older
            else f"delete {self.directory} to start over"
        )
        detail = str(err).splitlines()[0] if str(err) else ""
        return CheckpointError(
            f"Checkpoint {path} is corrupt ({type(err).__name__}: {detail}). To recover, "
            f"{fallback}, or train into a new --out directory."
        )


def _paths(tree: Any) -> set[str]:
    """The array leaves' paths as ``a/b/c``, the same for a saved metadata tree and a state."""

    def name(key: Any) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(name(k) for k in path) for path, _ in flat}


def _names(names: set[str]) -> str:
    shown = ", ".join(sorted(names)[:3]) or "-"
    return shown + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")


def _fmt(items: list[tuple[int, ...]]) -> str:
    return ", ".join(str(shape) for shape in items) or "-"


def _shape(x: Any) -> tuple[int, ...]:
    # Shapes only: a fresh template may hold Python scalars where the saved state has arrays.
    return tuple(int(d) for d in np.shape(x))


def _check_same_structure(state: Any, template: Any) -> None:
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(template), strict=True):
        if np.shape(a) != np.shape(b):
            raise ValueError(f"array shape {np.shape(a)} differs from expected {np.shape(b)}")
