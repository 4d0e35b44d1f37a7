"""The host training loop: true transitions in the buffer, bootstrapping on truncation, resume
that is bit-identical to an uninterrupted run, and the run-directory contract."""

import json
import os
import signal

import gymnasium as gym
import jax
import numpy as np
import pytest

from jaxrl import registry
from jaxrl.cli import main
from jaxrl.envs import HostEnv, make_env
from jaxrl.loops import TrainConfig, init_loop_state
from jaxrl.loops.checkpoint import Checkpointer
from jaxrl.loops.logging import read_metrics
from jaxrl.run import train


class CounterEnv(gym.Env):
    """obs = [steps since reset, episode id]; terminates when action > 0.5; time limit 4."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        self.episode, self.t = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t, self.episode], np.float32)

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, bool(action[0] > 0.5), False, {}


class ConstantEnv(gym.Env):
    """Reward 1 forever, constant observation; only a time limit (10 steps) ends episodes."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, False, False, {}


gym.register("JaxrlTest/Counter-v0", entry_point=CounterEnv, max_episode_steps=4)
gym.register("JaxrlTest/Constant-v0", entry_point=ConstantEnv, max_episode_steps=10)


def _run(name, env, out, steps, **agent_kw):
    train_kw = agent_kw.pop("train", {})
    config_cls = registry.get(name).config
    cfg = config_cls(**{"hidden_dims": (32, 32), **agent_kw})
    run = TrainConfig(
        env=env,
        total_steps=steps,
        seed=0,
        out=str(out),
        progress=False,
        tensorboard=False,
        **{"eval_every": steps, "eval_episodes": 2, **train_kw},
    )
    return train(name, run, cfg)


def _restore_state(out, name="sac", env_id="JaxrlTest/Counter-v0", **agent_kw):
    agent_cls, config_cls = registry.get(name).agent, registry.get(name).config
    cfg = config_cls(**{"hidden_dims": (32, 32), **agent_kw})
    env = make_env(env_id)
    agent = agent_cls.create(cfg, env.obs_example, env.action_example, 0)
    template = init_loop_state(registry.get(name), agent, env)
    return Checkpointer(os.path.join(out, "checkpoints")).restore(template)


def test_host_env_returns_final_observation_not_reset_observation():
    env = HostEnv("JaxrlTest/Counter-v0", num_envs=3)
    obs = env.reset(seed=0)
    rng = np.random.default_rng(0)
    n_trunc = n_term = 0
    for _ in range(40):
        action = rng.uniform(-1, 1, (3, 1)).astype(np.float32)
        next_obs, new_obs, reward, term, trunc = env.step(action)
        np.testing.assert_array_equal(next_obs[:, 0], obs[:, 0] + 1)  # a real successor ...
        np.testing.assert_array_equal(next_obs[:, 1], obs[:, 1])  # ... of the same episode
        np.testing.assert_array_equal(term, action[:, 0] > 0.5)
        np.testing.assert_array_equal(trunc & ~term, (next_obs[:, 0] == 4) & ~term)
        done = term | trunc
        np.testing.assert_array_equal(new_obs[done, 0], 0)  # the agent sees the reset obs
        n_trunc, n_term = n_trunc + (trunc & ~term).sum(), n_term + term.sum()
        obs = new_obs
    assert n_trunc > 5 and n_term > 5


def test_buffer_holds_only_real_transitions(tmp_path):
    out = tmp_path / "run"
    _run(
        "sac",
        "JaxrlTest/Counter-v0",
        out,
        300,
        learning_starts=10_000,
        buffer_size=1000,
        train={"num_envs": 2},
    )
    state, meta = _restore_state(out, buffer_size=1000, learning_starts=10_000)
    assert meta["step"] == 300
    data = jax.tree.map(np.asarray, state.buffer.data)
    size = int(state.buffer.size)
    assert size == 300
    obs, nxt = data.obs[:size], data.next_obs[:size]
    np.testing.assert_array_equal(nxt[:, 0], obs[:, 0] + 1)
    np.testing.assert_array_equal(nxt[:, 1], obs[:, 1])
    np.testing.assert_array_equal(data.terminal[:size], (data.action[:size, 0] > 0.5))
    # truncated (time-limit) rows are stored with terminal = 0, so they are bootstrapped
    truncated = (nxt[:, 0] == 4) & (data.action[:size, 0] <= 0.5)
    assert truncated.sum() > 5 and (data.terminal[:size][truncated] == 0).all()


