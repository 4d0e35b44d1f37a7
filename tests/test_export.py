"""Policy export (``jaxrl export``): ONNX, numpy and JAX artifacts against the JAX policy.

The reference every export is compared with is computed here from its parts (normalizer,
``agent.eval_actions``, action rescaling), not with ``jaxrl.export.policy.policy_function``.
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import registry
from jaxrl.cli import main
from jaxrl.envs.wrappers import RunningStats
from jaxrl.export.policy import (
    CONTRACT_VERSION,
    FORMATS,
    PolicySource,
    contract_path,
    export_policy,
    load_policy,
)
from jaxrl.offline.common import DataNorm
from jaxrl.run.runs import load_run

OBS, ACT = 5, 3
LOW = np.array([-2.0, -1.0, 0.0], np.float32)
HIGH = np.array([2.0, 3.0, 0.5], np.float32)
# Agents the exporter must refuse, and why. Any other registered agent must export.
REFUSED = {
    "idql": "its evaluation policy draws random numbers",
    "diffusion-ql": "its evaluation policy draws random numbers",
    "fql": "its evaluation policy draws random numbers",  # eval_noise='sampled'; see below
    "expo": "its evaluation policy draws random numbers",
    "tdmpc2": "it is a planner",
    "pets": "it is a planner",
}
# Policies the ONNX/numpy converter cannot express; they export in the jax format only.
JAX_ONLY = {"reinflow": "'iota'"}  # the Euler sampler's sinusoidal time codes
MEAN = np.array([1.0, -2.0, 0.5, 3.0, 0.0], np.float32)
STD = np.array([2.0, 0.5, 1.0, 4.0, 0.1], np.float32)


def _tiny(spec, **overrides):
    """A small agent of ``spec`` with non-trivial normalizer statistics where it has them.

    Planners are refused on their registry kind before their agent is looked at, so none is
    created for them (TD-MPC2 and PETS take seconds to initialize).
    """
    if spec.kind == "planner":
        return PolicySource(spec, None, OBS, LOW, HIGH)
    fields = {f.name for f in dataclasses.fields(spec.config)}
    sizes = {f: (8, 8) for f in fields if f.endswith("hidden_dims")}
    sizes.update({f: 8 for f in fields if f.endswith("_dim")})  # diffusion time embedding
    sizes.update({f: 2 for f in fields if f == "num_qs"})  # RLPD's ten critics
    agent = spec.agent.create(
        spec.config(**{**sizes, **overrides}), jnp.zeros(OBS), jnp.zeros(ACT), 0
    )
    if spec.data_norm:
        agent = agent.replace(norm=DataNorm(jnp.asarray(MEAN), jnp.asarray(STD), 1.0, 0.0))
    stats = None
    if spec.env_obs_norm:
        stats = RunningStats(jnp.float32(100.0), jnp.asarray(MEAN), jnp.asarray(STD**2))
    return PolicySource(spec, agent, OBS, LOW, HIGH, obs_stats=stats, env="test")


def _reference(src, obs):
    """Raw observations -> actions in env units, as the evaluation loops compute them."""
    x = jnp.asarray(obs)
    if src.obs_stats is not None:
        x = jnp.clip((x - src.obs_stats.mean) / jnp.sqrt(src.obs_stats.var + 1e-8), -10, 10)
    a = np.clip(np.asarray(jax.jit(src.agent.eval_actions)(x)), -1.0, 1.0)
    return np.asarray(src.action_low) + (a + 1.0) * 0.5 * (src.action_high - src.action_low)


def _observations(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return (MEAN + STD * rng.normal(size=(n, OBS)) * 2.0).astype(np.float32)


def _assert_exports_match(src, tmp_path, obs):
    want = _reference(src, obs)
    assert np.std(want) > 1e-3  # the policy is not constant: the comparison means something
    for fmt in FORMATS:
        path = export_policy(src, fmt, str(tmp_path / f"policy-{fmt}"))
        policy = load_policy(path, obs_size=OBS)
        np.testing.assert_allclose(policy(obs), want, atol=1e-5, err_msg=fmt)
        np.testing.assert_allclose(policy(obs[3]), want[3], atol=1e-5, err_msg=fmt)


@pytest.mark.parametrize("name", registry.names())
def test_every_agent_exports_or_is_refused(name, tmp_path):
    src = _tiny(registry.get(name))
    if name in REFUSED:
        # The refusal comes before any format's conversion: one format stands for all.
        with pytest.raises(ValueError, match=f"Cannot export {name}: {REFUSED[name]}"):
            export_policy(src, "onnx", str(tmp_path / "policy.onnx"))
        assert not os.listdir(tmp_path)  # nothing written
        return
    if name in JAX_ONLY:  # a clear refusal naming the way out, and that way works
        with pytest.raises(ValueError, match=f"uses {JAX_ONLY[name]}.*Use the jax format"):
            export_policy(src, "onnx", str(tmp_path / "policy.onnx"))
        path = export_policy(src, "jax", str(tmp_path / "policy-jax"))
        obs = _observations()
        np.testing.assert_allclose(
            load_policy(path, obs_size=OBS)(obs), _reference(src, obs), atol=1e-5
        )
        return
    _assert_exports_match(src, tmp_path, _observations())


def test_fql_with_zero_eval_noise_exports(tmp_path):
    src = _tiny(registry.get("fql"), eval_noise="zero", actor_layer_norm=True)
    _assert_exports_match(src, tmp_path, _observations(seed=1))


@pytest.mark.parametrize("activation", ["swish", "elu", "gelu"])
def test_ppo_activations_export(activation, tmp_path):
    # swish: logistic; elu: expm1, gt, select_n; gelu: integer_pow.
    src = _tiny(registry.get("ppo"), activation=activation)
    _assert_exports_match(src, tmp_path, _observations(seed=2))


def _converter_probe(x):
    """Operations no agent above uses, with a batch-dependent broadcast and reshape."""
    y = jnp.concatenate([jax.lax.erf(x), jnp.log1p(jnp.abs(x)), jax.lax.rsqrt(1.0 + x * x)], 1)
    y = jnp.clip(y.reshape(x.shape[0], 3, 4).transpose(0, 2, 1), -0.5, 0.7)
    # lax slices: numpy indexing with a symbolic batch traces to gather (not converted).
    col = [jax.lax.slice_in_dim(x, i, i + 1, axis=1) for i in range(3)]
    first = jnp.expand_dims(jnp.squeeze(col[0], 1), 1)
    z = jnp.max(y, axis=2) + jnp.sum(jax.lax.slice_in_dim(y, 1, 3, axis=2), axis=2) - first
    pick = jnp.where(col[1] > 0, 2, jnp.where(col[2] > 0, 1, 0))
    w = jax.lax.select_n(jnp.broadcast_to(pick, z.shape), z, jnp.exp(-z), -z)
    return jnp.squeeze(w[:, None, :], 1) + jnp.broadcast_to(jnp.min(x, 1, keepdims=True), w.shape)


def test_converter_ops_against_jax():
    import onnxruntime as ort

    from jaxrl.export import runtime_numpy as export_runtime_numpy
    from jaxrl.export.policy import to_onnx, to_program

    x = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 4"), jnp.float32)
    program, consts = to_program(jax.make_jaxpr(_converter_probe)(x))
    obs = np.random.default_rng(3).normal(size=(500, 4)).astype(np.float32)
    want = np.asarray(jax.jit(_converter_probe)(obs))
    got = export_runtime_numpy.Policy(program, consts)(obs)
    np.testing.assert_allclose(got, want, atol=1e-5)
    session = ort.InferenceSession(to_onnx(program, consts, 4))
    for batch in (obs, obs[:1]):  # the batch size is symbolic
        got = session.run(["action"], {"obs": batch})[0]
        np.testing.assert_allclose(got, want[: len(batch)], atol=1e-5)


def test_refusal_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="FQL: train with --eval-noise zero"):
        export_policy(_tiny(registry.get("fql")), "onnx", str(tmp_path / "p.onnx"))
    with pytest.raises(ValueError, match="train a policy agent"):
        export_policy(_tiny(registry.get("pets")), "onnx", str(tmp_path / "p.onnx"))


def test_contract_records_the_normalizer_and_scaling(tmp_path):
    src = _tiny(registry.get("ppo"))
    path = export_policy(src, "numpy", str(tmp_path / "policy.npz"))
    with open(contract_path(path)) as f:
        contract = json.load(f)
    assert contract["contract_version"] == CONTRACT_VERSION and contract["format"] == "numpy"
    assert contract["observation"]["size"] == OBS and contract["action"]["size"] == ACT
    np.testing.assert_allclose(contract["normalizer"]["mean"], MEAN)
    np.testing.assert_allclose(contract["normalizer"]["std"], STD, rtol=1e-6)
    assert contract["normalizer"]["clip"] == 10.0
    np.testing.assert_array_equal(contract["action"]["low"], LOW)
    np.testing.assert_array_equal(contract["action"]["high"], HIGH)
    assert contract["agent"] == "ppo" and contract["artifact"] == "policy.npz"
    assert len(contract["sha256"]) == 64
    assert contract["runtime"]["file"] == "export_runtime_numpy.py"
    # Offline agents: the dataset statistics inside the agent are recorded, without a clip.
    path = export_policy(_tiny(registry.get("td3-bc")), "jax", str(tmp_path / "p.jaxexport"))
    with open(contract_path(path)) as f:
        norm = json.load(f)["normalizer"]
    np.testing.assert_allclose(norm["std"], STD)
    assert norm["clip"] is None
    # No normalizer at all: SAC.
    path = export_policy(_tiny(registry.get("sac")), "jax", str(tmp_path / "s.jaxexport"))
    with open(contract_path(path)) as f:
        assert json.load(f)["normalizer"] is None


def test_numpy_runtime_runs_without_jax(tmp_path):
    src = _tiny(registry.get("td3-bc"))
    path = export_policy(src, "numpy", str(tmp_path / "policy.npz"))
    obs = _observations(20)
    np.save(tmp_path / "obs.npy", obs)
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); "
        "import export_runtime_numpy as rt; "
        "p = rt.load(sys.argv[1] + '/policy.npz'); "
        "np.save(sys.argv[1] + '/act.npy', p(np.load(sys.argv[1] + '/obs.npy'))); "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxrl')]"
    )
    subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path)], check=True)
    assert os.path.exists(os.path.join(os.path.dirname(path), "export_runtime_numpy.py"))
    np.testing.assert_allclose(np.load(tmp_path / "act.npy"), _reference(src, obs), atol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One artifact per format of a tiny TD3 (paths in a fresh directory per test)."""
    root = tmp_path_factory.mktemp("exports")
    src = _tiny(registry.get("td3"))
    return {fmt: export_policy(src, fmt, str(root / f"policy-{fmt}")) for fmt in FORMATS}


