"""Ablation importance against an independent computation: numpy forwards written out by hand from the
weights (a small model and the MetaDrive expert's .npz), torch's forward with a hook (the SB3 policy);
both backends; memory bounded by the block, not the dataset."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.analysis import importance as imp
from policyport.analysis import record_dataset
from policyport.errors import InputMismatchError, OptionError

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["numpy", "onnxruntime"]


@pytest.fixture(scope="module")
def small():
    """obs (3) -> Gemm -> Relu h1 (5) -> MatMul + Add -> z2 -> Tanh h2 (4) -> [Gemm W3 (4, 2), plus the sum
    of h2 over its neurons] -> action (2). h1 has one linear reader (the shortcut through MatMul); h2 has
    two readers and z2 a Tanh (the graph run again)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = {"w1": rng.normal(size=(3, 5)), "b1": rng.normal(size=5) * 0.3, "w2": rng.normal(size=(5, 4)),
         "b2": rng.normal(size=4) * 0.3, "w3": rng.normal(size=(4, 2)), "b3": rng.normal(size=2)}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    nodes = [helper.make_node("Gemm", ["obs", "w1", "b1"], ["z1"]),
             helper.make_node("Relu", ["z1"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["z2"]),
             helper.make_node("Tanh", ["z2"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w3", "b3"], ["y"]),
             helper.make_node("ReduceSum", ["h2", "axes"], ["s"], keepdims=1),
             helper.make_node("Add", ["y", "s"], ["action"])]
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()] + [numpy_helper.from_array(np.array([1]), "axes")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model, {k: v.astype(np.float64) for k, v in w.items()}


def small_forward(w, obs, ablate=None):
    """The small model in float64 numpy; ``ablate``: (tensor, neuron, value) set after its node."""
    def hook(name, a):
        if ablate is not None and ablate[0] == name:
            a = a.copy()
            a[:, ablate[1]] = ablate[2]
        return a

    h1 = hook("h1", np.maximum(obs @ w["w1"] + w["b1"], 0))
    z2 = hook("z2", h1 @ w["w2"] + w["b2"])
    h2 = hook("h2", np.tanh(z2))
    return h2 @ w["w3"] + w["b3"] + h2.sum(axis=1, keepdims=True)


def hand_scores(forward, obs, tensor, values, element=None):
    """Mean |change| of the output (or one element of it) per ablated neuron, by hand."""
    base = forward(obs)
    scores, signed = [], []
    for j, value in enumerate(values):
        change = forward(obs, (tensor, j, value)) - base
        if element is not None:
            change = change[:, element]
        scores.append(np.abs(change).mean())
        signed.append(change.mean())
    return np.array(scores), np.array(signed)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    obs = np.random.default_rng(3).normal(size=(700, 3)).astype(np.float32)
    path = tmp_path_factory.mktemp("small") / "obs.npy"
    np.save(path, obs)
    return path, obs.astype(np.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_small_model_scores_equal_the_hand_computed_ones(small, small_data, backend, ablation):
    model, w = small
    path, obs = small_data
    result = imp.importance(model, path, tensors="h1,z2,h2", ablation=ablation, backend=backend, batch_size=128,
                            max_rows=300)
    assert [t.name for t in result.tensors] == ["h1", "z2", "h2"]
    h1 = np.maximum(obs @ w["w1"] + w["b1"], 0)
    z2 = h1 @ w["w2"] + w["b2"]
    acts = {"h1": h1, "z2": z2, "h2": np.tanh(z2)}
    for t in result.tensors:
        values = acts[t.name].mean(axis=0) if ablation == "mean" else np.zeros(acts[t.name].shape[1])
        scores, signed = hand_scores(lambda o, a=None: small_forward(w, o, a), obs, t.name, values)
        np.testing.assert_allclose(t.values, values, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(t.scores, scores, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.mean_change, signed, rtol=1e-5, atol=1e-6)
        assert scores.max() > 0.05  # every layer matters to the output
    assert result.rows == 700 and result.ablation == ablation and result.output == "action"


def test_the_linear_shortcut_is_taken_where_the_only_reader_is_linear(small):
    model, _ = small
    downs, skipped = imp.downstreams(model, ["h1", "z2", "h2"], "action", "numpy")
    assert downs["h1"].linear is not None and downs["h1"].cut == "m2"
    assert downs["z2"].linear is None and downs["h2"].linear is None and not skipped


def test_means_from_a_recording_give_the_first_pass_result(tmp_path, small, small_data):
    model, _ = small
    path, _ = small_data
    rec = tmp_path / "rec.npz"
    record_dataset(model, path, rec, tensors="h1,h2")
    given = imp.importance(model, path, tensors="h1,h2", ablation="mean", means=rec)
    computed = imp.importance(model, path, tensors="h1,h2", ablation="mean")
    for a, b in zip(given.tensors, computed.tensors):
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6, atol=1e-9)
    with pytest.raises(InputMismatchError, match=r"holds no \['z2'\]"):
        imp.importance(model, path, tensors="z2", ablation="mean", means=rec)


@pytest.fixture(scope="module")
def expert_weights():
    with np.load(ROOT / "fixtures" / "real" / "metadrive_ppo_expert.npz") as f:
        return {k.removeprefix("default_policy/"): f[k].astype(np.float64) for k in f.files}


def expert_layers(w, obs):
    """The MetaDrive expert by hand from the .npz: its hidden activations, and for each hidden layer the
    mean action (fc_out's first two columns) as a function of that layer's activations."""
    h1 = np.tanh(obs @ w["fc_1/kernel"] + w["fc_1/bias"])
    h2 = np.tanh(h1 @ w["fc_2/kernel"] + w["fc_2/bias"])

    def from_h2(a):
        return (a @ w["fc_out/kernel"] + w["fc_out/bias"])[:, :2]

    return {"fc_1/tanh": h1, "fc_2/tanh": h2}, {
        "fc_1/tanh": lambda a: from_h2(np.tanh(a @ w["fc_2/kernel"] + w["fc_2/bias"])), "fc_2/tanh": from_h2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadrive_steering_importance_equals_the_hand_computed_one(tmp_path, metadrive_model, metadrive_obs,
                                                                    expert_weights, backend):
    obs = metadrive_obs[:100]
    np.save(tmp_path / "obs.npy", obs)
    result = imp.importance(metadrive_model, tmp_path / "obs.npy", tensors="fc_*/tanh", output="action[0]",
                            ablation="mean", backend=backend)
    assert result.measured == "action[0]" and [t.name for t in result.tensors] == ["fc_1/tanh", "fc_2/tanh"]
    acts, rest = expert_layers(expert_weights, obs.astype(np.float64))
    for t in result.tensors:
        a, means = acts[t.name], acts[t.name].mean(axis=0)
        base = rest[t.name](a)[:, 0]
        changes = []
        for j in range(a.shape[1]):
            ablated = a.copy()
            ablated[:, j] = means[j]
            changes.append(rest[t.name](ablated)[:, 0] - base)
        changes = np.array(changes)
        np.testing.assert_allclose(t.values, means, atol=1e-6)
        np.testing.assert_allclose(t.scores, np.abs(changes).mean(axis=1), atol=2e-6)
        np.testing.assert_allclose(t.mean_change, changes.mean(axis=1), atol=2e-6)
        assert t.ranked(1)[0]["neuron"] == int(np.argmax(np.abs(changes).mean(axis=1)))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_sb3_policy_importance_equals_torchs_forward_with_the_neuron_ablated(tmp_path, backend):
    torch = pytest.importorskip("torch")
    import io

    src = ROOT / "fixtures" / "real" / "sb3_ppo_cartpole.zip"
    with zipfile.ZipFile(src) as z:
        state = torch.load(io.BytesIO(z.read("policy.pth")), map_location="cpu", weights_only=True)
    net = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 2)).double()
    net.load_state_dict({"0.weight": state["mlp_extractor.policy_net.0.weight"],
                         "0.bias": state["mlp_extractor.policy_net.0.bias"],
                         "2.weight": state["mlp_extractor.policy_net.2.weight"],
                         "2.bias": state["mlp_extractor.policy_net.2.bias"],
                         "4.weight": state["action_net.weight"], "4.bias": state["action_net.bias"]})
    obs = np.random.default_rng(5).uniform(-2, 2, (300, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    result = imp.importance(pp.convert(src), tmp_path / "obs.npy", tensors="*tanh", output="logits", backend=backend)
    layers = {"mlp_extractor.policy_net.1/tanh": net[1], "mlp_extractor.policy_net.3/tanh": net[3]}
    assert [t.name for t in result.tensors] == list(layers)
    x = torch.from_numpy(obs.astype(np.float64))
    with torch.no_grad():
        base = net(x).numpy()
        for t in result.tensors:
            expected = []
            for j in range(64):
                def ablate(module, inputs, output, j=j):
                    output = output.clone()
                    output[:, j] = 0
                    return output

                handle = layers[t.name].register_forward_hook(ablate)
                expected.append(np.abs(net(x).numpy() - base).mean())
                handle.remove()
            np.testing.assert_allclose(t.scores, expected, atol=2e-6)


def test_memory_is_bounded_by_the_block_not_the_dataset(tmp_path, small, monkeypatch):
    """Every run takes at most max(batch, max_rows) rows and every read at most a block, whatever the
    number of observations: the largest run is the same on 2,000 and on 8,000 of them."""
    from policyport.analysis import tables
    from policyport.runtime import Session

    model, _ = small
    seen = {"run": 0, "record": 0, "read": 0}

    def counting(kind, method):
        def wrapped(self, feeds, *args, **kwargs):
            first = next(iter(feeds.values())) if isinstance(feeds, dict) else feeds
            seen[kind] = max(seen[kind], len(first))
            return method(self, feeds, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(Session, "run", counting("run", Session.run))
    monkeypatch.setattr(Session, "record", counting("record", Session.record))
    reading = tables.NpyTable.iter_batches

    def read(self, batch_size, names=None):
        for block in reading(self, batch_size, names):
            seen["read"] = max(seen["read"], len(next(iter(block.values()))))
            yield block

    monkeypatch.setattr(tables.NpyTable, "iter_batches", read)
    largest = []
    for rows in (2000, 8000):
        np.save(tmp_path / "obs.npy", np.random.default_rng(rows).normal(size=(rows, 3)).astype(np.float32))
        seen.update(run=0, record=0, read=0)
        done = []
        result = imp.importance(model, tmp_path / "obs.npy", tensors="h1,z2", ablation="mean", batch_size=100,
                                max_rows=400, progress=lambda d, t: done.append((d, t)))
        assert result.rows == rows and seen["read"] == 100 and seen["record"] == 100
        assert seen["run"] == 400  # 4 neurons of a block at once (z2 has 4, h1 5: 4 then 1)
        assert done[-1] == (2 * rows, 2 * rows) and done == sorted(done) and len(done) == 2 * rows // 100
        largest.append(seen["run"])
    assert largest[0] == largest[1]


def test_refusals(tmp_path, small, small_data):
    model, _ = small
    path, _ = small_data
    with pytest.raises(InputMismatchError, match=r"no graph output 'value'; it has \['action'\]"):
        imp.importance(model, path, output="value")
    with pytest.raises(InputMismatchError, match=r"positions \[2\] are not on its last axis"):
        imp.importance(model, path, output="action[2]")
    with pytest.raises(OptionError, match="is for mean ablation"):
        imp.importance(model, path, means=path)
    with pytest.raises(OptionError, match="unknown ablation 'resample'"):
        imp.importance(model, path, ablation="resample")
    with pytest.raises(InputMismatchError, match="match"):
        imp.importance(model, path, tensors="fc_*")
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), np.float32))
    with pytest.raises(InputMismatchError, match="holds no observations"):
        imp.importance(model, tmp_path / "empty.npy")


def test_output_elements_parse_as_the_override_grammar():
    assert imp.parse_output("action[0]") == ("action", (0,))
    assert imp.parse_output("logits[1,3]") == ("logits", (1, 3))
    assert imp.parse_output("logits[0:3]") == ("logits", (0, 1, 2))
    assert imp.parse_output("fc_2/tanh") == ("fc_2/tanh", None)
    for bad in ("action[x]", "action[3:1]", "action[-1]"):
        with pytest.raises(OptionError, match="is not a position"):
            imp.parse_output(bad)


def test_tensors_the_output_does_not_read_are_left_out(metadrive_model, tmp_path, metadrive_obs):
    np.save(tmp_path / "obs.npy", metadrive_obs[:20])
    result = imp.importance(metadrive_model, tmp_path / "obs.npy", tensors="fc_2/tanh,log_std,logits")
    assert result.skipped == {"log_std": "'action' does not depend on it"}
    logits = next(t for t in result.tensors if t.name == "logits")
    assert np.all(logits.scores[2:] == 0) and np.all(logits.scores[:2] > 0)  # action is logits[:, :2]


@pytest.mark.slow
def test_the_ray_engine_gives_the_local_result(small, small_data):
    pytest.importorskip("ray")
    import ray

    model, _ = small
    path, _ = small_data
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        remote = imp.importance(model, path, tensors="h1,h2", ablation="mean", engine="ray", batch_size=256)
    finally:
        ray.shutdown()
    local = imp.importance(model, path, tensors="h1,h2", ablation="mean", batch_size=256)
    assert remote.engine == "ray" and remote.rows == local.rows
    for a, b in zip(remote.tensors, local.tensors):
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9, atol=1e-12)


def test_the_linear_reader_follows_gemms_attributes_and_refuses_a_tensor_read_twice():
    """ONNX Gemm (opset 13): Y = alpha * A @ B' + beta * C, B' = B.T when transB=1."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(6, dtype=np.float32).reshape(2, 3)  # (N, K) read transposed

    def model(bias: str, **attrs):
        graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", bias], ["y"], **attrs)], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
                                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(2, np.float32), "c")])
        return helper.make_model(graph)

    z, rows = imp.linear_reader(model("c", transB=1, alpha=2.0), "x")
    assert z == "y" and rows.shape == (3, 2)
    np.testing.assert_array_equal(rows, 2.0 * w.T)
    assert imp.linear_reader(model("x", transB=1), "x") is None  # x is the bias too
    assert imp.linear_reader(model("c", transA=1), "x") is None
