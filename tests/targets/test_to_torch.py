"""to-torch: a policy as a generated nn.Module whose forward, run by torch, matches the source's own
forward; every weight an nn.Parameter that trains, normaliser statistics buffers, names from the source."""

from __future__ import annotations

import json
import re
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
    # a torch source: the keys are the source's names, so converting back gives them without a mapping
    pp.to_torch(str(SB3 / "ppo_pendulum.zip"), folder.parent / "sb3")
    first = pp.extract_weights(pp.convert(str(SB3 / "ppo_pendulum.zip")))
    again = pp.extract_weights(pp.convert(Logits(import_policy(folder.parent / "sb3").load()), input_shape=(3,)))
    assert {k.removeprefix("inner.") for k in again} == set(first) and len(first) == 7
    for key, value in first.items():
        assert again[f"inner.{key}"].tobytes() == value.tobytes(), key


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
    done = pp.to_torch(str(ROOT / "fixtures/keras/mlp_norm.keras"), tmp_path / "k")
    module = import_policy(tmp_path / "k").load()
    source = keras.saving.load_model(ROOT / "fixtures/keras/mlp_norm.keras")
    # Keras' names are no torch keys (and its kernels are [in, out]): parameters.json maps each key to them
    names = json.loads((tmp_path / "k/parameters.json").read_text())
    weights = {v.path: np.asarray(v) for v in source.weights}
    assert done.renamed == {k: e["source"] for k, e in names.items() if e["source"] is not None}
    assert sorted(done.renamed.values()) == sorted(weights)
    state = module.state_dict()
    for key, name in done.renamed.items():
        value = weights[name].T if names[key]["layout"] == "transposed" else weights[name]
        assert state[key].numpy().tobytes() == np.ascontiguousarray(value).tobytes(), key
    assert names["fc_1.weight"]["key"] == ("sanitized: the source's names are not a torch layer's (NAME.weight, "
                                           "NAME.bias); the layer's weight is stored [in, out] by the source, "
                                           "[out, in] by nn.Linear")
    assert names["bn.running_mean"]["key"].startswith("sanitized: the source's names are not a torch norm layer's")
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
    assert report["renamed"] == {"dense.weight": "dense/kernel:0", "dense.bias": "dense/bias:0"}  # out.* are the keys
    again = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out)])
    assert again.exit_code == 3 and "exists" in again.output
    forced = CliRunner().invoke(app, ["to-torch", str(path), "-o", str(out), "--force"])
    assert forced.exit_code == 0, forced.output
    assert ("state_dict keys: the source's parameter names, but where torch cannot take one as a key (mapped in "
            "parameters.json): dense.weight for dense/kernel:0, dense.bias for dense/bias:0\n") in forced.stdout
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


# ------------------------------------------------------------ state_dict keys: the source's names


def _torch_load(path: Path, *keys: str, trusted: bool = False) -> dict:
    """The tensors of a checkpoint, read by torch, under the names the source's library gives them:
    ``keys`` picks the source's state_dicts out of a checkpoint dict (prefixed by their key where
    several are picked: an skrl agent checkpoint holds one per model). ``trusted``: the fixture
    pickles more than tensors (rl_games, Sample Factory, ML-Agents save their own objects beside them)."""
    loaded = torch.load(path, map_location="cpu", weights_only=not trusted)
    if not keys:
        return dict(loaded)
    if len(keys) == 1:
        return dict(loaded[keys[0]])
    return {f"{key}.{name}": value for key in keys for name, value in loaded[key].items()}


def _sb3_source():
    from stable_baselines3 import PPO

    model = PPO.load(SB3 / "ppo_pendulum.zip", device="cpu")
    obs = np.random.default_rng(4).uniform(-2, 2, (300, 3)).astype(np.float32)
    return model.policy.state_dict(), obs, model.predict(obs, deterministic=True)[0]


def _expected(folder: Path, expected: str, output: str = "action"):
    return lambda: (np.load(folder / "observations.npy"), np.load(expected)[output])


def _torch_forward(build, path: Path, obs_dim: int, pick=lambda out: out):
    """The source module built by torch (as the library defines it), its file's tensors loaded strictly,
    run by torch on observations: the reference (``pick`` takes it from the module's output)."""
    def reference():
        module = build()
        module.load_state_dict(_torch_load(path))
        obs = np.random.default_rng(5).uniform(-2, 2, (300, obs_dim)).astype(np.float32)
        with torch.no_grad():
            out = module(torch.from_numpy(obs))
        return obs, pick(out).detach().numpy()
    return reference


