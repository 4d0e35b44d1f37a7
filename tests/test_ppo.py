"""PPO components: config rules, losses on hand-made cases, the pure update, a learning bandit."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.agents.ppo import PPO, PPOConfig, Rollout, policy_loss, value_loss
from jaxrl.config import ConfigError
from jaxrl.distributions import TanhNormal

OBS_DIM, ACT_DIM = 3, 2
SMALL = dict(policy_hidden_dims=(16, 16), value_hidden_dims=(16, 16))


def _create(seed=0, **kw):
    cfg = PPOConfig(**{**SMALL, **kw})
    return PPO.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)


def _rollout(agent, num_steps, num_envs, seed=0):
    """A random rollout (numpy data, cheap to build) with log-probs from the agent's policy."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: jnp.asarray(rng.normal(size=(num_steps, num_envs, *shape)), jnp.float32)  # noqa: E731
    obs, raw_action = f(OBS_DIM), f(ACT_DIM)
    log_prob = agent.policy.apply_fn(agent.policy.params, obs).log_prob_raw(raw_action)
    ends = rng.random((num_steps, num_envs))
    return Rollout(
        obs=obs,
        action=jnp.tanh(raw_action),
        extras={"raw_action": raw_action, "log_prob": log_prob},
        reward=f(),
        terminated=jnp.asarray(ends < 0.1, jnp.float32),
        truncated=jnp.asarray((ends >= 0.1) & (ends < 0.2), jnp.float32),
        next_obs=f(OBS_DIM),
    )


