"""The D4RL dataset recipe in one call: train the expert, pick the medium point, write the files.

D4RL (Fu et al., 2020, sec. 5) made its locomotion datasets from one SAC training run:
*expert* rolls out the trained policy, *medium* the policy early-stopped at about a third of the
expert's performance, *medium-replay* is that run's replay buffer up to the medium point and
*medium-expert* concatenates medium and expert data; both policies act stochastically.
``d4rl_recipe`` (``jaxrl dataset recipe``) does all of it into one directory::

    OUT/expert_sac/            an ordinary `jaxrl train sac` run directory (resumable)
    OUT/<env>-<kind>.hdf5      one D4RL-format file per kind
    OUT/manifest.json          what was made, from what, with every file's sha256

Choices, stated once:

- The expert is the run's best evaluation after its first (deterministic policy,
  ``eval_episodes`` episodes; ties: the later step): its checkpoint is the expert policy, its
  return the expert return (a short run's last evaluation can fall in a collapse: Hopper-v5
  scored 3,187 at 290k, 1,244 at 300k).
- The random return is the mean return of a uniform random policy (``ref_episodes`` episodes).
- The medium point is the evaluation before the expert's whose return is nearest
  ``random + (expert - random) / 3`` (normalized score 33.3). Ties go to the earlier step.
- The expert run keeps a checkpoint (with the replay buffer) at every evaluation, so the medium
  policy and its buffer are read from the chosen point's checkpoint, never retrained.
- Every file stores the random and expert returns as its reference returns, so
  ``jaxrl dataset info`` reports normalized scores against this expert.

With ``OUT/record.json`` (an earlier recipe's manifest) the expert trains only as far as the
files need, and takes the record's returns when its evaluations match (``recipe_files``).

Rerunning the same call resumes: a finished expert run is not touched, and a file whose
recorded recipe matches is kept (files are written atomically, so an existing one is complete).
Everything is seeded: the same call gives files with the same sha256 (after a resume too, on
MuJoCo envs, whose checkpoints hold the simulator state).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from jaxrl.agents import SACConfig
from jaxrl.data import Dataset, load_dataset, reference_returns, save_d4rl
from jaxrl.errors import ConfigError, DatasetError
from jaxrl.loops.logging import write_json
from jaxrl.run.recipe_files import (
    EXPERT_DIR,
    RECORD_FILE,
    checked_record,
    eval_curve,
    file_entry,
    read_json,
    read_record,
    steps_to_follow,
)

RECIPE_KINDS = ("medium", "medium-replay", "expert", "medium-expert", "random")
"""Kinds ``d4rl_recipe`` makes (``random`` too, for completeness)."""
DEFAULT_KINDS = ("medium", "medium-replay")
MEDIUM_FRACTION = 1 / 3
"""Where the medium point lies between the random and the expert return (D4RL: a third)."""
# Rollout seeds are offsets of the recipe's seed (the expert run trains with the seed itself).
_SEEDS = {"medium": 1, "expert": 2, "random": 3, "reference": 1000}


class TrainingStopped(Exception):
    """The expert run stopped before its budget (a stop signal, or the NaN guard).

    Attributes:
        summary: the run's ``summary.json`` (``status`` says why).
    """

    def __init__(self, summary: dict[str, Any]):
        super().__init__(f"the expert run stopped ({summary.get('status', 'stopped')})")
        self.summary = summary


def d4rl_recipe(
    env_id: str,
    out: str,
    expert_steps: int,
    seed: int = 0,
    kinds: tuple[str, ...] | list[str] = DEFAULT_KINDS,
    dataset_steps: int = 1_000_000,
    eval_every: int = 10_000,
    eval_episodes: int = 10,
    ref_episodes: int = 50,
    agent_config: Any = None,
    progress: bool = True,
    strict_record: bool = False,
) -> dict[str, Any]:
    """Make D4RL-style datasets of ``env_id`` in ``out`` (see the module docstring).

    Args:
        env_id: a Gymnasium env (``Hopper-v5``).
        out: the output directory (created; rerunning with it resumes).
        expert_steps: environment steps of the expert SAC run.
        seed: seeds the expert run (``seed``) and the rollouts (``seed + 1``, ``+ 2``, ...).
        kinds: the datasets to write, of ``RECIPE_KINDS``.
        dataset_steps: transitions of each rolled-out dataset (medium, expert, random; each
            half of medium-expert). medium-replay holds the buffer up to the medium point.
        eval_every: env steps between the expert's evaluations (each keeps a checkpoint).
        eval_episodes: episodes per evaluation.
        ref_episodes: episodes of the uniform random policy measuring the random return.
        agent_config: the expert's ``SACConfig`` (default: the paper's settings).
        progress: show the training progress bar.
        strict_record: raise when the expert run leaves ``out/record.json``'s path.

    Returns:
        The manifest (also written to ``out/manifest.json``).

    Raises:
        ConfigError: a bad budget, kind or env, an expert run trained past ``expert_steps``, or
            a ``record.json`` made with other settings.
        DatasetError: ``strict_record`` and the expert run leaves the record's path.
        TrainingStopped: the expert run was stopped; the same call resumes it.
    """
    budgets = {
        "--expert-steps": expert_steps,
        "--dataset-steps": dataset_steps,
        "--eval-every": eval_every,
        "--eval-episodes": eval_episodes,
        "--ref-episodes": ref_episodes,
    }
    kinds = _check(env_id, tuple(kinds), budgets)
    run_dir = os.path.join(out, EXPERT_DIR)
    cfg = expert_config(env_id, run_dir, expert_steps, seed, eval_every, eval_episodes, progress)
    agent_config = agent_config or SACConfig()
    settings = {"env": env_id, "seed": seed, "expert_steps": expert_steps}
    settings |= {"eval_every": eval_every, "eval_episodes": eval_episodes}
    record = read_record(out, settings | {"dataset_steps": dataset_steps})
    if record is not None:  # train only as far as the files need (``recipe_files``)
        upto = max([steps_to_follow(record, kinds), *_checkpoint_steps(run_dir)[-1:]])
        _train_expert(dataclasses.replace(cfg, total_steps=upto), agent_config)
        curve, kept = eval_curve(run_dir), _checkpoint_steps(run_dir)
        record = checked_record(record, curve, strict_record)
    if record is None:
        _train_expert(cfg, agent_config)
        curve, kept = eval_curve(run_dir), _checkpoint_steps(run_dir)
        expert_step = expert_point(curve, kept, expert_steps)
        expert_return = curve[expert_step]
        random_return = _random_return(env_id, ref_episodes, seed + _SEEDS["reference"])
        target = random_return + MEDIUM_FRACTION * (expert_return - random_return)
        medium_step = medium_point(curve, target, kept, expert_step)
    else:  # the run so far is the record's: so are the points and returns it chose
        expert_step, expert_return = record["expert_step"], record["expert_return"]
        random_return, medium_step = record["random_return"], record["medium_step"]
        target = random_return + MEDIUM_FRACTION * (expert_return - random_return)
    refs = (random_return, expert_return)
    recipe = {
        "env": env_id,
        "seed": seed,
        "expert_steps": expert_steps,
        "eval_every": eval_every,
        "eval_episodes": eval_episodes,
        "expert_step": expert_step,
        "medium_step": medium_step,
        "dataset_steps": dataset_steps,
        "ref_returns": list(refs),
    }
    steps = {"medium": medium_step, "expert": expert_step}
    name = env_id.lower().replace("/", "_")
    paths = {k: os.path.join(out, f"{name}-{k}.hdf5") for k in RECIPE_KINDS}
    made: dict[str, Dataset] = {}

    def dataset(kind: str) -> Dataset:
        """The file of ``kind`` when this recipe wrote it already, else a new dataset."""
        if kind not in made:
            ds = _existing(paths[kind], kind, recipe)
            if ds is None:
                ds = _make(kind, env_id, run_dir, steps, dataset_steps, seed, refs, dataset)
                ds.metadata.update(_provenance(kind, recipe, steps, ref_episodes))
            made[kind] = ds
        return made[kind]

    files = {}
    for kind in kinds:
        ds = dataset(kind)
        if ds.source != paths[kind]:  # made now
            ds = made[kind] = load_dataset(save_d4rl(ds, paths[kind]))
        files[kind] = file_entry(ds.source, ds.info(), out)
    manifest = {
        "env": env_id,
        "seed": seed,
        "rollout_seeds": {k: seed + v for k, v in _SEEDS.items()},
        "agent": "sac",
        "expert_run": EXPERT_DIR,
        "expert_steps": expert_steps,
        "eval_every": eval_every,
        "eval_episodes": eval_episodes,
        "dataset_steps": dataset_steps,
        "expert_step": expert_step,
        "expert_return": expert_return,
        "expert_return_is": f"best evaluation return of the expert run (step {expert_step})",
        "random_return": random_return,
        "random_return_is": f"mean return of a uniform random policy, {ref_episodes} episodes",
        "medium_target_return": target,
        "medium_step": medium_step,
        "medium_return": curve[medium_step],
        "ref_min_return": random_return,
        "ref_max_return": expert_return,
        "d4rl_ref_returns": reference_returns(env_id),
        "files": files,
    }
    if record is not None:
        manifest["followed_record"] = {"file": RECORD_FILE, "expert_trained_to": max(kept)}
    write_json(os.path.join(out, "manifest.json"), manifest)
    return manifest


def _check(env_id: str, kinds: tuple, budgets: dict[str, int]) -> tuple[str, ...]:
    """``kinds`` without repeats, once the request is known to be one the recipe can make."""
    from jaxrl.envs.jax_envs import is_jax_env

    for name, value in budgets.items():
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}.")
    expert_steps, every = budgets["--expert-steps"], budgets["--eval-every"]
    if expert_steps < 2 * every:
        raise ConfigError(
            f"--expert-steps {expert_steps} leaves no evaluation before the end to be the medium "
            f"point; make it at least twice --eval-every ({every}), or lower --eval-every."
        )
    unknown = [k for k in kinds if k not in RECIPE_KINDS]
    if unknown or not kinds:
        raise ConfigError(
            f"Unknown dataset kind(s) {unknown or '(none given)'}; --kinds takes one or more of "
            f"{', '.join(RECIPE_KINDS)}."
        )
    if is_jax_env(env_id):
        raise ConfigError(
            f"The recipe trains and collects on Gymnasium envs; {env_id!r} is a JAX env. Pass "
            "the Gymnasium id (e.g. Hopper-v5, Pendulum-v1)."
        )
    return tuple(dict.fromkeys(kinds))


def expert_config(env_id: str, run_dir: str, steps: int, seed: int, eval_every: int,
                  eval_episodes: int, progress: bool = False) -> Any:  # fmt: skip
    """The expert run's ``TrainConfig``: a checkpoint at every evaluation, all of them kept."""
    from jaxrl.loops import TrainConfig

    return TrainConfig(
        env=env_id,
        total_steps=steps,
        seed=seed,
        eval_every=eval_every,
        eval_episodes=eval_episodes,
        log_every=min(1000, eval_every),
        checkpoint_every=eval_every,
        max_to_keep=steps // eval_every + 1,  # every evaluation point, and the end
        progress=progress,
        out=run_dir,
    )


