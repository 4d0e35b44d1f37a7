"""PRDC: Policy Regularization with Dataset Constraint (Ran et al., 2023, arXiv:2306.06569).

TD3+BC whose behavior-cloning target is not the minibatch row's own action but the action of
the dataset row nearest to ``[beta * s, pi(s)]`` in the joint space ``{[beta * s_j, a_j]}`` of
the whole dataset: the policy may pick any action the data shows in a similar state, instead of
the one action taken in this state. The critic is TD3+BC's (clipped double Q with target policy
smoothing); the update schedule is TD3's (``td3.delayed_policy_update``).

The agent keeps the dataset's rows on the device (``rows``, a ``DatasetRows``: the registry's
``dataset_rows``), and the exact nearest-row search runs inside the jitted actor step.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct
from flax.training.train_state import TrainState

from jaxrl import rl
from jaxrl.agents import td3
from jaxrl.config import OfflineFields, check_choice, check_positive, check_range
from jaxrl.networks import (
    NETWORK_INITS,
    DeterministicActor,
    EnsembleQ,
    hparam_leaves,
    make_train_state,
)
from jaxrl.offline.common import DataNorm, DatasetRows
from jaxrl.types import Batch, InfoDict, Params

# ----------------------------------------------------------------------------------------- losses


def actor_loss(actor_params: Params, agent: PRDC, batch: Batch) -> tuple[jax.Array, InfoDict]:
    """``-lambda * E[Q_1(s, pi(s))] + E[MSE(pi(s), a_nn)]`` with ``lambda = alpha / E|Q_1|``.

    PRDC's policy objective (Ran et al., 2023, Sec. 4; the authors' ``prdc.py``): the dataset
    constraint ``d^beta_D(s, pi(s))`` is the squared error between ``pi(s)`` and the action of
    the dataset row nearest to ``[beta * s, pi(s)]``, averaged over action dimensions (as
    TD3+BC's BC term, which it replaces). Neither ``lambda`` nor the search is differentiated:
    the neighbour is a constant target, found with the current policy's actions.
    """
    actions = agent.actor.apply_fn(actor_params, batch.obs)
    q = agent.critic.apply_fn(agent.critic.params, batch.obs, actions)[0]
    lam = agent.hparams["alpha"] / jax.lax.stop_gradient(jnp.abs(q).mean())
    idx, dist = agent.rows.nearest(
        batch.obs, jax.lax.stop_gradient(actions), agent.hparams["beta"], agent.config.chunk_size
    )
    dc = rl.bc_mse(actions, agent.rows.action[idx])
    loss = -lam * q.mean() + dc
    return loss, dict(zip(_ACTOR_INFO, (loss, dc, q.mean(), lam, dist.mean()), strict=True))


# -------------------------------------------------------------------------------------- the agent


class PRDC(struct.PyTreeNode):
    """PRDC state: TD3+BC's (actor, critics, targets, step, RNG, hparams, norm) and the rows.

    ``rows`` starts as one zero row (``create`` has no dataset); ``jaxrl train`` and the scripts
    set the dataset's rows before training (``jaxrl.run.offline.with_data_norm``). A program
    that trains the agent itself sets them with ``agent.replace(rows=dataset_rows(dataset,
    agent.norm, low, high))`` (``jaxrl.offline.common``), after ``norm``.
    """

    rng: jax.Array
    actor: TrainState
    critic: TrainState
    target_actor_params: Params
    target_critic_params: Params
    step: jax.Array
    hparams: dict[str, jax.Array]
    norm: DataNorm
    rows: DatasetRows
    config: PRDCConfig = struct.field(pytree_node=False)

    def update(self, batch: Batch) -> tuple[PRDC, InfoDict]:
        """Critic step every call; actor (with the search) and targets every ``policy_delay``."""
        return td3.delayed_policy_update(
            self, self.norm.batch(batch), td3.critic_loss, actor_loss, _ACTOR_INFO
        )

    def sample_actions(self, obs: jax.Array, rng: jax.Array) -> jax.Array:
        """Deterministic action plus Gaussian exploration noise, clipped to [-1, 1]."""
        noise = self.hparams["exploration_noise"]
        return td3.exploration_actions(self.eval_actions(obs), noise, rng)

    def eval_actions(self, obs: jax.Array) -> jax.Array:
        """Deterministic actions in [-1, 1] for raw (unnormalized) observations."""
        return self.actor.apply_fn(self.actor.params, self.norm.obs(obs))

    @classmethod
    def create(
        cls,
        config: PRDCConfig,
        obs_example: jax.Array,
        action_example: jax.Array,
        seed: int | jax.Array,
    ) -> PRDC:
        """Initialize from a single (unbatched) observation and action; ``seed`` may be traced."""
        rng, k_actor, k_critic = jax.random.split(jax.random.key(seed), 3)
        obs, act = obs_example[None], action_example[None]
        obs_dim, act_dim = obs_example.shape[-1], action_example.shape[-1]
        inits = NETWORK_INITS[config.network_init]
        actor_def = DeterministicActor(act_dim, config.hidden_dims, inits=inits)
        actor = make_train_state(actor_def, k_actor, config.actor_lr, obs)
        critic_def = EnsembleQ(config.hidden_dims, config.num_qs, inits=inits)
        critic = make_train_state(critic_def, k_critic, config.critic_lr, obs, act)
        hparams = hparam_leaves(config, *_HPARAMS)
        # Targets start as copies (distinct buffers, so the whole agent can be donated to jit).
        target_actor, target_critic = jax.tree.map(jnp.copy, (actor.params, critic.params))
        norm = DataNorm.identity(obs_dim)
        rows = DatasetRows.zeros(1, obs_dim, act_dim)
        return cls(
            rng,
            actor,
            critic,
            target_actor,
            target_critic,
            jnp.int32(0),
            hparams,
            norm,
            rows,
            config,
        )


# Sweepable float leaves of ``hparams`` (copied from the config in ``create``).
_HPARAMS = ("discount", "tau", "alpha", "beta", "policy_noise", "noise_clip", "exploration_noise")
_ACTOR_INFO = ("actor/loss", "actor/dc", "actor/q", "actor/lambda", "actor/nn_sq_dist")

# ------------------------------------------------------------------------------------------ config


@partial(dataclasses.dataclass, frozen=True)
class PRDCConfig(OfflineFields):
    """PRDC hyperparameters; defaults follow Ran et al. (2023) for MuJoCo (LAMDA-RL/PRDC).

    The authors' README runs hopper and walker2d with ``alpha 2.5, beta 2.0`` and halfcheetah
    with ``alpha 40``; d3rlpy's ``PRDCConfig`` defaults to 2.5 / 2.0. The rest is TD3+BC's:
    observations standardized with the dataset's mean and std (+1e-3), the first critic in the
    actor loss, 256x256 networks.

    Where this differs from the reference:

    - The nearest row is found by an exact brute-force search on the device, inside the jitted
      update (``DatasetRows.nearest``), where the authors query a SciPy KD-tree (d3rlpy:
      scikit-learn's ``NearestNeighbors``) on the host. Both are exact, so the neighbours are
      the same up to ties and float rounding; the search costs ``O(N)`` per query instead of
      about ``O(log N)`` (at 1M hopper rows and batch 256, 7 GFLOP per actor step:
      ``benchmarks/prdc_cost.py``), but needs no host round trip per actor step, runs under
      ``scan`` and ``vmap``, and keeps ``beta`` a sweepable leaf (a KD-tree is built for one
      ``beta``). Vmapped members each hold a copy of the rows.
    - The rows are all of the loaded dataset's rows; the authors' come from
      ``d4rl.qlearning_dataset``, which drops each episode's last row at a time limit.
    - The authors' ``k`` (neighbours) is fixed at 1, as every command in their README.

    The networks start as the authors' and d3rlpy's do, from PyTorch's ``nn.Linear`` default
    (``network_init 'torch'``). jaxrl's other TD3-style agents use Xavier-uniform kernels and
    zero biases (``'xavier'``); on a hopper-medium dataset (100k steps, two seeds) PyTorch's
    start ended at 1,736 and 1,081 where Xavier's ended at 1,047 and 707 (``docs/results.md``).
    """

    actor_lr: float = 3e-4
    """Adam learning rate of the actor."""
    critic_lr: float = 3e-4
    """Adam learning rate of the twin critics."""
    num_qs: int = 2
    """Number of critics (the target takes their minimum; the actor uses the first)."""
    hidden_dims: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics."""
    network_init: Literal["torch", "xavier"] = "torch"
    """Dense layers: PyTorch's default (kernel, bias U(+-1/sqrt(fan_in))) or Xavier, zero bias."""
    policy_noise: float = 0.2
    """Std of the target policy smoothing noise (in normalized action units)."""
    noise_clip: float = 0.5
    """Clip range of the target policy smoothing noise."""
    policy_delay: int = 2
    """Critic updates per actor/target update (the nearest-row search runs in the actor step)."""
    alpha: float = 2.5
    """Weight of the Q term in the actor loss, lambda = alpha / mean|Q| (40 on halfcheetah)."""
    beta: float = 2.0
    """Weight of the observation in the search space [beta * s, a] (large: nearest state)."""
    chunk_size: int = 1024
    """Rows per step of the nearest-row search; [batch, chunk] floats should fit in L2 cache."""
    exploration_noise: float = 0.1
    """Std of the Gaussian exploration noise (online fine-tuning)."""
    normalize_observations: bool = True
    """Normalize observations with dataset mean and std (TD3+BC's state normalization)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(
            self, "actor_lr", "critic_lr", "hidden_dims", "num_qs", "policy_delay", "chunk_size"
        )
        for name in _HPARAMS[2:]:  # coefficients and noise scales: >= 0
            check_range(self, name, 0.0, float("inf"))
        check_choice(self, "network_init", tuple(NETWORK_INITS))
