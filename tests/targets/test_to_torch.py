"""to-torch: a policy as a generated nn.Module whose forward, run by torch, matches the source's own
forward; every weight an nn.Parameter that trains, normaliser statistics buffers, names from the source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
SB3 = ROOT / "fixtures/sb3"


def import_policy(folder: Path):
    """The generated module, imported by path as a user would."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"policy_{abs(hash(folder))}", folder / "policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_step_changes_every_parameter(module, obs: np.ndarray) -> tuple[list[str], list[str]]:
    """Take one SGD step on the sum of every floating output; the parameters it left unchanged, and
    the buffers it changed."""
    module.train()
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    optimiser = torch.optim.SGD(module.parameters(), lr=0.1)
    outputs = module(torch.from_numpy(obs))
    loss = sum((v.double() ** 2).sum() for v in outputs.values() if v.dtype.is_floating_point)
    loss.backward()
    optimiser.step()
    params = dict(module.named_parameters())
    after = module.state_dict()
    frozen = [k for k, p in params.items() if torch.equal(before[k], p.detach())]
    moved = [k for k in after if k not in params and not torch.equal(before[k], after[k])
             and not k.endswith("num_batches_tracked")]
    return frozen, moved


@pytest.fixture(scope="module")
def expert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("to_torch") / "metadrive"
    done = pp.to_torch(str(EXPERT), folder, activation="tanh", head="diag-gaussian")
    return done, folder


def test_metadrive_matches_the_npz_forward_written_by_hand(expert):
    done, folder = expert
    w = np.load(EXPERT)
    obs = np.random.default_rng(3).uniform(0, 1, (200, 275)).astype(np.float32)
    h = np.tanh(obs.astype(np.float64) @ w["default_policy/fc_1/kernel"] + w["default_policy/fc_1/bias"])
    h = np.tanh(h @ w["default_policy/fc_2/kernel"] + w["default_policy/fc_2/bias"])
    logits = h @ w["default_policy/fc_out/kernel"] + w["default_policy/fc_out/bias"]
    with torch.no_grad():
        got = import_policy(folder).load()(torch.from_numpy(obs))
    assert list(got) == ["logits", "action", "log_std"]
    np.testing.assert_allclose(got["logits"].numpy(), logits, atol=2e-5, rtol=0)
    np.testing.assert_allclose(got["action"].numpy(), logits[:, :2], atol=2e-5, rtol=0)
    np.testing.assert_allclose(got["log_std"].numpy(), logits[:, 2:], atol=2e-5, rtol=0)
    assert done.tensors == 7 and done.max_abs < 1e-5


def test_metadrive_layers_are_named_after_the_source_and_hold_its_weights(expert):
    done, folder = expert
    module = import_policy(folder).load()
    linears = {n: m for n, m in module.named_children() if isinstance(m, torch.nn.Linear)}
    assert list(linears) == ["default_policy_fc_1", "default_policy_fc_2", "default_policy_fc_out"]
    names = json.loads((folder / "parameters.json").read_text())
    w = np.load(EXPERT)
    for key, value in module.state_dict().items():
        entry = names[key]
        source = w[entry["source"]]
        stored = source.T if entry["layout"] == "transposed" else source
        assert value.numpy().tobytes() == np.ascontiguousarray(stored).tobytes(), key
    assert sorted(e["source"] for e in names.values()) == sorted(w.files)
    from safetensors.numpy import load_file

    tensors = load_file(folder / "policy.safetensors")
    assert {k: v.tobytes() for k, v in tensors.items()} == {k: v.numpy().tobytes() for k, v in module.state_dict().items()}


def test_metadrive_every_weight_trains(expert):
    _, folder = expert
    module = import_policy(folder).load()
    assert all(p.requires_grad for p in module.parameters())
    assert sum(p.numel() for p in module.parameters()) == sum(a.size for a in np.load(EXPERT).values())
    frozen, moved = one_step_changes_every_parameter(module, np.full((4, 275), 0.5, np.float32))
    assert frozen == [] and moved == []


