"""A full disk during a checkpoint write: a clear error, the previous checkpoint loadable, and a
resume from it once there is space. Uses a size-limited tmpfs mount (skipped where the test
cannot mount one, e.g. without root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from jaxrl.cli import main
from jaxrl.loops.checkpoint import Checkpointer

ARGS = ["sac", "--env", "jax:pendulum", "--num-envs", "2", "--total-steps", "300"]
ARGS += ["--learning-starts", "50", "--eval-every", "300", "--checkpoint-every", "100"]
ARGS += ["--log-every", "100", "--hidden-dims", "16", "16", "--buffer-size", "2000"]
ARGS += ["--eval-episodes", "1", "--no-progress", "--no-tensorboard"]


@pytest.fixture
def small_disk(tmp_path):
    """A 320 KiB tmpfs: room for one checkpoint of the run above (~190 KiB) but not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(mount)]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_keeps_the_last_checkpoint_and_resumes(small_disk, capsys):
    out = str(small_disk / "run")
    with pytest.raises(SystemExit) as exit:
        main(["train", *ARGS, "--out", out])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Could not write the checkpoint of step 200")
    assert "no space left on the device" in err and "step 100, intact" in err
    assert "Traceback" not in err
    ckpt = Checkpointer(os.path.join(out, "checkpoints"))
    assert ckpt.all_steps() == [100]
    assert not [n for n in os.listdir(os.path.join(out, "checkpoints")) if "tmp" in n]
    assert ckpt.meta()["step"] == 100
    # More space: the same command resumes from step 100 and completes.
    remount = ["mount", "-o", "remount,size=4m", str(small_disk)]
    subprocess.run(remount, check=True)
    main(["train", *ARGS, "--out", out])
    assert "Resuming" in capsys.readouterr().out
    assert ckpt.all_steps() == [200, 300]
