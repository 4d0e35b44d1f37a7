"""Reference deviations, fixed: RLPD's update schedule, ReBRAC's masked penalty, Brax's GAE."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl import rl
from jaxrl.agents.ppo import PPO, PPOConfig, gae_minibatch
from jaxrl.agents.sac import SAC, RLPDConfig, SACConfig
from jaxrl.data import Dataset
from jaxrl.data.episodes import EpisodeTracker, next_actions
from jaxrl.offline.td3_bc import TD3BC, ReBRACConfig, critic_loss
from jaxrl.types import Transition

OBS_DIM, ACT_DIM = 3, 2


def _sac_batches(num, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=(num, batch, *s)), jnp.float32)  # noqa: E731
    return Transition(f(OBS_DIM), jnp.tanh(f(ACT_DIM)), f(), f(OBS_DIM), jnp.zeros((num, batch)))


# ------------------------------------------------------------------------------------------ RLPD


def test_rlpd_steps_actor_and_temperature_once_per_utd_group():
    # The loops call update utd_ratio times per env step; after K = 3 env steps with utd 4 the
    # critic has taken 4K = 12 steps and the actor and the temperature K = 3 each.
    small = dict(hidden_dims=(8,), num_qs=2, utd_ratio=4, batch_size=4)
    rlpd = SAC.create(RLPDConfig(**small), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    sac = SAC.create(SACConfig(**small), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    batches = _sac_batches(12)

    @jax.jit
    def run(agent):
        return jax.lax.scan(lambda a, b: a.update(b), agent, batches)

    rlpd, info = run(rlpd)
    assert (int(rlpd.critic.step), int(rlpd.actor.step), int(rlpd.temp.step)) == (12, 3, 3)
    # Actor and temperature metrics come from the steps that took them (the 4th, 8th, 12th).
    stepped = np.asarray(info["temp/alpha"]) != 0
    np.testing.assert_array_equal(stepped, np.arange(1, 13) % 4 == 0)
    sac, _ = run(sac)  # SAC keeps one actor and temperature step per critic step
    assert (int(sac.critic.step), int(sac.actor.step), int(sac.temp.step)) == (12, 12, 12)


def test_rlpd_schedule_holds_under_vmap_over_seeds():
    cfg = RLPDConfig(hidden_dims=(8,), num_qs=2, utd_ratio=2, batch_size=4)
    batches = _sac_batches(4)

    @jax.jit
    @jax.vmap
    def run(seed):
        agent = SAC.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), seed)
        return jax.lax.scan(lambda a, b: a.update(b), agent, batches)[0]

    agents = run(jnp.arange(2))
    np.testing.assert_array_equal(agents.critic.step, [4, 4])
    np.testing.assert_array_equal(agents.actor.step, [2, 2])
    np.testing.assert_array_equal(agents.temp.step, [2, 2])


def test_rlpd_target_entropy_is_minus_half_the_action_dim():
    make = lambda cfg: SAC.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(6), 0)  # noqa: E731
    assert float(make(RLPDConfig(hidden_dims=(8,))).hparams["target_entropy"]) == -3.0
    assert float(make(SACConfig(hidden_dims=(8,))).hparams["target_entropy"]) == -6.0
    explicit = RLPDConfig(hidden_dims=(8,), target_entropy=-1.5)
    assert float(make(explicit).hparams["target_entropy"]) == -1.5


def test_rlpd_target_evaluates_only_the_random_pair_and_equals_its_minimum():
    # The target applies the critic to the pair's parameters only; it must equal the minimum of
    # that pair's rows of the full ensemble's output, and the pair must vary with the key.
    agent = SAC.create(RLPDConfig(hidden_dims=(8,)), jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    batch = jax.tree.map(lambda x: x[0], _sac_batches(1, batch=16))
    full = np.asarray(agent.critic.apply_fn(agent.target_critic_params, batch.obs, batch.action))
    assert full.shape == (10, 16)
    pairs = set()
    for seed in range(8):
        params = rl.ensemble_subset(jax.random.key(seed), agent.target_critic_params, 2)
        sub = agent.critic.apply_fn(params, batch.obs, batch.action)
        rows = [i for i in range(10) for s in sub if np.allclose(s, full[i], atol=1e-6)]
        assert sub.shape == (2, 16) and len(set(rows)) == 2
        np.testing.assert_allclose(sub.min(0), full[rows].min(0), atol=1e-6)
        pairs.add(frozenset(rows))
    assert len(pairs) >= 3


# ---------------------------------------------------------------------------------------- ReBRAC


def test_next_actions_are_masked_at_time_limits_terminals_and_the_last_row():
    # Episodes: rows 0-1 (time limit at 1), rows 2-3 (terminal at 3), row 4 (cut by the data).
    actions = np.arange(1.0, 6.0)[:, None]
    terminals = np.array([0, 0, 0, 1, 0], bool)
    timeouts = np.array([0, 1, 0, 0, 0], bool)
    nxt, mask = next_actions(actions, terminals, timeouts)
    np.testing.assert_array_equal(nxt[:, 0], [2.0, 0.0, 4.0, 0.0, 0.0])
    np.testing.assert_array_equal(mask, [1.0, 0.0, 1.0, 0.0, 0.0])
    # The dataset's buffer carries the mask with the next action.
    ds = Dataset(
        observations=np.zeros((5, OBS_DIM), np.float32),
        actions=actions.astype(np.float32),
        rewards=np.zeros(5, np.float32),
        next_observations=np.zeros((5, OBS_DIM), np.float32),
        terminals=terminals,
        timeouts=timeouts,
    )
    t = ds.transitions(-8.0, 8.0, with_next_action=True)
    np.testing.assert_array_equal(t.next_action_mask, mask)
    np.testing.assert_allclose(t.next_action[mask == 1, 0], [2.0 / 8.0, 4.0 / 8.0])


def _rebrac_targets(mask):
    # Target actions a' = [.5, .5] on both rows, the data's next action [0, 0] (penalty .5 each);
    # min Q' = 1, reward 0, gamma 0.9, beta_2 = 0.1, no terminals, noise-free smoothing.
    cfg = ReBRACConfig(hidden_dims=(8,), critic_bc_coef=0.1, policy_noise=0.0, discount=0.9)
    agent = TD3BC.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    agent = agent.replace(
        actor=agent.actor.replace(apply_fn=lambda p, obs: jnp.full((2, ACT_DIM), 0.5)),
        critic=agent.critic.replace(apply_fn=lambda p, obs, a: p),
        target_critic_params=jnp.ones((2, 2)),
    )
    z = jnp.zeros
    batch = Transition(
        z((2, OBS_DIM)), z((2, ACT_DIM)), z(2), z((2, OBS_DIM)), z(2),
        next_action=z((2, ACT_DIM)), next_action_mask=jnp.asarray(mask, jnp.float32),
    )  # fmt: skip
    _, info = critic_loss(jnp.zeros((2, 2)), agent, batch, jax.random.key(0))
    return float(info["critic/target"]), float(info["critic/bc_penalty"])


def test_rebrac_penalty_is_zero_on_rows_whose_next_action_is_unknown():
    # Known: y = 0.9 * (1 - 0.1 * 0.5) = 0.855; unknown (mask 0): y = 0.9 * 1 = 0.9.
    np.testing.assert_allclose(_rebrac_targets([1.0, 1.0]), (0.855, 0.5), rtol=1e-6)
    np.testing.assert_allclose(_rebrac_targets([0.0, 0.0]), (0.9, 0.0), rtol=1e-6)
    np.testing.assert_allclose(_rebrac_targets([1.0, 0.0]), ((0.855 + 0.9) / 2, 0.25), rtol=1e-6)


def test_tracker_releases_rows_only_once_their_next_action_is_known():
    # Two envs; env 1 hits a time limit at step 0. Step t's rows leave the tracker at step t + 1
    # with the action of step t + 1 as next action (mask 1), or 0 with mask 0 after an episode end.
    tracker = EpisodeTracker(num_envs=2, capacity=8, discount=0.9)

    def step(t, done):
        act = np.array([[t, 10.0 + t], [-t, -10.0 - t]], np.float32).T  # [2 envs, 2 dims]
        z = np.zeros(2, np.float32)
        row = Transition(
            np.full((2, OBS_DIM), t, np.float32), act, z + t, np.zeros((2, OBS_DIM)), z,
            next_action=np.zeros((2, ACT_DIM), np.float32), next_action_mask=z,
        )  # fmt: skip
        return tracker.hold(row, np.asarray(done))

    assert step(0, [False, True]) is None  # nothing is released before the next action exists
    rows, done = step(1, [False, False])
    np.testing.assert_array_equal(rows.obs[:, 0], [0.0, 0.0])  # step 0's rows
    np.testing.assert_array_equal(rows.next_action, [[1.0, -1.0], [0.0, 0.0]])
    np.testing.assert_array_equal(rows.next_action_mask, [1.0, 0.0])
    np.testing.assert_array_equal(done, [False, True])
    # A checkpoint round trip (JSON) keeps the held rows.
    import json

    restored = EpisodeTracker(2, 8, 0.9)
    restored.load(json.loads(json.dumps(tracker.state())))
    tracker = restored
    rows, done = step(2, [False, False])
    np.testing.assert_array_equal(rows.obs[:, 0], [1.0, 1.0])
    np.testing.assert_array_equal(rows.next_action, [[2.0, -2.0], [12.0, -12.0]])
    np.testing.assert_array_equal(rows.next_action_mask, [1.0, 1.0])


# ------------------------------------------------------------------------------------------- PPO


def _gae(terminated, truncated, next_values, bootstrap=False):
    col = lambda x: jnp.asarray(x, jnp.float32)[:, None]  # noqa: E731  [T = 3, B = 1]
    vs, adv = rl.gae_value_targets(
        col([1.0, 2.0, 3.0]), col([0.5, 1.0, 1.5]), col(next_values), col(terminated),
        col(truncated), 0.9, 0.5, bootstrap,
    )  # fmt: skip
    return np.asarray(vs)[:, 0], np.asarray(adv)[:, 0]


def test_brax_gae_targets_and_advantages_hand_computed():
    # gamma 0.9, lambda 0.5, V = [.5, 1, 1.5], r = [1, 2, 3]; the segment ends in a termination.
    # deltas [1.4, 2.35, 1.5] -> GAE [2.76125, 3.025, 1.5]; v_s = V + GAE;
    # advantages r + gamma * (1 - term) * v_{t+1} - V = [.5 + .9 * 4.025, 1 + .9 * 3, 1.5].
    vs, adv = _gae([0, 0, 1], [0, 0, 0], [1.0, 1.5, 9.0])
    np.testing.assert_allclose(vs, [3.26125, 4.025, 3.0], rtol=1e-6)
    np.testing.assert_allclose(adv, [4.1225, 3.7, 1.5], rtol=1e-6)
    # A time limit at step 1 (Brax): that step has no TD error and no advantage, the trace stops
    # there, and step 2 bootstraps from V(next_obs) = 2: deltas [1.4, 0, 3.3].
    vs, adv = _gae([0, 0, 0], [0, 1, 0], [1.0, 7.0, 2.0])
    np.testing.assert_allclose(vs, [1.9, 1.0, 4.8], rtol=1e-6)
    np.testing.assert_allclose(adv, [1.4, 0.0, 3.3], rtol=1e-6)
    # bootstrap_truncated: step 1 bootstraps from V(final obs) = 2.5: deltas [1.4, 3.25, 3.3].
    vs, adv = _gae([0, 0, 0], [0, 1, 0], [1.0, 2.5, 2.0], bootstrap=True)
    np.testing.assert_allclose(vs, [3.3625, 4.25, 4.8], rtol=1e-6)
    np.testing.assert_allclose(adv, [4.325, 3.25, 3.3], rtol=1e-6)


def test_ppo_computes_gae_per_segment_with_the_current_value_network():
    # V(s) = s[0] for a hand-set value "network"; one segment of 3 steps, no ends: the targets
    # are gae_value_targets of that segment, bootstrapped from V of its last next observation.
    cfg = PPOConfig(policy_hidden_dims=(4,), value_hidden_dims=(4,), unroll_length=3)
    agent = PPO.create(cfg, jnp.zeros(OBS_DIM), jnp.zeros(ACT_DIM), 0)
    agent = agent.replace(value=agent.value.replace(apply_fn=lambda p, obs: obs[..., 0]))
    obs = jnp.zeros((1, 3, OBS_DIM)).at[0, :, 0].set(jnp.asarray([0.5, 1.0, 1.5]))
    next_obs = jnp.zeros((1, 3, OBS_DIM)).at[0, :, 0].set(jnp.asarray([1.0, 1.5, 2.0]))
    z = jnp.zeros((1, 3))
    segments = {
        "obs": obs, "next_obs": next_obs, "raw_action": jnp.zeros((1, 3, ACT_DIM)),
        "log_prob": z, "reward": jnp.asarray([[1.0, 2.0, 3.0]]), "terminated": z, "truncated": z,
    }  # fmt: skip
    hp = {**agent.hparams, "discount": jnp.float32(0.9), "gae_lambda": jnp.float32(0.5)}
    rows = gae_minibatch(agent.replace(hparams=hp), segments)
    vs, adv = _gae([0, 0, 0], [0, 0, 0], [1.0, 1.5, 2.0])
    np.testing.assert_allclose(rows["return"], vs, rtol=1e-6)
    np.testing.assert_allclose(rows["advantage"], adv, rtol=1e-6)
    assert rows["obs"].shape == (3, OBS_DIM)