def test_the_module_imports_with_torch_alone(expert, tmp_path):
    _, folder = expert
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import policy; m = policy.load(); "
            "out = m(torch.zeros(2, 275)); print(sorted(out), 'policyport' in sys.modules)")
    result = subprocess.run([sys.executable, "-I", "-c", code, str(folder)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['action',", "'log_std',", "'logits']", "False"]


@pytest.mark.slow
def test_convert_back_gives_the_first_conversions_initializers(expert):
    _, folder = expert
    first = pp.extract_weights(pp.convert(str(EXPERT), activation="tanh", head="diag-gaussian"))

    class Logits(torch.nn.Module):  # the module's logits alone, as a policy exporter sees it
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, obs):
            return self.inner(obs)["logits"]

    again = pp.extract_weights(pp.convert(Logits(import_policy(folder).load()), input_shape=(275,)))
    names = json.loads((folder / "parameters.json").read_text())
    assert len(again) == len(first) == 6
    for key, entry in names.items():
        value = again[f"inner.{key}"]
        value = value.T if entry["layout"] == "transposed" else value
        assert np.ascontiguousarray(value).tobytes() == first[entry["source"]].tobytes(), key


@pytest.mark.slow
def test_sb3_ppo_with_vecnormalize_matches_sb3(tmp_path):
    from stable_baselines3 import PPO

    done = pp.to_torch(str(SB3 / "ppo_pendulum_vecnorm.zip"), tmp_path / "ppo")
    module = import_policy(tmp_path / "ppo").load()
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    assert "log_std" in params and {"obs_rms.mean", "obs_rms.var"} <= set(buffers)
    model = PPO.load(SB3 / "ppo_pendulum_vecnorm.zip", device="cpu")
    theirs = {k for k in model.policy.state_dict() if "value" not in k}  # the actor's: SB3's names
    assert set(params) == theirs and done.renamed == {}
    norm = _vecnormalize(SB3 / "ppo_pendulum_vecnorm/vecnormalize.pkl")
    obs = np.random.default_rng(0).uniform(-2, 2, (500, 3)).astype(np.float32)
    want, _ = model.predict(norm.normalize_obs(obs), deterministic=True)
    with torch.no_grad():
        got = module(torch.from_numpy(obs))
    np.testing.assert_allclose(got["action"].numpy(), want, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got["log_std"].numpy()[0], model.policy.log_std.detach().numpy())
    assert done.max_abs < 1e-5
    frozen, moved = one_step_changes_every_parameter(module, obs[:8])
    assert frozen == [] and moved == []


def _vecnormalize(path: Path):
    """SB3's VecNormalize statistics, unpickled (a fixture this project wrote)."""
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


@pytest.mark.slow
def test_sb3_dqn_q_values_match_sb3(tmp_path):
    from stable_baselines3 import DQN

    pp.to_torch(str(SB3 / "dqn_cartpole.zip"), tmp_path / "dqn")
    module = import_policy(tmp_path / "dqn").load()
    model = DQN.load(SB3 / "dqn_cartpole.zip", device="cpu")
    obs = np.random.default_rng(1).uniform(-2, 2, (1000, 4)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(obs))
        want = model.q_net(torch.from_numpy(obs))
    np.testing.assert_allclose(got["logits"].numpy(), want.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got["action"].numpy(), model.predict(obs, deterministic=True)[0])


@pytest.mark.slow
def test_keras_model_with_batch_and_layer_norm_matches_keras(tmp_path):
    keras = pytest.importorskip("keras")
    pp.to_torch(str(ROOT / "fixtures/keras/mlp_norm.keras"), tmp_path / "k")
    module = import_policy(tmp_path / "k").load()
    source = keras.saving.load_model(ROOT / "fixtures/keras/mlp_norm.keras")
    obs = np.random.default_rng(2).uniform(0, 1, (300, 6)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(obs))["fc_out"].numpy()
    np.testing.assert_allclose(got, np.asarray(source(obs, training=False)), atol=1e-5, rtol=0)
    assert set(dict(module.named_buffers())) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    assert {k for k, _ in module.named_parameters()} == {f"{m}.{p}" for m in ("fc_1", "fc_2", "fc_out", "bn", "ln")
                                                         for p in ("weight", "bias")}


def _foreign_graph(tmp_path: Path) -> Path:
    """A graph as tf2onnx and ML-Agents write them, without policyport's metadata: MatMul + Add with
    the bias seen through an Identity node, then Gemm; tensor names that are not identifiers."""
    rng = np.random.default_rng(5)
    w1, b1 = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    w2, b2 = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=2).astype(np.float32)
    nodes = [
        helper.make_node("Identity", ["dense/bias:0"], ["dense/bias/read"], name="alias"),
        helper.make_node("MatMul", ["obs", "dense/kernel:0"], ["dense/MatMul"], name="dense/MatMul"),
        helper.make_node("Add", ["dense/MatMul", "dense/bias/read"], ["dense/BiasAdd"], name="dense/BiasAdd"),
        helper.make_node("Relu", ["dense/BiasAdd"], ['x"); import os #'], name="act"),
        helper.make_node("Gemm", ['x"); import os #', "out.weight", "out.bias"], ["logits"], name="out", transB=1),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
                              [numpy_helper.from_array(w1, "dense/kernel:0"), numpy_helper.from_array(b1, "dense/bias:0"),
                               numpy_helper.from_array(w2, "out.weight"), numpy_helper.from_array(b2, "out.bias")])
    path = tmp_path / "foreign.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path, (w1, b1, w2, b2)


