"""Graph inputs as exporters write them: free dims as -1 or 0, initializers that are inputs too,
scalar and fixed-shape inputs beside a batched one, symbolic dims shared between inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.runtime.base import count_observations
from policyport.verification.verify import sample_inputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verification"
BACKENDS = list(pp.BACKENDS)
RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def gemm_tanh(dims, ir_version=8):
    """obs declared with ``dims`` -> Gemm(W, B) -> Tanh -> y, as Paddle2ONNX writes a free batch."""
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 3])
    nodes = [helper.make_node("Gemm", ["obs", "W", "B"], ["h"], name="fc"), helper.make_node("Tanh", ["h"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "g", [obs], [y], [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)


@pytest.mark.parametrize("dim", [-1, 0, -7])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dim_written_as_minus_one_or_zero_is_free(dim, backend):
    sess = pp.load(gemm_tanh([dim, 4]), backend=backend)
    assert sess.inputs[0].shape == (None, 4) and sess.inputs[0].has_batch_axis
    obs = RNG.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(obs)["y"], np.tanh(obs @ W + B), rtol=1e-6, atol=1e-6)
    with pytest.raises(pp.InputMismatchError, match=r"axis 1 is 3, the model needs 4"):
        sess.run(np.zeros((5, 3), np.float32))


def test_a_minus_one_batch_verifies_and_packs(tmp_path):
    model = gemm_tanh([-1, 4])
    report = pp.verify(model, samples=5)
    assert report.passed and report.samples == 5 and report.notes == []
    assert {c.shape for c in report.comparisons} == {(5, 3)}
    folder = pp.pack(model, tmp_path / "b", samples=5)
    policy = json.loads((folder / "policy.json").read_text())
    assert policy["inputs"][0]["shape"] == [None, 4] and policy["golden"]["samples"] == 5
    assert pp.verify_bundle(folder).passed
    np.testing.assert_array_equal(pp.load(folder).run(np.ones((2, 4), np.float32))["y"],
                                  pp.load(model).run(np.ones((2, 4), np.float32))["y"])


def test_onnxruntime_gets_the_zero_dim_freed_and_the_file_is_untouched(tmp_path):
    model = gemm_tanh([0, 4])
    before = model.SerializeToString()
    assert pp.load(model, backend="onnxruntime").run(np.ones((3, 4), np.float32))["y"].shape == (3, 3)
    assert model.SerializeToString() == before


# ------------------------------------------------------------------------- initializers as inputs


@pytest.fixture(scope="module")
def keep_initializers():
    """torch's Linear(4, 2) exported with keep_initializers_as_inputs=True (see make_fixtures.py)."""
    return onnx.load(FIXTURES / "initializer_inputs.onnx")


