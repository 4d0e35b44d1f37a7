"""Measure training speed of brax.training PPO / SAC on a Brax environment.

Run with the brax virtualenv created by ``setup_brax.sh`` (brax.training 0.14.2
needs jax 0.7.x; it calls ``jax.device_put_replicated``, removed in newer jax)::

    .venv-brax/bin/python benchmarks/peers/brax_training.py --algo ppo \
        --env inverted_pendulum --backend mjx --num-envs 64 --batch-size 64 \
        --num-minibatches 8 --unroll-length 5 --num-updates-per-batch 4 \
        --total-steps 300000 --seed 0 --json-out ppo.json

One JSON line with the result is printed to stdout (and written to --json-out).
CLI defaults follow brax's published inverted_pendulum config (lr 3e-4, discounting
0.97, reward_scaling 10, normalize_observations, entropy_cost 1e-2), not the
``train()`` signature defaults (lr 1e-4, discounting 0.9, reward_scaling 1, no
normalization); every setting used is echoed in the JSON.

Timing
------
brax calls ``progress_fn`` once before training (step 0, an initial eval, only
when ``num_evals > 1``) and then after each of the ``num_evals - 1`` training
epochs, each followed by one eval. The first epoch includes XLA compilation, so

* ``env_steps_per_s`` = (steps at last callback - steps at 2nd callback) /
  (wall time between those callbacks). It covers epochs 2..num_evals-1 and
  INCLUDES the periodic eval that follows each of them (``num_eval_envs``
  envs x ``episode_length`` steps each, policy inference only).
* ``env_steps_per_s_excl_eval`` uses the same step window divided by brax's own
  per-epoch training time (``training/walltime``, timed around the jitted
  epoch with ``block_until_ready``), i.e. eval time removed. This is the
  number to compare against a fused training loop without evaluation.
* ``compile_s`` estimates one-time cost: time from ``train()`` entry to the
  2nd callback minus what that many env steps (and evals) take at the steady
  rate. It covers env reset/eval/prefill/epoch compilation (not imports).
* ``wall_s`` is the whole ``train()`` call (everything, incl. compile + evals).

Work per brax "training step" (brax 0.14.2, one device, action_repeat=1)
-----------------------------------------------------------------------
Both agents wrap the env with ``envs.training.wrap``: VmapWrapper ->
EpisodeWrapper(episode_length) -> AutoResetWrapper. At ``episode_length``
steps the episode is cut (done=1, info['truncation']=1); on done the state is
reset in place, so ``next_observation`` of a done transition is the reset obs.

PPO (``ppo.train``):
  env_step_per_training_step = batch_size * unroll_length * num_minibatches.
  * Rollout: ``batch_size * num_minibatches // num_envs`` sequential unrolls,
    each ``unroll_length`` steps of all ``num_envs`` envs, with the current
    policy (stochastic tanh-Normal sample) and the normalizer from the previous
    step -> ``batch_size*num_minibatches`` sequences of ``unroll_length``.
  * Observation normalizer (Welford running mean/std over every observation of
    the rollout) is updated once, BEFORE the SGD phase, and the updated stats
    are used by all SGD minibatches. (It is always updated; it is applied,
    ``(obs - mean) / std`` with no clipping, only if normalize_observations.)
  * SGD: ``num_updates_per_batch`` epochs; each epoch permutes the sequences
    and splits them into ``num_minibatches`` minibatches of ``batch_size``
    sequences (= batch_size*unroll_length transitions) -> one Adam step each.
    Gradient steps per training step = num_updates_per_batch * num_minibatches.
  * The loss recomputes values and GAE (lambda=gae_lambda, default 0.95) on
    each minibatch with the CURRENT value params (bootstrap from the value of
    the last next_observation of each sequence); advantages normalized per
    minibatch; ratio clip 0.3; value loss 0.5*vf_coef(0.5)*mean((vs-V)^2) with
    no value clipping; entropy bonus = entropy_cost * sampled tanh-Normal
    entropy; rewards scaled by reward_scaling; truncated steps masked out of
    deltas/advantages. One Adam over policy+value (lr constant, no grad clip).
  * Networks: policy MLP policy_hidden (default (32,)*4), value MLP
    value_hidden (default (256,)*5), swish, lecun_uniform; tanh-Normal with
    state-dependent scale = softplus(x)+0.001.
  * Number of training steps: num_evals_after_init = max(num_evals-1, 1)
    epochs of ceil(total_steps / (num_evals_after_init * env_step_per_training
    _step)) training steps each, so brax may overshoot total_steps.
  Example (--num-envs 64 --batch-size 64 --num-minibatches 8 --unroll-length
  5 --num-updates-per-batch 4): 8 unrolls x 5 steps x 64 envs = 2560 env
  steps, then 4 x 8 = 32 Adam steps on minibatches of 64x5 = 320 transitions.

SAC (``sac.train``):
  One training step = ONE ``env.step`` of all ``num_envs`` envs (num_envs env
  steps, stochastic policy sample, normalizer updated with those num_envs
  observations, transitions inserted in the replay queue), then ONE sample of
  ``batch_size * grad_updates_per_step`` transitions (uniform with replacement
  over the buffer) split into ``grad_updates_per_step`` minibatches of
  ``batch_size``, each doing one SGD step (alpha, critic, actor Adam updates +
  Polyak target update tau=0.005). So updates are NOT one per env step: it is
  grad_updates_per_step updates per num_envs env steps (64 envs, 1 update ->
  1 gradient step per 64 env steps).
  * Update order inside one SGD step: alpha loss (old policy), critic loss
    (old alpha, old policy, target Q), actor loss (OLD Q params, old alpha);
    target_entropy = -0.5 * action_size; alpha Adam lr fixed at 3e-4, policy
    and Q Adam lr = learning_rate; twin Q (min), relu MLPs hidden (256,256).
    Critic target = r*reward_scaling + discount*(1-done)*gamma*(minQ' - a*logp');
    truncated transitions are masked out of the critic loss entirely.
  * Prefill: before training, ceil(min_replay_size / num_envs) actor steps are
    taken with the (untrained, stochastic) policy, NOT uniform random actions;
    they update the normalizer and COUNT toward total_steps (env_steps).
    Then ceil((total_steps - prefill_steps) / (num_evals_after_init*num_envs))
    training steps per epoch.
  * Replay: FIFO queue of max_replay_size (default = total_steps).
  * Normalizer: same Welford stats, updated every env step (prefill included);
    used (without clipping) by policy and Q nets only if
    normalize_observations; the buffer stores raw observations.
"""

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import functools  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore", message="Brax System, piplines")

