"""The synthetic policies shaped like published ones (fixtures/synthetic/, made by make_published.py).

Every fixture runs on both backends. Deterministic tensors must match onnxruntime, and the graph
outputs torch's own float32 forward, to 1e-5; both backends' outputs are compared with torch's float64
forward too, which shows how far float32 rounding alone carries each of them. Random outputs (the
ML-Agents actor's sampled actions) must have the right shape, dtype and distribution, reproducibly
per seed. The torch-dependent test that rebuilds the fixtures from their script is marked slow.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import policyport as pp  # noqa: E402

FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "synthetic"
NAMES = ["mlagents_hybrid", "lstm_policy_opset9", "lstm_policy_opset17", "conv_grid", "attention_entities"]
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
ATOL = 1e-5


def load_fixture(name):
    model = onnx.load(str(FOLDER / f"{name}.onnx"))
    with np.load(FOLDER / f"{name}.reference.npz") as f:
        arrays = {k: f[k] for k in f.files}
    feeds = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("inputs/")}
    torch32 = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("torch32/")}
    torch64 = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("torch64/")}
    return model, feeds, torch32, torch64


def stochastic_tensors(model) -> set[str]:
    """Every tensor computed from a random op's output."""
    random: set[str] = set()
    for node in model.graph.node:
        if node.op_type in RANDOM_OPS or random & set(node.input):
            random.update(node.output)
    return random


