"""TD-MPC2's world model (``jaxrl.agents.tdmpc2``): its networks and latent rollouts.

The networks of the authors' ``WorldModel`` for state observations (``make_modules``), the
policy prior's tanh-Gaussian head (``squashed_policy``), the model's optimizer (``adam``), the
latent rollouts MPPI plans with (``prior_actions``, ``plan_value``), the authors' model sizes
(``MODEL_SIZES``, ``Sizes``, ``sizes``) and the settings the authors derive from the env
(``heuristic_discount``, ``seed_steps``, ``tdmpc2_env_defaults``), and its two layers
(``SimNorm``, ``NormedMLP``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxrl import networks as nets
from jaxrl import rl


class SimNorm(nn.Module):
    """Simplicial normalization: a softmax over consecutive groups of ``dim`` features.

    Lavoie et al. (2022), "Simplicial Embeddings in Self-Supervised Learning"; TD-MPC2's latent
    normalization (Hansen et al., 2024, Sec. 3). The input width must be a multiple of ``dim``;
    each group of the output sums to 1.
    """

    dim: int = 8

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalize ``x`` of shape ``[..., k * dim]``."""
        if x.shape[-1] % self.dim:
            raise ValueError(
                f"SimNorm needs a feature width divisible by dim={self.dim}, got {x.shape[-1]}."
            )
        groups = x.reshape(*x.shape[:-1], -1, self.dim)
        return jax.nn.softmax(groups, axis=-1).reshape(x.shape)


class NormedMLP(nn.Module):
    """TD-MPC2's MLP (Hansen et al., 2024): hidden layers Dense -> LayerNorm -> Mish, Dense out.

    As the authors' ``layers.mlp``: weights ~ N(0, 0.02^2), zero biases, LayerNorm epsilon 1e-5;
    ``dropout`` after the first Dense layer only; ``simnorm_dim`` adds LayerNorm + ``SimNorm``
    after the output layer; ``zero_out`` starts the output kernel at zero.
    """

    hidden_dims: Sequence[int]
    out_dim: int
    simnorm_dim: int | None = None
    dropout: float = 0.0
    zero_out: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """Apply to ``[..., in_dim]``; dropout is active when ``deterministic`` is False."""
        init = nn.initializers.normal(0.02)
        for i, width in enumerate(self.hidden_dims):
            x = nn.Dense(width, kernel_init=init)(x)
            if i == 0 and self.dropout > 0:
                x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
            x = jax.nn.mish(nn.LayerNorm(epsilon=1e-5)(x))
        x = nn.Dense(self.out_dim, kernel_init=nn.initializers.zeros if self.zero_out else init)(x)
        if self.simnorm_dim is None:
            return x
        return SimNorm(self.simnorm_dim)(nn.LayerNorm(epsilon=1e-5)(x))


# The agent and its config are passed in (typed Any): importing them here would make this
# module and ``tdmpc2`` import each other.


def heuristic_discount(
    episode_length: int, denom: float = 5, lo: float = 0.95, hi: float = 0.995
) -> float:
    """The authors' discount: ``clip((L/denom - 1) / (L/denom), lo, hi)`` (0.995 for L = 1000)."""
    if episode_length <= 0:
        raise ValueError(f"episode_length must be positive, got {episode_length}.")
    frac = episode_length / denom
    return float(min(max((frac - 1.0) / frac, lo), hi))


def seed_steps(episode_length: int) -> int:
    """The authors' random-action warm-up: ``max(1000, 5 * episode_length)`` env steps."""
    return max(1000, 5 * int(episode_length))


def tdmpc2_env_defaults(config: Any, episode_length: int) -> dict[str, float | int]:
    """The settings the authors derive from the env: discount and seed (warm-up) steps.

    The registry hands this to the run setup (``AgentSpec.with_env_defaults``), which applies
    it to the fields left unset: ``discount`` None (an explicit discount is kept) and
    ``learning_starts`` at its class default.
    """
    del config
    return {
        "discount": heuristic_discount(episode_length),
        "learning_starts": seed_steps(episode_length),
    }


# -------------------------------------------------------------------------------- model sizes


class Sizes(NamedTuple):
    """The widths and counts a model size sets (``TDMPC2Config.sizes``)."""

    enc_dim: int
    mlp_dim: int
    latent_dim: int
    num_enc_layers: int
    num_q: int
    num_samples: int
    num_elites: int
    num_pi_trajs: int
    iterations: int


