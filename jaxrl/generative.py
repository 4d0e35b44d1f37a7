"""Generative action models shared by the diffusion and flow agents (IDQL, Diffusion-QL, FQL).

Two model families, each a network plus pure training/sampling functions:

- **Diffusion (DDPM).** ``DenoiserNet`` predicts the noise ``eps`` added to an action at diffusion
  step ``t`` (Ho et al., 2020); ``vp_schedule`` is the variance-preserving beta schedule of
  Diffusion-QL / IDQL; ``ddpm_sample`` runs IDQL's ancestral sampler (the iterate clipped,
  variance ``beta_t``) and ``ddpm_posterior_sample`` Diffusion-QL's (the predicted ``x_0``
  clipped, the posterior mean and variance ``beta~_t``).
- **Flow matching.** The same network class predicts a velocity ``v(x_t, t)`` along the straight
  path from noise to action (Lipman et al., 2023; FQL's ``ActorVectorField``); ``euler_sample``
  integrates it with a fixed number of Euler steps.

Every sampler takes a fixed, static number of steps and a PRNG key, so it runs inside ``jit``,
``vmap`` and ``scan`` and returns the same actions for the same key. Samplers take the network as a
closure ``fn(x, t) -> eps | velocity`` (observations and parameters already bound), which keeps them
independent of how an agent stores its parameters and lets Diffusion-QL differentiate through them.
The step loops are rolled ``lax.scan``s: XLA compiles one step, not one per step (unrolled, an
update that differentiates through the chain took about twice as long to compile on CPU, and no
less time to run).
``map_rows`` makes a sampling policy deterministic by seeding its noise with each observation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.training.train_state import TrainState

from jaxrl.networks import MLP, default_init, make_train_state

DenoiseFn = Callable[[jax.Array, jax.Array], jax.Array]
"""``fn(x, t) -> prediction``: ``x`` ``[..., action_dim]``, ``t`` ``[..., 1]`` (step or time)."""


def mish(x: jax.Array) -> jax.Array:
    """Mish activation ``x * tanh(softplus(x))`` (the diffusion policies' nonlinearity)."""
    return x * jnp.tanh(jax.nn.softplus(x))


def sinusoidal_embedding(t: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
    """Transformer-style embedding of ``t`` (``[..., 1]``) into ``[..., dim]`` sines and cosines.

    Frequencies are geometric from 1 down to ``1 / max_period`` (Vaswani et al., 2017), so both
    integer diffusion steps and flow times in ``[0, 1]`` get distinct, smooth codes.
    """
    if dim % 2:
        raise ValueError(f"sinusoidal_embedding needs an even dim, got {dim}.")
    half = dim // 2
    freqs = jnp.exp(-jnp.log(max_period) * jnp.arange(half, dtype=jnp.float32) / max(half - 1, 1))
    args = t.astype(jnp.float32) * freqs
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)


class ResidualBlock(nn.Module):
    """Pre-LayerNorm residual MLP block ``x + W2 act(W1 LN(dropout(x)))`` with a 4x wide middle.

    IDQL's ``MLPResNetBlock`` (Hansen-Estruch et al., 2023, LN-ResNet).
    """

    width: int
    activation: Callable[[jax.Array], jax.Array] = mish
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        """Apply the block; dropout is active only when ``train``."""
        h = x
        if self.dropout_rate > 0.0:
            h = nn.Dropout(self.dropout_rate, deterministic=not train)(h)
        h = nn.LayerNorm()(h)
        h = nn.Dense(4 * self.width, kernel_init=default_init())(h)
        h = nn.Dense(self.width, kernel_init=default_init())(self.activation(h))
        return x + h


class DenoiserNet(nn.Module):
    """``f(s, x_t, t)``: the noise (DDPM) or velocity (flow) at a point ``x_t`` of the action path.

    Attributes:
        out_dim: action dimension.
        hidden_dims: layer widths ('mlp') or, for 'ln_resnet', one residual block per entry (all
            entries must be equal: the residual stream has one width).
        architecture: 'mlp' (Diffusion-QL, FQL) or 'ln_resnet' (IDQL's LayerNorm residual net).
        time_embedding: 'sinusoidal' (embedding followed by a small mish MLP, as the diffusion
            papers) or 'raw' (``t`` concatenated as is, as FQL).
        time_dim: width of the sinusoidal time code.
        layer_norm: LayerNorm on each hidden layer of the 'mlp' variant.
        layer_norm_order: 'pre_act' (Dense -> LN -> act) or 'post_act' (Dense -> act -> LN, FQL).
        dropout_rate: dropout inside the residual blocks during training ('ln_resnet').
        activation: hidden nonlinearity.
    """

    out_dim: int
    hidden_dims: Sequence[int] = (256, 256, 256)
    architecture: Literal["mlp", "ln_resnet"] = "mlp"
    time_embedding: Literal["sinusoidal", "raw"] = "sinusoidal"
    time_dim: int = 16
    layer_norm: bool = False
    dropout_rate: float = 0.0
    activation: Callable[[jax.Array], jax.Array] = mish
    layer_norm_order: Literal["pre_act", "post_act"] = "pre_act"

    @nn.compact
    def __call__(
        self, obs: jax.Array, x: jax.Array, t: jax.Array, train: bool = False
    ) -> jax.Array:
        """Prediction ``[..., out_dim]`` for observations, noisy actions and times ``[..., 1]``."""
        if self.time_embedding == "sinusoidal":
            temb = sinusoidal_embedding(t, self.time_dim)
            temb = MLP((2 * self.time_dim, self.time_dim), self.activation)(temb)
        else:
            temb = t.astype(jnp.float32)
        h = jnp.concatenate([x, temb, obs], axis=-1)
        if self.architecture == "mlp":
            mlp = MLP(
                (*self.hidden_dims, self.out_dim),
                self.activation,
                self.layer_norm,
                layer_norm_order=self.layer_norm_order,
            )
            return mlp(h)
        width = self.hidden_dims[0]
        h = nn.Dense(width, kernel_init=default_init())(h)
        for _ in self.hidden_dims:
            h = ResidualBlock(width, self.activation, self.dropout_rate)(h, train)
        return nn.Dense(self.out_dim, kernel_init=default_init())(self.activation(h))


# ----------------------------------------------------------------------------------- diffusion


class DiffusionSchedule(NamedTuple):
    """Per-step noise levels of a ``T``-step diffusion (numpy, so they fold into the program).

    Attributes:
        betas: ``[T]`` variances ``beta_t`` of the forward steps.
        alphas: ``[T]`` ``1 - beta_t``.
        alpha_bars: ``[T]`` cumulative products ``prod_{s <= t} alpha_s``.
    """

    betas: np.ndarray
    alphas: np.ndarray
    alpha_bars: np.ndarray

    @property
    def num_steps(self) -> int:
        """Number of diffusion steps ``T``."""
        return len(self.betas)

    @property
    def alpha_bars_prev(self) -> np.ndarray:
        """``[T]`` ``abar_{t-1}``, with ``abar_{-1} = 1`` before the first step."""
        return np.concatenate([np.ones(1, self.alpha_bars.dtype), self.alpha_bars[:-1]])

    @property
    def posterior_variance(self) -> np.ndarray:
        """``[T]`` ``beta~_t = beta_t (1 - abar_{t-1}) / (1 - abar_t)``, the posterior variance.

        The variance of ``q(x_{t-1} | x_t, x_0)`` (Ho et al., 2020, eq. 7); zero at the first
        step, where ``x_{t-1}`` is the data itself.
        """
        return self.betas * (1.0 - self.alpha_bars_prev) / (1.0 - self.alpha_bars)


def vp_schedule(num_steps: int, beta_min: float = 0.1, beta_max: float = 10.0) -> DiffusionSchedule:
    """Variance-preserving schedule discretized to ``num_steps`` steps (Song et al., 2021).

    ``alpha_t = exp(-beta_min / T - (beta_max - beta_min) (2t - 1) / (2 T^2))`` for ``t = 1..T``,
    the schedule Diffusion-QL (Wang et al., 2023, sec. 4) and IDQL use with ``T = 5``.
    """
    if num_steps < 1:
        raise ValueError(f"A diffusion needs at least one step, got num_steps={num_steps}.")
    t = np.arange(1, num_steps + 1, dtype=np.float64)
    alphas = np.exp(
        -beta_min / num_steps - 0.5 * (beta_max - beta_min) * (2 * t - 1) / num_steps**2
    )
    alpha_bars = np.cumprod(alphas)
    f32 = np.float32
    return DiffusionSchedule((1.0 - alphas).astype(f32), alphas.astype(f32), alpha_bars.astype(f32))


def ddpm_noising(
    key: jax.Array, actions: jax.Array, schedule: DiffusionSchedule
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A uniformly drawn step ``t`` and ``x_t = sqrt(abar_t) a + sqrt(1 - abar_t) eps`` per row.

    Returns ``(x_t, t [..., 1] float, eps)``; the DDPM loss is ``||eps_theta(s, x_t, t) - eps||^2``
    (Ho et al., 2020, eq. 14).
    """
    k_t, k_eps = jax.random.split(key)
    t = jax.random.randint(k_t, (*actions.shape[:-1], 1), 0, schedule.num_steps)
    eps = jax.random.normal(k_eps, actions.shape)
    abar = jnp.asarray(schedule.alpha_bars)[t]
    return jnp.sqrt(abar) * actions + jnp.sqrt(1.0 - abar) * eps, t.astype(jnp.float32), eps


def ddpm_loss(
    fn: DenoiseFn, key: jax.Array, actions: jax.Array, schedule: DiffusionSchedule
) -> jax.Array:
    """Per-row DDPM loss ``||eps - eps_theta(x_t, t)||^2`` summed over action dimensions.

    The simplified objective of Ho et al. (2020, eq. 14) at a uniformly drawn step; ``fn`` is the
    noise network with its observations bound. Returns ``[...]`` (one value per action row).
    """
    x_t, t, eps = ddpm_noising(key, actions, schedule)
    return jnp.sum((fn(x_t, t) - eps) ** 2, axis=-1)


def ddpm_sample(
    fn: DenoiseFn,
    key: jax.Array,
    shape: tuple[int, ...],
    schedule: DiffusionSchedule,
    clip: bool = True,
) -> jax.Array:
    """Ancestral DDPM sampling with ``sigma_t^2 = beta_t`` (Ho et al., 2020, Algorithm 2).

    ``x_{t-1} = (x_t - beta_t / sqrt(1 - abar_t) eps) / sqrt(alpha_t) + sigma_t z`` from
    ``x_T ~ N(0, I)``, no noise at the last step; ``clip`` keeps every iterate in ``[-1, 1]``
    (IDQL's ``clip_sampler``). Differentiable in the parameters ``fn`` closes over.
    """
    k_init, k_steps = jax.random.split(key)
    betas, alphas, abars = (jnp.asarray(a) for a in schedule)

    def step(x, inputs):
        t, k = inputs
        eps = fn(x, jnp.full((*shape[:-1], 1), t, jnp.float32))
        x = (x - betas[t] / jnp.sqrt(1.0 - abars[t]) * eps) / jnp.sqrt(alphas[t])
        x = x + (t > 0) * jnp.sqrt(betas[t]) * jax.random.normal(k, shape)
        return (jnp.clip(x, -1.0, 1.0) if clip else x), None

    steps = jnp.arange(schedule.num_steps - 1, -1, -1)
    keys = jax.random.split(k_steps, schedule.num_steps)
    x, _ = jax.lax.scan(step, jax.random.normal(k_init, shape), (steps, keys))
    return jnp.clip(x, -1.0, 1.0)


def ddpm_posterior_step(
    x: jax.Array, eps: jax.Array, t: jax.Array | int, schedule: DiffusionSchedule, z: jax.Array
) -> jax.Array:
    """One reverse step through the posterior ``q(x_{t-1} | x_t, x_0)`` at a clipped ``x_0``.

    ``x_0 = clip(x_t / sqrt(abar_t) - sqrt(1 / abar_t - 1) eps, -1, 1)``, then
    ``x_{t-1} = c1_t x_0 + c2_t x_t + sqrt(beta~_t) z`` with ``c1_t = beta_t sqrt(abar_{t-1}) /
    (1 - abar_t)`` and ``c2_t = (1 - abar_{t-1}) sqrt(alpha_t) / (1 - abar_t)`` (Ho et al., 2020,
    eqs. 6-7, 15), no noise at ``t = 0``. Diffusion-QL's ``p_sample`` with ``clip_denoised``.

    Args:
        x: the iterate ``x_t``, ``[..., A]``.
        eps: the predicted noise at ``x_t``, same shape.
        t: the 0-based step index (scalar, may be traced).
        schedule: the diffusion's noise levels.
        z: standard normal noise, same shape as ``x``.

    Returns:
        ``x_{t-1}``, same shape as ``x``.
    """
    betas, alphas, abars = (jnp.asarray(a) for a in schedule)
    abar, abar_prev = abars[t], jnp.asarray(schedule.alpha_bars_prev)[t]
    x0 = jnp.clip(jnp.sqrt(1.0 / abar) * x - jnp.sqrt(1.0 / abar - 1.0) * eps, -1.0, 1.0)
    mean = (
        betas[t] * jnp.sqrt(abar_prev) / (1.0 - abar) * x0
        + (1.0 - abar_prev) * jnp.sqrt(alphas[t]) / (1.0 - abar) * x
    )
    # The reference's exp(0.5 log(max(var, 1e-20))): finite everywhere, masked at t = 0.
    std = jnp.sqrt(jnp.maximum(jnp.asarray(schedule.posterior_variance)[t], 1e-20))
    return mean + (jnp.asarray(t) > 0) * std * z


def ddpm_posterior_sample(
    fn: DenoiseFn, key: jax.Array, shape: tuple[int, ...], schedule: DiffusionSchedule
) -> jax.Array:
    """DDPM sampling through the clipped-``x_0`` posterior (Diffusion-QL's sampler).

    From ``x_T ~ N(0, I)``, ``T`` steps of ``ddpm_posterior_step``: the iterate itself is never
    clipped, only the ``x_0`` it predicts and the final action. Differentiable in the parameters
    ``fn`` closes over (zero gradient where ``x_0`` is clipped, as the reference's ``clamp_``).
    """
    k_init, k_steps = jax.random.split(key)

    def step(x, inputs):
        t, k = inputs
        eps = fn(x, jnp.full((*shape[:-1], 1), t, jnp.float32))
        return ddpm_posterior_step(x, eps, t, schedule, jax.random.normal(k, shape)), None

    steps = jnp.arange(schedule.num_steps - 1, -1, -1)
    keys = jax.random.split(k_steps, schedule.num_steps)
    x, _ = jax.lax.scan(step, jax.random.normal(k_init, shape), (steps, keys))
    return jnp.clip(x, -1.0, 1.0)


# --------------------------------------------------------------------------------- flow matching


def flow_matching_targets(
    key: jax.Array, actions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Points on the straight path from noise to data and their velocity (rectified flow).

    ``x_t = (1 - t) x_0 + t a`` with ``x_0 ~ N(0, I)`` and ``t ~ U[0, 1]``; the target velocity is
    ``a - x_0`` (Lipman et al., 2023; Liu et al., 2023). Returns ``(x_t, t [..., 1], velocity)``.
    """
    k_noise, k_t = jax.random.split(key)
    x0 = jax.random.normal(k_noise, actions.shape)
    t = jax.random.uniform(k_t, (*actions.shape[:-1], 1))
    return (1.0 - t) * x0 + t * actions, t, actions - x0


def flow_matching_loss(fn: DenoiseFn, key: jax.Array, actions: jax.Array) -> jax.Array:
    """Per-row conditional flow-matching loss ``||v_theta(x_t, t) - (a - x_0)||^2`` (summed).

    FQL's BC flow objective (Park et al., 2025, eq. 4); ``fn`` is the velocity network with its
    observations bound. Returns ``[...]``.
    """
    x_t, t, velocity = flow_matching_targets(key, actions)
    return jnp.sum((fn(x_t, t) - velocity) ** 2, axis=-1)


def euler_sample(fn: DenoiseFn, noise: jax.Array, num_steps: int, clip: bool = True) -> jax.Array:
    """Integrate ``dx/dt = v(x, t)`` from ``noise`` at ``t = 0`` to ``t = 1`` in ``num_steps``.

    FQL's ``compute_flow_actions``: fixed-step Euler, result clipped to ``[-1, 1]``. Deterministic
    given the noise.
    """
    if num_steps < 1:
        raise ValueError(f"euler_sample needs num_steps >= 1, got {num_steps}.")

    def step(x, i):
        t = jnp.full((*x.shape[:-1], 1), i / num_steps, jnp.float32)
        return x + fn(x, t) / num_steps, None

    x, _ = jax.lax.scan(step, noise, jnp.arange(num_steps, dtype=jnp.float32))
    return jnp.clip(x, -1.0, 1.0) if clip else x


def cosine_horizon(max_steps: int | None) -> int | None:
    """Updates of a diffusion agent's cosine decay: ``max_steps``; None: 1M; 0: no decay."""
    return None if max_steps == 0 else max_steps or 1_000_000


def init_diffusion_actor(
    net: nn.Module,
    key: jax.Array,
    learning_rate: float,
    obs: jax.Array,
    act: jax.Array,
    max_steps: int | None,
    max_grad_norm: float | None = None,
) -> tuple[TrainState, Any]:
    """A noise network's train state and its moving average (IDQL's and Diffusion-QL's actor).

    ``obs`` and ``act`` are batched examples; the Adam step size decays along a cosine over
    ``cosine_horizon(max_steps)`` updates. The average starts as a copy of the parameters
    (distinct buffers, so the agent can be donated to ``jit``).
    """
    horizon = cosine_horizon(max_steps)
    actor = make_train_state(
        net,
        key,
        learning_rate,
        obs,
        act,
        act[..., :1],
        cosine_decay_steps=horizon,
        max_grad_norm=max_grad_norm,
    )
    return actor, jax.tree.map(jnp.copy, actor.params)


# ----------------------------------------------------------------------- deterministic evaluation


def observation_key(key: jax.Array, obs: jax.Array) -> jax.Array:
    """``key`` folded with a hash of the bits of one ``[D]`` observation.

    Evaluation must be a deterministic function of the observation, but a sampler run with one
    fixed noise vector at every step is a fixed quantile of the policy, not a sample of it (on
    Pendulum a diffusion BC policy evaluated that way spins at about -1,300 while its samples
    score like the data, about -670). Seeding the noise with the observation keeps both.
    """
    bits = jax.lax.bitcast_convert_type(obs.astype(jnp.float32), jnp.uint32)
    mult = jnp.uint32(2654435761) * (jnp.arange(obs.shape[-1], dtype=jnp.uint32) + 1)
    return jax.random.fold_in(key, jnp.sum(bits * mult, dtype=jnp.uint32))


def map_rows(fn: Callable[[jax.Array, jax.Array], jax.Array], key: jax.Array, obs: jax.Array):
    """``fn(o, observation_key(key, o))`` for every ``[D]`` row ``o`` of ``obs`` (any leading dims).

    The deterministic evaluation of a sampling policy (IDQL, Diffusion-QL, FQL, EXPO): a row's
    action depends only on that observation and ``key``, not on the batch it arrives in.
    """
    flat = obs.reshape(-1, obs.shape[-1])
    out = jax.vmap(lambda o: fn(o, observation_key(key, o)))(flat)
    return out.reshape(*obs.shape[:-1], out.shape[-1])
