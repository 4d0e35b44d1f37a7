"""EXPO: Expressive Policy Optimization (Dong, Li, Sadigh & Finn, 2025, arXiv:2507.07986).

A diffusion *base* policy is trained only by imitation (a DDPM loss on replay minibatches, which
hold the dataset's rows when ``--dataset`` is mixed in, as RLPD). A small tanh-Gaussian *edit*
policy ``pi_e(e | s, a)`` moves a base action by at most ``edit_scale`` per dimension and is
trained like SAC's actor to raise Q. Neither is used alone: the *on-the-fly* (OTF) policy draws
``num_samples`` base actions, edits the first ``num_edit_samples`` of them, and takes the
candidate (base or edited) of highest Q, both to act and as the TD target's next action. The
critic, its targets and the update schedule are RLPD's (``sac.update_step`` with
``delayed_actor_update``); the base policy steps with the edit policy and keeps a moving average,
which acts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import generative as gen
from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.agents import sac
from jaxrl.agents.sac import SACConfig
from jaxrl.config import ConfigError, check_positive, check_range
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def critic_loss(
    critic_params: Params, agent: EXPO, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """TD regression onto ``r + gamma (1 - d) min_{i in M} Q'_i(s', a'_OTF)`` (EXPO's backup).

    ``a'_OTF`` is the on-the-fly policy's action at ``s'`` (``EXPO.otf`` with the base policy's
    current parameters, as the authors' ``sample_batch_actions``); ``M`` is a random subset of
    ``num_min_qs`` target critics (RLPD/REDQ). No entropy term: the OTF policy has no density.
    The squared error is averaged over critics and batch, as the authors' code.
    """
    k_otf, k_sub = jax.random.split(key)
    next_actions = agent.otf(agent.base.params, batch.next_obs, k_otf)
    next_q = agent.target_q(k_sub, batch.next_obs, next_actions)
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_q, agent.hparams["discount"])
    )
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    loss = jnp.mean((qs - target[None]) ** 2)
    return loss, {"critic/loss": loss, "critic/q_mean": qs.mean(), "critic/target": target.mean()}


def edit_loss(
    params: Params, agent: EXPO, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """EXPO's edit-policy objective, SAC's (Haarnoja et al., 2018, eq. 7) on edited actions.

    ``E[alpha log pi_e(e | s, a) - Q(s, a + e)]`` with ``a`` the minibatch's actions (as the
    authors' ``update_edit_actor``) and ``e = edit_scale * tanh(u)``; the log-density is that of
    the scaled edit (``- A log edit_scale``). ``Q`` is the critics' mean (or minimum, by
    ``policy_q``).
    """
    actions, log_probs, edits = agent.edit(params, batch.obs, batch.action, key)
    qs = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)
    q = qs.min(axis=0) if agent.config.policy_q == "min" else qs.mean(axis=0)
    alpha = agent.temp.apply_fn(agent.temp.params)
    loss = jnp.mean(alpha * log_probs - q)
    info = {"actor/loss": loss, "actor/entropy": -log_probs.mean(), "actor/q": q.mean()}
    return loss, {**info, "actor/edit_size": jnp.abs(edits).mean()}


def base_loss(
    params: Params, agent: EXPO, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """The base policy's imitation loss: DDPM noise regression (Ho et al., 2020, eq. 14).

    ``E ||eps - eps_theta(s, x_t, t)||^2`` on the minibatch's actions (replay, plus the dataset's
    rows when one is mixed in), summed over action dimensions, as the authors' ``update_actor``.
    """
    fn = partial(agent.base.apply_fn, params, batch.obs)
    loss = jnp.mean(gen.ddpm_loss(fn, key, batch.action, agent.schedule))
    return loss, {"base/loss": loss}


# -------------------------------------------------------------------------------------- the agent


class EditPolicy(nn.Module):
    """``pi_e(. | s, a)``: SAC's tanh-Gaussian actor on an observation and a base action."""

    action_dim: int
    hidden_dims: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, base_action: jax.Array):
        """The distribution of the unscaled edit ``tanh(u)`` in ``[-1, 1]``."""
        actor = nets.TanhGaussianActor(self.action_dim, self.hidden_dims)
        return actor(jnp.concatenate([obs, base_action], axis=-1))


