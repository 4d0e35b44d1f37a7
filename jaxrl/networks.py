"""Network modules shared by every agent: MLPs, Q ensembles, actor heads, batch renormalization.

The optimizer helpers every agent uses with them (``make_train_state``, ``gradient_step``,
``hparam_leaves``, ``when``) live in ``jaxrl.optim`` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl.distributions import TanhNormal
from jaxrl.optim import (  # noqa: F401  (re-exported: agents call them as ``nets.*``)
    gradient_step,
    hparam_leaves,
    make_stats_train_state,
    make_train_state,
    stats_gradient_step,
    when,
)

default_init = nn.initializers.xavier_uniform
fan_in_uniform = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
"""Kernels drawn from ``U(+-1/sqrt(fan_in))``: PyTorch ``nn.Linear``'s default weights."""


class DenseInits(NamedTuple):
    """``MLP``'s Dense initializers (Xavier kernels, zero biases; output None: as hidden).

    ``fan_in_bias`` draws every bias from ``U(+-1/sqrt(fan_in))`` of its layer instead
    (PyTorch ``nn.Linear``'s default biases; a bias initializer alone does not see the fan-in).
    """

    kernel_init: Callable = default_init()
    bias_init: Callable = nn.initializers.zeros
    out_kernel_init: Callable | None = None
    out_bias_init: Callable | None = None
    fan_in_bias: bool = False


NETWORK_INITS: dict[str, DenseInits] = {
    "xavier": DenseInits(),
    "torch": DenseInits(fan_in_uniform, fan_in_bias=True),
}
"""Dense initializations by the names configs use: jaxrl's default (Xavier-uniform kernels, zero
biases) and PyTorch ``nn.Linear``'s default (kernels and biases ``U(+-1/sqrt(fan_in))``), which
the PyTorch reference code of several agents keeps."""


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "swish": nn.swish,
    "tanh": nn.tanh,
    "elu": nn.elu,
    "gelu": nn.gelu,
}
"""Activation functions by the names configs use (e.g. ``PPOConfig.activation``)."""


class MLP(nn.Module):
    """Multi-layer perceptron with optional LayerNorm in each hidden layer.

    Attributes:
        hidden_dims: widths of the layers; the last one is the output width.
        activation: nonlinearity between layers.
        layer_norm: apply LayerNorm to each hidden layer.
        activate_final: also apply norm and activation after the last layer.
        kernel_init: initializer of every Dense kernel (Xavier-uniform by default).
        layer_norm_order: where the LayerNorm goes: 'pre_act' (Dense -> LN -> act; RLPD's
            critic) or 'post_act' (Dense -> act -> LN; FQL's ``MLP`` and ReBRAC's networks).
        bias_init, out_kernel_init, out_bias_init: of every Dense bias (zeros by default), and
            of the last layer (None: as the others); ``MLP(dims, **dense_inits._asdict())``.
        fan_in_bias: draw every bias from ``U(+-1/sqrt(fan_in))`` instead (``DenseInits``).
    """

    hidden_dims: Sequence[int]
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    layer_norm: bool = False
    activate_final: bool = False
    kernel_init: Callable = default_init()
    layer_norm_order: Literal["pre_act", "post_act"] = "pre_act"
    bias_init: Callable = nn.initializers.zeros
    out_kernel_init: Callable | None = None
    out_bias_init: Callable | None = None
    fan_in_bias: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the MLP to ``x`` of shape ``[..., in_dim]``."""
        if self.layer_norm_order not in ("pre_act", "post_act"):
            raise ValueError(
                "MLP layer_norm_order must be 'pre_act' or 'post_act', got "
                f"{self.layer_norm_order!r}."
            )
        last = len(self.hidden_dims) - 1
        for i, width in enumerate(self.hidden_dims):
            kernel_init = (i == last and self.out_kernel_init) or self.kernel_init
            bias_init = (i == last and self.out_bias_init) or self.bias_init
            if self.fan_in_bias:  # U(+-1/sqrt(fan_in)) of this layer
                bound = x.shape[-1] ** -0.5
                bias_init = partial(jax.random.uniform, minval=-bound, maxval=bound)
            x = nn.Dense(width, kernel_init=kernel_init, bias_init=bias_init)(x)
            if i < last or self.activate_final:
                if self.layer_norm and self.layer_norm_order == "pre_act":
                    x = nn.LayerNorm()(x)
                x = self.activation(x)
                if self.layer_norm and self.layer_norm_order == "post_act":
                    x = nn.LayerNorm()(x)
        return x


class QNetwork(nn.Module):
    """State-action value ``Q(s, a)`` as an MLP on the concatenated input; returns ``[...]``.

    ``layer_norm_order`` ('pre_act' or 'post_act') and ``inits`` (``DenseInits``) go to ``MLP``.
    """

    hidden_dims: Sequence[int] = (256, 256)
    layer_norm: bool = False
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    layer_norm_order: Literal["pre_act", "post_act"] = "pre_act"
    inits: DenseInits = DenseInits()

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Q-value of each (obs, action) row."""
        x = jnp.concatenate([obs, action], axis=-1)
        norm = {"layer_norm": self.layer_norm, "layer_norm_order": self.layer_norm_order}
        mlp = MLP((*self.hidden_dims, 1), self.activation, **norm, **self.inits._asdict())
        return mlp(x)[..., 0]


