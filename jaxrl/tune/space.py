"""What both sweep backends share (``jaxrl.tune``): search specs and trial plumbing.

``parse_search`` reads ``FIELD=DIST:ARGS`` specs into ``Param``s, ``apply_settings`` sets
sampled values on an agent config, ``Sweep`` carries what every trial of a sweep shares, and
the helpers check a sweep, find a run's last evaluation step, classify a diverged evaluation
and write ``best_config.json``. ``jaxrl.tune.optuna_search`` and ``jaxrl.tune.ray_search``
build on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from jaxrl.config import check_new_field
from jaxrl.errors import ConfigError

DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")
"""Distributions ``parse_search`` accepts."""

SETTINGS_KEYS = ("hparams", "hyperparams")
"""Agent attributes holding config values as leaves: ``agent.hparams`` (discount, tau, ...)
and ``opt_state.hyperparams`` (``optax.inject_hyperparams``: learning rates, Adam's b1, ...)."""


class Diverged(RuntimeError):
    """A trial's agent went non-finite (NaN parameters or a non-finite evaluation return)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched config field.

    Attributes:
        kind: one of ``DISTRIBUTIONS``.
        low: lower end (``uniform``, ``loguniform``, ``int``; inclusive).
        high: upper end (inclusive).
        choices: the values of a ``choice``.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def spec(self) -> str:
        """The ``DIST:ARGS`` text this parameter was parsed from (``parse_search`` reads it)."""
        if self.kind == "choice":
            items = (
                " ".join(map(setting_text, c)) if isinstance(c, tuple) else setting_text(c)
                for c in self.choices
            )
            return "choice:" + ",".join(items)
        return f"{self.kind}:{setting_text(self.low)}:{setting_text(self.high)}"


def setting_text(value: Any) -> str:
    """A setting as a search spec writes it: ``null``/``true``/``false`` as JSON, else ``str``."""
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def literal_value(text: str) -> Any:
    """``"3"`` -> 3, ``"0.5"`` -> 0.5, ``"true"``/``"null"`` -> True/None, else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _number(name: str, text: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"Search {name}: {text!r} is not {kind}.") from None


def parse_search(specs: list[str], config_cls: Any, *, base: Any = None) -> dict[str, Param]:
    """Parse ``FIELD=DIST:ARGS`` search specs over the fields of ``config_cls``.

    ``DIST`` is ``uniform:LOW:HIGH``, ``loguniform:LOW:HIGH`` (``LOW > 0``), ``int:LOW:HIGH``
    (integers, both ends included) or ``choice:A,B,C`` (each value read as JSON, else as text; a
    value with spaces is a tuple, e.g. ``hidden_dims=choice:64 64,256 256``). Each end and each
    choice is checked against the config's own validation, set on ``base``.

    Args:
        specs: e.g. ``["actor_lr=loguniform:1e-5:1e-3", "n_step=choice:1,3,5"]``.
        config_cls: the agent's config dataclass (``jaxrl.registry.get(name).config``).
        base: the config the values will be set on (checks that relate fields, such as
            ``num_min_qs <= num_qs``, depend on it); default ``config_cls()``.

    Returns:
        ``{field: Param}`` in the order given.

    Raises:
        ValueError: a malformed spec, an unknown field (the message lists the known ones), an
            unknown distribution, ``LOW >= HIGH``, a ``loguniform`` with ``LOW <= 0``, an empty
            ``choice``, a field given twice, or a value the config rejects.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    search: dict[str, Param] = {}
    for spec in specs:
        name, eq, rest = spec.partition("=")
        kind, colon, args = rest.partition(":")
        name, kind = name.strip(), kind.strip()
        if not (eq and colon and name):
            raise ConfigError(
                f"Search {spec!r} is not FIELD=DIST:ARGS; e.g. actor_lr=loguniform:1e-5:1e-3, "
                "tau=uniform:0.001:0.02, batch_size=int:64:512, n_step=choice:1,3,5."
            )
        check_new_field(config_cls, name, search, f"Search {spec!r}", "keep one spec per field")
        if kind not in DISTRIBUTIONS:
            raise ConfigError(
                f"Search {spec!r}: unknown distribution {kind!r}; use one of "
                f"{', '.join(DISTRIBUTIONS)} (e.g. {name}=uniform:LOW:HIGH)."
            )
        if kind == "choice":
            items = [a.strip() for a in args.split(",") if a.strip()]
            if not items:
                raise ConfigError(
                    f"Search {spec!r}: the choice is empty; list values, e.g. {name}=choice:1,3,5."
                )
            choices = tuple(
                tuple(literal_value(x) for x in item.split())
                if " " in item
                else literal_value(item)
                for item in items
            )
            param = Param(kind, choices=choices)
            values = list(choices)
        else:
            parts = args.split(":")
            if len(parts) != 2:
                raise ConfigError(f"Search {spec!r}: write {name}={kind}:LOW:HIGH.")
            integer = kind == "int"
            low, high = (_number(name, p.strip(), integer) for p in parts)
            if low >= high:
                raise ConfigError(
                    f"Search {spec!r}: LOW ({low}) must be below HIGH ({high}); swap or widen them."
                )
            if kind == "loguniform" and low <= 0:
                raise ConfigError(
                    f"Search {spec!r}: loguniform needs LOW > 0 (got {low}); use uniform for a "
                    "range that includes 0, or a positive LOW such as 1e-6."
                )
            annotation = fields[name].type  # a string under ``from __future__ import annotations``
            if not isinstance(annotation, str):
                annotation = getattr(annotation, "__name__", str(annotation))
            if not integer and annotation.split("|")[0].strip() == "int":
                raise ConfigError(
                    f"Search {spec!r}: {name} is an integer field; use {name}=int:LOW:HIGH "
                    "or a choice."
                )
            param = Param(kind, low, high)
            values = [low, high]
        for value in values:
            try:
                dataclasses.replace(config_cls() if base is None else base, **{name: value})
            except (TypeError, ValueError) as err:
                raise ConfigError(
                    f"Search {spec!r}: {name}={value!r} is not accepted: {err}"
                ) from None
        search[name] = param
    return search


def apply_settings(agent_cfg: Any, settings: dict[str, Any]) -> Any:
    """``agent_cfg`` with ``settings`` (JSON-like values: lists become tuples); validated."""
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    return dataclasses.replace(agent_cfg, **values)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What every trial of one sweep shares; the backends hand it to their trial plumbing.

    Attributes:
        agent_name: a registered agent.
        train_cfg: the loop options of every trial (``out`` is replaced per trial; a local
            ``dataset`` path is already absolute, see ``absolute_dataset``).
        agent_cfg: the agent config the searched fields are set on.
        search: ``parse_search`` output.
        trials: trials to run (Optuna: in this process; Ray: the population).
        out_root: absolute directory of the trial run directories and ``best_config.json``.
        seed: seed of the sampler or of the random search.
    """

    agent_name: str
    train_cfg: Any
    agent_cfg: Any
    search: dict[str, Param]
    trials: int
    out_root: str
    seed: int

    @classmethod
    def of(
        cls,
        agent_name: str,
        train_cfg: Any,
        agent_cfg: Any,
        search: dict[str, Param],
        *,
        trials: int,
        out_root: str,
        seed: int = 0,
    ) -> Sweep:
        """A checked sweep, with a local dataset path and ``out_root`` made absolute.

        Raises:
            ConfigError: an empty search, ``trials`` < 1, or ``train_cfg.num_seeds`` > 1.
        """
        check_sweep(train_cfg, search, trials)
        train_cfg, out_root = absolute_dataset(train_cfg), os.path.abspath(out_root)
        return cls(agent_name, train_cfg, agent_cfg, search, trials, out_root, seed)


# ------------------------------------------------------------------------------ shared helpers


def absolute_dataset(train_cfg: Any) -> Any:
    """``train_cfg`` with a local ``--dataset`` path made absolute (``minari:ID`` stays)."""
    dataset = train_cfg.dataset
    if dataset and not dataset.startswith("minari:"):
        dataset = os.path.abspath(dataset)
    return dataclasses.replace(train_cfg, dataset=dataset)


def check_sweep(train_cfg: Any, search: dict[str, Param], trials: int) -> None:
    """Refuse an empty search, fewer than one trial, or several seeds per trial (ConfigError)."""
    if not search:
        raise ConfigError("The search is empty; give at least one FIELD=DIST:ARGS.")
    if trials < 1:
        raise ConfigError(f"trials must be at least 1, got {trials}.")
    if train_cfg.num_seeds != 1:
        raise ConfigError(
            "--num-seeds trains several seeds in one run; a sweep's trials are single runs. "
            "Drop --num-seeds (repeat the sweep with another --seed to compare seeds)."
        )


def last_eval_step(spec: Any, train_cfg: Any) -> int:
    """The step of a run's last evaluation (the harness numbers offline-then-online steps on)."""
    if not train_cfg.dataset:
        return train_cfg.total_steps
    if spec.kind == "offline":
        offline = (
            train_cfg.total_steps if train_cfg.offline_steps is None else train_cfg.offline_steps
        )
        return offline + (train_cfg.online_steps or 0)
    return train_cfg.online_steps or train_cfg.total_steps


def eval_failure(out: str, step: int, eval_return: float, nonfinite: int) -> str | None:
    """Why an evaluation means the run diverged, or None."""
    if nonfinite > 0:
        return f"{out}: the agent held NaN values after {nonfinite} updates by step {step}"
    if not math.isfinite(eval_return):
        return f"{out}: evaluation return {eval_return} at step {step}"
    return None


def write_best(out_root: str, run_dir: str | None, fallback: dict[str, Any], sweep: dict) -> str:
    """Write ``out_root/best_config.json`` from the best run's ``config.json``; its path."""
    from jaxrl.loops.logging import write_json

    config = fallback
    if run_dir and os.path.exists(os.path.join(run_dir, "config.json")):
        with open(os.path.join(run_dir, "config.json")) as f:
            config = json.load(f)
    path = os.path.join(out_root, "best_config.json")
    write_json(path, {**config, "sweep": sweep})
    return path


@dataclasses.dataclass(frozen=True)
class Best:
    """The best finished trial of a sweep, as a backend found it.

    Attributes:
        trial: the backend's trial id (Optuna's number, Ray's trial id).
        value: its final evaluation return.
        params: the searched settings it trained with.
        run_dir: its run directory (None when unknown).
        where: the backend and where its record lives (``{"backend": "optuna", ...}``).
    """

    trial: Any
    value: float
    params: dict[str, Any]
    run_dir: str | None
    where: dict[str, Any]


def sweep_summary(
    job: Sweep, counts: dict[str, int], n_trials: int, best: Best | None, **extra: Any
) -> dict[str, Any]:
    """What a backend returns: trial counts, and the best trial with its ``best_config.json``.

    ``extra`` (the backend's storage, ...) goes in as given; with a ``best``, its config is
    written to ``out_root/best_config.json`` (see ``write_best``).
    """
    from jaxrl.loops.config import run_config

    summary: dict[str, Any] = {
        "out_root": job.out_root,
        **extra,
        "best_value": None,
        "best_params": None,
        "best_trial": None,
        "best_run_dir": None,
        "best_config": None,
        "n_trials": n_trials,
        "trials": counts,
    }
    if best is None:
        return summary
    config = apply_settings(job.agent_cfg, best.params)
    fallback = run_config(job.agent_name, config, job.train_cfg)
    record = {**best.where, "trial": best.trial, "value": best.value, "params": best.params}
    return summary | {
        "best_value": best.value,
        "best_params": best.params,
        "best_trial": best.trial,
        "best_run_dir": best.run_dir,
        "best_config": write_best(job.out_root, best.run_dir, fallback, record),
    }


__all__ = [
    "Best",
    "DISTRIBUTIONS",
    "Diverged",
    "Param",
    "SETTINGS_KEYS",
    "Sweep",
    "absolute_dataset",
    "apply_settings",
    "check_sweep",
    "eval_failure",
    "last_eval_step",
    "literal_value",
    "parse_search",
    "setting_text",
    "sweep_summary",
    "write_best",
]