import brax  # noqa: E402
import jax  # noqa: E402
from brax import envs  # noqa: E402
from brax.training.agents.ppo import networks as ppo_networks  # noqa: E402
from brax.training.agents.ppo import train as ppo  # noqa: E402
from brax.training.agents.sac import networks as sac_networks  # noqa: E402
from brax.training.agents.sac import train as sac  # noqa: E402


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def add_train_args(p: argparse.ArgumentParser, algos: tuple[str, ...] = ("ppo", "sac")) -> None:
    """Add the env and hyperparameter options (shared with ``suite_brax.py``).

    Args:
        p: the parser.
        algos: the ``--algo`` choices; with one choice, ``--algo`` defaults to it.
    """
    if len(algos) == 1:
        p.add_argument("--algo", choices=algos, default=algos[0])
    else:
        p.add_argument("--algo", choices=algos, required=True)
    p.add_argument("--env", default="inverted_pendulum")
    p.add_argument("--backend", default="mjx", help="mjx | generalized | positional | spring")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--episode-length", type=int, default=1000)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--discounting", type=float, default=0.97)
    p.add_argument("--reward-scaling", type=float, default=10.0)
    p.add_argument("--normalize-observations", action=argparse.BooleanOptionalAction, default=True)
    g = p.add_argument_group("ppo")
    g.add_argument("--unroll-length", type=int, default=5)
    g.add_argument("--batch-size", type=int, default=None, help="ppo: 64, sac: 256")
    g.add_argument("--num-minibatches", type=int, default=8)
    g.add_argument("--num-updates-per-batch", type=int, default=4)
    g.add_argument("--entropy-cost", type=float, default=1e-2)
    g.add_argument("--policy-hidden", type=_sizes, default=(32,) * 4, help="e.g. 32,32,32,32")
    g.add_argument("--value-hidden", type=_sizes, default=(256,) * 5)
    g = p.add_argument_group("sac")
    g.add_argument("--grad-updates-per-step", type=int, default=1)
    g.add_argument("--min-replay-size", type=int, default=1024)
    g.add_argument("--max-replay-size", type=int, default=None, help="default: total steps")
    g.add_argument("--hidden", type=_sizes, default=(256, 256), help="sac policy and Q MLPs")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_train_args(p)
    p.add_argument("--total-steps", type=int, required=True, help="brax num_timesteps")
    p.add_argument("--num-evals", type=int, default=6, help=">= 3 so a post-compile window exists")
    p.add_argument("--num-eval-envs", type=int, default=16)
    p.add_argument(
        "--deterministic-eval",
        action="store_true",
        help="evaluate the tanh(mean) action (brax default: stochastic sample)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    if args.batch_size is None:
        args.batch_size = 64 if args.algo == "ppo" else 256
    if args.num_evals < 3:
        p.error("--num-evals must be >= 3 (first training epoch includes compilation)")
    return args


def make_train_fn(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """brax.training's ``train`` with ``args`` bound (all but progress_fn), and its settings.

    ``args`` holds the options of :func:`add_train_args` (``batch_size`` resolved) plus
    ``total_steps``, ``num_evals``, ``num_eval_envs``, ``deterministic_eval`` and ``seed``.
    The returned function takes ``progress_fn``.
    """
    env = envs.get_environment(args.env, backend=args.backend)

    common = dict(
        environment=env,
        num_timesteps=args.total_steps,
        num_envs=args.num_envs,
        num_evals=args.num_evals,
        num_eval_envs=args.num_eval_envs,
        episode_length=args.episode_length,
        action_repeat=1,
        learning_rate=args.learning_rate,
        discounting=args.discounting,
        reward_scaling=args.reward_scaling,
        normalize_observations=args.normalize_observations,
        batch_size=args.batch_size,
        deterministic_eval=args.deterministic_eval,
        seed=args.seed,
    )
    if args.algo == "ppo":
        settings = dict(
            unroll_length=args.unroll_length,
            batch_size=args.batch_size,
            num_minibatches=args.num_minibatches,
            num_updates_per_batch=args.num_updates_per_batch,
            entropy_cost=args.entropy_cost,
            policy_hidden=list(args.policy_hidden),
            value_hidden=list(args.value_hidden),
        )
        steps_per_train_step = args.batch_size * args.unroll_length * args.num_minibatches
        settings["env_steps_per_training_step"] = steps_per_train_step
        settings["grad_steps_per_training_step"] = args.num_updates_per_batch * args.num_minibatches
        train_fn = functools.partial(
            ppo.train,
            unroll_length=args.unroll_length,
            num_minibatches=args.num_minibatches,
            num_updates_per_batch=args.num_updates_per_batch,
            entropy_cost=args.entropy_cost,
            network_factory=functools.partial(
                ppo_networks.make_ppo_networks,
                policy_hidden_layer_sizes=args.policy_hidden,
                value_hidden_layer_sizes=args.value_hidden,
            ),
            **common,
        )
    else:
        settings = dict(
            batch_size=args.batch_size,
            grad_updates_per_step=args.grad_updates_per_step,
            min_replay_size=args.min_replay_size,
            max_replay_size=args.max_replay_size or args.total_steps,
            hidden=list(args.hidden),
            env_steps_per_training_step=args.num_envs,
            grad_steps_per_training_step=args.grad_updates_per_step,
            prefill_env_steps=-(-args.min_replay_size // args.num_envs) * args.num_envs,
        )
        train_fn = functools.partial(
            sac.train,
            grad_updates_per_step=args.grad_updates_per_step,
            min_replay_size=args.min_replay_size,
            max_replay_size=args.max_replay_size,
            network_factory=functools.partial(
                sac_networks.make_sac_networks, hidden_layer_sizes=args.hidden
            ),
            **common,
        )
    return train_fn, settings


def main() -> None:
    args = parse_args()
    train_fn, settings = make_train_fn(args)

    calls: list[tuple[float, int, dict]] = []

    def progress_fn(step, metrics):
        now = time.perf_counter()
        metrics = {k: float(v) for k, v in metrics.items()}
        calls.append((now, int(step), metrics))
        print(
            f"[{now - t0:7.1f}s] step {int(step):>9d} "
            f"eval_return {metrics.get('eval/episode_reward', float('nan')):9.2f} "
            f"train_sps {metrics.get('training/sps', float('nan')):9.1f} "
            f"eval_s {metrics.get('eval/epoch_eval_time', float('nan')):6.2f}",
            file=sys.stderr,
            flush=True,
        )

    t0 = time.perf_counter()
    train_fn(progress_fn=progress_fn)
    wall = time.perf_counter() - t0

    # calls[0] = initial eval at step 0, calls[1] = after epoch 1 (compile), ...
    (t1, s1, m1), (tn, sn, mn) = calls[1], calls[-1]
    window_steps = sn - s1
    rate = window_steps / (tn - t1)
    train_time = mn["training/walltime"] - m1["training/walltime"]
    rate_excl_eval = window_steps / train_time
    steady_eval_s = [m["eval/epoch_eval_time"] for _, _, m in calls[2:]]
    eval_s = sum(steady_eval_s) / len(steady_eval_s)
    # One-time cost up to the 2nd callback: remove the steady-state cost of the
    # s1 env steps and of the 2 evals run so far.
    compile_s = (t1 - t0) - s1 / rate_excl_eval - 2 * eval_s

    result = {
        "library": "brax.training",
        "version": brax.__version__,
        "jax": jax.__version__,
        "algo": args.algo,
        "env": args.env,
        "backend": args.backend,
        "num_envs": args.num_envs,
        "total_steps_requested": args.total_steps,
        "total_steps_done": sn,
        "episode_length": args.episode_length,
        "learning_rate": args.learning_rate,
        "discounting": args.discounting,
        "reward_scaling": args.reward_scaling,
        "normalize_observations": args.normalize_observations,
        "action_repeat": 1,
        **settings,
        "seed": args.seed,
        "num_evals": args.num_evals,
        "num_eval_envs": args.num_eval_envs,
        "deterministic_eval": args.deterministic_eval,
        "timed_window_steps": window_steps,
        "timed_window_epochs": len(calls) - 2,
        "env_steps_per_s": round(rate, 1),
        "env_steps_per_s_excl_eval": round(rate_excl_eval, 1),
        "rate_note": (
            f"env_steps_per_s: steps/time between 2nd and last progress callback "
            f"(after compile), includes {len(calls) - 2} periodic evals of "
            f"{args.num_eval_envs} envs x {args.episode_length} steps "
            f"(~{eval_s:.2f}s each); _excl_eval: brax training/walltime only"
        ),
        "eval_s_per_eval": round(eval_s, 3),
        # Start-up breakdown (each includes XLA compilation):
        # first_eval_s: env reset + eval compile + initial eval (progress call 0);
        # epoch1_train_s: first training epoch (SAC: + replay prefill);
        # eval_after_epoch1_s: 2nd eval; brax re-traces and re-compiles the eval
        # here because the donated eval state (done, info[...]) and the
        # normalizer's std_eps change weak_type between the 1st and 2nd eval
        # (seen with JAX_EXPLAIN_CACHE_MISSES=1). Later evals reuse it.
        "first_eval_s": round(calls[0][0] - t0, 2),
        "epoch1_train_s": round(m1["training/walltime"], 2),
        "eval_after_epoch1_s": round(m1["eval/epoch_eval_time"], 2),
        "final_eval_return": round(mn.get("eval/episode_reward", float("nan")), 3),
        "wall_s": round(wall, 2),
        "compile_s": round(compile_s, 2),
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