_MPPI = dict(num_samples=512, num_elites=64, num_pi_trajs=24, iterations=6)  # config.yaml

MODEL_SIZES: dict[int | str, Sizes] = {
    1: Sizes(256, 384, 128, 2, 2, **_MPPI),
    5: Sizes(256, 512, 512, 2, 5, **_MPPI),
    19: Sizes(1024, 1024, 768, 3, 5, **_MPPI),
    48: Sizes(1792, 1792, 768, 4, 5, **_MPPI),
    317: Sizes(4096, 4096, 1376, 5, 8, **_MPPI),
    "cpu": Sizes(64, 64, 64, 2, 2, num_samples=64, num_elites=8, num_pi_trajs=8, iterations=3),
}
"""The authors' model sizes by parameter count in millions (``common/__init__.py``,
``MODEL_SIZE``: encoder, MLP and latent widths, encoder layers, Q ensemble; the sizes leave
planning at ``config.yaml``'s), plus ``"cpu"``: a model and an MPPI budget small enough to
learn on a CPU (the learning test's; about 0.07M parameters)."""


def sizes(config: Any) -> Sizes:
    """The config's widths and counts: the fields set explicitly, the rest from its model size."""
    chosen = {name: getattr(config, name) for name in Sizes._fields}
    explicit = {name: value for name, value in chosen.items() if value is not None}
    return MODEL_SIZES[config.model_size]._replace(**explicit)


def config_problems(config: Any) -> list[str]:
    """What is wrong with a ``TDMPC2Config`` beyond single-field ranges (empty when valid)."""
    c = config
    if c.model_size not in MODEL_SIZES:
        names = ", ".join(map(str, MODEL_SIZES))
        return [f"model_size must be one of {names}, got {c.model_size!r}"]
    d = sizes(c)
    problems = [
        (d.num_q < 2, f"num_q must be >= 2 (2 random Qs are drawn), got {d.num_q}"),
        (c.num_bins < 2, f"num_bins must be >= 2, got {c.num_bins}"),
        (c.vmin >= c.vmax, "vmin must be < vmax"),
        (c.log_std_min >= c.log_std_max, "log_std_min must be < log_std_max"),
        (d.num_pi_trajs < 0, f"num_pi_trajs must be >= 0, got {d.num_pi_trajs}"),
        (d.num_pi_trajs >= d.num_samples, "num_pi_trajs must be < num_samples"),
        (d.latent_dim % c.simnorm_dim != 0, "latent_dim must be a multiple of simnorm_dim"),
    ]
    return [message for bad, message in problems if bad]


# ----------------------------------------------------------------------------------- networks


@functools.cache
def make_modules(config: Any, action_dim: int) -> dict[str, nn.Module]:
    """The networks of the authors' ``WorldModel`` for state observations, by name.

    All are ``NormedMLP`` (LayerNorm, Mish, N(0, 0.02^2) weights); encoder and dynamics end in
    LayerNorm + SimNorm; the reward and Q output layers start at zero; Q dropout on layer 1.
    """
    c, d = config, sizes(config)
    hidden = (d.mlp_dim, d.mlp_dim)
    mlp, enc_hidden = NormedMLP, (d.enc_dim,) * max(d.num_enc_layers - 1, 1)
    q_ensemble = nets.ensemble(mlp, d.num_q, split_rngs=("params", "dropout"))
    return {
        "encoder": mlp(enc_hidden, d.latent_dim, c.simnorm_dim),
        "dynamics": mlp(hidden, d.latent_dim, c.simnorm_dim),
        "reward": mlp(hidden, c.num_bins, zero_out=True),
        "termination": mlp(hidden, 1),
        "policy": mlp(hidden, 2 * action_dim),
        "qs": q_ensemble(hidden, c.num_bins, None, c.dropout, True),
    }


