"""Proximal Policy Optimization (Schulman et al., 2017, arXiv:1707.06347) for vectorized JAX envs.

Brax-style: separate policy and value networks, a tanh-squashed Gaussian policy, several epochs
of shuffled minibatch SGD over ``unroll_length`` segments of the rollout, and GAE computed per
minibatch on its segments with the current value network (Brax's ``compute_ppo_loss``). One
``update`` consumes a whole time-major ``Rollout`` and is pure, so the fused loop can scan, jit
and vmap it.

On-policy protocol (``PPO.on_policy``): the loop collects ``rollout_length(num_envs)`` steps of
every env with ``policy_step`` (which also returns the ``extras`` the update needs), then calls
``update`` once. Observation normalization is the loop's job (``PPOConfig.normalize_observations``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import rl
from jaxrl.buffers import split_rows
from jaxrl.config import ConfigError, check_choice, check_positive, check_range
from jaxrl.networks import (
    ACTIVATIONS,
    NormalTanhPolicy,
    ValueNetwork,
    make_train_state,
    observing,
)
from jaxrl.types import InfoDict, Params, Rollout

__all__ = ["PPO", "PPOConfig", "Rollout", "gae_minibatch", "policy_loss", "value_loss"]
__all__ += ["rollout_segments", "sgd_epochs"]  # the epochs and segments ReinFlow's PPO shares


# ----------------------------------------------------------------------------------------- losses


def policy_loss(
    policy_params: Params, agent: PPO, batch: dict[str, jax.Array], key: jax.Array
) -> tuple[jax.Array, InfoDict]:
    """Clipped surrogate, PPO eq. 7, minus ``entropy_cost`` times the entropy (PPO eq. 9).

    Ratios use the log-density of the stored pre-tanh action, as in Brax; the entropy of the
    squashed Gaussian is the closed-form Gaussian entropy plus a one-sample log-det estimate.
    """
    hp = agent.hparams
    dist = agent.policy.apply_fn(policy_params, batch["obs"])
    log_ratio = dist.log_prob_raw(batch["raw_action"]) - batch["log_prob"]
    ratio = jnp.exp(log_ratio)
    adv = batch["advantage"]
    if agent.config.normalize_advantage:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = jnp.mean(rl.ppo_clipped_objective(ratio, adv, hp["clip_eps"]))
    entropy = jnp.mean(dist.squashed_entropy_estimate(key))
    loss = -surrogate - hp["entropy_cost"] * entropy
    return loss, {
        "policy/loss": -surrogate,
        "policy/entropy": entropy,
        "policy/approx_kl": jnp.mean(ratio - 1.0 - log_ratio),  # Schulman's k3 estimator
        "policy/clip_frac": jnp.mean(jnp.abs(ratio - 1.0) > hp["clip_eps"]),
        "policy/std": jnp.mean(dist.scale),
    }


def value_loss(
    value_params: Params, agent: PPO, batch: dict[str, jax.Array]
) -> tuple[jax.Array, InfoDict]:
    """Squared error to the GAE value targets (PPO eq. 9, ``L^VF``), ``0.5 * vf_coef * mean``."""
    values = agent.value.apply_fn(value_params, batch["obs"])
    loss = agent.hparams["vf_coef"] * jnp.mean(optax.losses.squared_error(values, batch["return"]))
    return 0.5 * loss, {"value/loss": 0.5 * loss, "value/mean": values.mean()}


def gae_minibatch(agent: PPO, segments: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Value targets and advantages of ``[B, unroll_length]`` segments, flattened to rows.

    As Brax's ``compute_ppo_loss``: GAE runs over each segment with the current value network,
    bootstrapped from ``V`` of the segment's last next observation (``rl.gae_value_targets``).
    """
    hp, value = agent.hparams, agent.value
    values = value.apply_fn(value.params, segments["obs"])
    if agent.config.bootstrap_truncated:
        next_values = value.apply_fn(value.params, segments["next_obs"])
    else:  # values[t + 1] is V(next_obs[t]) wherever the episode goes on
        last = value.apply_fn(value.params, segments["next_obs"][:, -1])
        next_values = jnp.concatenate([values[:, 1:], last[:, None]], axis=1)
    time_major = [x.T for x in (values, next_values, segments["terminated"])]
    returns, advantages = rl.gae_value_targets(
        segments["reward"].T * hp["reward_scaling"],
        *time_major,
        segments["truncated"].T,
        hp["discount"],
        hp["gae_lambda"],
        agent.config.bootstrap_truncated,
    )
    rows = {k: v for k, v in segments.items() if k not in _GAE_INPUTS}
    rows |= {"advantage": advantages.T, "return": returns.T, "value": values}
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), rows)


