"""FQL: Flow Q-Learning (Park, Li & Levine, 2025, arXiv:2502.02538).

A flow-matching policy clones the behavior data, but it is never differentiated through its
integration: a separate *one-step* policy ``mu(s, z)`` maps a noise vector straight to an action,
trained to maximize ``Q`` while staying close to what the BC flow produces from the same noise
(distillation). Acting costs one MLP pass, like a Gaussian actor; the critics bootstrap from the
one-step policy's actions.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import generative as gen
from jaxrl import rl
from jaxrl.config import OfflineFields, check_choice, check_positive, check_range
from jaxrl.networks import MLP, EnsembleQ, gradient_step, hparam_leaves, make_train_state
from jaxrl.offline.common import DataNorm, check_generative_config, map_rows
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def critic_loss(
    critic_params: Params, agent: FQL, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """TD regression onto ``r + gamma (1 - d) agg_i Q'_i(s', mu(s', z))``, FQL eq. 6.

    ``agg`` is the mean (the paper's default) or the minimum over the critics (``q_agg``); the
    squared error is averaged over critics and batch, as the authors' code.
    """
    next_actions = agent.one_step_actions(agent.one_step.params, batch.next_obs, key)
    next_qs = agent.critic.apply_fn(agent.target_critic_params, batch.next_obs, next_actions)
    next_v = _aggregate(next_qs, agent.config.q_agg)
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_v, agent.hparams["discount"])
    )
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    loss = jnp.mean((qs - target[None]) ** 2)
    return loss, {"critic/loss": loss, "critic/q_mean": qs.mean(), "critic/target": target.mean()}


def flow_loss(
    flow_params: Params, agent: FQL, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Flow-matching BC loss ``E ||v(s, x_t, t) - (a - x_0)||^2``, FQL eq. 4 (mean over dims)."""
    fn = partial(agent.flow.apply_fn, flow_params, batch.obs)
    loss = jnp.mean(gen.flow_matching_loss(fn, key, batch.action)) / batch.action.shape[-1]
    return loss, {"flow/loss": loss}


def one_step_loss(
    params: Params, agent: FQL, batch: Batch, noise: jax.Array, flow_actions: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """``-E[Q(s, mu(s, z))] + alpha E||mu(s, z) - flow(s, z)||^2``, FQL eq. 8.

    ``flow(s, z)`` is the BC flow integrated from the same noise (no gradient); ``Q`` is the
    mean over critics, divided by ``E|Q|`` when ``normalize_q_loss``; the distillation error is
    averaged over action dimensions, as the authors' code.
    """
    actions = agent.one_step.apply_fn(params, jnp.concatenate([batch.obs, noise], axis=-1))
    distill = jnp.mean((actions - flow_actions) ** 2)
    qs = agent.critic.apply_fn(agent.critic.params, batch.obs, jnp.clip(actions, -1.0, 1.0))
    q = jnp.mean(qs, axis=0)
    q_loss = -q.mean()
    if agent.config.normalize_q_loss:
        q_loss = q_loss / jax.lax.stop_gradient(jnp.abs(q).mean())
    loss = q_loss + agent.hparams["alpha"] * distill
    return loss, {"actor/loss": loss, "actor/distill": distill, "actor/q": q.mean()}


def _aggregate(qs: jax.Array, how: str) -> jax.Array:
    return jnp.mean(qs, axis=0) if how == "mean" else rl.min_over_ensemble(qs)


# -------------------------------------------------------------------------------------- the agent


class FQL(struct.PyTreeNode):
    """FQL state: BC flow, one-step policy, critics and targets, RNG, hparams, data norm.

    Sweepable leaves: the learning rates (in each ``opt_state``) and ``hparams`` (``discount``,
    ``tau``, ``alpha``).
    """

    rng: jax.Array
    flow: TrainState
    one_step: TrainState
    critic: TrainState
    target_critic_params: Params
    hparams: dict[str, jax.Array]
    norm: DataNorm
    action_dim: int = struct.field(pytree_node=False)
    config: FQLConfig = struct.field(pytree_node=False)

    def flow_actions(self, flow_params: Params, obs: jax.Array, noise: jax.Array) -> jax.Array:
        """The BC flow's actions for (normalized) ``obs``, integrated from ``noise`` (Euler)."""
        fn = partial(self.flow.apply_fn, flow_params, obs)
        return gen.euler_sample(fn, noise, self.config.flow_steps)

    def one_step_actions(self, params: Params, obs: jax.Array, key: jax.Array) -> jax.Array:
        """``clip(mu(s, z), -1, 1)`` with ``z ~ N(0, I)`` for (normalized) ``obs``."""
        noise = jax.random.normal(key, (*obs.shape[:-1], self.action_dim))
        actions = self.one_step.apply_fn(params, jnp.concatenate([obs, noise], axis=-1))
        return jnp.clip(actions, -1.0, 1.0)

    def update(self, batch: Batch) -> tuple[FQL, InfoDict]:
        """Critic, BC flow and one-step policy steps (FQL's joint loss), then the target update."""
        batch = self.norm.batch(batch)
        rng, k_critic, k_flow, k_noise = jax.random.split(self.rng, 4)
        critic, info = gradient_step(self.critic, critic_loss, self, batch, k_critic)
        # The distillation target uses the flow before this step's update, as FQL's joint loss.
        noise = jax.random.normal(k_noise, batch.action.shape)
        flow_actions = jax.lax.stop_gradient(self.flow_actions(self.flow.params, batch.obs, noise))
        flow, flow_info = gradient_step(self.flow, flow_loss, self, batch, k_flow)
        one_step, actor_info = gradient_step(
            self.one_step, one_step_loss, self, batch, noise, flow_actions
        )
        target = rl.polyak_update(critic.params, self.target_critic_params, self.hparams["tau"])
        agent = self.replace(
            rng=rng, flow=flow, one_step=one_step, critic=critic, target_critic_params=target
        )
        return agent, {**info, **flow_info, **actor_info}

    def _act(self, obs: jax.Array, key: jax.Array) -> jax.Array:
        return self.one_step_actions(self.one_step.params, self.norm.obs(obs), key)

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """One pass of the one-step policy with fresh noise."""
        return self._act(obs, rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """The evaluation policy of ``config.eval_noise``; deterministic per agent and observation.

        'sampled' (the authors' protocol): the one-step policy with noise ``z ~ N(0, I)`` drawn
        from a key made of the agent's ``rng`` and a hash of each observation, so a fresh-looking
        draw at every new state, the same action for the same state. 'zero': ``z = 0``.
        """
        if self.config.eval_noise == "sampled":
            return map_rows(self._act, self.rng, obs)
        obs = self.norm.obs(obs)
        zeros = jnp.zeros((*obs.shape[:-1], self.action_dim), obs.dtype)
        actions = self.one_step.apply_fn(self.one_step.params, jnp.concatenate([obs, zeros], -1))
        return jnp.clip(actions, -1.0, 1.0)

    @classmethod
    def create(
        cls, config: FQLConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> FQL:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_flow, k_one, k_critic = jax.random.split(jax.random.key(seed), 4)
        obs, act = obs_example[None], action_example[None]
        dim = action_example.shape[-1]
        ln_order = config.layer_norm_order
        flow_def = gen.DenoiserNet(
            dim,
            config.actor_hidden_dims,
            time_embedding=config.time_embedding,
            layer_norm=config.actor_layer_norm,
            activation=jax.nn.gelu,
            layer_norm_order=ln_order,
        )
        flow = make_train_state(flow_def, k_flow, config.actor_lr, obs, act, act[:, :1])
        one_def = MLP(
            (*config.actor_hidden_dims, dim),
            jax.nn.gelu,
            config.actor_layer_norm,
            layer_norm_order=ln_order,
        )
        one_step = make_train_state(
            one_def, k_one, config.actor_lr, jnp.concatenate([obs, act], -1)
        )
        critic_def = EnsembleQ(
            config.critic_hidden_dims,
            config.num_qs,
            config.critic_layer_norm,
            jax.nn.gelu,
            layer_norm_order=ln_order,
        )
        critic = make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        hparams = hparam_leaves(config, "discount", "tau", "alpha")
        target = jax.tree.map(jnp.copy, critic.params)
        norm = DataNorm.identity(obs_example.shape[-1])
        return cls(rng, flow, one_step, critic, target, hparams, norm, dim, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class FQLConfig(OfflineFields):
    """FQL hyperparameters; defaults are the paper's (seohongpark/fql ``agents/fql.py``).

    4x512 GELU MLPs, LayerNorm in the critics applied after each activation (the authors'
    ``MLP``: Dense -> GELU -> LayerNorm), 10 Euler steps, mean-Q aggregation, alpha = 10 (the
    paper tunes alpha per task: 10 for most OGBench locomotion mazes, up to 3e4 on Adroit).

    Evaluation protocol: the authors evaluate the one-step policy as it acts, with fresh noise
    ``z ~ N(0, I)`` at every step (``utils/evaluation.py`` calls ``sample_actions``; the
    temperature it passes is unused by FQL), over 50 episodes. ``eval_actions`` does the same
    with the noise keyed by the agent's RNG and the observation (``eval_noise='sampled'``), so
    it is deterministic for a given agent and observation; ``eval_noise='zero'`` evaluates the
    noise distribution's mode ``z = 0`` instead.
    """

    actor_lr: float = 3e-4
    """Adam learning rate of the BC flow and the one-step policy."""
    critic_lr: float = 3e-4
    """Adam learning rate of the critics."""
    actor_hidden_dims: tuple[int, ...] = (512, 512, 512, 512)
    """Hidden layer widths of the BC flow and the one-step policy."""
    critic_hidden_dims: tuple[int, ...] = (512, 512, 512, 512)
    """Hidden layer widths of the critics."""
    actor_layer_norm: bool = False
    """LayerNorm after each hidden layer of the flow and one-step networks."""
    critic_layer_norm: bool = True
    """LayerNorm after each hidden layer of the critics."""
    layer_norm_order: Literal["post_act", "pre_act"] = "post_act"
    """LayerNorm placement: 'post_act' (Dense -> act -> LN; authors) or 'pre_act' (Dense -> LN)."""
    time_embedding: Literal["raw", "sinusoidal"] = "raw"
    """Flow-time input of the velocity network: 'raw' t (the authors') or 'sinusoidal'."""
    flow_steps: int = 10
    """Euler steps integrating the BC flow (distillation targets)."""
    alpha: float = 10.0
    """Weight of the distillation term (higher = closer to the behavior policy)."""
    q_agg: Literal["mean", "min"] = "mean"
    """Aggregation of the critics in the TD target and actor loss target: 'mean' or 'min'."""
    normalize_q_loss: bool = False
    """Divide the actor's Q term by the batch's mean |Q| (scale-free alpha)."""
    eval_noise: Literal["sampled", "zero"] = "sampled"
    """Evaluation noise: 'sampled' z ~ N(0, I) keyed by the observation (authors) or 'zero'."""
    num_qs: int = 2
    """Number of critics."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self,
            *("actor_lr", "critic_lr", "actor_hidden_dims", "critic_hidden_dims", "flow_steps"),
            "num_qs",
        )
        check_generative_config(self)
        check_range(self, "alpha", 0.0, float("inf"))
        check_choice(self, "q_agg", ("mean", "min"))
        check_choice(self, "time_embedding", ("raw", "sinusoidal"))
        check_choice(self, "layer_norm_order", ("post_act", "pre_act"))
        check_choice(self, "eval_noise", ("sampled", "zero"))
