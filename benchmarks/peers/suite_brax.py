"""Learning run of brax.training PPO on a Brax env at jaxrl's PPO settings, in a jaxrl run dir.

Run with the brax virtualenv created by ``setup_brax.sh`` (``make peers-brax``; brax.training
0.14.2 needs jax 0.7.x)::

    .venv-brax/bin/python benchmarks/peers/suite_brax.py --env inverted_pendulum \
        --steps 1000000 --out runs/brax-ppo-s0 --seed 0 --eval-every 100000 --eval-episodes 16

The options and the construction of ``ppo.train`` come from ``brax_training.py``; the defaults
here are jaxrl's ``PPOConfig`` (64 envs, unroll 5, batch 64, 16 minibatches, 4 epochs,
lr 3e-4, discount 0.97, reward scaling 1, entropy cost 0.01, policy 4x32 / value 5x256 swish,
observation normalization). Every setting is in ``config.json`` (``settings``).

Evaluation: brax's own evaluator, ``num_evals = ceil(steps / eval_every) + 1`` (its step-0
evaluation is not written), each over ``--eval-episodes`` envs playing one episode of at most
``--episode-length`` steps with the deterministic policy (``deterministic_eval=True``). Each
``progress_fn`` call after training starts becomes one ``metrics.csv`` row
(``eval/episode_reward`` and its ``_std``). brax rounds the budget up to whole training steps
(``batch_size * unroll_length * num_minibatches`` env steps), so the rows' steps are brax's
actual counts and the last one (``summary.json``'s ``total_steps``) can exceed ``--steps``.

Resume: a directory with ``summary.json`` is finished (printed, exit 0) and never rerun. A run
killed before that restarts from scratch: brax.training's checkpoint restores parameters only
(not the optimizer state, step count or RNG), so there is nothing to continue from; the rows of
the killed attempt are dropped and ``wall_clock_s`` counts the final attempt only.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

import rundir

# mujoco.mjx prints "Failed to import warp" on stdout; stdout is kept for the summary line.
with contextlib.redirect_stdout(sys.stderr):
    import brax
    import brax_training
    import jax

# jaxrl's PPOConfig defaults (jaxrl/agents/ppo.py), in brax_training.py's option names.
JAXRL_PPO = {
    "num_envs": 64,
    "episode_length": 1000,
    "learning_rate": 3e-4,
    "discounting": 0.97,
    "reward_scaling": 1.0,
    "normalize_observations": True,
    "unroll_length": 5,
    "batch_size": 64,
    "num_minibatches": 16,
    "num_updates_per_batch": 4,
    "entropy_cost": 1e-2,
    "policy_hidden": (32, 32, 32, 32),
    "value_hidden": (256, 256, 256, 256, 256),
}

# brax.training 0.14.2 PPO settings with no option here; they equal jaxrl's PPO defaults.
FIXED = {
    "clipping_epsilon": 0.3,
    "gae_lambda": 0.95,
    "vf_loss_coefficient": 0.5,
    "max_grad_norm": None,
    "normalize_advantage": True,
    "bootstrap_on_timeout": False,
    "activation": "swish",
    "action_repeat": 1,
}


def main() -> None:
    """Parse flags, train with brax.training and write the run directory."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    brax_training.add_train_args(p, algos=("ppo",))
    p.set_defaults(**JAXRL_PPO)
    p.add_argument("--steps", type=int, default=1_000_000, help="total env steps (brax rounds up)")
    rundir.add_common_args(p, eval_every=100_000, eval_episodes=16)
    args = p.parse_args()
    if args.eval_every <= 0 or args.steps <= 0:
        p.error("--steps and --eval-every must be positive")

    run = rundir.RunDir(args.out)
    run.exit_if_finished()
    args.total_steps = args.steps
    args.num_evals = math.ceil(args.steps / args.eval_every) + 1
    args.num_eval_envs = args.eval_episodes
    args.deterministic_eval = True
    train_fn, algo_settings = brax_training.make_train_fn(args)
    env_id = f"brax:{args.env}"
    settings = {
        "backend": args.backend,
        "num_envs": args.num_envs,
        "episode_length": args.episode_length,
        "learning_rate": args.learning_rate,
        "discounting": args.discounting,
        "reward_scaling": args.reward_scaling,
        "normalize_observations": args.normalize_observations,
        **algo_settings,
        **FIXED,
        "num_evals": args.num_evals,
        "num_eval_envs": args.num_eval_envs,
        "deterministic_eval": True,
        "eval_every_requested": args.eval_every,
        "steps_note": "brax rounds the budget up to whole training steps; rows hold its counts",
        "resume": "restart from scratch (brax.training cannot resume a killed run)",
        "jax": jax.__version__,
    }
    config = {
        "agent": "ppo",
        "env": env_id,
        "dataset": None,
        "seed": args.seed,
        "impl": f"brax.training {brax.__version__}",
        "total_steps": args.steps,
        "settings": settings,
    }
    run.write_config(config)
    run.checkpoint()  # never one here: this drops the rows of a killed attempt

    def progress_fn(step: int, metrics: dict) -> None:
        if int(step) == 0:
            return  # the initial evaluation, before any training
        mean = float(metrics["eval/episode_reward"])
        std = float(metrics["eval/episode_reward_std"])
        run.append_metrics(int(step), mean, std)
        print(f"step {int(step)} eval_return {mean:.2f} +- {std:.2f}", file=sys.stderr, flush=True)

    train_fn(progress_fn=progress_fn)
    last = run.last_eval()
    steps_done = last[0] if last else 0
    wall = run.wall_clock_s()
    run.finish(config, None, env_steps_per_s=steps_done / max(wall, 1e-9))


if __name__ == "__main__":
    main()