def ensemble(
    module_cls: type[nn.Module], num: int, split_rngs: tuple[str, ...] = ("params",)
) -> type[nn.Module]:
    """Return ``module_cls`` replicated ``num`` times with independent parameters (``nn.vmap``).

    Inputs are shared across members; outputs gain a leading axis of size ``num``. Parameters and
    running statistics (``batch_stats``, ``BatchRenorm``) are per member. The RNG
    streams named in ``split_rngs`` differ between members (add ``"dropout"`` for independent
    dropout masks).
    """
    return nn.vmap(
        module_cls,
        variable_axes={"params": 0, "batch_stats": 0},
        split_rngs={name: True for name in split_rngs},
        in_axes=None,
        out_axes=0,
        axis_size=num,
    )


class EnsembleQ(nn.Module):
    """``num_qs`` independent Q-networks in one vmapped call; returns ``[num_qs, ...]``.

    ``layer_norm_order`` and ``inits`` are ``QNetwork``'s. Applied to the parameters of some of
    the members (``rl.ensemble_subset``), it evaluates only those.
    """

    hidden_dims: Sequence[int] = (256, 256)
    num_qs: int = 2
    layer_norm: bool = False
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    layer_norm_order: Literal["pre_act", "post_act"] = "pre_act"
    inits: DenseInits = DenseInits()

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        """Q-values of every ensemble member."""
        # After init the member count comes from the parameters, so a subset of them applies.
        qs = ensemble(QNetwork, self.num_qs if self.is_initializing() else None)(
            self.hidden_dims, self.layer_norm, self.activation, self.layer_norm_order, self.inits
        )
        return qs(obs, action)