def _train_expert(cfg: Any, agent_config: Any) -> None:
    """Train (or resume, or leave alone when finished) the expert SAC run in ``cfg.out``."""
    from jaxrl.loops import prepare_run_dir, run_config
    from jaxrl.run.train import train

    summary = read_json(os.path.join(cfg.out, "summary.json"))
    done = _checkpoint_steps(cfg.out)
    if done and done[-1] > cfg.total_steps:
        raise ConfigError(
            f"{cfg.out} was trained for {done[-1]} steps, more than --expert-steps "
            f"{cfg.total_steps}; pass --expert-steps {done[-1]} or use a new --out directory."
        )
    finished = summary.get("completed") and summary.get("total_steps") == cfg.total_steps
    if finished and cfg.total_steps in done:
        # Not even restored; its settings must still be the ones asked for.
        prepare_run_dir(cfg.out, run_config("sac", agent_config, cfg), check_only=True)
        return
    summary = train("sac", cfg, agent_config)
    if not summary.get("completed"):
        raise TrainingStopped(summary)


def expert_point(curve: dict[int, float], kept: list[int], expert_steps: int) -> int:
    """The best checkpointed evaluation step after the first (ties: the later step).

    The first is left out, as the medium policy comes earlier; ``expert_steps`` if none.
    """
    candidates = sorted(s for s in curve if s in set(kept) and s > 0)[1:]
    return max(candidates, key=lambda s: (curve[s], s)) if candidates else expert_steps


