"""Rollout videos: frames from every env kind, mp4 round trips, --video-every, the no-GL error."""

import os
import struct
import subprocess
import sys

import imageio.v2 as imageio
import jax
import numpy as np
import pytest

from jaxrl.agents.sac import SAC, SACConfig
from jaxrl.envs import make_env
from jaxrl.envs import render as render_mod
from jaxrl.envs.jax_envs import make_jax_env
from jaxrl.errors import ConfigError
from jaxrl.loops.evaluation import record_jax
from jaxrl.loops.video import episode_frames, write_video

SIZE = (96, 64)  # width, height


@pytest.fixture(autouse=True)
def _find_gl(monkeypatch):
    """The suite turns MuJoCo's GL off (conftest); these tests let jaxrl find a backend."""
    if os.environ.get("MUJOCO_GL") == "disable":
        monkeypatch.delenv("MUJOCO_GL")


def _agent(obs_dim, act_dim):
    cfg = SACConfig(hidden_dims=(8,))
    return SAC.create(cfg, np.zeros(obs_dim, np.float32), np.zeros(act_dim, np.float32), 0)


def _check_frames(frames, n, moving_rows=None):
    """Non-blank frames that change from one to the next."""
    assert frames.shape == (n, SIZE[1], SIZE[0], 3) and frames.dtype == np.uint8
    assert min(f.std() for f in frames) > 5.0, "a blank frame"
    diffs = [np.abs(a.astype(int) - b).mean() for a, b in zip(frames[:-1], frames[1:], strict=True)]
    assert np.mean(np.asarray(diffs) > 0) >= 0.8, f"frames do not change: {diffs}"


def _round_trip(tmp_path, frames, fps):
    path = write_video(str(tmp_path / "v.mp4"), frames, fps)
    back = [f for f in imageio.get_reader(path)]
    assert len(back) == len(frames) and back[0].shape == frames[0].shape
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Pendulum-v1"])
def test_host_env_frames_move_and_round_trip(env_id, tmp_path):
    if env_id.startswith("Half"):
        render_mod.gl_backend()
    env = make_env(env_id, 1, render=SIZE)
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        frames = []
        for _ in range(20):
            env.step(rng.uniform(-1, 1, (1, env.action_dim)))
            frames.append(env.render())
        fps = env.frame_rate
    finally:
        env.close()
    from jaxrl.loops.video import _fit

    frames = np.stack([_fit(f, *SIZE) for f in frames])
    _check_frames(frames, 20)
    assert fps == pytest.approx(20.0)  # both step 0.05 s
    _round_trip(tmp_path, frames, fps)


@pytest.mark.parametrize("env_id", ["brax:inverted_pendulum", "jax:pendulum"])
def test_jax_env_episode_frames(env_id, tmp_path):
    env = make_jax_env(f"{env_id}?episode_length=20", 1)
    # The untrained policy's actions move both: the pole falls, the pendulum swings.
    agent = _agent(env.observation_size, env.action_size)
    frames, fps = episode_frames(agent, env, 3, SIZE)
    _check_frames(frames, 20)
    assert fps == pytest.approx(25.0 if env_id.startswith("brax") else 20.0, rel=1e-4)
    _round_trip(tmp_path, frames, fps)


def test_randomized_episodes_render_with_their_own_drawn_model(monkeypatch):
    env = make_jax_env("brax:inverted_pendulum?mass_scale=0.5:2&episode_length=5", 2)
    agent = _agent(env.observation_size, env.action_size)
    rollout = jax.jit(lambda a, k, s: record_jax(a, env, k, s))
    _, data, _ = jax.device_get(rollout(agent, jax.random.key(1), None))
    drawn = np.asarray(data["model"]["body_mass"])[0]  # [copies, bodies] at the first step
    assert not np.allclose(drawn[0], drawn[1])
    used = []
    original = render_mod.MujocoFrames.frame

    def spy(self, qpos):
        used.append(np.array(self.model.body_mass))
        return original(self, qpos)

    monkeypatch.setattr(render_mod.MujocoFrames, "frame", spy)
    episode_frames(agent, env, 1, SIZE, episodes=2, rollout=rollout)
    assert len(used) == 10
    np.testing.assert_allclose(used[0], drawn[0], rtol=1e-6)
    np.testing.assert_allclose(used[-1], drawn[1], rtol=1e-6)
    nominal = np.asarray(env.core.env.sys.mj_model.body_mass)
    assert not np.allclose(used[0], nominal)