def test_the_fixtures_are_the_ones_the_manifest_records():
    manifest = json.loads((FOLDER / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["torch"].startswith("2.13.0") and manifest["exporter"] == "torch.onnx.export(dynamo=False)"
    assert sorted(manifest["files"]) == sorted(f"{n}{suffix}" for n in NAMES for suffix in (".onnx", ".reference.npz"))
    for file, digest in manifest["files"].items():
        assert hashlib.sha256((FOLDER / file).read_bytes()).hexdigest() == digest, file
        assert (FOLDER / file).stat().st_size < 100_000, file  # small fixtures


@pytest.mark.parametrize("name", NAMES)
def test_every_deterministic_tensor_matches_onnxruntime_and_torch(name):
    model, feeds, torch32, torch64 = load_fixture(name)
    ours = pp.load(model, backend="numpy", seed=0).record(feeds)
    theirs = pp.load(model, backend="onnxruntime", seed=0).record(feeds)
    random = stochastic_tensors(model)
    compared = 0
    for tensor, value in ours.items():
        if tensor in random:
            continue
        other = theirs[tensor]
        assert value.dtype == other.dtype and value.shape == other.shape, tensor
        if value.dtype.kind == "f":  # -inf where a masked action's log-probability is (ML-Agents' mask)
            finite = np.isfinite(other)
            np.testing.assert_array_equal(value[~finite], other[~finite], err_msg=tensor)
            assert np.abs(value[finite] - other[finite]).max(initial=0) <= ATOL + 1e-5 * np.abs(other[finite]).max(
                initial=0), tensor
        else:
            np.testing.assert_array_equal(value, other, err_msg=tensor)
        compared += 1
    assert compared >= len(torch32)
    for output, expected in torch32.items():
        assert ours[output].shape == expected.shape, output
        assert np.abs(ours[output] - expected).max() <= ATOL, output
        assert np.abs(theirs[output] - expected).max() <= ATOL, output
        exact = torch64[output]
        # each float32 run is as close to the float64 forward as torch's own float32 forward is, give or
        # take float32 rounding of the output itself
        slack = 4 * np.finfo(np.float32).eps * max(1.0, float(np.abs(exact).max()))
        assert np.abs(ours[output] - exact).max() <= 2 * np.abs(expected - exact).max() + slack, output


def as_float64(model):
    """A copy of ``model`` computing in float64: float32 initializers, Constant values and graph inputs
    and outputs widened (the attention fixture has no Cast whose target would need it too)."""
    from onnx import AttributeProto, TensorProto, numpy_helper

    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    tensors = list(wide.graph.initializer) + [a.t for n in wide.graph.node for a in n.attribute
                                              if a.type == AttributeProto.TENSOR]
    for t in tensors:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in [*wide.graph.input, *wide.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    return wide


def test_attention_logits_near_1e3_are_as_exact_as_float32_allows_on_both_backends():
    """The attention logits reach ~2.5e3 (float32 spacing there: 2.4e-4), so no float32 run can be
    within 1e-5 of the exact values; numpy and onnxruntime are equally far from a float64 run of the
    same graph on every tensor, and within 1e-5 plus that distance of each other."""
    model, feeds, _, _ = load_fixture("attention_entities")
    ours = pp.load(model, backend="numpy").record(feeds)
    theirs = pp.load(model, backend="onnxruntime").record(feeds)
    exact = pp.load(as_float64(model), backend="numpy").record({k: v.astype(np.float64) for k, v in feeds.items()})
    assert np.abs(exact["/MatMul_output_0"]).max() > 1e3
    assert np.abs(ours["/MatMul_output_0"] - exact["/MatMul_output_0"]).max() > 1e-5  # float32 cannot do better
    for tensor, value in ours.items():
        if value.dtype.kind != "f":
            continue
        ours_off = np.abs(value - exact[tensor]).max()
        theirs_off = np.abs(theirs[tensor] - exact[tensor]).max()
        assert ours_off <= 1.5 * theirs_off + 4 * np.finfo(np.float32).eps * np.abs(exact[tensor]).max(), tensor
        # and of each other, within what float32 itself is off there (BLAS kernels sum in their own order, and a
        # softmax of logits near 1e3 carries their 2.4e-4 spacing)
        assert np.abs(value - theirs[tensor]).max() <= ATOL + 2 * theirs_off, tensor


def test_lstm_opset_9_and_17_give_the_same_policy():
    """LSTM-7 (opset 9) and LSTM-14 (opset 17) implementations on the same exported weights."""
    m9, feeds, _, _ = load_fixture("lstm_policy_opset9")
    m17, _, _, _ = load_fixture("lstm_policy_opset17")
    a = pp.load(m9, backend="numpy").run(feeds)
    b = pp.load(m17, backend="numpy").run(feeds)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_the_lstm_policy_carries_its_memory_across_calls():
    """Two calls of 6 steps, the second fed the first's (hn, cn), equal one call of 12 steps."""
    model, feeds, _, _ = load_fixture("lstm_policy_opset17")
    session = pp.load(model, backend="numpy")
    whole = session.run(feeds)
    first = session.run({"obs": feeds["obs"][:, :6], "h0": feeds["h0"], "c0": feeds["c0"]})
    second = session.run({"obs": feeds["obs"][:, 6:], "h0": first["hn"], "c0": first["cn"]})
    np.testing.assert_allclose(np.concatenate([first["action"], second["action"]], axis=1), whole["action"], atol=1e-6)
    np.testing.assert_allclose(second["hn"], whole["hn"], atol=1e-6)


@pytest.mark.parametrize("name", ["lstm_policy_opset9", "conv_grid"])
def test_packed_folders_run_the_new_ops_with_numpy_alone(name, tmp_path):
    """Their attributes (activation lists, pads, strides ...) survive graph.json: the folder reproduces
    the model's outputs bit for bit and verifies against its golden data."""
    model, feeds, _, _ = load_fixture(name)
    folder = pp.pack(model, tmp_path / "bundle", samples=8)
    assert pp.verify_bundle(folder).passed
    packed = pp.load(folder, backend="numpy").run(feeds)
    for output, value in pp.load(model, backend="numpy").run(feeds).items():
        np.testing.assert_array_equal(packed[output], value)


def test_mlagents_constant_outputs():
    model, feeds, _, _ = load_fixture("mlagents_hybrid")
    out = pp.load(model, backend="numpy").run(feeds)
    assert out["version_number"].tolist() == [3.0] and out["memory_size"].tolist() == [0.0]
    assert out["continuous_action_output_shape"].tolist() == [2.0]
    assert out["discrete_action_output_shape"].tolist() == [[3.0, 2.0]]


def repeated_observation(feeds, samples):
    """One observation whose unclipped action mean is at least 4 sigma inside ML-Agents' clip at +-3,
    repeated ``samples`` times, with its action mask."""
    model, _, torch32, _ = load_fixture("mlagents_hybrid")
    mean = torch32["deterministic_continuous_actions"] * 3
    inside = np.all(np.abs(mean) < 3 - 4 * np.exp([-0.5, -1.2]), axis=1)
    row = int(np.argmax(inside))
    assert inside[row]
    return {k: np.repeat(v[row:row + 1], samples, axis=0) for k, v in feeds.items()}, mean[row]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_mlagents_sampled_actions_follow_the_policy_distribution(backend):
    """continuous_actions = clip(mean + N(0, 1) * exp(log_sigma), -3, 3) / 3 with log_sigma (-0.5, -1.2);
    discrete_actions drawn with the masked softmax probabilities, masked actions never."""
    model, feeds, _, _ = load_fixture("mlagents_hybrid")
    samples = 8000
    batch, mean = repeated_observation(feeds, samples)
    batch["action_masks"][:, 0] = 0  # mask the first action of branch 0 everywhere
    session = pp.load(model, backend=backend, seed=11)
    recorded = session.record(batch)
    continuous, discrete = recorded["continuous_actions"], recorded["discrete_actions"]
    assert continuous.dtype == np.float32 and continuous.shape == (samples, 2)
    assert discrete.dtype == np.int64 and discrete.shape == (samples, 2)
    z = (continuous * 3 - mean) / np.exp([-0.5, -1.2])
    assert np.all(np.abs(z.mean(axis=0)) < 5 / np.sqrt(samples)), z.mean(axis=0)
    assert np.all(np.abs(z.std(axis=0) - 1) < 5 / np.sqrt(2 * samples)), z.std(axis=0)
    softmax = [t for t in recorded if t.startswith("/Softmax")]
    assert len(softmax) == 2
    for branch, tensor in enumerate(softmax):
        p = recorded[tensor][0].astype(np.float64)
        frequencies = np.bincount(discrete[:, branch], minlength=len(p)) / samples
        for f, q in zip(frequencies, p):
            assert abs(f - q) <= 5 * np.sqrt(q * (1 - q) / samples) + 1e-12, (branch, frequencies, p)
    assert not (discrete[:, 0] == 0).any()  # masked


def test_mlagents_sampling_is_reproducible_per_seed():
    model, feeds, _, _ = load_fixture("mlagents_hybrid")

    def sampled(seed):
        out = pp.load(model, backend="numpy", seed=seed).run(feeds)
        return out["continuous_actions"], out["discrete_actions"]

    a, b, c = sampled(3), sampled(3), sampled(4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def _script():
    spec = importlib.util.spec_from_file_location("make_published", FOLDER / "make_published.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_script_rebuilds_each_fixture_and_torch_agrees_live(name):
    """torch==2.13.0 exports the committed graph again from the seeded script, and its forward pass
    computed now gives the committed references; the numpy backend matches that live forward."""
    pytest.importorskip("torch")
    script = _script()
    module, model_bytes, inputs, outputs = script.build(name)
    committed, feeds, torch32, _ = load_fixture(name)
    rebuilt = onnx.load_from_string(model_bytes)
    assert [(n.op_type, list(n.input), list(n.output)) for n in rebuilt.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in committed.graph.node]
    for a, b in zip(rebuilt.graph.initializer, committed.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b))
    np.testing.assert_equal(script.observations(name), feeds)
    import torch

    live = script.torch_outputs(module, feeds, outputs, torch.float32)
    ours = pp.load(committed, backend="numpy").run(feeds)
    for output, expected in torch32.items():
        np.testing.assert_allclose(live[output], expected, rtol=0, atol=1e-6)
        assert np.abs(ours[output] - live[output]).max() <= ATOL, output