@pytest.mark.slow
def test_truncation_is_bootstrapped(tmp_path):
    # With gamma = 0.9 and reward 1 forever, Q = 1 / (1 - 0.9) = 10 when time-limit truncation is
    # bootstrapped; treating it as termination would give ~4.1 (the average over episode time).
    _run(
        "td3",
        "JaxrlTest/Constant-v0",
        tmp_path / "r",
        3000,
        discount=0.9,
        critic_lr=1e-3,
        tau=0.1,
        learning_starts=200,
        buffer_size=5000,
        train={"log_every": 500},
    )
    q = [r["critic/q_mean"] for r in read_metrics(str(tmp_path / "r" / "metrics.csv"))]
    assert 8.5 < q[-1] < 11.5, q


def _metrics_without_timing(out):
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


RESUME_KW = dict(
    learning_starts=200,
    buffer_size=5000,
    train={"eval_every": 400, "log_every": 100, "checkpoint_every": 250},
)


@pytest.mark.slow
def test_resume_is_bit_identical_on_mujoco(tmp_path, monkeypatch):
    env_id = "InvertedPendulum-v5"
    full, split, killed = tmp_path / "full", tmp_path / "split", tmp_path / "killed"
    _run("sac", env_id, full, 1200, **_copy(RESUME_KW))
    # (1) stop at a checkpoint boundary, then continue with a larger budget
    _run("sac", env_id, split, 800, **_copy(RESUME_KW))  # a final step evaluates: pick 2 x 400
    _run("sac", env_id, split, 1200, **_copy(RESUME_KW))
    # (2) Ctrl-C in the middle of an episode, between checkpoints
    original, calls = HostEnv.step, {"n": 0}

    def step_and_interrupt(self, action):
        if self.num_envs == 1:
            calls["n"] += 1
            if calls["n"] == 613:
                os.kill(os.getpid(), signal.SIGINT)
        return original(self, action)

    monkeypatch.setattr(HostEnv, "step", step_and_interrupt)
    summary = _run("sac", env_id, killed, 1200, **_copy(RESUME_KW))
    assert not summary["completed"] and summary["total_steps"] == 613
    monkeypatch.setattr(HostEnv, "step", original)
    _run("sac", env_id, killed, 1200, **_copy(RESUME_KW))

    want = _metrics_without_timing(full)
    assert len(want) == 12 and sum("eval_return" in r for r in want) == 3
    assert _metrics_without_timing(split) == want
    assert _metrics_without_timing(killed) == want


def _copy(kw):
    return {**kw, "train": dict(kw["train"])}


def test_updates_dispatched_before_the_env_step_change_nothing(tmp_path, monkeypatch):
    # The loop dispatches an update before the env step when its minibatch rows miss the rows
    # the step writes. Forcing every update after the write must give the same run, bit for bit.
    from jaxrl.loops import host as host_lib

    kw = dict(learning_starts=100, batch_size=64, buffer_size=300, train={"log_every": 50})
    written, drawn = [], []
    rows_written, draw = host_lib.HostState.rows_written, host_lib.MinibatchSampler.draw
    record = lambda self: written.append(rows_written(self)) or written[-1]  # noqa: E731
    monkeypatch.setattr(host_lib.HostState, "rows_written", record)
    monkeypatch.setattr(
        host_lib.MinibatchSampler,
        "draw",
        lambda self, *a: drawn.append(draw(self, *a)) or drawn[-1],
    )
    _run("sac", "InvertedPendulum-v5", tmp_path / "early", 700, **_copy(kw))
    # 600 learning steps; with a 300-row buffer a 64-row minibatch reads the row being written
    # on ~20% of them, so both paths run.
    touched = [np.isin(rows, w).any() for (rows, _), w in zip(drawn, written, strict=True)]
    assert len(touched) == 600 and 20 < sum(touched) < 300
    monkeypatch.setattr(host_lib.HostState, "rows_written", lambda self: None)
    _run("sac", "InvertedPendulum-v5", tmp_path / "late", 700, **_copy(kw))
    want = _metrics_without_timing(tmp_path / "late")
    assert len(want) == 14 and "critic/loss" in want[-1]
    assert _metrics_without_timing(tmp_path / "early") == want


def test_resume_of_unsavable_env_says_episodes_restart(tmp_path, capsys):
    def pendulum(steps):
        return _run(
            "sac",
            "Pendulum-v1",
            tmp_path / "p",
            steps,
            learning_starts=100,
            buffer_size=1000,
            train={"eval_every": 150},
        )

    pendulum(150)
    summary = pendulum(250)
    assert summary["completed"] and summary["total_steps"] == 250
    text = capsys.readouterr().out
    assert "Resuming" in text and "restart" in text
    # Rerunning a finished run changes nothing (its summary keeps the measured speeds).
    assert pendulum(250) == summary and "already completed" in capsys.readouterr().out