def _tensorboard_tags(run_dir):
    """(tag, step, has_image) of every summary value in the run's TensorBoard event files."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for name in os.listdir(run_dir):
        if not name.startswith("events.out.tfevents"):
            continue
        with open(os.path.join(run_dir, name), "rb") as f:
            raw = f.read()
        at = 0
        while at < len(raw):  # TFRecord: length, its crc, the record, its crc
            (n,) = struct.unpack("<Q", raw[at : at + 8])
            event = Event.FromString(raw[at + 12 : at + 12 + n])
            at += 12 + n + 4
            for v in event.summary.value:
                found.append((v.tag, event.step, v.HasField("image")))
    return found


class _Wandb:
    """A stand-in ``wandb`` module: records what runs log (no network)."""

    def __init__(self):
        self.logged = []

    def init(self, **kwargs):
        return self

    def log(self, values, step):
        self.logged.append((step, values))

    def finish(self, exit_code=0):
        pass

    class Video:
        def __init__(self, path, format):
            self.path, self.format = path, format


@pytest.mark.slow
def test_video_every_writes_videos_at_its_evaluation_points(tmp_path, monkeypatch):
    from jaxrl.loops import TrainConfig
    from jaxrl.run.train import train

    wandb = _Wandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    out = str(tmp_path / "run")
    cfg = TrainConfig(
        env="jax:pendulum?episode_length=30", total_steps=640, num_envs=4, out=out,
        eval_every=128, eval_episodes=2, log_every=64, video_every=2, video_width=64,
        video_height=48, progress=False, wandb_project="p",
    )  # fmt: skip
    train("sac", cfg, SACConfig(hidden_dims=(16,), learning_starts=64))
    sent = [(step, v["eval/video"]) for step, v in wandb.logged if "eval/video" in v]
    assert [(s, os.path.basename(v.path), v.format) for s, v in sent] == [
        (k, f"step_{k}.mp4", "mp4") for k in (256, 512, 640)
    ]
    # Evaluation points at 128, 256, ..., 640: every 2nd (256, 512) and the last one.
    videos = sorted(os.listdir(os.path.join(out, "videos")))
    assert videos == ["step_256.mp4", "step_512.mp4", "step_640.mp4"]
    frames = [f for f in imageio.get_reader(os.path.join(out, "videos", "step_640.mp4"))]
    assert len(frames) == 30 and frames[0].shape == (48, 64, 3)
    tags = _tensorboard_tags(out)
    assert sorted(s for t, s, image in tags if t == "eval/video" and image) == [256, 512, 640]


def test_no_gl_backend_is_one_clear_error_and_leaves_no_run_dir(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "DISPLAY"}
    env["MUJOCO_GL"] = "glfw"  # needs a display, which a test machine does not have
    done = subprocess.run(
        [sys.executable, "-m", "jaxrl.cli", "train", "sac", "--env", "HalfCheetah-v5",
         "--total-steps", "10", "--video-every", "1", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, done.stderr
    assert "no OpenGL backend works" in lines[0] and "libegl1" in lines[0], lines[0]
    assert not out.exists()


def test_video_options_are_checked():
    from jaxrl.loops import TrainConfig

    with pytest.raises(ConfigError, match="even"):
        TrainConfig(video_every=1, video_width=95)
    with pytest.raises(ConfigError, match="video_every"):
        TrainConfig(video_every=0)


def test_eval_command_films_the_evaluation_episodes(tmp_path, capsys):
    import json

    from jaxrl.cli import main

    out = str(tmp_path / "run")
    main(["train", "sac", "--env", "Pendulum-v1", "--total-steps", "100", "--learning-starts", "50",
          "--hidden-dims", "8", "--eval-every", "50", "--eval-episodes", "1", "--no-progress",
          "--no-tensorboard", "--out", out])  # fmt: skip
    capsys.readouterr()
    main(["eval", out, "--episodes", "2", "--video", "--width", "64", "--height", "48"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["video"] == os.path.join(out, "videos", "eval_step_100.mp4")
    frames = [f for f in imageio.get_reader(result["video"])]
    assert len(frames) == 400 and frames[0].shape == (48, 64, 3)  # two 200-step episodes
    mine = str(tmp_path / "at50.mp4")
    main(["eval", out, "--episodes", "1", "--step", "50", "--video", mine, "--fps", "10"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 50 and result["video"] == mine
    assert imageio.get_reader(mine).get_meta_data()["fps"] == 10
    with pytest.raises(SystemExit) as err:
        main(["eval", out, "--video", "--width", "65"])
    assert err.value.code == 2 and "even" in capsys.readouterr().err
