"""Learning run of Stable-Baselines-Jax (sbx) SAC, TD3 or CrossQ at jaxrl's settings, in a run dir.

Run inside the peer virtualenv created by ``setup_peers.sh`` (``make peers``)::

    .venv-peers/bin/python benchmarks/peers/suite_sbx.py --algo sac --env HalfCheetah-v5 \
        --steps 100000 --out runs/sbx-sac-s0 --seed 0 --eval-every 5000 --eval-episodes 10

Writes ``config.json``, ``metrics.csv``, ``summary.json`` and ``checkpoints/`` as described in
``rundir.py``; the final summary is printed as one JSON line. Every ``--eval-every`` env steps
and at the end, the deterministic policy (``predict(deterministic=True)``) plays
``--eval-episodes`` episodes in a separate env, and a checkpoint is written (``model.save`` and
``save_replay_buffer``).

Resume: a directory with ``summary.json`` is finished (printed, exit 0). Otherwise the latest
checkpoint is loaded (model, optimizer states, ``num_timesteps``, replay buffer) and
``learn(remaining, reset_num_timesteps=False)`` continues to the same total; the uniform random
warm-up is not repeated because sbx draws random actions only while ``num_timesteps <
learning_starts``. The interrupted training episode is not restored: the env starts a new
episode (the stored transitions are unaffected, each holds its own next observation).

Hyperparameters follow jaxrl's ``SACConfig`` / ``TD3Config`` / ``CrossQConfig`` defaults; every
setting used is in ``config.json`` (``settings``), and what sbx cannot match is listed under
``settings.unmatched``.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import flax.linen as nn  # noqa: E402
import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import rundir  # noqa: E402
import sbx  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.noise import NormalActionNoise  # noqa: E402

# jaxrl's defaults (jaxrl/agents/sac.py SACConfig, td3.py TD3Config, config.py OffPolicyFields).
JAXRL_DEFAULTS = {
    "sac": {
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "temp_lr": 3e-4,
        "batch_size": 256,
        "tau": 0.005,
        "discount": 0.99,
        "hidden_dims": [256, 256],
        "num_qs": 2,
        "init_temperature": 1.0,
        "utd_ratio": 1,
        "buffer_size": 1_000_000,
        "learning_starts": 5_000,
    },
    "td3": {
        "actor_lr": 3e-4,
        "critic_lr": 3e-4,
        "batch_size": 256,
        "tau": 0.005,
        "discount": 0.99,
        "hidden_dims": [256, 256],
        "num_qs": 2,
        "policy_noise": 0.2,
        "noise_clip": 0.5,
        "exploration_noise": 0.1,
        "policy_delay": 2,
        "utd_ratio": 1,
        "buffer_size": 1_000_000,
        "learning_starts": 25_000,
    },
    "crossq": {  # SBX's own CrossQ defaults, which jaxrl's CrossQConfig takes
        "actor_lr": 1e-3,
        "critic_lr": 1e-3,
        "temp_lr": 1e-3,
        "batch_size": 256,
        "discount": 0.99,
        "actor_hidden_dims": [256, 256],
        "critic_hidden_dims": [1024, 1024],
        "num_qs": 2,
        "policy_delay": 3,
        "adam_b1": 0.5,
        "bn_momentum": 0.99,
        "renorm_warmup_steps": 100_000,
        "init_temperature": 1.0,
        "utd_ratio": 1,
        "buffer_size": 1_000_000,
        "learning_starts": 5_000,
    },
}

# Differences sbx 0.28.0 does not let us remove (read from sbx's sac/, td3/ and common/ sources).
UNMATCHED = {
    "common": [
        "first update after env step learning_starts + 1 (SB3 trains when num_timesteps > "
        "learning_starts); random actions for the first learning_starts steps, as jaxrl",
        "resume: the interrupted training episode restarts from a reset (jaxrl restores the "
        "MuJoCo state)",
    ],
    "sac": [
        "kernel init: flax default lecun_normal (jaxrl: xavier_uniform)",
        "actor log-std clipped to [-20, 2] (jaxrl: tanh-squashed into [-5, 2])",
        "temperature loss log(alpha) * (H - target) (jaxrl: alpha * (H - target), SAC eq. 18): "
        "same fixed point, the gradient on log(alpha) is not scaled by alpha",
        "critic loss 0.5 * sum over critics of the MSE (jaxrl: 0.5 * ensemble TD loss)",
    ],
    "crossq": [
        "actor mean and log-std heads: lecun_normal (jaxrl: xavier_uniform, as its SAC; the "
        "hidden layers are lecun_normal in both)",
        "actor log-std clipped to [-20, 2] (jaxrl: tanh-squashed into [-5, 2])",
        "the temperature's Adam steps with sbx's policy learning rate and beta1 0.9, as jaxrl",
    ],
    "td3": [
        "kernel init: flax default lecun_normal (jaxrl: xavier_uniform)",
        "actor loss -min over critics of Q(s, pi(s)) (jaxrl: -Q_1, as the TD3 paper)",
        "both target networks move after every critic step (jaxrl: every policy_delay steps, "
        "with the actor)",
    ],
}


def make_model(algo: str, env: gym.Env, cfg: dict, seed: int, total: int) -> tuple:
    """An sbx SAC or TD3 model configured as jaxrl's agent; also the settings used.

    Args:
        algo: ``'sac'`` or ``'td3'``.
        env: the training env.
        cfg: jaxrl field values (``JAXRL_DEFAULTS[algo]``).
        seed: the run's seed.
        total: total env steps (the replay buffer is allocated for at most this many).

    Returns:
        ``(model, settings)``.
    """
    act_dim = int(np.prod(env.action_space.shape))
    # The buffer never holds more than `total` transitions, so a smaller allocation is the same
    # buffer (and keeps the replay file of each checkpoint small).
    capacity = min(cfg["buffer_size"], total)
    kw = dict(
        learning_rate=cfg["actor_lr"],  # actor (and, for SAC, the temperature)
        qf_learning_rate=cfg["critic_lr"],
        buffer_size=capacity,
        learning_starts=cfg["learning_starts"],
        batch_size=cfg["batch_size"],
        tau=cfg.get("tau"),
        gamma=cfg["discount"],
        train_freq=1,
        gradient_steps=cfg["utd_ratio"],
        seed=seed,
        verbose=0,
    )
    pi, qf = (
        cfg.get(k, cfg.get("hidden_dims")) for k in ("actor_hidden_dims", "critic_hidden_dims")
    )
    policy_kwargs = {"net_arch": {"pi": list(pi), "qf": list(qf)}, "n_critics": cfg["num_qs"]}
    if algo == "crossq":
        if cfg["adam_b1"] != 0.5:
            raise SystemExit("sbx CrossQ's policy sets Adam's beta1 to 0.5")
        kw.pop("tau")  # no target network
        kw.update(
            policy_delay=cfg["policy_delay"],
            ent_coef=f"auto_{cfg['init_temperature']}",
            target_entropy=-float(act_dim),
        )
        policy_kwargs.update(
            batch_norm_momentum=cfg["bn_momentum"],
            renorm_warmup_steps=cfg["renorm_warmup_steps"],
            activation_fn=nn.relu,
        )
        cls = sbx.CrossQ
    elif algo == "sac":
        if cfg["temp_lr"] != cfg["actor_lr"]:
            raise SystemExit("sbx SAC steps the temperature with the actor's learning rate")
        kw.update(
            policy_delay=1,
            ent_coef=f"auto_{cfg['init_temperature']}",
            target_entropy=-float(act_dim),
        )
        policy_kwargs.update(activation_fn=nn.relu, layer_norm=False, dropout_rate=0.0)
        cls = sbx.SAC
    else:
        kw.update(
            policy_delay=cfg["policy_delay"],
            target_policy_noise=cfg["policy_noise"],
            target_noise_clip=cfg["noise_clip"],
            action_noise=NormalActionNoise(
                np.zeros(act_dim), cfg["exploration_noise"] * np.ones(act_dim)
            ),
        )
        cls = sbx.TD3
    settings = {
        **cfg,
        "sbx": {
            **{k: v for k, v in kw.items() if k not in ("action_noise", "verbose")},
            "policy": "MlpPolicy",
            "policy_kwargs": {k: getattr(v, "__name__", v) for k, v in policy_kwargs.items()},
            "action_noise": f"Normal(0, {cfg['exploration_noise']})" if algo == "td3" else None,
            "buffer_note": f"buffer_size {cfg['buffer_size']} allocated as min(it, total steps)",
            "handle_timeout_termination": True,
            "n_envs": 1,
        },
        "eval": "deterministic policy (predict(deterministic=True)) in a separate env",
        "unmatched": UNMATCHED["common"] + UNMATCHED[algo],
    }
    model = cls("MlpPolicy", env, policy_kwargs=policy_kwargs, **kw)
    return model, settings


def evaluate(model, env: gym.Env, episodes: int, seed: int) -> tuple[float, float]:
    """Mean and std of the undiscounted return of ``episodes`` deterministic episodes."""
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns)), float(np.std(returns))


class EvalAndCheckpoint(BaseCallback):
    """Evaluate, log a metrics row and checkpoint at each evaluation point before the end.

    It acts at the start of a rollout, after the previous step's transition is stored and its
    gradient step is done, so a checkpoint holds a consistent state at ``num_timesteps``.
    """

    def __init__(self, eval_fn, run: rundir.RunDir, points: list[int], start: int) -> None:
        super().__init__()
        self.eval_fn = eval_fn
        self.run = run
        self.points = [p for p in points if p > start]

    def _on_rollout_start(self) -> None:
        if self.points and self.num_timesteps >= self.points[0]:
            self.points.pop(0)
            self.eval_fn(self.model)

    def _on_step(self) -> bool:
        return True


def main() -> None:
    """Parse flags, train (or resume) and write the run directory."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", choices=["sac", "td3", "crossq"], required=True)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=100_000, help="total env steps")
    p.add_argument("--learning-starts", type=int, default=None, help="default: jaxrl's")
    rundir.add_common_args(p, eval_every=5_000, eval_episodes=10)
    args = p.parse_args()
    if args.eval_every <= 0 or args.steps <= 0:
        p.error("--steps and --eval-every must be positive")

    run = rundir.RunDir(args.out)
    run.exit_if_finished()
    mujoco.set_mju_user_warning(lambda msg: print(f"MuJoCo warning: {msg}", file=sys.stderr))

    cfg = dict(JAXRL_DEFAULTS[args.algo])
    if args.learning_starts is not None:
        cfg["learning_starts"] = args.learning_starts
    env, eval_env = gym.make(args.env), gym.make(args.env)
    model, settings = make_model(args.algo, env, cfg, args.seed, args.steps)
    config = {
        "agent": args.algo,
        "env": args.env,
        "dataset": None,
        "seed": args.seed,
        "impl": f"sbx-rl {sbx.__version__}",
        "total_steps": args.steps,
        "settings": {
            **settings,
            "eval_every": args.eval_every,
            "eval_episodes": args.eval_episodes,
            "eval_seeds": f"episode i of every evaluation resets with seed {10**6}+1000*seed+i",
        },
    }
    run.write_config(config)
    eval_seed = 10**6 + 1000 * args.seed

    meta = run.checkpoint()
    start = 0
    if meta is not None:
        model = type(model).load(os.path.join(meta["dir"], "model.zip"), env=env)
        model.load_replay_buffer(os.path.join(meta["dir"], "replay.pkl"))
        start = int(model.num_timesteps)
        if start != meta["step"]:
            raise RuntimeError(f"checkpoint says step {meta['step']}, model has {start}")
        # The env cannot be restored: start a new episode, seeded by step for reproducibility.
        model._last_obs = None
        model.get_env().seed(args.seed + start)
        model.action_space.seed(args.seed + start)
        print(f"resuming {args.out} at step {start}", file=sys.stderr, flush=True)

    def eval_and_save(m) -> None:
        step = int(m.num_timesteps)
        mean, std = evaluate(m, eval_env, args.eval_episodes, eval_seed)
        run.append_metrics(step, mean, std)
        print(f"step {step} eval_return {mean:.2f} +- {std:.2f}", file=sys.stderr, flush=True)

        def save(folder: str) -> None:
            m.save(os.path.join(folder, "model.zip"))
            m.save_replay_buffer(os.path.join(folder, "replay.pkl"))

        run.save_checkpoint(step, save)

    points = rundir.eval_points(args.steps, args.eval_every)
    if start < args.steps:
        callback = EvalAndCheckpoint(eval_and_save, run, points, start)
        model.learn(
            total_timesteps=args.steps - start,
            callback=callback,
            reset_num_timesteps=start == 0,
            progress_bar=False,
        )
        if int(model.num_timesteps) != args.steps:
            raise RuntimeError(f"learn stopped at {model.num_timesteps}, expected {args.steps}")
        eval_and_save(model)
    env.close()
    eval_env.close()
    wall = run.wall_clock_s()
    refs = rundir.gymnasium_refs(args.env)
    run.finish(config, refs, env_steps_per_s=args.steps / max(wall, 1e-9))


if __name__ == "__main__":
    main()