class _CleanRLQNetwork(torch.nn.Module):
    """cleanrl/dqn.py's QNetwork, for CartPole's 4 observations and 2 actions."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.network = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))

    def forward(self, x):
        return self.network(x)


def _fixture_module(name: str):
    """A module of fixtures/torch/modules.py (the classes the torch fixtures were saved from), built by torch."""
    sys.path.insert(0, str(ROOT / "fixtures/torch"))
    try:
        import modules
    finally:
        sys.path.remove(str(ROOT / "fixtures/torch"))
    return getattr(modules, name)()


RSL, RLG, SKRL = ROOT / "fixtures/rsl_rl", ROOT / "fixtures/rl_games", ROOT / "fixtures/skrl"
TIANSHOU, TORCHRL, SF = ROOT / "fixtures/tianshou", ROOT / "fixtures/torchrl", ROOT / "fixtures/sample_factory"
SF_RUN = SF / "train_dir/mlp_tanh"
ML_AGENTS, WALKER_NORM = ROOT / "fixtures/ml_agents", "network_body.observation_encoder.processors.0.normalizer"
#: kind -> (source, convert options, the source's tensors read by torch, the keys of them the policy does not
#: read (value function, critic, counters), (observations, the source framework's output), the output compared)
TORCH_SOURCES = {
    "sb3": (SB3 / "ppo_pendulum.zip", {}, None,
            {"mlp_extractor.value_net.0.weight", "mlp_extractor.value_net.0.bias", "mlp_extractor.value_net.2.weight",
             "mlp_extractor.value_net.2.bias", "value_net.weight", "value_net.bias"}, None, "action"),
    "rsl_rl": (RSL / "gaussian/model_0.pt", {}, lambda p: _torch_load(p, "actor_state_dict"),
               {"obs_normalizer._var", "obs_normalizer.count"},  # the forward reads _mean and _std
               _expected(RSL, RSL / "gaussian/expected.npz"), "action"),
    "rl_games": (RLG / "ant_elu/nn/ant_elu.pth", {}, lambda p: _torch_load(p, "model", trusted=True),
                 {"a2c_network.value.weight", "a2c_network.value.bias", "running_mean_std.count",
                  "value_mean_std.running_mean", "value_mean_std.running_var", "value_mean_std.count"},
                 _expected(RLG, RLG / "ant_elu/expected.npz", "mu"), "action"),
    "skrl": (SKRL / "isaaclab_elu/checkpoints/agent_1000.pt", {},
             lambda p: _torch_load(p, "policy", "observation_preprocessor"),
             {"policy.value_layer.weight", "policy.value_layer.bias", "observation_preprocessor.current_count"},
             _expected(SKRL, SKRL / "isaaclab_elu/expected.npz"), "action"),
    "cleanrl": (ROOT / "fixtures/cleanrl/dqn.cleanrl_model", {}, _torch_load, set(),
                _torch_forward(_CleanRLQNetwork, ROOT / "fixtures/cleanrl/dqn.cleanrl_model", 4), "logits"),
    "tianshou": (TIANSHOU / "ppo_discrete/policy_state_dict.pt", {"activation": "relu"}, _torch_load,
                 {f"critic.{m}.{p}" for m in ("preprocess.model.model.0", "preprocess.model.model.2",
                                                               "last.model.0") for p in ("weight", "bias")},
                 _expected(TIANSHOU, TIANSHOU / "ppo_discrete/expected.npz"), "action"),
    "torchrl": (TORCHRL / "discrete_elu.pt", {"activation": "elu"}, _torch_load, set(),
                _expected(TORCHRL, TORCHRL / "discrete_elu.expected.npz"), "action"),
    "sample_factory": (SF_RUN / "checkpoint_p0/checkpoint_000000050_409600.pth", {},
                       lambda p: _torch_load(p, "model", trusted=True),
                       {"critic_linear.weight", "critic_linear.bias", "obs_normalizer.running_mean_std.running_mean_std.obs.count",
                        "returns_normalizer.running_mean", "returns_normalizer.running_var", "returns_normalizer.count"}
                       | {f"critic_{m}.{p}" for m in ("decoder.mlp.0", "encoder.encoders.obs.mlp_head.0",
                                                       "encoder.encoders.obs.mlp_head.2") for p in ("weight", "bias")},
                       _expected(SF, SF_RUN / "expected.npz"), "action"),
    "ml_agents_export": (ML_AGENTS / "exports/Walker.onnx", {},  # exported from walker_ppo's checkpoint
                         lambda p: _torch_load(ML_AGENTS / "walker_ppo/Walker/Walker-5000.pt", "Policy", trusted=True),
                         {"version_number", "is_continuous_int_deprecated", "continuous_act_size_vector",
                          "discrete_act_size_vector", "act_size_vector_deprecated",  # the exporter writes its own
                          f"{WALKER_NORM}.normalization_steps", f"{WALKER_NORM}.running_variance",  # folded into std
                          "network_body.processors.0.normalizer.normalization_steps",  # the same module, twice
                          "network_body.processors.0.normalizer.running_mean",
                          "network_body.processors.0.normalizer.running_variance"},
                         lambda: tuple(np.load(ML_AGENTS / "exports/Walker.reference.npz")[k] for k in
                                       ("inputs/obs_0", "torch32/deterministic_continuous_actions")),
                         "deterministic_continuous_actions"),
    "state_dict": (ROOT / "fixtures/torch/gaussian.state_dict.pt", {"activation": "tanh"}, _torch_load,
                   {"mlp_extractor.value_net.0.weight", "mlp_extractor.value_net.0.bias", "value_net.weight",
                    "value_net.bias"},
                   _torch_forward(lambda: _fixture_module("GaussianPolicy"), ROOT / "fixtures/torch/gaussian.state_dict.pt", 4,
                                  lambda out: torch.cat((out[0], out[2]), dim=1)),  # [mean, log_std]
                   "logits"),
    "state_dict_norms": (ROOT / "fixtures/torch/norms.state_dict.pt", {"activation": "tanh,relu"}, _torch_load, set(),
                         _torch_forward(lambda: _fixture_module("norms").eval(), ROOT / "fixtures/torch/norms.state_dict.pt",
                                        5), "logits"),  # LayerNorm and BatchNorm1d keep 1.weight, 5.running_mean ...
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TORCH_SOURCES))
def test_state_dict_keys_are_the_source_s_and_its_own_tensors_load_by_name(kind, tmp_path):
    """The written module's state_dict keys are the source's own (read by torch or the source's library,
    not by policyport) wherever the policy reads that tensor; the other keys are the graph's constants,
    which parameters.json says are sanitized; the source's tensors, loaded by name into an empty Policy,
    give the source framework's outputs."""
    path, options, read, unused, reference, output = TORCH_SOURCES[kind]
    if kind == "sb3":
        theirs, obs, want = _sb3_source()
    else:
        theirs = read(path)
        obs, want = reference()
    theirs = {k: v for k, v in theirs.items() if isinstance(v, torch.Tensor)}
    done = pp.to_torch(str(path), tmp_path / kind, **options)
    policy = import_policy(tmp_path / kind)
    names = json.loads((tmp_path / kind / "parameters.json").read_text())
    keys = set(policy.Policy().state_dict())
    assert set(theirs) - keys == unused
    assert {k for k in keys if names[k]["key"].startswith("sanitized")} == keys - set(theirs)
    assert all(names[k]["role"] in ("constant", "normaliser") and names[k]["initializer"] not in theirs
               for k in keys - set(theirs))  # sanitized only: the graph's constants (clip bounds, epsilon)
    assert done.renamed == {}
    assert {k for k in keys if names[k]["role"] in ("weight", "bias")} <= set(theirs)
    module = policy.Policy()
    trained = {k for k, p in module.named_parameters() if p.requires_grad}
    # the libraries' buffers: normaliser statistics and counters (rsl_rl EmpiricalNormalization, rl_games and
    # Sample Factory RunningMeanStd, skrl RunningStandardScaler, ML-Agents Normalizer, BatchNorm) and ML-Agents'
    # export constants (nn.Parameters with requires_grad=False: memory_size_vector, version_number); every
    # other tensor of theirs that the policy reads is trained by its library, so must be an nn.Parameter here
    buffers = re.compile(r"(^|\.)(_mean|_std|_var|count|running_mean|running_var|running_variance|"
                         r"normalization_steps|num_batches_tracked|mean|var|[a-z_]+_vector|version_number)$")
    assert trained == {k for k in set(theirs) & keys if not buffers.search(k)}
    loaded = module.load_state_dict({k: theirs[k] for k in theirs if k in keys}, strict=False)
    assert set(loaded.missing_keys) == keys - set(theirs)
    written = torch.load(tmp_path / kind / "policy.pt", weights_only=True)  # the graph's constants
    module.load_state_dict({k: written[k] for k in loaded.missing_keys}, strict=False)
    with torch.no_grad():
        got = module.eval()(torch.from_numpy(obs.astype(np.float32)))[output].numpy()
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want.reshape(got.shape), atol=1e-5, rtol=0)
    else:
        np.testing.assert_array_equal(got.reshape(-1), want.reshape(-1))


