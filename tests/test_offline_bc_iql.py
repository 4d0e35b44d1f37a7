from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.config import ConfigError
from jaxrl.networks import GaussianActor
from jaxrl.offline import iql as iql_lib
from jaxrl.offline.bc import BC, BCConfig
from jaxrl.offline.common import DataNorm
from jaxrl.offline.iql import IQL, IQLConfig
from jaxrl.types import Transition

OBS_DIM, ACT_DIM, B = 3, 2, 16
SMALL = {"hidden_dims": (16, 16), "batch_size": B}
AGENTS = [(BC, BCConfig(**SMALL)), (IQL, IQLConfig(**SMALL, max_steps=100))]
IDS = ["bc", "iql"]


def _batch(key, n=B):
    k = jax.random.split(key, 5)
    return Transition(
        jax.random.normal(k[0], (n, OBS_DIM)),
        jax.random.uniform(k[1], (n, ACT_DIM), minval=-1.0, maxval=1.0),
        jax.random.normal(k[2], (n,)),
        jax.random.normal(k[3], (n, OBS_DIM)),
        (jax.random.uniform(k[4], (n,)) < 0.1).astype(jnp.float32),
    )


# Jitted once per (agent, config) and shared by the tests: eager dispatch and recompiles dominate.
@partial(jax.jit, static_argnums=(0, 1))
def _create(cls, cfg, seed):
    return cls.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)


_scan = jax.jit(lambda agent, batches: jax.lax.scan(lambda a, b: a.update(b), agent, batches))


BATCHES = jax.vmap(_batch)(jax.random.split(jax.random.key(5), 3))  # scanned: [3, B, ...]


def _params(agent):
    return [s.params for s in (getattr(agent, n, None) for n in ("actor", "value", "critic")) if s]


def _assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


# ---------------------------------------------------------------------- losses against by-hand math


def test_iql_value_loss_is_expectile_regression_onto_min_target_q():
    agent = _create(IQL, AGENTS[1][1], 0)
    batch = _batch(jax.random.key(1))
    qs = agent.critic.apply_fn(agent.target_critic_params, batch.obs, batch.action)
    target_q = jnp.min(qs, axis=0)
    loss, _ = iql_lib.value_loss(agent.value.params, agent, batch, target_q)
    u = np.asarray(target_q - agent.value.apply_fn(agent.value.params, batch.obs))
    np.testing.assert_allclose(loss, np.mean(np.where(u < 0, 0.3, 0.7) * u**2), rtol=1e-5)


def test_iql_actor_loss_weights_are_clipped():
    agent = _create(IQL, AGENTS[1][1], 0)
    batch = _batch(jax.random.key(2))
    v = agent.value.apply_fn(agent.value.params, batch.obs)
    mean, std = agent.actor.apply_fn(agent.actor.params, batch.obs)
    logp = jax.scipy.stats.norm.logpdf(batch.action, mean, std).sum(-1)
    # A huge advantage saturates every weight at max_weight = 100; zero advantage gives BC.
    loss, info = iql_lib.actor_loss(agent.actor.params, agent, batch, v + 50.0)
    np.testing.assert_allclose(info["actor/weight_mean"], 100.0)
    np.testing.assert_allclose(loss, -100.0 * logp.mean(), rtol=1e-5)
    loss, _ = iql_lib.actor_loss(agent.actor.params, agent, batch, v)
    np.testing.assert_allclose(loss, -logp.mean(), rtol=1e-5)


def test_iql_critic_target_bootstraps_from_value():
    agent = _create(IQL, AGENTS[1][1], 0)
    batch = _batch(jax.random.key(3))
    _, info = iql_lib.critic_loss(agent.critic.params, agent, batch)
    next_v = agent.value.apply_fn(agent.value.params, batch.next_obs)
    want = batch.reward + 0.99 * (1.0 - batch.terminal) * next_v
    np.testing.assert_allclose(info["critic/target"], want.mean(), rtol=1e-5)