def _copy(path, tmp_path):
    import shutil

    out = str(tmp_path / os.path.basename(path))
    shutil.copyfile(path, out)
    shutil.copyfile(contract_path(path), contract_path(out))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_or_corrupt_artifact_is_refused(exported, fmt, tmp_path):
    path = _copy(exported[fmt], tmp_path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match="does not match its contract's sha256.*corrupt"):
        load_policy(path)
    # A file that matches its contract but is not a policy: a parse error, said clearly.
    with open(path, "wb") as f:
        f.write(b"not a policy")
    contract = json.load(open(contract_path(path)))
    contract["sha256"] = __import__("hashlib").sha256(b"not a policy").hexdigest()
    json.dump(contract, open(contract_path(path), "w"))
    with pytest.raises(ValueError, match=f"cannot be read as a {fmt} policy"):
        load_policy(path)


def test_contract_mismatches_are_refused(exported, tmp_path):
    path = _copy(exported["onnx"], tmp_path)
    assert load_policy(path, obs_size=OBS).obs_size == OBS
    with pytest.raises(ValueError, match=f"observations of size {OBS}, but 7 were stated"):
        load_policy(path, obs_size=7)
    with pytest.raises(ValueError, match=r"takes observations \[batch, 5\], got \(2, 4\)"):
        load_policy(path)(np.zeros((2, 4), np.float32))
    cpath = contract_path(path)
    contract = json.load(open(cpath))
    for version in (CONTRACT_VERSION + 1, "1", 0):
        json.dump({**contract, "contract_version": version}, open(cpath, "w"))
        with pytest.raises(ValueError, match="contract version"):
            load_policy(path)
    with open(cpath, "w") as f:
        f.write(json.dumps(contract)[:40])
    with pytest.raises(ValueError, match="not a valid policy contract"):
        load_policy(path)
    os.remove(cpath)
    with pytest.raises(ValueError, match="has no contract"):
        load_policy(path)


