"""Activation patching and steering directions (API and CLI) on the MetaDrive expert and SB3's CartPole
PPO policy, checked against forwards computed here from the files' weights (numpy) and torch's own."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from expert import expert_forward
from policyport.analysis.directions import alpha_sweep, mean_difference
from policyport.analysis.patching import activation_patching
from test_cli import invoke

BACKENDS = list(pp.BACKENDS)
CARTPOLE = Path(__file__).resolve().parents[2] / "fixtures" / "real" / "sb3_ppo_cartpole.zip"


def fraction(patched, clean, corrupt):
    delta = clean - corrupt
    return float(np.sum((patched - corrupt) * delta) / np.sum(delta * delta))


@pytest.fixture(scope="module")
def pair(metadrive_obs):
    return metadrive_obs[:12], metadrive_obs[12:24]


@pytest.mark.parametrize("backend", BACKENDS)
def test_patching_matches_the_forward_computed_here_per_tensor_and_per_neuron(metadrive_onnx, metadrive_weights, pair,
                                                                              backend):
    a, b = pair
    result = activation_patching(pp.load(metadrive_onnx, backend=backend), a, b, "fc_1/tanh,fc_2/tanh",
                                 per_neuron=True, output="logits")
    a1, a2, clean = expert_forward(metadrive_weights, a)
    _, _, corrupt = expert_forward(metadrive_weights, b)
    assert [t.name for t in result.tensors] == ["fc_1/tanh", "fc_2/tanh"] and result.output == "logits"
    for t, (clean_act, layer) in zip(result.tensors, [(a1, "h1"), (a2, "h2")]):
        assert t.restored["logits"] == pytest.approx(1.0, abs=1e-6)  # the whole layer: all of the difference
        want = []
        for i in range(clean_act.shape[1]):
            def patched(v, i=i):
                v = v.copy()
                v[:, i] = clean_act[:, i]
                return v
            want.append(fraction(expert_forward(metadrive_weights, b, **{layer: patched})[2], clean, corrupt))
        np.testing.assert_allclose(t.neurons["logits"], want, atol=2e-5, err_msg=t.name)
    assert np.abs(result.tensors[0].neurons["logits"]).max() > 0.01  # a neuron alone restores a visible part


def test_both_backends_give_the_same_fractions(metadrive_onnx, pair):
    results = [activation_patching(pp.load(metadrive_onnx, backend=b), *pair, "fc_2/tanh", per_neuron=True).to_dict()
               for b in BACKENDS]
    for one, other in zip(results[0]["tensors"], results[1]["tensors"]):
        np.testing.assert_allclose(one["neurons"], other["neurons"], atol=1e-5)
        assert one["restored"] == pytest.approx(other["restored"], abs=1e-6)


@pytest.fixture(scope="module")
def cartpole_onnx(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("cartpole") / "cartpole.onnx"
    onnx.save(pp.convert(CARTPOLE), path)
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_the_sb3_policy_a_whole_layer_restores_all_and_the_integer_action_is_left_out(cartpole_onnx, backend):
    rng = np.random.default_rng(4)
    a, b = (rng.normal(0, 1, (16, 4)).astype(np.float32) for _ in range(2))
    result = activation_patching(pp.load(cartpole_onnx, backend=backend), a, b, "mlp_extractor.*")
    assert result.output == "logits" and result.outputs == ["logits"]  # the Categorical action is an integer
    assert [t.name for t in result.tensors] == ["mlp_extractor.policy_net.0/linear", "mlp_extractor.policy_net.1/tanh",
                                                "mlp_extractor.policy_net.2/linear", "mlp_extractor.policy_net.3/tanh"]
    for t in result.tensors:
        assert t.restored["logits"] == pytest.approx(1.0, abs=1e-6), t.name


@pytest.mark.slow
def test_on_the_sb3_policy_per_neuron_fractions_equal_torchs_forward_with_a_hook(cartpole_onnx):
    torch = pytest.importorskip("torch")
    import io

    with zipfile.ZipFile(CARTPOLE) as z:
        state = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=True, map_location="cpu")
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh())
    net.load_state_dict({k.removeprefix("mlp_extractor.policy_net."): v for k, v in state.items()
                         if k.startswith("mlp_extractor.policy_net.")})
    head = torch.nn.Linear(64, 2)
    head.load_state_dict({k.removeprefix("action_net."): v for k, v in state.items() if k.startswith("action_net.")})
    rng = np.random.default_rng(9)
    a, b = (rng.normal(0, 1, (16, 4)).astype(np.float32) for _ in range(2))
    with torch.no_grad():
        hidden_a = net[:2](torch.from_numpy(a))
        clean, corrupt = head(net(torch.from_numpy(a))).double().numpy(), head(net(torch.from_numpy(b))).double().numpy()
        want = []
        for i in range(64):
            def hook(module, inputs, value, i=i):
                value = value.clone()
                value[:, i] = hidden_a[:, i]
                return value
            handle = net[1].register_forward_hook(hook)
            want.append(fraction(head(net(torch.from_numpy(b))).double().numpy(), clean, corrupt))
            handle.remove()
    for backend in BACKENDS:
        result = activation_patching(pp.load(cartpole_onnx, backend=backend), a, b, "mlp_extractor.policy_net.1/tanh",
                                     per_neuron=True)
        np.testing.assert_allclose(result.tensors[0].neurons["logits"], want, atol=2e-5)


def test_patch_cli_json_and_heat_map(metadrive_onnx, pair, tmp_path):
    np.save(tmp_path / "a.npy", pair[0])
    np.save(tmp_path / "b.npy", pair[1])
    result = invoke("patch", metadrive_onnx, "--clean", tmp_path / "a.npy", "--corrupt", tmp_path / "b.npy",
                    "--tensors", "fc_2/tanh", "--per-neuron", "--json", "--plot", tmp_path / "p.png",
                    "--backend", "onnxruntime")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["output"] == "action" and doc["outputs"] == ["logits", "action", "log_std"]
    (tensor,) = doc["tensors"]
    assert tensor["name"] == "fc_2/tanh" and tensor["restored"] == pytest.approx(1.0, abs=1e-6)
    assert len(tensor["neurons"]) == 256 and doc["plot"] == str(tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = invoke("patch", metadrive_onnx, "--clean", tmp_path / "a.npy", "--corrupt", tmp_path / "b.npy",
                   "--tensors", "fc_1/tanh")
    assert table.exit_code == 0 and "fc_1/tanh" in table.stdout and "1.0000" in table.stdout


@pytest.mark.parametrize("change, code, message", [
    ("rows", 3, "the clean observations have 5 rows and the corrupt 12"),
    ("same", 3, "the clean and corrupt observations give the same output; there is nothing to restore"),
    ("output", 3, "'nope' is not a floating graph output; choose one of logits, action, log_std"),
    ("plot", 2, "p.npz is named as a .npz file, but the output is a PNG image; name it .png"),
])
def test_patch_cli_refusals(metadrive_onnx, pair, tmp_path, change, code, message):
    np.save(tmp_path / "a.npy", pair[0][:5] if change == "rows" else pair[1] if change == "same" else pair[0])
    np.save(tmp_path / "b.npy", pair[1])
    extra = {"output": ["--output", "nope"], "plot": ["--plot", tmp_path / "p.npz"]}.get(change, [])
    result = invoke("patch", metadrive_onnx, "--clean", tmp_path / "a.npy", "--corrupt", tmp_path / "b.npy", *extra,
                    "--json")
    assert result.exit_code == code
    assert message in (result.stdout if code == 3 else result.output)
    assert not (tmp_path / "p.npz").exists()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory, metadrive_onnx, metadrive_obs):
    folder = tmp_path_factory.mktemp("directions")
    for name, rows in (("a", slice(0, 300)), ("b", slice(300, 500))):
        np.save(folder / f"{name}.npy", metadrive_obs[rows])
        result = invoke("record", metadrive_onnx, "-i", folder / f"{name}.npy", "-o", folder / f"{name}.parquet", "-q",
                        "--batch-size", "64")
        assert result.exit_code == 0, result.output
    return folder


@pytest.mark.parametrize("backend", BACKENDS)
def test_direction_is_the_difference_of_means_and_steers_as_computed_here(recordings, metadrive_onnx, metadrive_weights,
                                                                          metadrive_obs, backend, tmp_path):
    result = invoke("direction", recordings / "a.parquet", recordings / "b.parquet", "--tensor", "fc_2/tanh",
                    "-o", tmp_path / "d.npy", "--model", metadrive_onnx, "-i", recordings / "b.npy",
                    "--alphas=-1,0,0.5,2", "--measure", "logits", "--plot", tmp_path / "s.png", "--backend", backend,
                    "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    want = expert_forward(metadrive_weights, metadrive_obs[:300])[1].mean(0) - \
        expert_forward(metadrive_weights, metadrive_obs[300:500])[1].mean(0)
    direction = np.load(tmp_path / "d.npy")
    assert direction.dtype == np.float32 and direction.shape == (256,) and doc["rows"] == [300, 200]
    np.testing.assert_allclose(direction, want, atol=1e-6)
    assert doc["norm"] == pytest.approx(float(np.linalg.norm(want)), rel=1e-5)
    for alpha, mean in zip([-1, 0, 0.5, 2], doc["sweep"]["mean"]):
        steered = expert_forward(metadrive_weights, metadrive_obs[300:500], h2=lambda v: v + alpha * direction)[2]
        np.testing.assert_allclose(mean, steered.mean(axis=0), atol=2e-5)
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_a_direction_of_zero_changes_nothing(recordings, metadrive_onnx, metadrive_obs):
    zero = mean_difference(recordings / "a.parquet", recordings / "a.parquet", "fc_1/tanh")
    assert not zero.vector.any() and zero.norm == 0.0
    for backend in BACKENDS:
        session = pp.load(metadrive_onnx, backend=backend)
        sweep = alpha_sweep(session, {"obs": metadrive_obs[:40]}, "fc_1/tanh", zero.vector, [-5, 0, 5])
        plain = session.run(metadrive_obs[:40])["action"]
        assert sweep.output == "action"
        for values in sweep.values:
            np.testing.assert_array_equal(values, plain)


@pytest.mark.parametrize("args, code, message", [
    (["--alphas", "1,2"], 2, "--alphas runs a model on observations: give --model MODEL and -i OBS"),
    (["--plot", "s.png"], 2, "--plot go with --alphas"),
    (["--alphas", "1,x", "--model", "M", "-i", "O"], 2, "is not a comma-separated list of numbers"),
    (["--tensor", "nope"], 3, "holds no tensor 'nope' with a row per observation"),
])
def test_direction_refusals(recordings, metadrive_onnx, tmp_path, args, code, message):
    args = [metadrive_onnx if a == "M" else recordings / "b.npy" if a == "O" else a for a in args]
    tensor = [] if "--tensor" in args else ["--tensor", "fc_1/tanh"]
    result = invoke("direction", recordings / "a.parquet", recordings / "b.parquet", *tensor, *args,
                    "-o", tmp_path / "d.npy")
    assert result.exit_code == code
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "d.npy").exists()