def medium_point(curve: dict[int, float], target: float, kept: list[int], expert_step: int) -> int:
    """The checkpointed evaluation step before ``expert_step`` with the return nearest ``target``.

    On a tie, the earlier step.

    Raises:
        DatasetError: no evaluation before the end has a checkpoint.
    """
    candidates = [s for s in curve if 0 < s < expert_step and s in set(kept)]
    if not candidates:
        raise DatasetError(
            f"The expert run has no checkpointed evaluation before step {expert_step} "
            f"(evaluations at {sorted(curve)}, checkpoints at {kept}); train it into a new "
            "--out directory so that the recipe keeps a checkpoint at every evaluation."
        )
    return min(candidates, key=lambda s: (abs(curve[s] - target), s))


def _checkpoint_steps(run_dir: str) -> list[int]:
    from jaxrl.loops.checkpoint import Checkpointer

    path = os.path.join(run_dir, "checkpoints")
    return Checkpointer(path).all_steps() if os.path.isdir(path) else []


def _random_return(env_id: str, episodes: int, seed: int) -> float:
    from jaxrl.run.collect import policy_return

    return policy_return(env_id, None, episodes, seed)


def _make(
    kind: str,
    env_id: str,
    run_dir: str,
    steps: dict[str, int],
    dataset_steps: int,
    seed: int,
    refs: tuple[float, float],
    dataset: Any,
) -> Dataset:
    """A new dataset of ``kind``; ``dataset(kind)`` gives the medium and expert parts."""
    from jaxrl.run.collect import collect

    if kind == "medium-expert":  # D4RL: the medium and the expert data, end to end
        medium, expert = dataset("medium"), dataset("expert")
        ds = Dataset.concatenate([medium, expert], metadata=dict(expert.metadata))
        ds.metadata.update(
            kind=kind,
            medium_policy=EXPERT_DIR,
            medium_policy_step=steps["medium"],
            transitions=len(ds),
            behavior_return_mean=float(ds.episode_returns().mean()),
        )
        return ds
    medium, expert = steps["medium"], steps["expert"]
    return collect(
        env_id,
        kind,
        medium if kind == "medium-replay" else dataset_steps,  # the whole buffer
        seed=seed + _SEEDS.get(kind, _SEEDS["medium"]),
        policy=None if kind == "random" else run_dir,
        policy_step={"medium": medium, "medium-replay": medium, "expert": expert}.get(kind),
        ref_min_return=refs[0],
        ref_max_return=refs[1],
    )