def test_cli_run_directory_contract_eval_and_corrupt_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = [
        "train",
        "sac",
        "--env",
        "Pendulum-v1",
        "--total-steps",
        "300",
        "--out",
        out,
        "--eval-every",
        "150",
        "--eval-episodes",
        "2",
        "--learning-starts",
        "100",
        "--hidden-dims",
        "32",
        "32",
        "--buffer-size",
        "1000",
        "--no-progress",
    ]
    main(args)
    assert "final eval return" in capsys.readouterr().out
    files = set(os.listdir(out))
    assert {
        "config.json",
        "metrics.csv",
        "summary.json",
        "checkpoints",
        "learning_curve.png",
    } <= files
    assert any(f.startswith("events.out.tfevents") for f in files)
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["agent"] == "sac" and config["agent_config"]["hidden_dims"] == [32, 32]
    summary = json.load(open(os.path.join(out, "summary.json")))
    for key in (
        "agent",
        "env",
        "seed",
        "total_steps",
        "final_eval_return_mean",
        "final_eval_return_std",
        "normalized_score",
        "wall_clock_s",
        "env_steps_per_s",
        "updates_per_s",
    ):
        assert key in summary
    rows = read_metrics(os.path.join(out, "metrics.csv"))
    assert [r["step"] for r in rows if "eval_return" in r] == [150, 300]
    assert rows[-1]["eval_return"] == summary["final_eval_return_mean"]

    main(["eval", out, "--episodes", "3"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 3 and np.isfinite(result["return_mean"])

    # A corrupt newest checkpoint: a clear error naming it; the previous one survives.
    ckpt_dir = os.path.join(out, "checkpoints")
    assert sorted(int(s) for s in os.listdir(ckpt_dir) if s.isdigit()) == [150, 300]
    for root, _, names in os.walk(os.path.join(ckpt_dir, "300")):
        for name in names:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"garbage")
    with pytest.raises(SystemExit) as exit_info:
        main(args[:5] + ["600"] + args[6:])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and os.path.join(ckpt_dir, "300") in err and "step 150" in err
    # Following the advice resumes from step 150.
    import shutil

    shutil.rmtree(os.path.join(ckpt_dir, "300"))
    main(args[:5] + ["600"] + args[6:])
    assert "Resuming" in capsys.readouterr().out
    assert json.load(open(os.path.join(out, "summary.json")))["total_steps"] == 600


def test_resume_with_a_different_config_is_refused(tmp_path, capsys):
    out = str(tmp_path / "run")
    base = [
        "train",
        "sac",
        "--env",
        "Pendulum-v1",
        "--total-steps",
        "120",
        "--out",
        out,
        "--learning-starts",
        "100",
        "--hidden-dims",
        "32",
        "32",
        "--buffer-size",
        "500",
        "--no-progress",
        "--eval-every",
        "120",
        "--eval-episodes",
        "1",
    ]
    main(base)
    with pytest.raises(SystemExit) as exit_info:
        main(base + ["--actor-lr", "0.001"])
    assert exit_info.value.code == 2
    assert "different configuration" in capsys.readouterr().err


def test_train_online_script_runs_end_to_end(tmp_path):
    import runpy

    from jaxrl.agents import TD3Config

    script = runpy.run_path(
        os.path.join(os.path.dirname(__file__), "..", "scripts", "train_online.py")
    )
    args = script["Args"](
        agent="td3",
        train=TrainConfig(
            env="Pendulum-v1",
            total_steps=200,
            out=str(tmp_path / "s"),
            eval_every=200,
            eval_episodes=1,
            progress=False,
            tensorboard=False,
        ),
        td3=TD3Config(hidden_dims=(16, 16), learning_starts=100, buffer_size=500),
    )
    summary = script["main"](args)
    assert summary["completed"] and summary["agent"] == "td3"
    assert os.path.exists(tmp_path / "s" / "learning_curve.png")


def test_eval_of_a_run_from_another_version_names_its_unknown_options(tmp_path, capsys):
    _run("sac", "Pendulum-v1", tmp_path, 60, learning_starts=20)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["train"]["overlap"] = True  # an option of another jaxrl version
    path.write_text(json.dumps(config))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(tmp_path), "--episodes", "1"])
    assert exit_info.value.code == 2
    assert "loop options this version of jaxrl does not know (overlap)" in capsys.readouterr().err