class BatchRenorm(nn.Module):
    """Batch renormalization (Ioffe, 2017) as CrossQ uses it (Bhatt et al., 2024).

    Training (``use_running_average=False``) normalizes by the batch's statistics, corrected by
    ``r`` and ``d`` (gradient-free, clipped to ``r_max`` / ``d_max``) toward the running ones once
    ``warmup_steps`` training calls have passed; before that it is plain batch normalization.
    Each training call updates the running mean and variance (``batch_stats``: apply with
    ``mutable=["batch_stats"]``). Evaluation uses the running statistics only.
    """

    use_running_average: bool
    momentum: float = 0.99
    epsilon: float = 1e-3
    warmup_steps: int = 100_000
    r_max: float = 3.0
    d_max: float = 5.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalize ``x`` of shape ``[..., features]`` over its leading axes."""
        shape = (x.shape[-1],)
        ra_mean = self.variable("batch_stats", "mean", jnp.zeros, shape, jnp.float32)
        ra_var = self.variable("batch_stats", "var", jnp.ones, shape, jnp.float32)
        steps = self.variable("batch_stats", "steps", jnp.zeros, (), jnp.int32)
        scale = self.param("scale", nn.initializers.ones, shape)
        bias = self.param("bias", nn.initializers.zeros, shape)
        if self.use_running_average:
            mean, var = ra_mean.value, ra_var.value
        else:
            axes = tuple(range(x.ndim - 1))
            mean = x.mean(axes)
            var = jnp.maximum(jnp.square(x).mean(axes) - jnp.square(mean), 0.0)
            if not self.is_initializing():
                ra_std = jnp.sqrt(ra_var.value + self.epsilon)
                r = jnp.sqrt(var + self.epsilon) / ra_std
                r = jax.lax.stop_gradient(jnp.clip(r, 1.0 / self.r_max, self.r_max))
                d = jax.lax.stop_gradient(
                    jnp.clip((mean - ra_mean.value) / ra_std, -self.d_max, self.d_max)
                )
                warm = steps.value >= self.warmup_steps
                batch_mean, batch_var = mean, var
                mean = jnp.where(warm, mean - d * jnp.sqrt(var) / r, mean)
                var = jnp.where(warm, var / jnp.square(r), var)
                m = self.momentum
                ra_mean.value = m * ra_mean.value + (1.0 - m) * batch_mean
                ra_var.value = m * ra_var.value + (1.0 - m) * batch_var
                steps.value = steps.value + 1
        return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


class RenormMLP(nn.Module):
    """CrossQ's MLP: ``BatchRenorm`` on the input, then Dense -> ReLU -> ``BatchRenorm`` layers.

    ``hidden_dims`` are the hidden widths; ``out_dim`` adds a last Dense layer (None: end at the
    last hidden layer). Called with ``train`` (a Python bool): batch statistics (True, apply
    with ``mutable=["batch_stats"]``) or the running ones (False).
    """

    hidden_dims: Sequence[int]
    out_dim: int | None = None
    momentum: float = 0.99
    warmup_steps: int = 100_000

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Apply to ``[..., in_dim]``."""
        norm = partial(BatchRenorm, not train, self.momentum, warmup_steps=self.warmup_steps)
        x = norm()(x)
        for width in self.hidden_dims:
            x = norm()(nn.relu(nn.Dense(width)(x)))
        return x if self.out_dim is None else nn.Dense(self.out_dim)(x)


class TanhGaussianActor(nn.Module):
    """Gaussian policy squashed by tanh with a state-dependent standard deviation.

    The log-std is mapped smoothly into ``[log_std_min, log_std_max]`` with a tanh, which keeps
    its gradient alive at the bounds (a hard clip would not).
    """

    action_dim: int
    hidden_dims: Sequence[int] = (256, 256)
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> TanhNormal:
        """Action distribution for ``obs``."""
        h = MLP(self.hidden_dims, activate_final=True)(obs)
        return gaussian_head(h, self.action_dim, self.log_std_min, self.log_std_max)


def gaussian_head(
    h: jax.Array, action_dim: int, log_std_min: float, log_std_max: float
) -> TanhNormal:
    """Two Dense heads on features ``h``: the mean and a log-std mapped into its bounds by tanh."""
    mean = nn.Dense(action_dim, kernel_init=default_init())(h)
    log_std = nn.Dense(action_dim, kernel_init=default_init())(h)
    log_std = log_std_min + 0.5 * (log_std_max - log_std_min) * (jnp.tanh(log_std) + 1.0)
    return TanhNormal(mean, jnp.exp(log_std))


class NormalTanhPolicy(nn.Module):
    """Brax's PPO policy: one MLP emits loc and raw scale of a tanh-squashed Gaussian.

    ``scale = softplus(raw) + min_std`` (Brax ``NormalTanhDistribution``); the standard deviation
    is state-dependent and never collapses below ``min_std``.
    """

    action_dim: int
    hidden_dims: Sequence[int] = (32, 32, 32, 32)
    activation: Callable[[jax.Array], jax.Array] = nn.swish
    min_std: float = 1e-3
    kernel_init: Callable = nn.initializers.lecun_uniform()

    @nn.compact
    def __call__(self, obs: jax.Array) -> TanhNormal:
        """Action distribution for ``obs``."""
        out = MLP(
            (*self.hidden_dims, 2 * self.action_dim), self.activation, kernel_init=self.kernel_init
        )(obs)
        loc, raw_scale = jnp.split(out, 2, axis=-1)
        return TanhNormal(loc, jax.nn.softplus(raw_scale) + self.min_std)