def test_gaussian_actor_tanh_mean_and_state_independent_std():
    actor = GaussianActor(ACT_DIM, (8,))
    obs = 100.0 * jax.random.normal(jax.random.key(0), (5, OBS_DIM))
    params = actor.init(jax.random.key(1), obs)
    mean, std = actor.apply(params, obs)
    assert mean.shape == std.shape == (5, ACT_DIM)
    assert float(jnp.abs(mean).max()) <= 1.0
    np.testing.assert_allclose(std, 1.0)  # log_std starts at 0 and ignores the state
    params = {"params": {**params["params"], "log_std": jnp.asarray([-20.0, 20.0])}}
    np.testing.assert_allclose(actor.apply(params, obs)[1][0], np.exp([-5.0, 2.0]), rtol=1e-6)


def test_iql_actor_lr_cosine_decays_to_zero_after_max_steps():
    agent = _create(IQL, AGENTS[1][1], 0)  # max_steps = 100

    @partial(jax.jit, static_argnums=1)
    def steps(state, n):
        grads = jax.tree.map(jnp.ones_like, state.params)
        return jax.lax.fori_loop(0, n, lambda _, s: s.apply_gradients(grads=grads), state)

    # The actor's step size reaches 0 after max_steps updates; the value's (constant) does not.
    for state, frozen in ((agent.actor, True), (agent.value, False)):
        state = steps(state, 100)
        after = steps(state, 1)
        same = jax.tree.all(jax.tree.map(np.array_equal, state.params, after.params))
        assert same == frozen
        assert state.opt_state.hyperparams["learning_rate"] == pytest.approx(3e-4)


# ------------------------------------------------------------------------------- agent contract


@pytest.mark.parametrize(("cls", "cfg"), AGENTS, ids=IDS)
def test_scan_determinism_and_finite(cls, cfg):
    a1, infos = _scan(_create(cls, cfg, 3), BATCHES)
    a2, _ = _scan(_create(cls, cfg, 3), BATCHES)
    _assert_trees_equal(_params(a1), _params(a2))
    a3, _ = _scan(_create(cls, cfg, 4), BATCHES)
    assert not np.allclose(jax.tree.leaves(a1.actor.params)[0], jax.tree.leaves(a3.actor.params)[0])
    assert all(k.split("/")[0] in ("actor", "value", "critic") for k in infos)
    for v in infos.values():
        assert v.shape == (3,) and np.isfinite(v).all()
    actions = a1.sample_actions(BATCHES.obs[0], jax.random.key(0))
    assert actions.shape == (B, ACT_DIM) and float(jnp.abs(actions).max()) <= 1.0
    assert float(jnp.abs(a1.eval_actions(BATCHES.obs[0])).max()) <= 1.0


@partial(jax.jit, static_argnums=(0, 1))
def _vmapped_run(cls, cfg, batches):
    agents = jax.vmap(lambda s: cls.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), s))(
        jnp.arange(2)
    )
    update = jax.vmap(lambda a, b: a.update(b), in_axes=(0, None))
    agents, _ = jax.lax.scan(update, agents, batches)
    return agents, jax.vmap(lambda a: a.eval_actions(batches.obs[0]))(agents)


@pytest.mark.parametrize(("cls", "cfg"), AGENTS, ids=IDS)
def test_vmap_over_seeds(cls, cfg):
    agents, actions = _vmapped_run(cls, cfg, BATCHES)
    assert actions.shape == (2, B, ACT_DIM)
    first = jax.tree.leaves(agents.actor.params)[0]
    assert first.shape[0] == 2 and not np.allclose(first[0], first[1])
    single, _ = _scan(_create(cls, cfg, 1), BATCHES)  # member 1 of the vmap = seed 1 alone
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x[1], y, rtol=1e-5, atol=1e-6),
        _params(agents),
        _params(single),
    )