def _leaves(tree):
    def as_numpy(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return [as_numpy(x) for x in jax.tree.leaves(tree)]


# --------------------------------------------------------------------------------- config rules


def test_rollout_length_follows_brax_rule():
    cfg = PPOConfig()
    assert cfg.rollout_length(64) == 5 * 64 * 16 // 64 == 80
    assert cfg.rollout_length(1) == 5 * 1024
    agent = _create(unroll_length=10, batch_size=8, num_minibatches=4)
    assert agent.rollout_length(16) == 10 * 8 * 4 // 16
    assert PPO.on_policy is True


def test_rollout_length_rejects_incompatible_num_envs():
    with pytest.raises(ConfigError, match=r"divisible by num_envs \(48\).*--num-envs"):
        PPOConfig().rollout_length(48)
    with pytest.raises(ValueError, match="positive"):
        PPOConfig().rollout_length(0)


@pytest.mark.parametrize(
    "field,value,flag",
    [
        ("batch_size", 0, "--batch-size"),
        ("clip_eps", -0.1, "--clip-eps"),
        ("gae_lambda", 1.5, "--gae-lambda"),
        ("max_grad_norm", 0.0, "--max-grad-norm"),
        ("anneal_lr_steps", -5, "--anneal-lr-steps"),
        ("entropy_cost", -1.0, "--entropy-cost"),
        ("activation", "sigmoid", "--activation"),
    ],
)
def test_config_validation_names_the_flag(field, value, flag):
    with pytest.raises(ConfigError, match=flag):
        PPOConfig(**{field: value})


def test_config_fields_are_documented():
    import inspect

    src = inspect.getsource(PPOConfig)
    for f in dataclasses.fields(PPOConfig):
        after = src.split(f"    {f.name}:", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), f.name


# ------------------------------------------------------------------------------- distributions


def test_tanh_normal_raw_log_prob_and_entropy_estimate():
    dist = TanhNormal(jnp.asarray([[0.3, -0.5]]), jnp.asarray([[0.4, 0.9]]))
    u, lp = dist.sample_raw_and_log_prob(jax.random.key(0))
    np.testing.assert_allclose(lp, dist.log_prob(jnp.tanh(u)), rtol=1e-4)
    np.testing.assert_allclose(dist.log_prob_raw(u), lp)
    # Saturated pre-tanh values stay finite (arctanh of a rounded +-1 would not).
    assert bool(jnp.isfinite(dist.log_prob_raw(jnp.asarray([[30.0, -30.0]]))).all())
    # The estimator agrees with the Monte-Carlo mean of -log p.
    keys = jax.random.split(jax.random.key(1), 20000)
    est = jax.vmap(dist.squashed_entropy_estimate)(keys).mean()
    mc = -jax.vmap(lambda k: dist.sample_and_log_prob(k)[1])(keys).mean()
    np.testing.assert_allclose(est, mc, atol=0.03)


# ------------------------------------------------------------------------------------- losses


def test_policy_loss_is_the_clipped_objective_on_a_hand_made_case():
    agent = _create(normalize_advantage=False, entropy_cost=0.0)  # clip_eps = 0.3
    obs = jax.random.normal(jax.random.key(0), (4, OBS_DIM))
    raw = jax.random.normal(jax.random.key(1), (4, ACT_DIM))
    current = agent.policy.apply_fn(agent.policy.params, obs).log_prob_raw(raw)
    ratio = jnp.asarray([0.5, 1.0, 1.5, 0.5])
    batch = {
        "obs": obs,
        "raw_action": raw,
        "log_prob": current - jnp.log(ratio),
        "advantage": jnp.asarray([1.0, 2.0, 1.0, -2.0]),
    }
    key = jax.random.key(2)
    loss_fn = jax.jit(policy_loss)
    loss, info = loss_fn(agent.policy.params, agent, batch, key)
    # min(0.5, 0.7) | 2 | min(1.5, 1.3) | min(-1.0, -1.4) -> mean 0.6
    np.testing.assert_allclose(loss, -0.6, rtol=1e-5)
    np.testing.assert_allclose(info["policy/clip_frac"], 0.75)
    # The entropy bonus enters with weight entropy_cost.
    hot = agent.replace(hparams={**agent.hparams, "entropy_cost": jnp.float32(0.1)})
    loss_hot, info_hot = loss_fn(agent.policy.params, hot, batch, key)
    np.testing.assert_allclose(loss_hot, -0.6 - 0.1 * info_hot["policy/entropy"], rtol=1e-5)


def test_value_loss_hand_computed():
    agent = _create()  # vf_coef = 0.5
    obs = jax.random.normal(jax.random.key(0), (4, OBS_DIM))
    v = agent.value.apply_fn(agent.value.params, obs)
    batch = {"obs": obs, "return": v + jnp.asarray([1.0, -1.0, 2.0, 0.0])}
    loss, _ = value_loss(agent.value.params, agent, batch)
    np.testing.assert_allclose(loss, 0.5 * 0.5 * 6.0 / 4.0, rtol=1e-5)


def test_policy_step_extras_and_action_bounds():
    agent = _create()
    obs = jax.random.normal(jax.random.key(0), (7, OBS_DIM)) * 50.0
    action, extras = agent.policy_step(obs, jax.random.key(1))
    assert action.shape == (7, ACT_DIM) and bool(jnp.all(jnp.abs(action) <= 1.0))
    assert set(extras) == {"raw_action", "log_prob"} and extras["log_prob"].shape == (7,)
    np.testing.assert_allclose(action, jnp.tanh(extras["raw_action"]))
    dist = agent.policy.apply_fn(agent.policy.params, obs)
    np.testing.assert_allclose(extras["log_prob"], dist.log_prob_raw(extras["raw_action"]))
    np.testing.assert_array_equal(agent.eval_actions(obs), agent.eval_actions(obs))
    assert agent.sample_actions(obs, jax.random.key(2)).shape == (7, ACT_DIM)


def test_update_rejects_a_rollout_that_does_not_split_into_minibatches():
    agent = _create(num_minibatches=4)
    z = jnp.zeros((3, 3))
    extras = {"raw_action": jnp.zeros((3, 3, ACT_DIM)), "log_prob": z}
    obs = jnp.zeros((3, 3, OBS_DIM))
    with pytest.raises(ValueError, match="num_minibatches=4"):
        agent.update(Rollout(obs, jnp.zeros((3, 3, ACT_DIM)), extras, z, z, z, obs))


# -------------------------------------------------------------------------------- pure update


def test_update_is_pure_under_jit_and_anneals_the_learning_rate():
    kw = dict(unroll_length=2, batch_size=4, num_minibatches=4, num_updates_per_batch=2)
    num_envs, num_updates = 4, 3
    num_steps = PPOConfig(**kw).rollout_length(num_envs)  # 2 * 16 / 4 = 8
    n = num_steps * num_envs
    agent = _create(3, **kw, anneal_lr_steps=2 * n)  # lr, lr / 2, then 0 for update 3
    rollouts = [_rollout(agent, num_steps, num_envs, i) for i in range(num_updates)]
    update = jax.jit(lambda a, r: a.update(r))

    def run(agent):
        infos, params = [], [agent.policy.params]
        for rollout in rollouts:
            agent, info = update(agent, rollout)
            infos.append(info)
            params.append(agent.policy.params)
        return agent, infos, [_leaves(p)[0] for p in params]

    final, infos, p = run(agent)
    assert all(np.isfinite(float(i["value/loss"])) for i in infos)
    assert int(final.num_updates) == num_updates
    # Learning happened, then annealing stopped it: update 3 leaves the parameters unchanged.
    assert not np.allclose(p[0], p[1]) and not np.allclose(p[1], p[2])
    np.testing.assert_array_equal(p[2], p[3])
    lr = PPOConfig().learning_rate
    got = [float(i["ppo/learning_rate"]) for i in infos]
    np.testing.assert_allclose(got, [lr, lr / 2, 0.0], rtol=1e-5)
    # No hidden state: running again from the same agent reproduces every number.
    again, _, _ = run(agent)
    for a, b in zip(_leaves(final), _leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ bandit learning


def test_bandit_learns_under_vmap_over_seeds_and_scan():
    # One-step episodes with a constant observation and reward -(a - 0.5)^2 per action dim: PPO
    # must move the mean action from ~0 to 0.5. Advantages are not normalized here: normalized,
    # a single-state bandit keeps shrinking the std to min_std at a constant rate and the policy
    # then jitters (KL >> 1 per update); unnormalized, the entropy bonus holds the std near 0.1.
    # Creation and the scanned updates are vmapped over seeds [0, 0, 1]: equal seeds must give
    # bit-identical agents.
    cfg = PPOConfig(
        **SMALL, unroll_length=1, batch_size=64, num_minibatches=4, normalize_advantage=False
    )
    num_envs = 256
    num_steps = cfg.rollout_length(num_envs)  # 1
    obs = jnp.ones((num_steps, num_envs, OBS_DIM))

    def error(agent):
        return jnp.abs(agent.eval_actions(obs[0, :1]) - 0.5).mean()

    def iteration(agent, key):
        action, extras = jax.vmap(agent.policy_step)(obs, jax.random.split(key, num_steps))
        ones = jnp.ones((num_steps, num_envs))
        reward = -jnp.sum((action - 0.5) ** 2, -1)
        agent, _ = agent.update(Rollout(obs, action, extras, reward, ones, 0 * ones, obs))
        return agent, error(agent)

    @jax.jit
    @jax.vmap
    def train(seed):
        agent = PPO.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
        keys = jax.random.split(jax.random.fold_in(jax.random.key(1), seed), 150)
        final, errors = jax.lax.scan(iteration, agent, keys)
        return error(agent), errors, final

    before, errors, final = train(jnp.asarray([0, 0, 1]))
    for x in _leaves(final):
        np.testing.assert_array_equal(x[0], x[1])
    assert not np.allclose(_leaves(final.policy.params)[0][0], _leaves(final.policy.params)[0][2])
    errors = np.asarray(errors)
    assert (np.asarray(before) > 0.2).all(), before
    assert (np.median(errors[:, -50:], axis=1) < 0.03).all(), (before, errors[:, -50:])
