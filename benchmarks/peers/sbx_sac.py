"""Measure end-to-end SAC training speed of Stable-Baselines-Jax (sbx) on HalfCheetah-v5.

Run inside the peer virtualenv created by ``setup_peers.sh``::

    .venv-peers/bin/python benchmarks/peers/sbx_sac.py --steps 6000 --learning-starts 1000 --seed 0

Hyperparameters follow the SAC paper defaults (Haarnoja et al., 2018). Only the
training phase is timed: the clock starts ``--warmup`` env steps after
``learning_starts`` (so JIT compilation of the update is excluded) and stops
when ``learn`` returns. One JSON line with the result is printed to stdout.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import mujoco  # noqa: E402
import sbx  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

ENV_ID = "HalfCheetah-v5"


class TrainTimer(BaseCallback):
    """Record the wall-clock time when ``num_timesteps`` reaches ``start_step``."""

    def __init__(self, start_step: int) -> None:
        super().__init__()
        self.start_step = start_step
        self.t_start: float | None = None

    def _on_step(self) -> bool:
        if self.t_start is None and self.num_timesteps >= self.start_step:
            self.t_start = time.perf_counter()
        return True


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6000, help="total env steps")
    p.add_argument("--learning-starts", type=int, default=1000, help="random steps before training")
    p.add_argument("--warmup", type=int, default=1000, help="train steps not timed (JIT)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps <= args.learning_starts + args.warmup:
        p.error("--steps must exceed --learning-starts + --warmup")
    return args


def main() -> None:
    args = parse_args()
    # Send MuJoCo warnings to stderr instead of a MUJOCO_LOG.TXT in the cwd.
    mujoco.set_mju_user_warning(lambda msg: print(f"MuJoCo warning: {msg}", file=sys.stderr))

    env = gym.make(ENV_ID)
    model = sbx.SAC(
        "MlpPolicy",
        env,
        learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=args.learning_starts,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        target_entropy="auto",
        policy_kwargs={"net_arch": {"pi": [256, 256], "qf": [256, 256]}, "n_critics": 2},
        seed=args.seed,
        verbose=0,
    )
    # Training updates begin after step learning_starts; skip the first `warmup` of them.
    timer = TrainTimer(start_step=args.learning_starts + args.warmup)
    model.learn(total_timesteps=args.steps, callback=timer, progress_bar=False)
    t_end = time.perf_counter()
    env.close()

    steps_timed = model.num_timesteps - timer.start_step
    result = {
        "library": "sbx",
        "sbx_version": sbx.__version__,
        "jax_version": jax.__version__,
        "env": ENV_ID,
        "steps_timed": steps_timed,
        "env_steps_per_s": round(steps_timed / (t_end - timer.t_start), 2),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