def _provenance(kind: str, recipe: dict, steps: dict[str, int], ref_episodes: int) -> dict:
    """A file's ``metadata/`` on the recipe (relative paths: the same bytes anywhere)."""
    return {
        "collected_by": "jaxrl dataset recipe",
        "recipe": json.dumps({**recipe, "kind": kind}, sort_keys=True),
        "policy": "" if kind == "random" else EXPERT_DIR,
        "expert_policy": EXPERT_DIR,
        "expert_step": steps["expert"],
        "medium_step": steps["medium"],
        "ref_min_source": f"uniform random policy, {ref_episodes} episodes",
        "ref_max_source": f"best evaluation return of {EXPERT_DIR}",
    }


def _existing(path: str, kind: str, recipe: dict) -> Dataset | None:
    """The file at ``path`` when a run of the same recipe wrote it, else None (remake it)."""
    if not os.path.exists(path):
        return None
    try:
        ds = load_dataset(path)
    except DatasetError:
        return None
    same = ds.metadata.get("recipe") == json.dumps({**recipe, "kind": kind}, sort_keys=True)
    return ds if same else None


__all__ = [
    "DEFAULT_KINDS",
    "EXPERT_DIR",
    "RECIPE_KINDS",
    "TrainingStopped",
    "d4rl_recipe",
    "eval_curve",
    "expert_config",
    "medium_point",
]