@pytest.mark.parametrize(("cls", "cfg"), AGENTS, ids=IDS)
def test_agent_applies_its_data_norm(cls, cfg):
    mean, std = jnp.asarray([1.0, -2.0, 0.5]), jnp.asarray([2.0, 0.5, 3.0])
    agent = _create(cls, cfg, 0).replace(
        norm=DataNorm(mean, std, jnp.float32(2.0), jnp.float32(-1))
    )
    raw = BATCHES
    pre = raw._replace(
        obs=(raw.obs - mean) / std, next_obs=(raw.next_obs - mean) / std, reward=2 * raw.reward - 1
    )
    a1, _ = _scan(agent, raw)
    a2, _ = _scan(agent.replace(norm=DataNorm.identity(OBS_DIM)), pre)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5), _params(a1), _params(a2))
    plain = _create(cls, cfg, 0)  # same seed, same parameters, identity norm
    obs, key = raw.obs[0], jax.random.key(8)
    np.testing.assert_allclose(agent.eval_actions(obs), plain.eval_actions(pre.obs[0]), rtol=1e-5)
    np.testing.assert_allclose(
        agent.sample_actions(obs, key), plain.sample_actions(pre.obs[0], key), rtol=1e-5
    )


# ------------------------------------------------------------------------------------------ configs


def test_config_defaults_are_the_papers():
    bc, iql = BCConfig(), IQLConfig()
    assert (bc.actor_lr, bc.batch_size, bc.hidden_dims) == (3e-4, 256, (256, 256))
    assert bc.normalize_observations and bc.reward_normalization == "none"
    assert (iql.expectile, iql.temperature, iql.discount, iql.tau) == (0.7, 3.0, 0.99, 0.005)
    assert (iql.actor_lr, iql.value_lr, iql.critic_lr, iql.max_weight) == (3e-4, 3e-4, 3e-4, 100.0)
    assert iql.actor_lr_schedule == "cosine" and iql.max_steps is None
    assert iql.reward_normalization == "return_range" and iql.normalize_observations
    for cfg in (bc, iql):
        assert (cfg.utd_ratio, cfg.buffer_size, cfg.learning_starts) == (1, 1_000_000, 0)


