"""Twin Delayed DDPG (Fujimoto et al., 2018, arXiv:1802.09477).

The delayed actor/target update is decided inside ``update`` from a step counter in the state,
so the training loop treats TD3 exactly like any other agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import networks as nets
from jaxrl import rl
from jaxrl.config import OffPolicyFields, check_choice, check_positive, check_range
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def target_values(agent: Any, next_obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Smoothed target actions ``a'`` and clipped double-Q values ``min_i Q'_i(s', a')``.

    TD3 paper, eqs. 10 and 14; shared by the TD3-based agents (TD3+BC, ReBRAC), whose ``agent``
    has TD3's target networks and ``policy_noise`` / ``noise_clip`` hyperparameters.
    """
    next_actions = rl.smoothed_target_actions(
        key,
        agent.actor.apply_fn(agent.target_actor_params, next_obs),
        agent.hparams["policy_noise"],
        agent.hparams["noise_clip"],
    )
    next_qs = agent.critic.apply_fn(agent.target_critic_params, next_obs, next_actions)
    return next_actions, rl.min_over_ensemble(next_qs)


def critic_loss(
    critic_params: Params, agent: TD3, batch: Batch, key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Clipped double-Q regression with target policy smoothing (TD3 paper, eqs. 10 and 14)."""
    _, next_v = target_values(agent, batch.next_obs, key)
    target = jax.lax.stop_gradient(
        rl.td_target(batch.reward, batch.terminal, next_v, agent.hparams["discount"])
    )
    qs = agent.critic.apply_fn(critic_params, batch.obs, batch.action)
    loss = rl.ensemble_td_loss(qs, target)
    return loss, {"critic/loss": loss, "critic/q_mean": qs.mean(), "critic/target": target.mean()}


def actor_loss(actor_params: Params, agent: TD3, batch: Batch) -> tuple[jax.Array, InfoDict]:
    """Deterministic policy gradient through the first critic: ``-E[Q_1(s, pi(s))]``."""
    actions = agent.actor.apply_fn(actor_params, batch.obs)
    q1 = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)[0]
    loss = -q1.mean()
    return loss, {"actor/loss": loss}


def exploration_actions(actions: jax.Array, std: jax.Array, rng: jax.Array) -> jax.Array:
    """``actions`` plus Gaussian noise of scale ``std``, clipped to [-1, 1] (TD3's exploration).

    Shared by TD3 and the deterministic offline actors that fine-tune online (TD3+BC, ReBRAC,
    PRDC, A2PR).
    """
    return jnp.clip(actions + std * jax.random.normal(rng, actions.shape), -1.0, 1.0)


def delayed_policy_update(
    agent: Any,
    batch: Batch,
    critic_loss_fn: Callable,
    actor_loss_fn: Callable,
    actor_info_keys: tuple[str, ...],
    between: Callable | None = None,
) -> tuple[Any, InfoDict]:
    """TD3's update schedule, shared by TD3, TD3+BC/ReBRAC and A2PR (Fujimoto et al., 2018, 5.2).

    A critic step on ``critic_loss_fn(params, agent, batch, key)`` every call, then
    ``between(agent, batch, key) -> (agent, info)`` when given (steps of other networks that read
    the new critics, with the critic step's ``key``: A2PR's value and VAE); every
    ``config.policy_delay`` calls an actor step on ``actor_loss_fn(params, agent, batch)``
    followed by the Polyak update of both target networks. On calls without an actor step the
    ``actor_info_keys`` are reported as NaN (so scanned infos keep one structure).

    ``agent`` needs the fields ``rng``, ``actor``, ``critic``, ``target_actor_params``,
    ``target_critic_params``, ``step`` and ``hparams["tau"]``.

    Under ``jax.vmap`` over agents (vmapped seeds, sweeps) ``step`` is batched, and JAX turns
    the ``lax.cond`` into a ``select`` that runs the actor step on every call and keeps it only
    when due: the results are the same, the actor's cost is paid every call. The loops run a
    single agent unbatched, so a one-seed run skips it.
    """
    rng, key = jax.random.split(agent.rng)
    critic, info = nets.gradient_step(agent.critic, critic_loss_fn, agent, batch, key)
    agent = agent.replace(rng=rng, critic=critic)
    if between is not None:
        agent, between_info = between(agent, batch, key)
        info = {**info, **between_info}

    def delayed(agent: Any) -> tuple[Any, InfoDict]:
        actor, actor_info = nets.gradient_step(agent.actor, actor_loss_fn, agent, batch)
        tau = agent.hparams["tau"]
        return agent.replace(
            actor=actor,
            target_actor_params=rl.polyak_update(actor.params, agent.target_actor_params, tau),
            target_critic_params=rl.polyak_update(
                agent.critic.params, agent.target_critic_params, tau
            ),
        ), actor_info

    def skip(agent: Any) -> tuple[Any, InfoDict]:
        return agent, {k: jnp.float32(jnp.nan) for k in actor_info_keys}

    do_actor = (agent.step + 1) % agent.config.policy_delay == 0
    agent, actor_info = jax.lax.cond(do_actor, delayed, skip, agent)
    return agent.replace(step=agent.step + 1), {**info, **actor_info}


# -------------------------------------------------------------------------------------- the agent


class TD3(struct.PyTreeNode):
    """TD3 state: actor, twin critics, their targets, a step counter, RNG, hyperparameters."""

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    target_actor_params: Params
    target_critic_params: Params
    step: jax.Array
    hparams: dict[str, jax.Array]
    config: TD3Config = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[TD3, InfoDict]:
        """Critic step every call; actor and target step every ``policy_delay`` calls."""
        return delayed_policy_update(self, batch, critic_loss, actor_loss, ("actor/loss",))

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Deterministic action plus Gaussian exploration noise, clipped to [-1, 1]."""
        actions = self.actor.apply_fn(self.actor.params, obs)
        return exploration_actions(actions, self.hparams["exploration_noise"], rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions in [-1, 1]."""
        return self.actor.apply_fn(self.actor.params, obs)

    @classmethod
    def create(
        cls, config: TD3Config, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> TD3:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic = jax.random.split(jax.random.key(seed), 3)
        obs, act = obs_example[None], action_example[None]
        inits = nets.NETWORK_INITS[config.network_init]
        actor_def = nets.observing(
            nets.DeterministicActor(action_example.shape[-1], config.hidden_dims, inits=inits),
            config.actor_observation_size,
        )
        actor = nets.make_train_state(actor_def, k_actor, config.actor_lr, obs)
        critic_def = nets.EnsembleQ(config.hidden_dims, config.num_qs, inits=inits)
        critic = nets.make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        hparams = nets.hparam_leaves(
            config, "discount", "tau", "policy_noise", "noise_clip", "exploration_noise"
        )
        # Targets start as copies (distinct buffers, so the whole agent can be donated to jit).
        target_actor, target_critic = jax.tree.map(jnp.copy, (actor.params, critic.params))
        return cls(rng, actor, critic, target_actor, target_critic, jnp.int32(0), hparams, config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class TD3Config(OffPolicyFields):
    """TD3 hyperparameters; defaults follow the authors' reference code for MuJoCo.

    One deviation: the networks start from Xavier-uniform kernels and zero biases, where the
    authors' code keeps PyTorch's ``nn.Linear`` default (``network_init 'torch'``); jaxrl's TD3
    results and learning test were measured with Xavier's.
    """

    learning_starts: int = 25_000  # the authors' start_timesteps
    exploration_noise: float = 0.1
    """Std of the Gaussian exploration noise."""

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics."""
    num_qs: int = 2
    """Number of critics (the target takes their minimum)."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    network_init: Literal["xavier", "torch"] = "xavier"
    """Xavier-uniform kernels and zero biases, or PyTorch nn.Linear's default (the authors')."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise (in normalized action units)."""
    noise_clip: float = 0.5
    """Clip range of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic updates per actor/target update."""
    actor_observation_size: int = 0
    """The actor sees the first N observation features, the critic all (0: all); `jaxrl train` sets
    it for envs with privileged=true (asymmetric actor-critic)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self, "actor_lr", "critic_lr", "hidden_dims", "num_qs", "policy_delay")
        for name in ("policy_noise", "noise_clip", "exploration_noise"):
            check_range(self, name, 0.0, float("inf"))
        check_choice(self, "network_init", tuple(nets.NETWORK_INITS))