def squashed_policy(out: jax.Array, key: jax.Array, log_std_min: float, log_std_max: float):
    """Sample the tanh-Gaussian policy prior from its network output ``[..., 2A]``.

    The log-std is squashed smoothly into ``[log_std_min, log_std_max]`` by a tanh. Returns
    ``(action, tanh(mean), entropy, scaled_entropy)``: ``entropy = -log pi(a|z)`` with the tanh
    correction; ``scaled_entropy = -A * log N(u; mean, std)`` of the pre-tanh sample ``u``, which
    is what the authors' current ``scaled_entropy`` evaluates to (its ratio cancels the tanh term).
    """
    mean, raw = jnp.split(out, 2, axis=-1)
    log_std = log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(raw) + 1.0)
    eps = jax.random.normal(key, mean.shape, mean.dtype)
    dim = mean.shape[-1]
    gauss_lp = jnp.sum(-0.5 * eps**2 - log_std, axis=-1) - 0.5 * math.log(2 * math.pi) * dim
    action = jnp.tanh(mean + eps * jnp.exp(log_std))
    log_prob = gauss_lp - jnp.sum(jnp.log(nn.relu(1.0 - action**2) + 1e-6), axis=-1)
    return action, jnp.tanh(mean), -log_prob, -dim * gauss_lp


def adam(
    learning_rate: jax.Array, enc_lr_scale: jax.Array, max_grad_norm: float, eps: float = 1e-8
) -> optax.GradientTransformation:
    """Adam with a global-norm clip and the encoder's updates scaled by ``enc_lr_scale``.

    Adam's step is linear in its rate, so scaling the encoder's updates is the authors' encoder
    parameter group at ``lr * enc_lr_scale``; the norm clip covers all parameters.
    """
    encoder_only = lambda params: {name: name == "encoder" for name in params}  # noqa: E731
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adam(learning_rate, eps=eps),
        optax.masked(optax.scale(enc_lr_scale), encoder_only),
    )


# ------------------------------------------------------------------------------ latent rollouts


def prior_actions(agent: Any, z: jax.Array, key: jax.Array) -> jax.Array:
    """``num_pi_trajs`` action sequences ``[N, H, A]`` of the policy prior rolled out from ``z``."""
    params, c = agent.model.params, agent.config
    num_pi_trajs = sizes(c).num_pi_trajs

    def prior_step(z: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        a = agent.act_prior(agent.policy.params, z, key)[0]
        return agent.next(params, z, a), a

    z_pi = jnp.broadcast_to(z, (num_pi_trajs, *z.shape))
    _, actions = jax.lax.scan(prior_step, z_pi, jax.random.split(key, c.horizon))
    return actions.swapaxes(0, 1)


def plan_value(agent: Any, z: jax.Array, actions: jax.Array, key: jax.Array) -> jax.Array:
    """Discounted predicted rewards + discount^H * Q(z_H, pi(z_H)) (2 random Qs' mean).

    The value by which MPPI ranks the action sequences ``actions [n, H, A]`` from latent ``z``;
    returns ``[n]``.
    """
    params, c, m = agent.model.params, agent.config, agent.modules
    gamma = agent.hparams["discount"]

    def model_step(carry: tuple, a: jax.Array) -> tuple[tuple, None]:
        zt, ret, discount, done = carry
        za = jnp.concatenate([zt, a], axis=-1)
        reward = rl.two_hot_inv(m["reward"].apply(params["reward"], za), c.vmin, c.vmax)
        zt = agent.next(params, zt, a)
        ret = ret + discount * (1.0 - done) * reward
        if c.episodic:  # a predicted termination (sigmoid > 0.5) ends the return
            logit = m["termination"].apply(params["termination"], zt)[..., 0]
            done = jnp.maximum(done, logit > 0)
        return (zt, ret, discount * gamma, done), None

    n = actions.shape[0]
    carry = (jnp.broadcast_to(z, (n, *z.shape)), jnp.zeros(n), jnp.ones(()), jnp.zeros(n))
    (zt, ret, discount, done), _ = jax.lax.scan(model_step, carry, actions.swapaxes(0, 1))
    k_a, k_pair = jax.random.split(key)
    a = agent.act_prior(agent.policy.params, zt, k_a)[0]
    return ret + discount * (1.0 - done) * agent.q_value(params["qs"], zt, a, k_pair, "avg")


__all__ = [
    "MODEL_SIZES",
    "Sizes",
    "adam",
    "config_problems",
    "heuristic_discount",
    "make_modules",
    "plan_value",
    "prior_actions",
    "seed_steps",
    "sizes",
    "squashed_policy",
    "tdmpc2_env_defaults",
]
