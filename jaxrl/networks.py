"""Network modules shared by every agent: MLPs, Q ensembles and actor heads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from jaxrl.distributions import TanhNormal

default_init = nn.initializers.xavier_uniform


class DenseInits(NamedTuple):
    """``MLP``'s Dense initializers (Xavier kernels, zero biases; output None: as hidden)."""

    kernel_init: Callable = default_init()
    bias_init: Callable = nn.initializers.zeros
    out_kernel_init: Callable | None = None
    out_bias_init: Callable | None = None


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

    Inputs are shared across members; outputs gain a leading axis of size ``num``. The RNG
    streams named in ``split_rngs`` differ between members (add ``"dropout"`` for independent
    dropout masks).
    """
    return nn.vmap(
        module_cls,
        variable_axes={"params": 0},
        split_rngs={name: True for name in split_rngs},
        in_axes=None,
        out_axes=0,
        axis_size=num,
    )


class EnsembleQ(nn.Module):
    """``num_qs`` independent Q-networks in one vmapped call; returns ``[num_qs, ...]``.

    ``layer_norm_order`` and ``inits`` are ``QNetwork``'s.
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
        qs = ensemble(QNetwork, self.num_qs)(
            self.hidden_dims, self.layer_norm, self.activation, self.layer_norm_order, self.inits
        )
        return qs(obs, action)


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
        mean = nn.Dense(self.action_dim, kernel_init=default_init())(h)
        log_std = nn.Dense(self.action_dim, kernel_init=default_init())(h)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (
            jnp.tanh(log_std) + 1.0
        )
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


def _adam(
    learning_rate: jax.Array, decay_steps: int | None, max_grad_norm: float | None
) -> optax.GradientTransformation:
    # The base rate stays an injected leaf (sweepable); only the decay factor is scheduled.
    if decay_steps is None:
        tx = optax.adam(learning_rate)
    else:
        cosine = optax.cosine_decay_schedule(1.0, decay_steps)
        tx = optax.adam(lambda count: learning_rate * cosine(count))
    if max_grad_norm is None:
        return tx
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)


def make_train_state(
    module: nn.Module,
    key: jax.Array,
    learning_rate: float,
    *example_inputs: jax.Array,
    cosine_decay_steps: int | None = None,
    max_grad_norm: float | None = None,
) -> TrainState:
    """Initialize ``module`` and an Adam optimizer whose learning rate is a pytree leaf.

    ``optax.inject_hyperparams`` keeps the learning rate in the optimizer state, so a vmapped
    sweep over learning rates compiles once.

    Args:
        module: the network.
        key: PRNG key of the parameter initialization.
        learning_rate: Adam step size (``opt_state.hyperparams["learning_rate"]``).
        *example_inputs: example inputs of ``module.init``.
        cosine_decay_steps: if set, the step size is multiplied by a cosine decay from 1 to 0
            over this many updates (then stays 0), as the IQL authors' actor optimizer.
        max_grad_norm: if set, gradients are clipped to this global norm before Adam
            (Diffusion-QL's ``grad_norm``).
    """
    params = module.init(key, *example_inputs)
    if cosine_decay_steps is None and max_grad_norm is None:
        tx = optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    else:
        tx = optax.inject_hyperparams(_adam, static_args=("decay_steps", "max_grad_norm"))(
            learning_rate=learning_rate, decay_steps=cosine_decay_steps, max_grad_norm=max_grad_norm
        )
    return TrainState.create(apply_fn=module.apply, params=params, tx=tx)


def hparam_leaves(config: object, *names: str) -> dict[str, jax.Array]:
    """``{name: float32(config.name)}``: the named config values as sweepable pytree leaves."""
    return {name: jnp.float32(getattr(config, name)) for name in names}


def gradient_step(state: TrainState, loss_fn: Callable, *args: object) -> tuple[TrainState, dict]:
    """One optimizer step on ``loss_fn(state.params, *args) -> (loss, info)``; returns the info.

    Every agent's per-network update is this: differentiate a loss that returns ``(loss, info)``
    with respect to one train state's parameters and apply the optimizer.
    """
    grads, info = jax.grad(loss_fn, has_aux=True)(state.params, *args)
    return state.apply_gradients(grads=grads), info