class ValueNetwork(nn.Module):
    """State value ``V(s)`` as an MLP; returns ``[...]``."""

    hidden_dims: Sequence[int] = (256, 256)
    activation: Callable[[jax.Array], jax.Array] = nn.relu
    kernel_init: Callable = default_init()

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        """Value of each observation row."""
        mlp = MLP((*self.hidden_dims, 1), self.activation, kernel_init=self.kernel_init)
        return mlp(obs)[..., 0]


class DeterministicActor(nn.Module):
    """Deterministic policy ``a = tanh(MLP(s))`` in ``[-1, 1]`` (TD3, TD3+BC, ReBRAC).

    ``layer_norm`` adds LayerNorm to each hidden layer (ReBRAC's optional actor LN), placed by
    ``layer_norm_order`` (``MLP``'s); ``inits`` initialize the Dense layers (``DenseInits``).
    """

    action_dim: int
    hidden_dims: Sequence[int] = (256, 256)
    layer_norm: bool = False
    layer_norm_order: Literal["pre_act", "post_act"] = "pre_act"
    inits: DenseInits = DenseInits()

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        """Action for ``obs``."""
        norm = {"layer_norm": self.layer_norm, "layer_norm_order": self.layer_norm_order}
        mlp = MLP((*self.hidden_dims, self.action_dim), **norm, **self.inits._asdict())
        return jnp.tanh(mlp(obs))


class GaussianActor(nn.Module):
    """Gaussian policy with a tanh-squashed mean and a state-independent log-std (IQL, AWR).

    As in the IQL authors' code (``state_dependent_std=False, tanh_squash_distribution=False``):
    the distribution itself is an unsquashed Gaussian ``N(tanh(MLP(s)), exp(log_std)^2)``, so the
    log-likelihood of dataset actions at the ``[-1, 1]`` bounds stays finite. ``log_std`` is one
    learned vector (initialized at 0) clipped to ``[log_std_min, log_std_max]``.
    """

    action_dim: int
    hidden_dims: Sequence[int] = (256, 256)
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(mean, std)`` of the action distribution; both ``[..., action_dim]``."""
        mean = jnp.tanh(MLP((*self.hidden_dims, self.action_dim))(obs))
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        std = jnp.exp(jnp.clip(log_std, self.log_std_min, self.log_std_max))
        return mean, jnp.broadcast_to(std, mean.shape)


class Temperature(nn.Module):
    """Learnable entropy temperature ``alpha = exp(log_alpha)`` (SAC automatic tuning)."""

    initial_value: float = 1.0

    @nn.compact
    def __call__(self) -> jax.Array:
        """Current temperature."""
        log_alpha = self.param(
            "log_alpha", lambda _: jnp.full((), jnp.log(self.initial_value), jnp.float32)
        )
        return jnp.exp(log_alpha)


class FirstFeatures(nn.Module):
    """``module`` applied to the first ``size`` features of its first input.

    Asymmetric actor-critic: the observation ends with privileged features (true state, drawn
    physics; ``jaxrl.envs.privileged``) that the critic reads and the deployed actor must not.
    """

    module: nn.Module
    size: int

    def __call__(self, obs: jax.Array, *args: Any, **kwargs: Any) -> Any:
        """``module(obs[..., :size], *args, **kwargs)``."""
        return self.module(obs[..., : self.size], *args, **kwargs)


def observing(module: nn.Module, size: int) -> nn.Module:
    """``module`` reading the first ``size`` observation features, or all of them for 0."""
    if size < 0:
        raise ValueError(f"actor_observation_size must be >= 0 (0: all features), got {size}.")
    return FirstFeatures(module, size) if size else module