@pytest.mark.parametrize(
    ("cls", "kwargs", "flag"),
    [
        (IQLConfig, {"expectile": 1.0}, "--expectile"),
        (IQLConfig, {"expectile": 0.0}, "--expectile"),
        (IQLConfig, {"temperature": -1.0}, "--temperature"),
        (IQLConfig, {"max_steps": -1}, "--max-steps"),  # 0 = no decay
        (IQLConfig, {"actor_lr_schedule": "linear"}, "--actor-lr-schedule"),
        (IQLConfig, {"reward_normalization": "zscore"}, "--reward-normalization"),
        (IQLConfig, {"tau": 0.0}, "--tau"),
        (IQLConfig, {"value_lr": -3e-4}, "--value-lr"),
        (BCConfig, {"actor_lr": 0.0}, "--actor-lr"),
        (BCConfig, {"hidden_dims": ()}, "--hidden-dims"),
        (BCConfig, {"reward_normalization": "zscore"}, "--reward-normalization"),
        (BCConfig, {"exploration_noise": -0.1}, "--exploration-noise"),
    ],
)
def test_bad_config_raises_naming_the_flag(cls, kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        cls(**kwargs)


# --------------------------------------------------------------------------------- learning tests


def _episode_returns(data: Transition) -> np.ndarray:
    # Episodes are stored in order; one ends where the next row does not continue it.
    breaks = np.flatnonzero(np.abs(data.obs[1:] - data.next_obs[:-1]).sum(-1) > 1e-6) + 1
    return np.array([r.sum() for r in np.split(np.asarray(data.reward), breaks)])


def _dataset_norm(data: Transition, reward_scale: float = 1.0) -> DataNorm:
    """What the offline loop sets when normalize_observations is on (CORL: std + 1e-3)."""
    return DataNorm(
        jnp.asarray(data.obs.mean(0)),
        jnp.asarray(data.obs.std(0) + 1e-3),
        jnp.float32(reward_scale),
        jnp.float32(0.0),
    )


@pytest.mark.slow
def test_bc_matches_expert_behavior(record_property):
    from jaxrl.run.recipe import eval_curve
    from tests.offline_utils import (
        EXPERT_STEPS,
        eval_pendulum,
        learning_seed,
        load_pendulum,
        pendulum_policies,
        train_offline_quick,
    )

    data = load_pendulum("expert")
    behavior = float(_episode_returns(data).mean())  # about -145 (a stochastic SAC policy)
    # What BC imitates is the expert's mean action, so the expert's own deterministic return
    # (its last evaluation, 50 episodes) is the other reference; the bar is the lower of the two.
    # They agree within 12% when the expert run ends converged (seeds 0-3: -147/-140,
    # -148/-160, -143/-137, -137/-152), but seed 4's run here ended in a dip: deterministic -372
    # against the data's -222, whose worst tenth of episodes never swing up (below -650), and
    # BC reached -420, failing a bar set from the data alone (-289).
    expert = eval_curve(pendulum_policies()["expert"])[EXPERT_STEPS]
    reference = min(behavior, expert)
    # The deterministic BC policy (100 evaluation episodes) lands up to 18% below that
    # reference (seeds 0-4 here: -173, -152, -143, -152, -420); 30% leaves room for noise and
    # still fails anything short of expert-like (medium: -670).
    threshold = reference - 0.3 * abs(reference)
    agent = BC.create(BCConfig(hidden_dims=(64, 64)), data.obs[0], data.action[0], learning_seed())
    agent, _ = train_offline_quick(agent.replace(norm=_dataset_norm(data)), data, 3000)
    ret = eval_pendulum(agent, episodes=100)
    print(f"BC: {ret:.1f} (behavior {behavior:.1f}, expert {expert:.1f}, bar {threshold:.1f})")
    record_property("value", ret)
    record_property("threshold", threshold)
    assert ret >= threshold


@pytest.mark.slow
def test_iql_beats_medium_behavior(record_property):
    from offline_utils import eval_pendulum, learning_seed, pendulum_dataset, train_offline_quick

    from jaxrl.offline.common import data_norm

    ds = pendulum_dataset("medium")
    data = ds.transitions(-2.0, 2.0)
    behavior = float(ds.episode_returns().mean())  # about -700
    expert = float(pendulum_dataset("expert").episode_returns().mean())  # about -145
    # IQL stays close to the data: on D4RL's medium datasets the paper's gain over the behavior
    # is 12-42% of the way to the expert (halfcheetah 40 -> 47, hopper 44 -> 66); the test asks
    # for 30%. The paper's locomotion settings (256x256, expectile 0.7, temperature 3) and 6,000
    # updates. With 64x64 networks one agent's return depended on its seed (three agents on seed
    # 2's medium data: -451/-496/-428 after 3,000 updates) and on the data (10,000 updates:
    # -205/-192/-198 on seed 2's, -1210/-1247/-1195 on seed 0's). With 256x256 three agents
    # scored -303/-315/-302 after 3,000 updates on seed 3's data and -405/-419/-429 after 6,000
    # on seed 0's (-533/-512/-515 after 3,000; thresholds -559 and -515).
    threshold = behavior + 0.3 * (expert - behavior)
    # The 'return_range' scaling, rewards * longest episode / (max - min episode return): the
    # authors' 1000 / (max - min) on D4RL's 1000-step episodes; Pendulum's are 200 steps long.
    cfg = IQLConfig(max_steps=6000)
    agent = IQL.create(cfg, data.obs[0], data.action[0], learning_seed())
    agent, _ = train_offline_quick(agent.replace(norm=data_norm(ds, cfg)), data, 6000)
    ret = eval_pendulum(agent, episodes=100)
    print(f"IQL medium: {ret:.1f} (behavior {behavior:.1f}, threshold {threshold:.1f})")
    record_property("value", ret)
    record_property("threshold", threshold)
    assert ret >= threshold