# ------------------------------------------------------------------------- the command line

QUIET = ["--no-progress", "--no-tensorboard", "--eval-episodes", "1", "--log-every", "40"]


def _export_cli(run_dir, fmt, capsys, *extra):
    main(["export", run_dir, "--format", fmt, *extra])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return result["artifact"]


def _raw_obs(n, size, seed=0):
    return (np.random.default_rng(seed).normal(size=(n, size)) * 3.0).astype(np.float32)


def test_cli_exports_a_td3_run_on_a_gymnasium_env(tmp_path, capsys):
    run = str(tmp_path / "td3")
    main(["train", "td3", "--env", "Pendulum-v1", "--total-steps", "80",
          "--eval-every", "80", "--hidden-dims", "16", "16", "--batch-size", "16",
          "--learning-starts", "40", "--buffer-size", "200", "--out", run, *QUIET])  # fmt: skip
    capsys.readouterr()
    path = _export_cli(run, "onnx", capsys)
    assert path == os.path.join(run, "export", "policy.onnx")
    policy = load_policy(path, obs_size=3)
    c = policy.contract
    assert (c["agent"], c["env"], c["step"], c["control_dt"]) == ("td3", "Pendulum-v1", 80, 0.05)
    assert c["action"]["low"] == [-2.0] and c["action"]["high"] == [2.0]
    assert c["agent_config"]["hidden_dims"] == [16, 16] and c["normalizer"] is None
    obs = _raw_obs(1000, 3)
    agent = load_run(run).agent
    want = -2.0 + (np.clip(np.asarray(agent.eval_actions(obs)), -1, 1) + 1.0) * 2.0
    np.testing.assert_allclose(policy(obs), want, atol=1e-5)
    out = str(tmp_path / "elsewhere" / "pi.npz")
    assert _export_cli(run, "numpy", capsys, "--out", out) == out
    np.testing.assert_allclose(load_policy(out, 3)(obs), want, atol=1e-5)
    with pytest.raises(SystemExit) as err:  # a user's mistake: one line, exit code 2
        main(["export", str(tmp_path / "nothing"), "--format", "jax"])
    assert err.value.code == 2 and "not a jaxrl run directory" in capsys.readouterr().err


