"""What the loops give a planner: its plan carried between steps and reset at each episode's
first step, checkpointed with the run; sequence minibatches of consecutive steps; and the burst
of updates when learning starts (registry kind "planner", ``sequence_field``, ``burst_at_start``).
"""

import dataclasses
import logging
import os

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrl.config import OffPolicyFields
from jaxrl.envs import make_env
from jaxrl.loops import TrainConfig, init_loop_state, prepare_run_dir, run_config, train_host
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics
from jaxrl.registry import AgentSpec

EPISODE = 6


class ClockEnv(gym.Env):
    """obs = [steps since reset, episode id]; only the time limit (6 steps) ends an episode."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.episode, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return np.array([self.t, self.episode], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t, self.episode], np.float32), 0.0, False, False, {}


gym.register("JaxrlTest/Clock-v0", entry_point=ClockEnv, max_episode_steps=EPISODE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeConfig(OffPolicyFields):
    """A planner that checks what the loops hand it."""

    horizon: int = 3
    """Steps per sequence in a minibatch."""


class Probe(struct.PyTreeNode):
    """Counts updates; its plan counts the steps of the episode, which the obs also holds.

    The carry is ``(count, mismatches)``: ``count`` restarts at 0 when ``first`` says a new
    episode begins, so once the first episode start was seen it equals ``obs[0]`` at every step
    if (and only if) the loop passes the carry on and sets ``first`` right.
    """

    updates: jax.Array
    sequences_ok: jax.Array
    config: ProbeConfig = struct.field(pytree_node=False)

    @classmethod
    def create(cls, config, obs_example, action_example, seed):
        return cls(jnp.int32(0), jnp.float32(1), config)

    def update(self, batch):
        obs, nxt = batch.obs, batch.next_obs
        ok = (
            jnp.all(nxt[:, :-1] == obs[:, 1:])  # consecutive steps...
            & jnp.all(obs[:, 1:, 0] == obs[:, :-1, 0] + 1)  # ...in time order...
            & jnp.all(obs[:, :, 1] == obs[:, :1, 1])  # ...of one episode
            & (obs.shape[1] == self.config.horizon)
        )
        ok = jnp.minimum(self.sequences_ok, ok.astype(jnp.float32))
        return self.replace(updates=self.updates + 1, sequences_ok=ok), {"probe/ok": ok}

    def init_plan(self, num_envs):
        return jnp.full((num_envs,), jnp.nan), jnp.zeros((num_envs,))

    def plan_actions(self, plan, obs, first, key, explore):
        count, mismatches = plan
        count = jnp.where(first, 0.0, count + 1.0)
        mismatches = mismatches + (~jnp.isnan(count) & (count != obs[:, 0]))
        return jnp.zeros((obs.shape[0], 1)), (count, mismatches)

    def sample_actions(self, obs, rng):
        return jnp.zeros((obs.shape[0], 1))

    def eval_actions(self, obs):
        return jnp.zeros((obs.shape[0], 1))


SPEC = AgentSpec(
    "probe-planner", Probe, ProbeConfig, "planner", sequence_field="horizon", burst_at_start=True
)


def test_host_loop_carries_the_plan_samples_sequences_and_bursts(tmp_path, caplog):
    cfg = ProbeConfig(learning_starts=40, batch_size=16, buffer_size=50)
    steps, out = 200, str(tmp_path / "run")
    train = TrainConfig(
        env="JaxrlTest/Clock-v0",
        total_steps=steps,
        out=out,
        progress=False,
        tensorboard=False,
        eval_every=100,
        eval_episodes=1,
        log_every=20,
        checkpoint_every=100,
    )
    env, eval_env = make_env(train.env), make_env(train.env)
    prepare_run_dir(out, run_config(SPEC.name, cfg, train))
    agent = Probe.create(cfg, env.obs_example, env.action_example, 0)
    with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
        summary = train_host(SPEC, agent, env, eval_env, train, out)
    assert summary["completed"]
    # The burst went through the step's own update program: one compilation, not one per length.
    compiled = [r for r in caplog.records if r.getMessage().startswith("Compiling jit(_learn)")]
    assert len(compiled) == 1, [r.getMessage()[:120] for r in compiled]
    template = init_loop_state(SPEC, agent, env)
    state, _ = Checkpointer(os.path.join(out, "checkpoints")).restore(template)
    count, mismatches = np.asarray(state.plan[0]), np.asarray(state.plan[1])
    # The carry synced at the first episode start after learning began, then never slipped.
    assert np.isfinite(count).all() and mismatches.sum() == 0
    # Minibatches were sequences of 3 consecutive steps of one episode (the buffer wrapped).
    assert float(state.agent.sequences_ok) == 1.0
    # One update per step after learning starts, plus the burst of `learning_starts` updates.
    assert int(state.agent.updates) == (steps - 40) + 40
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert rows[-1]["probe/ok"] == 1.0 and "eval_return" in rows[-1]


def test_pets_with_mppi_trains_in_the_host_loop_and_evaluates_by_planning(tmp_path, capsys):
    import json

    from jaxrl.cli import main

    out = str(tmp_path / "pets")
    tiny = ["--hidden-dims", "32", "32", "--ensemble-size", "2", "--num-elites", "2"]
    tiny += ["--population", "32", "--cem-elites", "4", "--cem-iterations", "2", "--horizon", "5"]
    tiny += ["--num-particles", "2", "--batch-size", "32", "--learning-starts", "100"]
    # One refit (at step 100) long enough to fit the raw reward targets (Pendulum's: -16 to 0).
    tiny += ["--model-lr", "1e-3", "--model-epochs", "100", "--patience", "0"]
    main(
        ["train", "pets", "--env", "Pendulum-v1", "--total-steps", "150", "--eval-every", "150"]
        + ["--eval-episodes", "1", "--out", out, "--no-progress", "--method", "mppi"]
        + tiny
    )
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["completed"] and np.isfinite(summary["final_eval_return_mean"])
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert np.isfinite(rows[-1]["model/nll"]) and rows[-1]["model/mse"] < 1.0  # it learned
    assert rows[-1]["model/mse_before"] > 5.0 and rows[-1]["model/epochs"] == 100
    capsys.readouterr()
    main(["eval", out, "--episodes", "1"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["agent"] == "pets" and np.isfinite(result["return_mean"])