def _named_layers_graph(tmp_path: Path, names: list[str]) -> tuple[Path, list[tuple[np.ndarray, np.ndarray]]]:
    """A chain of Gemm layers (transB=1, torch's [out, in]) with ReLU between them, whose weight and bias
    initializers are named NAME.weight and NAME.bias: what torch.onnx writes for modules named so."""
    rng = np.random.default_rng(7)
    nodes, inits, layers, x = [], [], [], "obs"
    for i, name in enumerate(names):
        w, b = rng.normal(size=(3, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}.weight"), numpy_helper.from_array(b, f"{name}.bias")]
        out = "logits" if i == len(names) - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [out], name=f"gemm{i}", transB=1))
        if out != "logits":
            nodes.append(helper.make_node("Relu", [out], [f"{out}/relu"], name=f"relu{i}"))
            out = f"{out}/relu"
        layers.append((w, b))
        x = out
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])], inits)
    path = tmp_path / "named.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path, layers


def test_names_torch_cannot_take_as_keys_become_flat_attributes_and_parameters_json_says_why(tmp_path):
    names = ["net.0", "net.0.extra", "train", "x.", "l\nimport os  #", "net.2", "head"]
    path, layers = _named_layers_graph(tmp_path, names)
    done = pp.to_torch(str(path), tmp_path / "out")
    text = (tmp_path / "out/policy.py").read_text()
    assert "\nimport os" not in text  # a line break in a name ends no comment
    module = import_policy(tmp_path / "out").load()
    keys = list(module.state_dict())
    assert keys == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net_0_extra.weight", "net_0_extra.bias",
                    "train_1.weight", "train_1.bias", "x_.weight", "x_.bias", "l_import_os___.weight",
                    "l_import_os___.bias", "head.weight", "head.bias"]
    # each ReLU at the position after its layer's, as torch sources hold them: positions 0 to 3, a Sequential
    assert "self.net = nn.Sequential(\n            nn.Linear(3, 3, bias=True),\n            nn.ReLU(),\n" in text
    assert "self.l_import_os___ = nn.Linear(3, 3, bias=True)  # 'l\\nimport os  #'\n" in text
    entries = json.loads((tmp_path / "out/parameters.json").read_text())
    assert {k: e["key"] for k, e in entries.items() if k.endswith(".weight")} == {
        "net.0.weight": "the source's name",
        "net_0_extra.weight": "sanitized: net.0 is another of the source's layers or tensors",
        "train_1.weight": "sanitized: the name is not a path of torch module names",  # nn.Module.train
        "x_.weight": "sanitized: the name is not a path of torch module names",  # an empty segment
        "l_import_os___.weight": "sanitized: the name is not a path of torch module names",
        "net.2.weight": "the source's name",
        "head.weight": "the source's name",
    }
    assert done.renamed == {f"{k}.{p}": f"{n}.{p}" for k, n in (("net_0_extra", "net.0.extra"), ("train_1", "train"),
                                                                ("x_", "x."), ("l_import_os___", "l\nimport os  #"))
                            for p in ("weight", "bias")}
    obs = np.random.default_rng(8).uniform(-1, 1, (40, 3)).astype(np.float32)
    want = obs.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        want = want @ w.T.astype(np.float64) + b
        want = np.maximum(want, 0) if i < len(layers) - 1 else want
    with torch.no_grad():
        got = module(torch.from_numpy(obs))["logits"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_the_target_commands_take_convert_s_options_for_the_source(tmp_path):
    """--keep-value and --no-filter reach the conversion: the value function comes along under SB3's names and
    gives SB3's own predict_values; without the filter the observation is read raw (no obs_rms buffers)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    source = SB3 / "ppo_pendulum_vecnorm.zip"
    kept = CliRunner().invoke(app, ["to-torch", str(source), "-o", str(tmp_path / "kept"), "--keep-value", "--json"])
    assert kept.exit_code == 0, kept.output
    module = import_policy(tmp_path / "kept").load()
    assert {"mlp_extractor.value_net.0.weight", "value_net.weight", "obs_rms.mean"} <= set(module.state_dict())
    sb3 = PPO.load(source, device="cpu")
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    stats = VecNormalize.load(str(SB3 / "ppo_pendulum_vecnorm/vecnormalize.pkl"),
                              DummyVecEnv([lambda: gym.make("Pendulum-v1")]))  # SB3's own normalisation
    obs = np.random.default_rng(3).uniform([-1, -1, -8], [1, 1, 8], (200, 3)).astype(np.float32)
    with torch.no_grad():
        ours = module(torch.from_numpy(obs))["value"].numpy().reshape(-1)
        normalised = torch.from_numpy(stats.normalize_obs(obs).astype(np.float32))
        theirs = sb3.policy.predict_values(normalised).numpy().reshape(-1)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    raw = CliRunner().invoke(app, ["to-torch", str(source), "-o", str(tmp_path / "raw"), "--no-filter"])
    assert raw.exit_code == 0, raw.output
    assert not [k for k in import_policy(tmp_path / "raw").Policy().state_dict() if k.startswith("obs_rms")]