def _ppo_run(run):
    """A PPO run directory on jax:pendulum as the fused loop writes it, with training statistics.

    Written with the loops' own pieces instead of by training (which compiles PPO's update
    for ~15 s); ``load_run`` restores it exactly as a trained run.
    """
    from jaxrl.loops import TrainConfig, init_fused_state, prepare_run_dir, run_config
    from jaxrl.loops.checkpoint import Checkpointer
    from jaxrl.run.runs import make_jax_envs

    spec = registry.get("ppo")
    agent_cfg = spec.config(policy_hidden_dims=(8, 8), value_hidden_dims=(8,))
    train_cfg = TrainConfig(env="jax:pendulum", num_envs=4, total_steps=80, out=run)
    prepare_run_dir(run, run_config("ppo", agent_cfg, train_cfg))
    env, _ = make_jax_envs("jax:pendulum", 4, 1, agent_cfg, spec)
    state = init_fused_state(spec, agent_cfg, env, 0)
    mean, var = jnp.array([0.3, -0.2, 1.5]), jnp.array([0.4, 0.5, 9.0])
    stats = RunningStats(jnp.float32(500.0), mean, var)
    state = state.replace(env=state.env.replace(extras={**state.env.extras, "obs_stats": stats}))
    Checkpointer(os.path.join(run, "checkpoints")).save(80, state, {"step": 80})


def test_cli_exports_a_ppo_run_with_its_observation_normalizer(tmp_path, capsys):
    run = str(tmp_path / "ppo")
    _ppo_run(run)
    loaded = load_run(run)
    stats = loaded.obs_stats
    np.testing.assert_allclose(stats.var, [0.4, 0.5, 9.0])  # the run's statistics, restored
    obs = _raw_obs(1000, 3, seed=1)
    normed = jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -10.0, 10.0)
    a = np.clip(np.asarray(loaded.agent.eval_actions(normed)), -1, 1)
    want = -2.0 + (a + 1.0) * 2.0
    for fmt in FORMATS:
        policy = load_policy(_export_cli(run, fmt, capsys), obs_size=3)
        np.testing.assert_allclose(policy(obs), want, atol=1e-5, err_msg=fmt)
        c = policy.contract
        assert (c["agent"], c["env"], c["step"]) == ("ppo", "jax:pendulum", 80)
        assert c["control_dt"] == 0.05
        np.testing.assert_allclose(c["normalizer"]["mean"], [0.3, -0.2, 1.5], rtol=1e-6)
        np.testing.assert_allclose(c["normalizer"]["std"], np.sqrt([0.4, 0.5, 9.0]), rtol=1e-6)
        assert c["normalizer"]["clip"] == 10.0 and c["format"] == fmt
