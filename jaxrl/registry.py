"""Every agent, named once: what it is and what the training loops must supply to it.

The command line, the loops, fine-tuning, run directories and the scripts dispatch on an
``AgentSpec``; they never probe an agent object for capabilities or branch on an agent's name.
A new agent is one file plus one line at the bottom of this module (``_builtin`` for the agents
shipped with jaxrl, ``register(AgentSpec(...))`` for an agent defined elsewhere).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, Literal

from jaxrl.errors import ConfigError

Kind = Literal["off-policy", "on-policy", "offline", "planner"]
"""How an agent trains.

- ``off-policy``: acts in an env and learns from a replay buffer (host or fused loop); with a
  dataset, the dataset is mixed into every minibatch (RLPD).
- ``on-policy``: collects a rollout with ``policy_step`` and updates on it (fused loop only);
  with ``dataset_pretrain``, it may first learn from a dataset in the offline loop.
- ``offline``: learns from a dataset in the offline loop; may then be fine-tuned online (host
  loop on Gymnasium envs, fused loop on JAX envs) with the dataset kept in the minibatch mix.
- ``planner``: acts by planning with a model; carries its plan across env steps in its state and
  is told at each step whether it is the first step of an episode.
"""

KINDS: tuple[str, ...] = ("off-policy", "on-policy", "offline", "planner")


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """One registry entry.

    Attributes:
        name: the command-line name (``jaxrl train NAME``).
        agent: the agent class (``create``, ``update``, ``sample_actions``, ``eval_actions``).
        config: the agent's config dataclass.
        kind: how it trains (see ``Kind``).
        needs_next_action: its batches carry ``next_action``, the action taken at ``next_obs``
            (ReBRAC's critic penalty); rows where it is unknown carry a zero mask.
        needs_mc_return: its batches carry ``mc_return``, the discounted return-to-go
            (Cal-QL's calibration).
        needs_source: its batches carry ``from_dataset``, 1 for the dataset's rows and 0 for
            the rows it collected online (H2O weighs simulator rows by a dynamics ratio and
            penalizes them, the real data not).
        horizon_field: the config field holding a learning-rate schedule's horizon in gradient
            steps (e.g. ``"max_steps"``), which the loops resolve to the run's budget when it is
            unset; None when the agent has no schedule.
        data_norm: the agent carries dataset statistics (``norm``: observation and reward
            normalization) that are set from the dataset before training.
        dataset_rows: the agent keeps the dataset's rows on the device (``rows``, a
            ``jaxrl.offline.common.DatasetRows``: observations normalized as the agent sees
            them, actions in ``[-1, 1]``) for a search inside its update (PRDC's nearest row).
            The loops set them from the dataset after ``norm``, for every member; they are
            part of the agent's state and so of its checkpoints.
        env_obs_norm: the config's ``normalize_observations`` means a running-statistics
            observation wrapper on the training envs (PPO); otherwise it is the agent's own
            business (dataset statistics) and the envs are never wrapped for it.
        sequence_field: the config field holding a sequence length ``H``: each minibatch holds
            runs of ``H`` consecutive steps of one episode (leaves ``[batch, H, ...]``) instead
            of single rows (TD-MPC2's ``horizon``); None for single rows.
        burst_at_start: when learning starts, the loops first run ``learning_starts`` gradient
            steps on the random-action data (TD-MPC2's pretraining on its seed steps).
        env_defaults: ``(config, episode_length) -> {field: value}``, settings derived from the
            env (TD-MPC2's discount heuristic); every run that knows its env applies them to
            the fields left unset (``for_env``). None when nothing depends on the env.
        termination_field: the config field (a bool) that makes the agent model episode
            terminations (TD-MPC2's ``episodic``): a run on an env that can terminate with it
            off is refused (``for_env``); None when the agent needs no such switch.
        actor_obs_field: the config field holding how many leading observation features the
            actor reads (asymmetric actor-critic: the rest are privileged critic inputs, see
            ``jaxrl.envs.privileged``); None when the agent cannot train that way.
        refit_field: the config field holding a period ``K`` in env steps: instead of
            ``utd_ratio`` minibatch steps per env step, the loops call ``update`` once with the
            whole replay buffer (its ``BufferState``) when the buffer reaches
            ``learning_starts + j K`` rows (``refit_due``), so the next action uses the refit
            model (PETS's periodic refit of its ensemble); None for minibatch updates.
        dataset_pretrain: an on-policy agent that may first learn from ``--dataset`` in the
            offline loop (``update`` on minibatches of dataset rows, ``Transition``s, of the
            config's ``batch_size``) and is then fine-tuned on its own rollouts in the fused
            loop (ReinFlow's behaviour-cloned flow policy, fine-tuned by PPO). The dataset is
            not mixed into the online updates.
        data_parallel: whether one run may split its envs and minibatches over several
            devices (``--devices`` with one seed; ``jaxrl.loops.mesh``). False for an agent
            whose update is not an average over minibatch rows: PETS refits its ensemble on
            the whole buffer, each member on its own bootstrap resample with a held-out split
            and early stopping, so there is no batch/N to give each device. Its seeds still
            spread over devices.
    """

    name: str
    agent: type
    config: type
    kind: Kind
    needs_next_action: bool = False
    needs_mc_return: bool = False
    needs_source: bool = False
    horizon_field: str | None = None
    data_norm: bool = False
    dataset_rows: bool = False
    env_obs_norm: bool = False
    sequence_field: str | None = None
    burst_at_start: bool = False
    env_defaults: Callable[[Any, int], dict[str, Any]] | None = None
    termination_field: str | None = None
    actor_obs_field: str | None = None
    refit_field: str | None = None
    dataset_pretrain: bool = False
    data_parallel: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"AgentSpec {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}."
            )
        fields = {f.name for f in dataclasses.fields(self.config)}
        for attr in (
            "horizon_field",
            "sequence_field",
            "termination_field",
            "actor_obs_field",
            "refit_field",
        ):
            field = getattr(self, attr)
            if field is not None and field not in fields:
                raise ValueError(
                    f"AgentSpec {self.name!r}: {attr} {field!r} is not a field of "
                    f"{self.config.__name__}."
                )

    @property
    def offline(self) -> bool:
        """True for agents that learn from a dataset first, in the offline loop.

        Offline agents, and on-policy agents that pretrain on one (``dataset_pretrain``).
        """
        return self.kind == "offline" or self.dataset_pretrain

    def sequence_length(self, config: Any) -> int | None:
        """Steps per sequence in a minibatch (``sequence_field``), or None for single rows."""
        return None if self.sequence_field is None else getattr(config, self.sequence_field)

    def refit_every(self, config: Any) -> int | None:
        """Env steps between whole-buffer refits (``refit_field``), or None for minibatches."""
        return None if self.refit_field is None else int(getattr(config, self.refit_field))

    def with_env_defaults(self, config: Any, episode_length: int) -> Any:
        """``config`` with the settings ``env_defaults`` derives from the env's episode length.

        Only fields still at their class default (None: derived from the env) change: a value
        the user chose stays.
        """
        if self.env_defaults is None:
            return config
        default = self.config()
        derived = self.env_defaults(config, episode_length)
        keep = {k: v for k, v in derived.items() if getattr(config, k) == getattr(default, k)}
        return dataclasses.replace(config, **keep)

    def for_env(self, config: Any, env_id: str) -> Any:
        """``config`` for a run on ``env_id``: ``with_env_defaults`` of its episode length.

        Raises:
            ConfigError: ``env_id`` can terminate (``jaxrl.envs.can_terminate``) and the
                config's ``termination_field`` is off.
        """
        if self.env_defaults is None and self.termination_field is None:
            return config
        from jaxrl.envs import can_terminate, episode_length

        field = self.termination_field
        if field is not None and not getattr(config, field) and can_terminate(env_id):
            flag = "--" + field.replace("_", "-")
            raise ConfigError(
                f"{env_id} can end an episode by termination (e.g. a fall), and {self.name} "
                f"handles terminations only with {flag}: pass {flag}, or pick an env whose "
                "episodes end only at the time limit."
            )
        return self.with_env_defaults(config, episode_length(env_id))

    def with_actor_observation(self, config: Any, env: Any) -> Any:
        """``config`` with the actor reading what the policy may see of ``env``'s observation.

        ``env.actor_observation_size`` is None for envs without privileged features (the config
        is returned unchanged) and the policy's width for envs built with ``privileged=true``.

        Raises:
            ValueError: the env has privileged features and the agent cannot keep them from
                its actor, or the config asks for another width.
        """
        size = env.actor_observation_size
        if size is None:
            return config
        field = self.actor_obs_field
        if field is None:
            able = [n for n in names() if get(n).actor_obs_field is not None]
            raise ConfigError(
                f"{self.name} cannot train on an env with privileged=true: its actor would read "
                f"the critic's privileged features. Use one of {', '.join(able)}, or drop "
                "privileged=true from the env id."
            )
        chosen = getattr(config, field)
        if chosen not in (0, size):
            raise ConfigError(
                f"--{field.replace('_', '-')} {chosen} does not match the env: with "
                f"privileged=true the policy sees the first {size} observation features; leave "
                "it at 0 and it is set from the env."
            )
        return dataclasses.replace(config, **{field: size})

    def check_data_parallel(self, devices: int) -> None:
        """Refuse to split one run of this agent over ``devices > 1`` devices when it cannot be.

        Raises:
            ConfigError: the agent is not data-parallel (``data_parallel``).
        """
        if devices > 1 and not self.data_parallel:
            able = [n for n in names("off-policy", "on-policy", "offline") if get(n).data_parallel]
            raise ConfigError(
                f"{self.name} cannot split one run over {devices} devices: its update is not "
                "an average over minibatch rows. Use --devices 1, or train several seeds "
                f"(--num-seeds) so that each device trains whole seeds; data-parallel agents: "
                f"{', '.join(able)}."
            )

    def make_config(self, **fields: Any) -> Any:
        """The agent's config from JSON-like fields (lists become tuples, as the CLI gives them)."""
        return self.config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


REGISTRY: dict[str, AgentSpec] = {}
"""The entries built so far, by name (a built-in agent's entry is built when first asked for)."""

_KINDS: dict[str, str] = {}  # every agent's kind, in registration order
_BUILTIN: dict[str, tuple[str, dict[str, Any]]] = {}  # not imported yet: "module:Agent:Config"


def register(spec: AgentSpec) -> AgentSpec:
    """Add ``spec`` to the registry (a name may be registered once)."""
    if spec.name in _KINDS:
        raise ConfigError(f"Agent {spec.name!r} is registered twice.")
    _KINDS[spec.name] = spec.kind
    REGISTRY[spec.name] = spec
    return spec


def _builtin(name: str, kind: Kind, where: str, **options: Any) -> None:
    """Name a built-in agent and what the loops must supply to it (``AgentSpec`` fields).

    ``where`` is ``"module:Agent:Config"`` under ``jaxrl``. The module is imported when the entry
    is first asked for (``get``), so listing the agents (``jaxrl --help``) imports none of them.
    """
    _KINDS[name] = kind
    _BUILTIN[name] = (where, options)


def get(name: str) -> AgentSpec:
    """The entry of agent ``name``.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    if name in _BUILTIN:
        where, options = _BUILTIN.pop(name)
        module_name, agent, config = where.split(":")
        module = importlib.import_module(f"jaxrl.{module_name}")
        if "env_defaults" in options:  # a function of the agent's module, named
            options = {**options, "env_defaults": vars(module)[options["env_defaults"]]}
        spec = AgentSpec(name, vars(module)[agent], vars(module)[config], _KINDS[name], **options)
        REGISTRY[name] = spec
    if name not in REGISTRY:
        raise ConfigError(f"Unknown agent {name!r}; choose one of: {', '.join(_KINDS)}.")
    return REGISTRY[name]


def names(*kinds: str) -> list[str]:
    """Registered agent names, in registration order; only those of ``kinds`` when given.

    Imports no agent: the built-in agents' kinds are known without their modules.
    """
    return [n for n, kind in _KINDS.items() if not kinds or kind in kinds]


_offline: dict[str, Any] = {"data_norm": True}
_asymmetric: dict[str, Any] = {"actor_obs_field": "actor_observation_size"}
_builtin("sac", "off-policy", "agents.sac:SAC:SACConfig", **_asymmetric)
_builtin("td3", "off-policy", "agents.td3:TD3:TD3Config", **_asymmetric)
_builtin("ppo", "on-policy", "agents.ppo:PPO:PPOConfig", env_obs_norm=True, **_asymmetric)
_builtin("rlpd", "off-policy", "agents.sac:SAC:RLPDConfig", **_asymmetric)
_builtin("sac-fast", "off-policy", "agents.sac:SAC:SACFastConfig", **_asymmetric)
_builtin(
    "reinflow",
    "on-policy",
    "agents.reinflow:ReinFlow:ReinFlowConfig",
    dataset_pretrain=True,
    horizon_field="bc_decay_steps",
)
_builtin("h2o", "off-policy", "agents.h2o:H2O:H2OConfig", needs_source=True)
_builtin("bc", "offline", "offline.bc:BC:BCConfig", **_offline)
_builtin("td3-bc", "offline", "offline.td3_bc:TD3BC:TD3BCConfig", **_offline)
_builtin("cql", "offline", "offline.cql:CQL:CQLConfig", **_offline)
_builtin("cal-ql", "offline", "offline.cql:CQL:CalQLConfig", needs_mc_return=True, **_offline)
_builtin("iql", "offline", "offline.iql:IQL:IQLConfig", horizon_field="max_steps", **_offline)
_builtin(
    "rebrac", "offline", "offline.td3_bc:ReBRAC:ReBRACConfig", needs_next_action=True, **_offline
)
_builtin("idql", "offline", "offline.idql:IDQL:IDQLConfig", horizon_field="max_steps", **_offline)
_builtin(
    "diffusion-ql",
    "offline",
    "offline.diffusion_ql:DiffusionQL:DiffusionQLConfig",
    horizon_field="max_steps",
    **_offline,
)
_builtin("fql", "offline", "offline.fql:FQL:FQLConfig", **_offline)
_builtin("prdc", "offline", "offline.prdc:PRDC:PRDCConfig", dataset_rows=True, **_offline)
_builtin("a2pr", "offline", "offline.a2pr:A2PR:A2PRConfig", **_offline)
_builtin(
    "famo2o", "offline", "offline.famo2o:FamO2O:FamO2OConfig", horizon_field="max_steps", **_offline
)
_builtin(
    "tdmpc2",
    "planner",
    "agents.tdmpc2:TDMPC2:TDMPC2Config",
    sequence_field="horizon",
    burst_at_start=True,
    env_defaults="tdmpc2_env_defaults",
    termination_field="episodic",
)
_builtin(
    "pets",
    "planner",
    "agents.pets:PETS:PETSConfig",
    refit_field="model_train_freq",
    data_parallel=False,
)
_builtin("expo", "off-policy", "agents.expo:EXPO:EXPOConfig", **_asymmetric)
_builtin("crossq", "off-policy", "agents.crossq:CrossQ:CrossQConfig")


def refit_due(steps: Any, num_envs: int, learning_starts: int, every: int) -> Any:
    """Whether a refit is due after ``steps`` env steps (Python or traced ints).

    True when the last vectorized step (``num_envs`` env steps) reached
    ``learning_starts + j every`` steps for some ``j >= 0``: the first refit sees exactly the
    ``learning_starts`` random-action rows (mbrl-lib's PETS trains before its first planned
    action), then one follows every ``every`` steps.
    """
    since = steps - learning_starts
    return (since >= 0) & (since % every < num_envs)


__all__ = ["AgentSpec", "KINDS", "Kind", "REGISTRY", "get", "names", "refit_due", "register"]