def test_a_foreign_graph_keeps_every_parameter_trainable_and_its_names(tmp_path):
    path, (w1, b1, w2, b2) = _foreign_graph(tmp_path)
    pp.to_torch(str(path), tmp_path / "out")
    text = (tmp_path / "out/policy.py").read_text()
    assert "import os" not in text.replace("'x\"); import os #'", "")
    module = import_policy(tmp_path / "out").load()
    assert [n for n, _ in module.named_parameters()] == ["dense.weight", "dense.bias", "out.weight", "out.bias"]
    obs = np.random.default_rng(0).uniform(-1, 1, (50, 3)).astype(np.float32)
    with torch.no_grad():
        got = module(torch.from_numpy(obs))["logits"].numpy()
    np.testing.assert_allclose(got, np.maximum(obs @ w1 + b1, 0) @ w2.T + b2, atol=1e-5, rtol=0)
    frozen, moved = one_step_changes_every_parameter(module, obs[:4])
    assert frozen == [] and moved == []


def all_sampled_export(folder: Path) -> Path:
    """The ML-Agents hybrid export with only its sampled outputs: nothing deterministic is left to write."""
    import onnx

    model = onnx.load(ROOT / "fixtures/synthetic/mlagents_hybrid.onnx")
    sampled = [o for o in model.graph.output if o.name in ("continuous_actions", "discrete_actions")]
    del model.graph.output[:]
    model.graph.output.extend(sampled)
    onnx.save(model, folder / "sampled.onnx")
    return folder / "sampled.onnx"


def test_an_op_without_a_module_is_refused_naming_it(tmp_path):
    result = CliRunner().invoke(app, ["to-torch", str(all_sampled_export(tmp_path)), "-o", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 3
    error = json.loads(result.stdout)["error"]
    assert error.startswith("every output of the graph is sampled (Multinomial node '/Multinomial', RandomNormalLike "
                            "node '/RandomNormalLike')")
    assert not (tmp_path / "out").exists()
    with pytest.raises(pp.UnsupportedOpError, match="LSTM"):
        pp.layer_plan(ROOT / "fixtures/synthetic/lstm_policy_opset17.onnx")


def test_cli_writes_once_and_refuses_options_an_onnx_model_does_not_take(tmp_path):
    path, _ = _foreign_graph(tmp_path)
    out = tmp_path / "out"
    first = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out), "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["parameters"] == ["dense.weight", "dense.bias", "out.weight", "out.bias"] and report["tensors"] == 3
    again = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out)])
    assert again.exit_code == 3 and "exists" in again.output
    forced = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    (out / "notes.txt").write_text("mine")
    refused = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out), "--force"])
    assert refused.exit_code == 3 and "notes.txt" in refused.output and (out / "notes.txt").exists()
    head = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(tmp_path / "o2"), "--head", "none"])
    assert head.exit_code == 2 and "head (--head) applies to a source converted here" in head.output


@pytest.mark.slow
def test_rllib_checkpoint_with_its_filter_matches_rays_outputs(tmp_path):
    ray_folder = ROOT / "fixtures/rllib/ray"
    done = pp.to_torch(str(ray_folder / "ppo_new"), tmp_path / "rllib", low=-1, high=1)
    module = import_policy(tmp_path / "rllib").load()
    expected = dict(np.load(ray_folder / "ppo_new_expected.npz"))  # Ray's own forward of the checkpoint
    with torch.no_grad():
        got = module(torch.from_numpy(expected["obs"].astype(np.float32)))
    np.testing.assert_allclose(got["logits"].numpy(), expected["action_dist_inputs"], atol=1e-5, rtol=0)
    assert done.buffers and not any(k.endswith((".weight", ".bias")) for k in done.buffers)
    frozen, moved = one_step_changes_every_parameter(module, expected["obs"][:8].astype(np.float32))
    assert frozen == [] and moved == []