_GAE_INPUTS = ("next_obs", "reward", "terminated", "truncated")


def rollout_segments(data: dict[str, jax.Array], unroll: int) -> dict[str, jax.Array]:
    """``[T, N, ...]`` arrays as ``[T * N / unroll, unroll, ...]`` segments of one env's steps."""

    def cut(x: jax.Array) -> jax.Array:
        num_steps, num_envs = x.shape[:2]
        x = x.reshape(num_steps // unroll, unroll, num_envs, *x.shape[2:])
        return jnp.swapaxes(x, 1, 2).reshape(-1, unroll, *x.shape[3:])

    return jax.tree.map(cut, data)


def sgd_epochs(
    step: Callable, carry: Any, data: Any, key: jax.Array, num_epochs: int, num_minibatches: int
) -> tuple[Any, InfoDict]:
    """``num_epochs`` passes of ``step((carry, key), minibatch) -> ((carry, key), info)``.

    Each epoch shuffles ``data``'s rows (segments) into ``num_minibatches`` minibatches and
    scans ``step`` over them; info is stacked ``[num_epochs, num_minibatches]``.
    """
    n = jax.tree.leaves(data)[0].shape[0]

    def epoch(carry, key):
        k_perm, k_steps = jax.random.split(key)
        perm = jax.random.permutation(k_perm, n)
        shuffled = jax.tree.map(lambda x: x[perm].reshape(num_minibatches, -1, *x.shape[1:]), data)
        shuffled = split_rows(shuffled, 1)  # each device its share of every minibatch
        (carry, _), info = jax.lax.scan(step, (carry, k_steps), shuffled)
        return carry, info

    return jax.lax.scan(epoch, carry, jax.random.split(key, num_epochs))


def _apply(state: TrainState, grads: Params, lr_frac: jax.Array) -> TrainState:
    # Adam's step is linear in the learning rate, so scaling it anneals the injected rate
    # without a second copy of that rate.
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    updates = jax.tree.map(lambda u: lr_frac * u, updates)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


# -------------------------------------------------------------------------------------- the agent


class PPO(struct.PyTreeNode):
    """PPO state: policy and value networks with optimizers, RNG, hyperparameters, update count.

    Sweepable leaves: the learning rates in ``policy.opt_state`` / ``value.opt_state``
    (``optax.inject_hyperparams``) and ``hparams`` (``clip_eps``, ``entropy_cost``, ``vf_coef``,
    ``gae_lambda``, ``discount``, ``reward_scaling``, ``max_grad_norm`` (inf = off),
    ``anneal_lr_steps`` (inf = off)).
    """

    on_policy: ClassVar[bool] = True

    rng: jax.Array
    policy: TrainState
    value: TrainState
    hparams: dict[str, jax.Array]
    num_updates: jax.Array
    config: PPOConfig = struct.field(pytree_node=False)

    def rollout_length(self, num_envs: int) -> int:
        """Env steps per env between updates; see ``PPOConfig.rollout_length``."""
        return self.config.rollout_length(num_envs)

    def policy_step(self, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Sample actions in [-1, 1] for ``obs [N, obs_dim]`` and the extras ``update`` needs.

        Returns:
            ``(action [N, act_dim], {"raw_action": [N, act_dim], "log_prob": [N]})``: the pre-tanh
            sample and the behaviour policy's log-density of the action.
        """
        dist = self.policy.apply_fn(self.policy.params, obs)
        raw_action, log_prob = dist.sample_raw_and_log_prob(key)
        return jnp.tanh(raw_action), {"raw_action": raw_action, "log_prob": log_prob}

    def update(self, rollout: Rollout) -> tuple[PPO, InfoDict]:
        """``num_updates_per_batch`` epochs of minibatch SGD over ``unroll_length`` segments.

        As Brax's PPO: the ``[T, N]`` rollout is cut into ``T * N / unroll_length`` segments;
        each epoch shuffles them and splits them into ``num_minibatches`` minibatches of
        ``batch_size`` segments. Each minibatch step computes GAE on its segments with the
        current value network (``gae_minibatch``), then takes one gradient step; policy and
        value gradients are clipped together to ``max_grad_norm`` (``optax.clip_by_global_norm``
        over both, as Brax's joint parameters). Info values are means over all steps.
        """
        cfg, hp = self.config, self.hparams
        num_steps, num_envs = rollout.reward.shape
        n, unroll = num_steps * num_envs, cfg.unroll_length
        if num_steps % unroll or (n // unroll) % cfg.num_minibatches:
            raise ValueError(
                f"The rollout holds {num_steps} x {num_envs} = {n} transitions, which do not split "
                f"into segments of unroll_length={unroll} and num_minibatches="
                f"{cfg.num_minibatches}; collect rollout_length(num_envs) steps per env."
            )
        data = {
            "obs": rollout.obs,
            "next_obs": rollout.next_obs,
            "raw_action": rollout.extras["raw_action"],
            "log_prob": rollout.extras["log_prob"],
            "reward": rollout.reward,
            "terminated": rollout.terminated,
            "truncated": rollout.truncated,
        }

        data = rollout_segments(data, unroll)
        # Linear annealing over env steps, constant within one update (CleanRL's schedule).
        done_steps = self.num_updates.astype(jnp.float32) * n
        lr_frac = jnp.clip(1.0 - done_steps / hp["anneal_lr_steps"], 0.0, 1.0)
        clip = optax.clip_by_global_norm(hp["max_grad_norm"])  # inf = off

        def minibatch_step(carry, segments):
            (policy, value), key = carry
            key, k_entropy = jax.random.split(key)
            agent = self.replace(policy=policy, value=value)
            batch = gae_minibatch(agent, segments)
            p_grads, p_info = jax.grad(policy_loss, has_aux=True)(
                policy.params, agent, batch, k_entropy
            )
            v_grads, v_info = jax.grad(value_loss, has_aux=True)(value.params, agent, batch)
            grads = (p_grads, v_grads)
            norm = optax.tree.norm(grads)
            (p_grads, v_grads), _ = clip.update(grads, clip.init(grads))
            policy, value = _apply(policy, p_grads, lr_frac), _apply(value, v_grads, lr_frac)
            returns = batch["return"]
            explained = 1.0 - jnp.var(returns - batch["value"]) / (jnp.var(returns) + 1e-8)
            info = {**p_info, **v_info, "ppo/grad_norm": norm}
            return ((policy, value), key), info | {"value/explained_variance": explained}

        rng, k_epochs = jax.random.split(self.rng)
        (policy, value), info = sgd_epochs(
            minibatch_step,
            (self.policy, self.value),
            data,
            k_epochs,
            cfg.num_updates_per_batch,
            cfg.num_minibatches,
        )
        info = jax.tree.map(jnp.mean, info)
        info["ppo/learning_rate"] = lr_frac * policy.opt_state.hyperparams["learning_rate"]
        agent = self.replace(rng=rng, policy=policy, value=value, num_updates=self.num_updates + 1)
        return agent, info

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions (tanh of the mean) in [-1, 1]."""
        return self.policy.apply_fn(self.policy.params, obs).mode()

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Stochastic actions in [-1, 1]."""
        return self.policy.apply_fn(self.policy.params, obs).sample(rng)

    @classmethod
    def create(
        cls, config: PPOConfig, obs_example: jax.Array, action_example: jax.Array, seed: int
    ) -> PPO:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_policy, k_value = jax.random.split(jax.random.key(seed), 3)
        obs = obs_example[None]
        act = ACTIVATIONS[config.activation]
        init = nn.initializers.lecun_uniform()
        policy_def = observing(
            NormalTanhPolicy(
                action_example.shape[-1], config.policy_hidden_dims, act, kernel_init=init
            ),
            config.actor_observation_size,
        )
        value_def = ValueNetwork(config.value_hidden_dims, act, kernel_init=init)
        policy = make_train_state(policy_def, k_policy, config.learning_rate, obs)
        value = make_train_state(value_def, k_value, config.learning_rate, obs)
        inf = float("inf")
        hparams = {
            "clip_eps": config.clip_eps,
            "entropy_cost": config.entropy_cost,
            "vf_coef": config.vf_coef,
            "gae_lambda": config.gae_lambda,
            "discount": config.discount,
            "reward_scaling": config.reward_scaling,
            "max_grad_norm": inf if config.max_grad_norm is None else config.max_grad_norm,
            "anneal_lr_steps": inf if config.anneal_lr_steps is None else config.anneal_lr_steps,
        }
        hparams = {k: jnp.float32(v) for k, v in hparams.items()}
        return cls(rng, policy, value, hparams, jnp.zeros((), jnp.int32), config)


# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class PPOConfig:
    """PPO hyperparameters; defaults follow Brax's PPO for locomotion, sized for 1-64 CPU envs.

    An update consumes batch_size * num_minibatches unrolls (5 * 64 * 16 = 5120 transitions by
    default, minibatches of 320), so num_envs must divide batch_size * num_minibatches (1024: any
    power of two up to 1024). With 64 envs, each env runs 16 unrolls (80 steps) per update, as in
    Brax's ant and inverted_pendulum settings; Brax's minibatches are far larger (GPU).
    """

    learning_rate: float = 3e-4
    """Adam learning rate of the policy and value networks."""
    anneal_lr_steps: int | None = None
    """Linearly anneal the learning rate to 0 over this many env steps; None = constant (Brax)."""
    max_grad_norm: float | None = None
    """Clip the joint policy+value gradient to this global norm; None = no clipping (Brax)."""
    entropy_cost: float = 1e-2
    """Weight of the entropy bonus in the policy loss."""
    vf_coef: float = 0.5
    """Value-loss coefficient; the value loss is 0.5 * vf_coef * mean squared error (Brax)."""
    clip_eps: float = 0.3
    """Clipping range epsilon of the probability ratio (Brax's default; the paper uses 0.2)."""
    discount: float = 0.97
    """Discount factor gamma."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    bootstrap_truncated: bool = False
    """Bootstrap time-limit steps from V(final obs) (one more value pass); False = Brax: dropped."""
    reward_scaling: float = 1.0
    """Multiply rewards by this before GAE (Brax uses 10 for some envs)."""
    normalize_advantage: bool = True
    """Standardize advantages within each minibatch."""
    normalize_observations: bool = True
    """The training loop normalizes observations with running statistics (not done by the agent)."""
    unroll_length: int = 5
    """Steps per unroll, Brax's unit of data and GAE's horizon (5 locomotion, 20-30 dm_control)."""
    batch_size: int = 64
    """Minibatch size in unrolls: each gradient step sees batch_size * unroll_length transitions."""
    num_minibatches: int = 16
    """Minibatches (gradient steps) per epoch (Brax uses 32 with far larger batches)."""
    num_updates_per_batch: int = 4
    """Epochs of minibatch SGD over each rollout."""
    policy_hidden_dims: tuple[int, ...] = (32, 32, 32, 32)
    """Hidden layer widths of the policy network."""
    value_hidden_dims: tuple[int, ...] = (256, 256, 256, 256, 256)
    """Hidden layer widths of the value network."""
    activation: Literal["swish", "relu", "tanh", "elu", "gelu"] = "swish"
    """Hidden activation of both networks."""
    actor_observation_size: int = 0
    """The policy sees the first N observation features, the value function all (0: all); `jaxrl
    train` sets it for envs with privileged=true (asymmetric actor-critic)."""

    def rollout_length(self, num_envs: int) -> int:
        """Env steps per env collected before each update (Brax's rule).

        ``unroll_length * batch_size * num_minibatches // num_envs``, so that one rollout holds
        ``batch_size * num_minibatches`` segments of ``unroll_length`` steps.

        Raises:
            ConfigError: if ``num_envs`` does not divide ``batch_size * num_minibatches``.
        """
        segments = self.batch_size * self.num_minibatches
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs <= 0:
            raise ConfigError(f"num_envs must be a positive integer, got {num_envs!r}.")
        if segments % num_envs:
            raise ConfigError(
                f"PPO needs batch_size * num_minibatches ({self.batch_size} * "
                f"{self.num_minibatches} = {segments}) to be divisible by num_envs ({num_envs}); "
                f"choose --num-envs dividing {segments}, or set --batch-size / --num-minibatches "
                f"so that their product is a multiple of {num_envs}."
            )
        return self.unroll_length * segments // num_envs

    def __post_init__(self) -> None:
        check_positive(
            self,
            "learning_rate",
            "anneal_lr_steps",
            "max_grad_norm",
            "vf_coef",
            "clip_eps",
            "reward_scaling",
            "unroll_length",
            "batch_size",
            "num_minibatches",
            "num_updates_per_batch",
            "policy_hidden_dims",
            "value_hidden_dims",
        )
        check_range(self, "entropy_cost", 0.0, float("inf"))
        check_range(self, "discount", 0.0, 1.0)
        check_range(self, "gae_lambda", 0.0, 1.0)
        check_choice(self, "activation", sorted(ACTIVATIONS))