class EXPO(struct.PyTreeNode):
    """EXPO state: edit policy, critics and target, temperature, base policy and its average.

    ``actor``, ``critic``, ``target_critic_params`` and ``temp`` are SAC's fields, so SAC's update
    schedule runs on it. Sweepable leaves: the learning rates (in each ``opt_state``) and
    ``hparams`` (``discount``, ``tau``, ``target_entropy``, ``edit_scale``, ``base_ema_tau``).
    """

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    target_critic_params: Params
    temp: TrainState
    base: TrainState
    base_ema_params: Params
    hparams: dict[str, jax.Array]
    action_dim: int = struct.field(pytree_node=False)
    config: EXPOConfig = struct.field(pytree_node=False)

    @property
    def schedule(self) -> gen.DiffusionSchedule:
        """The variance-preserving schedule of ``config.diffusion_steps`` steps."""
        return gen.vp_schedule(self.config.diffusion_steps)

    def edit(
        self, params: Params, obs: jax.Array, base_actions: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Edited actions ``clip(a + e, -1, 1)``, the edits' log-densities and the edits ``e``.

        ``e = edit_scale * tanh(u)``, ``u`` from the edit policy with ``params``; ``|e| <=
        edit_scale`` per dimension, and clipping to the action space only shrinks it.
        """
        raw, log_probs = self.actor.apply_fn(params, obs, base_actions).sample_and_log_prob(key)
        scale = self.hparams["edit_scale"]
        edits = scale * raw
        log_probs = log_probs - self.action_dim * jnp.log(scale)  # density of the scaled edit
        return jnp.clip(base_actions + edits, -1.0, 1.0), log_probs, edits

    def target_q(self, key: jax.Array, obs: jax.Array, actions: jax.Array) -> jax.Array:
        """``min_{i in M} Q'_i(s, a)``, ``M`` a random subset of ``num_min_qs`` target critics.

        Only the subset is evaluated (``rl.ensemble_subset``), which matters when 2 of 10
        critics score 16 candidates per state.
        """
        params = rl.ensemble_subset(key, self.target_critic_params, self.config.num_min_qs)
        qs = self.critic.apply_fn(params, obs, actions)
        return rl.min_over_ensemble(qs.reshape(qs.shape[0], -1)).reshape(qs.shape[1:])

    def otf(self, base_params: Params, obs: jax.Array, key: jax.Array) -> jax.Array:
        """The on-the-fly policy: the best of the base and edited candidates by ``target_q``.

        ``num_samples`` DDPM samples of the base policy with ``base_params`` per observation
        ``[..., D]``, the first ``num_edit_samples`` of them edited; one random subset of critics
        scores every candidate (as the authors). Returns the chosen actions ``[..., A]``.
        """
        n, m = self.config.num_samples, self.config.num_edit_samples
        k_base, k_edit, k_sub = jax.random.split(key, 3)
        obs_n = jnp.broadcast_to(obs[..., None, :], (*obs.shape[:-1], n, obs.shape[-1]))
        fn = partial(self.base.apply_fn, base_params, obs_n)
        base = gen.ddpm_sample(fn, k_base, (*obs_n.shape[:-1], self.action_dim), self.schedule)
        edited = self.edit(self.actor.params, obs_n[..., :m, :], base[..., :m, :], k_edit)[0]
        candidates = jnp.concatenate([base, edited], axis=-2)  # [..., N + M, A]
        q = self.target_q(k_sub, jnp.concatenate([obs_n, obs_n[..., :m, :]], -2), candidates)
        best = jnp.argmax(q, axis=-1)
        return jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]

    def update(self, batch: Batch) -> tuple[EXPO, InfoDict]:
        """SAC's update with EXPO's losses, then the base policy's step and moving average.

        The critic steps every call; the edit policy, temperature and base policy step on every
        ``utd_ratio``-th call with ``delayed_actor_update`` (the authors' ``update``: ``utd_ratio``
        critic steps, then one step of each policy on the last minibatch), otherwise on each.
        Their info values are 0 on the other calls.
        """
        agent, info = sac.update_step(self, batch, critic_loss, edit_loss)
        rng, key = jax.random.split(agent.rng)
        agent = agent.replace(rng=rng)

        def base_step(agent: EXPO) -> tuple[TrainState, Params, InfoDict]:
            base, base_info = nets.gradient_step(agent.base, base_loss, agent, batch, key)
            tau = agent.hparams["base_ema_tau"]
            return base, rl.polyak_update(base.params, agent.base_ema_params, tau), base_info

        def skip(agent: EXPO) -> tuple[TrainState, Params, InfoDict]:
            shapes = jax.eval_shape(base_step, agent)[2]
            zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
            return agent.base, agent.base_ema_params, zeros

        every = self.config.utd_ratio if self.config.delayed_actor_update else 1
        if every == 1:
            base, ema, base_info = base_step(agent)
        else:
            due = agent.critic.step % every == 0  # the call that stepped the edit policy
            base, ema, base_info = jax.lax.cond(due, base_step, skip, agent)
        return agent.replace(base=base, base_ema_params=ema), {**info, **base_info}

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """The OTF policy with the base policy's moving average (authors' ``sample_actions``)."""
        return self.otf(self.base_ema_params, obs, rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """As ``sample_actions``, its noise seeded by each observation: a deterministic policy."""
        return gen.map_rows(lambda o, k: self.sample_actions(o, k), self.rng, obs)

    @classmethod
    def create(
        cls, config: EXPOConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> EXPO:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_edit, k_critic, k_temp, k_base = jax.random.split(jax.random.key(seed), 5)
        obs, act = obs_example[None], action_example[None]
        dim, size = action_example.shape[-1], config.actor_observation_size
        decay = config.lr_decay_steps or None
        edit_def = nets.observing(EditPolicy(dim, config.hidden_dims), size)
        actor = nets.make_train_state(
            edit_def, k_edit, config.actor_lr, obs, act, cosine_decay_steps=decay
        )
        critic, target, temp, hparams = sac.init_critic_and_temperature(
            config, obs_example, action_example, k_critic, k_temp, config.target_entropy_scale
        )
        base_def = gen.DenoiserNet(
            dim,
            (config.base_width,) * config.base_blocks,
            "ln_resnet",
            time_dim=config.time_dim,
            activation=jax.nn.swish,
        )
        base, ema = gen.init_diffusion_actor(
            nets.observing(base_def, size), k_base, config.base_lr, obs, act, config.lr_decay_steps
        )
        if config.target_entropy is None and config.edit_target_entropy:
            # The scaled edit's entropy is the unscaled one's + A log(edit_scale).
            shift = dim * jnp.log(jnp.float32(config.edit_scale))
            hparams = {**hparams, "target_entropy": hparams["target_entropy"] + shift}
        hparams = {**hparams, **nets.hparam_leaves(config, "edit_scale", "base_ema_tau")}
        return cls(rng, actor, critic, target, temp, base, ema, hparams, dim, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class EXPOConfig(SACConfig):
    """EXPO hyperparameters; defaults are the authors' (pd-perry/EXPO) common settings.

    From ``configs/expo_config.py`` and the README's launch commands. The paper reports no MuJoCo
    locomotion runs; these are the settings its D4RL AntMaze and robomimic commands share:
    RLPD's critic (10 LayerNorm critics, target minimum over a random pair, UTD 20, target
    entropy -A/2) with 3 layers of 256 and no entropy backup; a 10-step DDPM base policy (VP
    schedule, 3 LayerNorm residual blocks of 256, swish, samples clipped to [-1, 1]) with a
    0.001 moving average; N = 8 base and 8 edited candidates; edits of at most 0.05; both
    policies' learning rates decay along a cosine over 3M updates; 5,000 random warm-up steps.
    SAC's actor fields (``actor_lr``, ``hidden_dims``, the temperature's) are the edit policy's;
    the loop's ``--offline-ratio`` (0.5) mixes a dataset in, as RLPD.

    Deviations: the diffusion step is a fixed sinusoidal code into a (256, 128) swish MLP (the
    authors: learnable Fourier features into (256, 256)); the base policy's optimizer is Adam
    (the authors: AdamW, weight decay 1e-4); edited candidates are clipped to [-1, 1] before Q
    (the authors leave it to the env); the edit policy's log-std is squashed into [-5, 2] by a
    tanh (``nets.TanhGaussianActor``; the authors clip to [-20, 2]). The target entropy is the
    scaled edit's, -A/2 + A log(edit_scale) (the authors' ``adjust_target_entropy``, off in their
    configs): the entropy of an edit of at most 0.05 is at most A (log 2 + log 0.05) = -2.3 A,
    so with their -A/2 the temperature's log rises by about its learning rate at every step and
    overflows float32 after ~300k updates; ``--no-edit-target-entropy`` restores it.
    """

    # RLPD's critic and schedule, and the authors' widths (SACConfig's docstrings apply).
    hidden_dims: tuple[int, ...] = (256, 256, 256)
    num_qs: int = 10
    num_min_qs: int | None = 2
    policy_q: Literal["min", "mean"] = "mean"
    critic_layer_norm: bool = True
    utd_ratio: int = 20
    target_entropy_scale: float = 0.5
    delayed_actor_update: bool = True
    backup_entropy: bool = False

    base_lr: float = 3e-4
    """Adam learning rate of the diffusion base policy."""
    lr_decay_steps: int = 3_000_000
    """Cosine decay of both policies' learning rates over this many of their updates (0: none)."""
    base_width: int = 256
    """Width of the base policy's residual blocks."""
    base_blocks: int = 3
    """Number of LayerNorm residual blocks of the base policy's noise network."""
    time_dim: int = 128
    """Width of the sinusoidal code of the diffusion step (even)."""
    diffusion_steps: int = 10
    """DDPM steps T of the base policy (training and sampling)."""
    base_ema_tau: float = 0.001
    """Step of the base policy's moving average, which acts: ema += tau * (params - ema)."""
    num_samples: int = 8
    """Base-policy samples N per state, to act and for the TD target's next action."""
    num_edit_samples: int = 8
    """How many of the N samples the edit policy also edits (candidates: N + this); <= N."""
    edit_scale: float = 0.05
    """Largest edit per action dimension (actions in [-1, 1]): a + edit_scale * tanh(u)."""
    edit_target_entropy: bool = True
    """Shift the default target entropy by A log(edit_scale), to the scaled edit's (see above)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            *("base_lr", "base_width", "base_blocks", "time_dim", "diffusion_steps"),
            *("num_samples", "edit_scale"),
        )
        check_range(self, "lr_decay_steps", 0, float("inf"))
        check_range(self, "base_ema_tau", 0.0, 1.0, low_open=True)
        check_range(self, "num_edit_samples", 0, self.num_samples)
        if self.time_dim % 2:
            raise ConfigError(
                f"EXPOConfig.time_dim must be even (sines and cosines), got {self.time_dim}; "
                "set --time-dim to e.g. 128."
            )
        if self.backup_entropy:
            raise ConfigError(
                "EXPO's on-the-fly policy has no log-density, so its TD target has no entropy "
                "bonus (the authors run with backup_entropy=False); drop --backup-entropy."
            )