@pytest.mark.parametrize("backend", BACKENDS)
def test_initializers_that_are_inputs_are_optional_inputs_with_a_default(keep_initializers, backend):
    weights = {t.name: numpy_helper.to_array(t) for t in keep_initializers.graph.initializer}
    sess = pp.load(keep_initializers, backend=backend)
    assert [v.name for v in sess.inputs] == ["obs"]
    assert [(v.name, v.shape) for v in sess.optional_inputs] == [("0.weight", (2, 4)), ("0.bias", (2,))]
    obs = RNG.standard_normal((3, 4)).astype(np.float32)
    expected = obs @ weights["0.weight"].T + weights["0.bias"]
    np.testing.assert_allclose(sess.run(obs)["action"], expected, rtol=1e-6, atol=1e-6)
    bias = np.array([10.0, -20.0], np.float32)
    overridden = sess.run({"obs": obs, "0.bias": bias})["action"]
    np.testing.assert_allclose(overridden, obs @ weights["0.weight"].T + bias, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(sess.record({"obs": obs, "0.bias": bias})["action"], overridden, rtol=1e-6)
    np.testing.assert_allclose(sess.run(obs)["action"], expected, rtol=1e-6, atol=1e-6)  # the default again
    with pytest.raises(pp.InputMismatchError, match=r"input '0.bias' expects shape \(2,\), got \(3,\)"):
        sess.run({"obs": obs, "0.bias": np.zeros(3, np.float32)})
    with pytest.raises(pp.InputMismatchError, match=r"optionally \['0.weight', '0.bias'\].*unexpected \['bias'\]"):
        sess.run({"obs": obs, "bias": bias})


def test_the_numpy_plan_keeps_its_constants_when_no_override_is_fed(keep_initializers):
    backend = pp.load(keep_initializers).backend
    backend.run({"obs": np.zeros((1, 4), np.float32)})
    assert list(backend._plans) == [frozenset()]  # no override fed: only the plan with every weight constant
    assert [s.kind for s in backend.plan.steps] == ["gemm"]  # the constant-weight fast path
    backend.run({"obs": np.zeros((1, 4), np.float32), "0.bias": np.zeros(2, np.float32)})
    assert set(backend._plans) == {frozenset(), frozenset({"0.bias"})}
    assert [s.kind for s in backend._plans[frozenset({"0.bias"})].steps] == ["call"]


def test_before_ir_4_initializers_listed_as_inputs_are_constants():
    model = onnx.load(FIXTURES / "initializer_inputs.onnx")
    model.ir_version = 3
    assert pp.load(model).optional_inputs == []


def test_initializer_inputs_survive_packing(keep_initializers, tmp_path):
    folder = pp.pack(keep_initializers, tmp_path / "b", samples=3)
    sess = pp.load(folder)
    obs = np.ones((1, 4), np.float32)
    assert sess.run({"obs": obs, "0.bias": np.zeros(2, np.float32)})["action"].tolist() == \
        pp.load(keep_initializers).run({"obs": obs, "0.bias": np.zeros(2, np.float32)})["action"].tolist()


# --------------------------------------------------------------------- scalars and fixed shapes


def scaled_policy(temperature_first=True):
    """``action = tanh(obs @ W) / temperature`` with ``temperature`` a scalar input declared first."""
    temperature = helper.make_tensor_value_info("temperature", TensorProto.FLOAT, [])
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["B", 4])
    y = helper.make_tensor_value_info("action", TensorProto.FLOAT, ["B", 3])
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["h"], name="fc"),
             helper.make_node("Tanh", ["h"], ["t"], name="act"),
             helper.make_node("Div", ["t", "temperature"], ["action"], name="scale")]
    inputs = [temperature, obs] if temperature_first else [obs, temperature]
    graph = helper.make_graph(nodes, "g", inputs, [y], [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_scalar_input_before_the_batched_one_verifies_and_packs(tmp_path):
    model = scaled_policy()
    feeds = sample_inputs(pp.load(model).inputs, samples=7, low=0.5, high=2.0)
    assert feeds["temperature"].shape == () and feeds["obs"].shape == (7, 4)
    report = pp.verify(model, samples=7, low=0.5, high=2.0)
    assert report.passed and report.samples == 7 and report.notes == []
    given = {"temperature": np.float32(0.25), "obs": np.ones((9, 4), np.float32)}
    assert pp.verify(model, given).samples == 9
    folder = pp.pack(model, tmp_path / "b", samples=6, low=0.5, high=2.0)
    policy = json.loads((folder / "policy.json").read_text())
    assert policy["golden"]["samples"] == 6
    assert pp.verify_bundle(folder).samples == 6


def fixed_input_model(shape):
    obs = helper.make_tensor_value_info("obs", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    graph = helper.make_graph([helper.make_node("Tanh", ["obs"], ["y"], name="act")], "g", [obs], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("shape", [(54,), ()])
def test_inputs_without_a_batch_axis_are_one_observation_whatever_samples_says(shape, tmp_path):
    model = fixed_input_model(shape)
    report = pp.verify(model, samples=64)
    assert report.passed and report.samples == 1
    assert report.notes == [f"the inputs have no batch axis (obs {_text(shape)}): 1 observation, not the 64 asked"]
    assert all(c.shape == shape for c in report.comparisons)
    folder = pp.pack(model, tmp_path / "b", samples=64)
    policy = json.loads((folder / "policy.json").read_text())
    with np.load(folder / "golden.npz") as golden:
        assert golden["inputs/obs"].shape == shape
    assert policy["golden"]["samples"] == 1 and pp.verify_bundle(folder).samples == 1


def test_a_fixed_batch_of_1_is_freed_where_each_row_is_computed_alone(tmp_path):
    """(1, 480) in front of a Tanh is an exporter's traced batch: verify and pack draw the observations
    asked, and verify compares the graph at that batch with the file's run one observation at a time."""
    model = fixed_input_model((1, 480))
    report = pp.verify(model, samples=64)
    assert report.passed and report.samples == 64
    [alone] = [c for c in report.comparisons if c.reference == "numpy batch 1"]
    assert alone.shape == (64, 480) and alone.max_abs == 0
    assert "policyport runs it at any batch" in report.notes[0]
    folder = pp.pack(model, tmp_path / "b", samples=64)
    with np.load(folder / "golden.npz") as golden:
        assert golden["inputs/obs"].shape == (64, 480)
    assert pp.verify_bundle(folder).samples == 64


def _text(shape):
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def test_free_dims_beyond_the_batch_axis_are_sampled_as_one_unless_named_like_a_batch():
    inputs = pp.load(fixed_input_model(("batch", "seq", 3))).inputs
    assert sample_inputs(inputs, samples=4)["obs"].shape == (4, 1, 3)
    inputs = pp.load(fixed_input_model(("batch", "batch", 3))).inputs
    assert sample_inputs(inputs, samples=4)["obs"].shape == (4, 4, 3)


def test_count_observations_follows_the_batch_axis():
    inputs = pp.load(scaled_policy(temperature_first=True)).inputs
    assert count_observations(inputs, {"temperature": np.float32(1), "obs": np.zeros((5, 4), np.float32)}) == 5
    assert count_observations(pp.load(fixed_input_model((54,))).inputs, {"obs": np.zeros(54, np.float32)}) == 1


# --------------------------------------------------------------------------- shared symbolic dims


def two_inputs():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "g", [a, b], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_sharing_a_symbolic_dim_are_checked_against_each_other(backend):
    sess = pp.load(two_inputs(), backend=backend)
    with pytest.raises(pp.InputMismatchError, match=r"dimension 'batch' is 3 in input 'a' but 1 in input 'b'"):
        sess.run({"a": np.zeros((3, 2), np.float32), "b": np.zeros((1, 2), np.float32)})
    out = sess.run({"a": np.ones((3, 2), np.float32), "b": np.full((3, 2), 2, np.float32)})["y"]
    assert out.tolist() == [[3.0, 3.0]] * 3


# ------------------------------------------------------------------------------------ byte order


def test_an_array_in_the_other_byte_order_is_converted_and_gives_the_native_outputs():
    obs = RNG.standard_normal((6, 4)).astype(np.float32)
    swapped = obs.astype(obs.dtype.newbyteorder("S"))
    assert swapped.dtype != obs.dtype and np.array_equal(swapped, obs)
    for backend in BACKENDS:
        sess = pp.load(gemm_tanh(["batch", 4]), backend=backend)
        want = sess.run({"obs": obs})["y"]
        for feeds in ({"obs": swapped}, swapped):
            got = sess.run(feeds)["y"]
            assert got.dtype == np.float32 and got.dtype.isnative and np.array_equal(got, want), backend
        recorded = sess.record({"obs": swapped}, "*")
        assert all(np.array_equal(v, sess.record({"obs": obs}, "*")[k]) for k, v in recorded.items())


def test_another_dtype_in_the_other_byte_order_is_still_refused_naming_both():
    sess = pp.load(gemm_tanh(["batch", 4]))
    with pytest.raises(pp.InputMismatchError, match=r"^input 'obs' expects dtype float32, got float64; convert"):
        sess.run({"obs": np.zeros((2, 4), ">f8")})


def test_every_command_reading_observations_takes_them_in_the_other_byte_order(tmp_path, metadrive_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    def invoke(*args):
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result

    model = tmp_path / "m.onnx"
    onnx.save(pp.convert(metadrive_path, activation="tanh"), model)
    obs = RNG.uniform(0, 1, (40, 275)).astype(np.float32)
    np.save(tmp_path / "native.npy", obs)
    np.save(tmp_path / "big.npy", obs.astype(">f4"))
    assert np.load(tmp_path / "big.npy").dtype.str == ">f4"
    for backend in BACKENDS:
        for name in ("native", "big"):
            invoke("run", model, "-i", tmp_path / f"{name}.npy", "-o", tmp_path / f"{name}-{backend}.npz", "--backend", backend)
        with np.load(tmp_path / f"native-{backend}.npz") as want, np.load(tmp_path / f"big-{backend}.npz") as got:
            assert want.files == got.files and all(np.array_equal(got[k], want[k]) for k in want.files)
    for name in ("native", "big"):
        invoke("record", model, "-i", tmp_path / f"{name}.npy", "-o", tmp_path / f"rec-{name}.npz", "--batch-size", "16")
    with np.load(tmp_path / "rec-native.npz") as want, np.load(tmp_path / "rec-big.npz") as got:
        tensors = [k for k in want.files if not k.startswith("policyport.")]  # the metadata names the input file
        assert want.files == got.files and len(tensors) >= 4
        assert all(np.array_equal(got[k], want[k]) for k in tensors)
    verified = invoke("verify", model, "-i", tmp_path / "big.npy", "--source", metadrive_path, "--json")
    assert json.loads(verified.stdout)["passed"] is True and json.loads(verified.stdout)["samples"] == 40
    folder = pp.pack(model, tmp_path / "bundle", samples=4)
    from policyport.handoff.folder_run import main

    assert main(folder, ["-i", str(tmp_path / "big.npy"), "-o", str(tmp_path / "packed.npz")]) == 0
    with np.load(tmp_path / "packed.npz") as got, np.load(tmp_path / "native-numpy.npz") as want:
        assert all(np.array_equal(got[k], want[k]) for k in got.files) and got.files
