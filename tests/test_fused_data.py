"""Prior data in the fused loop: datasets collected on JAX envs, and the minibatch mix.

A dataset on a JAX env (``jaxrl dataset collect --env jax:pendulum``) round-trips through the
D4RL file; in the fused loop it is a second device buffer, and every minibatch takes
``--offline-ratio`` of its rows from it inside the compiled chunk, as the host loop does.
(Resuming across the offline-to-online switch on a JAX env is a case of test_preemption.py;
the agents the fused loop cannot fine-tune are refused in test_bad_inputs.py.)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from jaxrl.buffers import buffer_from_arrays
from jaxrl.cli import main
from jaxrl.data import load_dataset
from jaxrl.loops import TrainConfig, prepare_run_dir, train_fused
from jaxrl.registry import AgentSpec
from jaxrl.run.collect import rollout_jax
from jaxrl.run.runs import make_jax_envs
from jaxrl.types import Transition

MARK = 5.0  # the dataset's reward: Pendulum's own rewards are never positive


@dataclasses.dataclass(frozen=True)
class _CounterConfig:
    batch_size: int = 8
    utd_ratio: int = 1
    buffer_size: int = 1000
    learning_starts: int = 10


class _Counter(struct.PyTreeNode):
    """An agent that acts randomly and counts the rows each source gave its minibatches."""

    prior_rows: jax.Array
    online_rows: jax.Array
    marked_rows: jax.Array
    updates: jax.Array
    config: _CounterConfig = struct.field(pytree_node=False)

    @classmethod
    def create(cls, config, obs, act, seed):
        del obs, act, seed
        return cls(jnp.int32(0), jnp.int32(0), jnp.int32(0), jnp.int32(0), config)

    def update(self, batch):
        new = self.replace(
            prior_rows=self.prior_rows + jnp.sum(batch.reward == MARK),
            online_rows=self.online_rows + jnp.sum(batch.reward <= 0.0),
            # The rows the loops mark as the dataset's (registry needs_source).
            marked_rows=self.marked_rows + jnp.sum(batch.from_dataset == 1.0),
            updates=self.updates + 1,
        )
        counts = {"count/prior": new.prior_rows, "count/online": new.online_rows}
        counts["count/marked"] = new.marked_rows
        return new, {**counts, "count/updates": new.updates}

    def sample_actions(self, obs, rng):
        return jax.random.uniform(rng, (obs.shape[0], 1), minval=-1, maxval=1)

    def eval_actions(self, obs):
        return jnp.zeros((obs.shape[0], 1))


@pytest.mark.parametrize(("env_id", "ratio"), [("jax:pendulum", 0.25), ("Pendulum-v1", 0.5)])
def test_both_loops_mix_the_dataset_into_every_minibatch_at_the_ratio(tmp_path, env_id, ratio):
    from jaxrl.envs import make_env
    from jaxrl.loops import train_host

    spec = AgentSpec("counter", _Counter, _CounterConfig, "off-policy", needs_source=True)
    config = _CounterConfig()
    n, steps = (2, 100) if env_id.startswith("jax:") else (1, 100)
    cfg = TrainConfig(
        env=env_id, num_envs=n, total_steps=steps, eval_every=steps, eval_episodes=1,
        progress=False, tensorboard=False,
    )  # fmt: skip
    rows = 300
    prior = buffer_from_arrays(
        Transition(
            jnp.zeros((rows, 3)), jnp.zeros((rows, 1)), jnp.full(rows, MARK), jnp.zeros((rows, 3)),
            jnp.zeros(rows), from_dataset=jnp.ones(rows),
        )
    )  # fmt: skip
    out = str(tmp_path / "run")
    prepare_run_dir(out, {"agent": "counter"})
    mix = {"prior": prior, "prior_ratio": ratio}
    if env_id.startswith("jax:"):  # the fused loop
        env, eval_env = make_jax_envs(env_id, n, 1, config, spec)
        summary = train_fused(spec, config, env, eval_env, cfg, [out], **mix)[0]
    else:  # the host loop
        agent = _Counter.create(config, None, None, 0)
        env, eval_env = make_env(env_id, n), make_env(env_id, 1)
        summary = train_host(spec, agent, env, eval_env, cfg, out, **mix)
        env.close()
        eval_env.close()
    assert summary["completed"] and summary["online_steps"] == steps
    with open(os.path.join(out, "metrics.csv")) as f:
        last = list(csv.DictReader(f))[-1]
    # Updates start at env step 10 (learning_starts): 45 iterations of utd_ratio * n updates.
    updates = (steps - config.learning_starts) // n * n
    from_prior = round(ratio * config.batch_size)
    assert int(float(last["count/updates"])) == updates
    assert int(float(last["count/prior"])) == updates * from_prior
    assert int(float(last["count/online"])) == updates * (config.batch_size - from_prior)
    # The online rows are marked 0, the dataset's 1.
    assert int(float(last["count/marked"])) == updates * from_prior


def test_jax_env_dataset_round_trips_and_rlpd_trains_with_it(tmp_path, capsys):
    path = str(tmp_path / "random.hdf5")
    main(["dataset", "collect", "--env", "jax:pendulum", "--kind", "random", "--steps", "600",
          "--seed", "3", "--ref-max-return", "-150", "--out", path])  # fmt: skip
    ds = load_dataset(path)
    direct = rollout_jax("jax:pendulum", None, 600, 3)
    assert ds.env_id == "jax:pendulum" and len(ds) == 600
    for key in ("observations", "actions", "rewards", "next_observations"):
        np.testing.assert_array_equal(getattr(ds, key), getattr(direct, key), err_msg=key)
    np.testing.assert_array_equal(ds.timeouts, direct.timeouts)
    assert ds.timeouts.sum() == 3 and not ds.terminals.any()  # 200-step episodes
    # Real transitions: within an episode, each row's next observation is the next row's.
    cont = ~ds.timeouts[:-1]
    np.testing.assert_array_equal(ds.next_observations[:-1][cont], ds.observations[1:][cont])
    assert np.abs(ds.actions).max() <= 1.0

    out = str(tmp_path / "rlpd")
    main(["train", "rlpd", "--env", "jax:pendulum", "--dataset", path, "--total-steps", "40",
          "--num-envs", "2", "--learning-starts", "10", "--utd-ratio", "1", "--num-qs", "2",
          "--hidden-dims", "16", "16", "--batch-size", "16", "--eval-episodes", "1",
          "--out", out])  # fmt: skip
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["completed"] and summary["dataset"] == path and summary["online_steps"] == 40
    assert summary["normalized_score"] is not None
    # Evaluated on a heavier pendulum (a "real" system), and refused on an env of other spaces.
    main(["eval", out, "--episodes", "2", "--env", "jax:pendulum?m=1.3"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["env"] == "jax:pendulum?m=1.3" and result["episodes"] == 2
    with pytest.raises(SystemExit):
        main(["eval", out, "--env", "jax:point_mass"])
    assert "has (observation, action) sizes (4, 2)" in capsys.readouterr().err
    # An offline run on the JAX env's data, continued online by `jaxrl finetune` (fused loop).
    out = str(tmp_path / "iql")
    main(["train", "iql", "--dataset", path, "--total-steps", "20", "--hidden-dims", "16", "16",
          "--batch-size", "16", "--eval-episodes", "1", "--out", out])  # fmt: skip
    main(["finetune", out, "--online-steps", "64"])
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["completed"] and summary["offline_steps"] == 20
    assert summary["online_steps"] == 64  # one iteration of the default 64 envs
    capsys.readouterr()


def test_an_on_policy_agent_pretrains_on_the_data_then_fine_tunes_on_its_rollouts(tmp_path, capsys):
    # The registry's dataset_pretrain: behaviour cloning in the offline loop, then PPO on the
    # agent's own rollouts in the fused loop, in one run directory (ReinFlow).
    path = str(tmp_path / "random.hdf5")
    main(["dataset", "collect", "--env", "jax:pendulum", "--kind", "random", "--steps", "400",
          "--ref-max-return", "-150", "--out", path])  # fmt: skip
    out = str(tmp_path / "rf")
    tiny = ["--velocity-hidden-dims", "16", "16", "--critic-hidden-dims", "16", "16",
            "--noise-hidden-dims", "8", "--batch-size", "32", "--unroll-length", "8",
            "--minibatch-segments", "4", "--num-minibatches", "2", "--num-epochs", "1"]  # fmt: skip
    main(["train", "reinflow", "--dataset", path, "--offline-steps", "20", "--online-steps", "64",
          "--num-envs", "8", "--eval-episodes", "1", "--out", out, *tiny])  # fmt: skip
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["completed"] and summary["offline_steps"] == 20
    assert summary["online_steps"] == 64  # one update of 8 envs x 8 steps
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["step"] == "20" and rows[0]["bc/loss"]  # the offline phase cloned the data
    assert rows[-1]["step"] == "84" and rows[-1]["actor/loss"]  # then PPO on its rollouts
    # Its online phase needs a JAX env: a Gymnasium dataset is refused before any training.
    gym_path = str(tmp_path / "gym.hdf5")
    main(["dataset", "collect", "--env", "Pendulum-v1", "--kind", "random", "--steps", "200",
          "--ref-max-return", "-150", "--out", gym_path])  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["train", "reinflow", "--dataset", gym_path, "--offline-steps", "5",
              "--online-steps", "5", "--out", str(tmp_path / "gym")])  # fmt: skip
    assert exc.value.code == 2
    assert "fine-tuned on its own rollouts in the fused loop" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "gym" / "checkpoints")
    with pytest.raises(SystemExit):  # its online rates are PPO's own
        main(["train", "reinflow", "--dataset", path, "--offline-steps", "5", "--online-steps",
              "5", "--online-lr-schedule", "cosine", "--out", str(tmp_path / "cos")])  # fmt: skip
    assert "online updates have rates of their own" in capsys.readouterr().err
