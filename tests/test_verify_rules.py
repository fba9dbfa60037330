"""policyport.verify's bookkeeping on small graphs: which pairs are compared, notes, refusals with their
messages, observations drawn, the float64 oracle and what it is not trusted for."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.errors import BadModelError, InputMismatchError, UndrawableInputError
from policyport.graph.model import INPUT_RANGES_KEY, ValueInfo
from policyport.verification.verify import ORACLE, first_rows, input_ranges, sample_inputs


def _mlp(batch="batch") -> onnx.ModelProto:
    """obs (batch, 3) -> Gemm h -> Tanh t -> y (batch, 2)."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["h"], name="h"), helper.make_node("Tanh", ["h"], ["y"], name="y")],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _mlp_forward(obs) -> dict[str, np.ndarray]:
    """What :func:`_mlp` computes, as a source's forward pass names it."""
    h = obs @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 10)
    return {"h": h, "y": np.tanh(h)}


def _two_inputs() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"], name="y")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


OBS = np.linspace(0, 1, 15, dtype=np.float32).reshape(5, 3)


def test_every_backend_after_the_first_is_compared_with_it_tensor_by_tensor():
    report = pp.verify(_mlp(), OBS)
    assert report.passed and report.samples == 5 and report.reference is None and report.notes == []
    assert [(c.tensor, c.candidate, c.reference) for c in report.comparisons] == [
        ("h", "onnxruntime", "numpy"), ("y", "onnxruntime", "numpy")]
    assert report.backends == ["numpy", "onnxruntime"] and (report.atol, report.rtol) == (None, None)
    flipped = pp.verify(_mlp(), OBS, backends=["onnxruntime", "numpy", "onnxruntime"])
    assert flipped.backends == ["onnxruntime", "numpy"]
    assert {(c.candidate, c.reference) for c in flipped.comparisons} == {("numpy", "onnxruntime")}


def test_a_reference_is_compared_with_every_backend_on_the_tensors_it_names():
    def reference(obs):
        return {"h": obs @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 10), "unknown": obs}

    report = pp.verify(_mlp(), OBS, reference=reference, atol=1e-6, rtol=0.0)
    assert report.passed and report.reference == "source" and (report.atol, report.rtol) == (1e-6, 0.0)
    assert [(c.tensor, c.candidate, c.reference) for c in report.comparisons] == [
        ("h", "onnxruntime", "numpy"), ("h", "numpy", "source"), ("h", "onnxruntime", "source"),
        ("y", "onnxruntime", "numpy")]
    alone = pp.verify(_mlp(), OBS, backends=["numpy"], reference=reference)
    assert [(c.tensor, c.candidate, c.reference) for c in alone.comparisons] == [("h", "numpy", "source")]


def test_a_reference_that_cannot_take_the_observations_is_a_bad_source():
    def reference(obs):
        return {"h": obs @ np.zeros((4, 2), np.float32)}

    with pytest.raises(BadModelError, match=r"the source does not fit the model: its forward pass fails on the "
                                            r"model's inputs \(5, 3\)"):
        pp.verify(_mlp(), OBS, reference=reference)

def test_a_reference_of_a_model_of_several_inputs_takes_the_feeds_by_name():
    feeds = {"a": OBS[:, :2], "b": OBS[:, 1:3]}
    given = []

    def reference(obs):
        given.append(obs)
        return {"y": obs["a"] + obs["b"]}

    pp.verify(_two_inputs(), feeds, reference=reference)
    assert list(given[0]) == ["a", "b"] and all(given[0][k] is feeds[k] for k in feeds)
    with pytest.raises(BadModelError, match=r"fails on the model's inputs a \(5, 2\), b \(5, 2\) \(no\)$"):
        pp.verify(_two_inputs(), feeds, reference=lambda obs: (_ for _ in ()).throw(ValueError("no")))


@pytest.mark.parametrize("backends,message", [
    (["numpy", "tf"], r"unknown backend\(s\) \['tf'\]; choose from numpy, onnxruntime"),
    ([], r"unknown backend\(s\) \[\]"),
    (["numpy", "numpy"], r"nothing to compare: one backend \(numpy\) and no source"),
])
def test_backends_that_cannot_be_compared_are_refused(backends, message):
    with pytest.raises(InputMismatchError, match=message):
        pp.verify(_mlp(), OBS, backends=backends)


@pytest.mark.parametrize("threads, error, message", [
    (-1, InputMismatchError, "must be a finite number >= 0 and <= 1024, got -1"),
    (5000, InputMismatchError, "must be a finite number >= 0 and <= 1024, got 5000"),
    (1.5, pp.ArgumentTypeError, "must be a whole number, not float 1.5"),
    (True, pp.ArgumentTypeError, "must be a whole number, not bool True"),
])
def test_threads_reach_every_backend_session(threads, error, message):
    with pytest.raises(error, match=rf"^threads \(0: one per core\) {re.escape(message)}$"):
        pp.verify(_mlp(), OBS, threads=threads)
    assert pp.verify(_mlp(), OBS, threads=2).passed


def test_an_array_feeds_only_a_single_input_model():
    with pytest.raises(InputMismatchError, match="^the model has several inputs; pass a dict of feeds$"):
        pp.verify(_two_inputs(), OBS[:, :2])
    report = pp.verify(_two_inputs(), {"a": OBS[:, :2], "b": OBS[:, 1:]})
    assert report.passed and report.samples == 5


def test_samples_with_inputs_take_the_first_rows_and_say_so():
    report = pp.verify(_mlp(), OBS, samples=3)
    assert report.samples == 3 and report.notes == ["using the first 3 of the 5 observations given"]
    exact = pp.verify(_mlp(), OBS, samples=5)
    assert exact.notes == ["using the first 5 of the 5 observations given"]
    more = pp.verify(_mlp(), OBS, samples=9)
    assert more.samples == 5 and more.notes == ["using the first 5 of the 5 observations given (9 asked)"]


def test_drawn_observations_follow_samples_range_and_seed():
    seen = []
    report = pp.verify(_mlp(), samples=7, low=-2.0, high=-1.0, seed=3, reference=lambda obs: seen.append(obs) or _mlp_forward(obs))
    assert report.samples == 7 and report.notes == []
    inputs = [ValueInfo("obs", np.dtype(np.float32), ("batch", 3))]
    assert np.array_equal(seen[0], sample_inputs(inputs, 7, -2.0, -1.0, seed=3)["obs"])
    assert seen[0].min() >= -2.0 and seen[0].max() < -1.0
    assert pp.verify(_mlp()).samples == 1000


def test_a_fixed_batch_of_1_is_freed_and_the_report_says_so():
    """obs (1, 3) in front of an MLP is an exporter's traced batch: the samples asked are drawn, and the
    freed graph is compared with the file's run on each observation alone."""
    report = pp.verify(_mlp(batch=1), samples=4)
    assert report.samples == 4 and report.passed
    assert report.notes == [("the file declares obs with a batch of 1; policyport runs it at any batch (every node "
                             "computes each row alone), and compares the graph outputs of the first 4 observations "
                             "run together with the file's own graph run on each alone (numpy batch 1)")]
    assert [c.shape for c in report.comparisons if c.reference == "numpy batch 1"] == [(4, 2)]


def test_zero_rows_are_refused():
    with pytest.raises(InputMismatchError, match="^no observations to verify on: the inputs hold 0 rows$"):
        pp.verify(_mlp(), np.zeros((0, 3), np.float32))


def test_rounding_false_lets_the_tolerance_alone_decide():
    report = pp.verify(_mlp(), OBS, atol=0.0, rtol=0.0, rounding=False)
    assert report.oracle is None and all(c.rule == "tolerance" for c in report.comparisons)
    judged = pp.verify(_mlp(), OBS, atol=0.0, rtol=0.0)
    failed_by_tolerance = [c for c in report.comparisons if not c.passed]
    if failed_by_tolerance:  # onnxruntime's MatMul summed in another order: the oracle judges those
        assert judged.oracle == ORACLE and judged.passed
        assert {c.tensor for c in judged.comparisons if c.rule == "rounding"} == {c.tensor for c in failed_by_tolerance}


# ------------------------------------------------------------------------------------ sample_inputs


def test_sample_inputs_shapes_dtypes_range_and_seed():
    inputs = [ValueInfo("obs", np.dtype(np.float32), ("batch", 3)), ValueInfo("mask", np.dtype(np.float64), ("batch", "n", 2)),
              ValueInfo("t", np.dtype(np.float16), ())]
    drawn = sample_inputs(inputs, 6, -3.0, -2.0, seed=11)
    assert list(drawn) == ["obs", "mask", "t"]
    assert [(a.shape, a.dtype) for a in drawn.values()] == [((6, 3), np.float32), ((6, 1, 2), np.float64), ((), np.float16)]
    assert all(((a >= -3.0) & (a <= -2.0)).all() for a in drawn.values())
    again = sample_inputs(inputs, 6, -3.0, -2.0, seed=11)
    assert all(np.array_equal(drawn[k], again[k]) for k in drawn)
    other = sample_inputs(inputs, 6, -3.0, -2.0, seed=12)
    assert not np.array_equal(drawn["obs"], other["obs"])
    expected = np.random.default_rng(11).uniform(-3.0, -2.0, (6, 3)).astype(np.float32)
    assert np.array_equal(drawn["obs"], expected)


def test_sample_inputs_gives_every_dim_named_like_the_batch_the_sample_count():
    inputs = [ValueInfo("a", np.dtype(np.float32), ("batch", 2)), ValueInfo("b", np.dtype(np.float32), (3, "batch"))]
    assert [a.shape for a in sample_inputs(inputs, 4).values()] == [(4, 2), (3, 4)]


@pytest.mark.parametrize("samples,low,high", [(0, 0.0, 1.0), (5, 1.0, 1.0), (5, 2.0, 1.0), (5, 0.0, np.inf),
                                              (5, -np.inf, 0.0), (5, np.nan, 1.0), (5, -1e308, 1e308)])
def test_sample_inputs_refuses_what_it_cannot_draw(samples, low, high):
    with pytest.raises(InputMismatchError, match="need samples >= 1 and finite low < high"):
        sample_inputs([ValueInfo("obs", np.dtype(np.float32), ("batch", 3))], samples, low, high)


def test_sample_inputs_refuses_what_it_cannot_draw_and_ranges_beyond_the_dtype():
    ids = ValueInfo("ids", np.dtype(np.int64), ("batch",))
    with pytest.raises(UndrawableInputError, match=(
            r"^cannot draw samples for input 'ids' \(int64, shape \('batch',\)\): the model does not record the "
            r"integers it takes, and \[0, 1\) holds only one integer \(0\); pass observations for it \(inputs=\), "
            r"or low/high spanning the integers it takes$")) as caught:
        sample_inputs([ids], 2)
    assert caught.value.integer and isinstance(caught.value, InputMismatchError)
    with pytest.raises(UndrawableInputError, match=r"\[0.2, 0.9\) holds no integer"):
        sample_inputs([ids], 2, 0.2, 0.9)
    with pytest.raises(UndrawableInputError, match=r"\[-1, 3\) reaches beyond uint8's \[0, 255\]") as caught:
        sample_inputs([ValueInfo("u", np.dtype(np.uint8), ("batch",))], 2, -1.0, 3.0)
    assert caught.value.integer is True  # the CLI's advice: --low/--high spanning the integers it takes
    with pytest.raises(UndrawableInputError, match=r"^cannot draw samples for input 'x' \(float32, shape None\): its rank "
                                                   r"is unknown; pass observations for it \(inputs=\)$") as caught:
        sample_inputs([ValueInfo("x", np.dtype(np.float32), None)], 2)
    assert caught.value.integer is False
    with pytest.raises(UndrawableInputError, match=r"\[0, 257\) reaches beyond uint8's \[0, 255\]"):
        sample_inputs([ValueInfo("u", np.dtype(np.uint8), ("batch",))], 2, 0.0, 257.0)
    with pytest.raises(UndrawableInputError, match=r"policyport draws floating, integer and bool observations") as caught:
        sample_inputs([ValueInfo("s", np.dtype(object), ("batch",))], 2)
    assert caught.value.integer is False
    with pytest.raises(InputMismatchError, match=r"float16 holds at most ±6.55e\+04"):
        sample_inputs([ValueInfo("h", np.dtype(np.float16), ("batch",))], 2, 0.0, 1e5)
    with pytest.raises(InputMismatchError, match=r"from \[-100000, -1\)"):
        sample_inputs([ValueInfo("h", np.dtype(np.float16), ("batch",))], 2, -1e5, -1.0)
    assert sample_inputs([ValueInfo("h", np.dtype(np.float16), ("batch",))], 2, -65504.0, 65504.0)["h"].shape == (2,)


def _indexed() -> onnx.ModelProto:
    """y = Cast(idx) * 1.0: an int64 input whose recorded range is [0, 5), as a Discrete(5) observation's."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["idx"], ["f"], name="f", to=TensorProto.FLOAT),
         helper.make_node("Mul", ["f", "one"], ["y"], name="y")], "g",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.helper.set_model_props(model, {INPUT_RANGES_KEY: '{"idx": {"low": 0, "high": 5}}'})
    return model


@pytest.mark.parametrize("backends", [("numpy", "onnxruntime"), ("onnxruntime",)])
def test_verify_draws_an_integer_input_from_its_recorded_range(backends):
    """[0, 1) holds one integer, which alone would be refused: the range the model records is used."""
    seen = []
    report = pp.verify(_indexed(), backends=backends, samples=400,
                       reference=lambda idx: seen.append(idx) or {"y": idx.astype(np.float32)})
    assert report.passed and {c.tensor for c in report.comparisons} >= {"y"}
    assert seen[0].dtype == np.int64 and set(seen[0].tolist()) == {0, 1, 2, 3, 4}
    drawn = sample_inputs([ValueInfo("idx", np.dtype(np.int64), ("batch",))], 400,
                          ranges={"idx": (np.int64(0), np.int64(5))})["idx"]
    assert set(drawn.tolist()) == {0, 1, 2, 3, 4}


def test_a_range_asked_for_says_which_inputs_it_does_not_reach():
    quiet = pp.verify(_indexed(), samples=50)
    assert not any("take the integers" in n for n in quiet.notes)  # the default range: nothing to say
    report = pp.verify(_indexed(), samples=50, low=-3.0, high=3.0)
    assert report.passed and report.notes == [
        "[-3, 3) (--low/--high, low=/high=) applies to no input: 'idx' takes the integers 0..4 the model records"]


def test_bool_inputs_are_drawn_false_and_true_alike():
    drawn = sample_inputs([ValueInfo("flag", np.dtype(np.bool_), ("batch",))], 20_000, seed=3)["flag"]
    assert drawn.dtype == np.bool_ and 0.48 < drawn.mean() < 0.52


def test_integer_ranges_at_their_edges_are_drawn():
    """Two integers are enough to draw from; a range may span the whole of its dtype."""
    two = sample_inputs([ValueInfo("ids", np.dtype(np.int64), ("batch",))], 200, 0.0, 2.0)["ids"]
    assert set(two.tolist()) == {0, 1}
    whole = sample_inputs([ValueInfo("u", np.dtype(np.uint8), ("batch",))], 5000, 0.0, 256.0)["u"]
    assert whole.dtype == np.uint8 and whole.min() == 0 and whole.max() == 255
    signed = sample_inputs([ValueInfo("i", np.dtype(np.int8), ("batch",))], 5000, -128.0, 128.0)["i"]
    assert signed.min() == -128 and signed.max() == 127


def test_integer_inputs_are_drawn_from_their_recorded_range_else_from_the_integers_of_low_high():
    inputs = [ValueInfo("cell", np.dtype(np.int64), ("batch", 2)), ValueInfo("ids", np.dtype(np.int32), ("batch",)),
              ValueInfo("mask", np.dtype(np.bool_), ("batch",)), ValueInfo("obs", np.dtype(np.float32), ("batch", 3))]
    ranges = {"cell": (np.array([0, 0]), np.array([3, 5]))}
    drawn = sample_inputs(inputs, 2000, -1.5, 2.5, seed=3, ranges=ranges)
    assert drawn["cell"].dtype == np.int64 and drawn["ids"].dtype == np.int32 and drawn["mask"].dtype == np.bool_
    assert [sorted(set(drawn["cell"][:, i])) for i in (0, 1)] == [[0, 1, 2], [0, 1, 2, 3, 4]]
    assert sorted(set(drawn["ids"])) == [-1, 0, 1, 2]  # the integers i with -1.5 <= i < 2.5
    assert sorted(set(drawn["mask"])) == [False, True]
    assert drawn["obs"].min() >= -1.5 and drawn["obs"].max() < 2.5
    again = sample_inputs(inputs, 2000, -1.5, 2.5, seed=3, ranges=ranges)
    assert all(np.array_equal(drawn[k], again[k]) for k in drawn)


def test_input_ranges_are_read_from_the_model_metadata():
    assert input_ranges({}) == {}
    ranges = input_ranges({INPUT_RANGES_KEY: '{"obs": {"low": 0, "high": [3, 5]}}'})
    assert list(ranges) == ["obs"] and ranges["obs"][0] == 0 and ranges["obs"][1].tolist() == [3, 5]
    spelled = input_ranges({INPUT_RANGES_KEY: '{"obs": {"low": 0.0, "high": [3.0, 5]}}'})["obs"]
    assert [bound.dtype for bound in (*ranges["obs"], *spelled)] == [np.int64] * 4  # however JSON spells the numbers
    for text, why in (('{"obs": {"low": 4, "high": 4}}', "a range with low >= high$"), ('[1]', "no attribute 'items'"),
                      ('{"obs": {"high": 4}}', "'low'"),
                      ('{"obs": {"low": 0, "high": 2.5}}', "bound 2.5 is not a whole number within int64's range"),
                      ('{"obs": {"low": 0, "high": 1e30}}', "bound 1e\\+30 is not a whole number"),
                      ('{"obs": {"low": 0, "high": 9223372036854775808}}', "bound 9223372036854775808 is not"),
                      ('{"obs": {"low": -99999999999999999999999, "high": 0}}', "bound -99999999999999999999999 is"),
                      ('{"obs": {"low": 0, "high": []}}', "bound \\[\\] is not")):
        with pytest.raises(BadModelError, match=rf"^model metadata 'policyport.input_ranges' is malformed: .*{why}"):
            input_ranges({INPUT_RANGES_KEY: text})
    with pytest.raises(BadModelError, match=r"^model metadata 'policyport.input_ranges' is not valid JSON: Expecting"):
        input_ranges({INPUT_RANGES_KEY: "{"})


def test_first_rows_cuts_batched_inputs_only():
    inputs = [ValueInfo("obs", np.dtype(np.float32), ("batch", 3)), ValueInfo("w", np.dtype(np.float32), (2, 2)),
              ValueInfo("t", np.dtype(np.float32), ())]
    feeds = {"obs": np.zeros((5, 3)), "w": np.zeros((2, 2)), "t": np.float32(1.0)}
    cut = first_rows(inputs, feeds, 1)
    assert cut["obs"].shape == (1, 3) and cut["w"].shape == (2, 2) and cut["t"] == 1.0
    unranked = first_rows([ValueInfo("u", np.dtype(np.float32), None)], {"u": np.zeros((5, 3))}, 2)
    assert unranked["u"].shape == (2, 3)


def test_the_default_seed_is_0_for_drawn_and_verified_observations():
    inputs = [ValueInfo("obs", np.dtype(np.float32), ("batch", 3))]
    expected = np.random.default_rng(0).uniform(0.0, 1.0, (4, 3)).astype(np.float32)
    assert np.array_equal(sample_inputs(inputs, 4)["obs"], expected)
    seen = []
    pp.verify(_mlp(), samples=4, reference=lambda obs: seen.append(obs) or _mlp_forward(obs))
    assert np.array_equal(seen[0], expected)


def test_the_memory_checks_name_what_they_measure(monkeypatch):
    import policyport.verification.verify as verification

    asked = []
    monkeypatch.setattr(verification, "check_memory", lambda need, what: asked.append((need, what)))
    inputs = [ValueInfo("obs", np.dtype(np.float32), ("batch", 3)), ValueInfo("t", np.dtype(np.float16), ())]
    sample_inputs(inputs, 5)
    assert asked == [(5 * 3 * (8 + 4) + 1 * (8 + 2), "drawing 5 observations for 2 input(s)")]
    asked.clear()
    pp.verify(_mlp(), OBS, reference=_mlp_forward)
    sessions = [pp.load(_mlp(), backend=b) for b in pp.BACKENDS]

    def need(tensors, source: bool):
        """What the comparison of one block holds: each backend's record as it holds it, the source's
        tensors twice over, and 96 bytes per element of the largest tensor."""
        names = sessions[0].selection(tensors)
        values = sessions[0].record({"obs": OBS}, names)
        records = sum(s.backend.memory_needed(s.tensor_sizes(OBS), 5, names) for s in sessions)
        return records + source * 2 * sum(v.nbytes for v in values.values()) + 96 * max(v.size for v in values.values())

    assert asked == [(need("*", True), "verifying 5 observations (3 sets of recorded tensors and their comparison)")]
    asked.clear()
    pp.verify(_mlp(), OBS, tensors="", rounding=False)
    assert asked == [(need("", False), "verifying 5 observations (2 sets of recorded tensors and their comparison)")]
    asked.clear()
    pp.verify(_mlp(), OBS, atol=0.0, rtol=0.0, reference=lambda obs: {"y": _mlp_forward(obs)["y"] + np.float32(1e-7)})
    assert [what for _, what in asked] == ["verifying 5 observations (3 sets of recorded tensors and their comparison)",
                                           "the rounding rule's float64 run over 5 observations"]
    assert asked[1][0] > asked[0][0]  # the comparison's sides again, and the float64 run


def _branches():
    """ya = Relu(a); yb = Tanh(b): each output reads one input."""
    nodes = [helper.make_node("Relu", ["a"], ["ya"], name="ya"), helper.make_node("Tanh", ["b"], ["yb"], name="yb")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "ab"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in ("ya", "yb")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_outputs_drop_the_feeds_of_inputs_the_pruned_graph_no_longer_reads():
    feeds = {"a": OBS[:, :2], "b": OBS[:, 1:]}
    report = pp.verify(_branches(), feeds, outputs="yb")
    assert report.passed and [c.tensor for c in report.comparisons] == ["yb"]
    assert [c.tensor for c in pp.verify(_branches(), feeds).comparisons] == ["ya", "yb"]


def test_fixed_batches_of_1_are_freed_together_and_listed():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    report = pp.verify(model, samples=3)
    assert report.samples == 3 and report.passed
    assert report.notes[0].startswith("the file declares a, b with a batch of 1")
    # a graph that mixes rows keeps its batch of 1: one observation, as the file declares
    model.graph.node.append(helper.make_node("Flatten", ["y"], ["flat"], name="flat", axis=0))
    model.graph.output.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, 2]))
    kept = pp.verify(model, samples=3)
    assert kept.samples == 1
    assert kept.notes == ["the inputs have no batch axis (a (1, 2), b (1, 2)): 1 observation, not the 3 asked"]


def test_trust_reaches_the_source(monkeypatch, tmp_path):
    import policyport.converter as converter
    import policyport.verification.verify as verification

    given = []
    real = verification._source_reference
    monkeypatch.setattr(verification, "_source_reference",  # the source's Converted: its reference and oracle
                        lambda model, source, trust=False, obs_norm=None: given.append(trust) or (
                            converter.Converted(None, _mlp_forward, "npz"), []))
    pp.verify(_mlp(), OBS, source="anything", trust=True)
    pp.verify(_mlp(), OBS, source="anything")
    assert given == [True, False]
    monkeypatch.setattr(verification, "_source_reference", real)
    seen = []

    def fake_convert(source, kind=None, options=None, trust=None):
        seen.append((kind, trust))
        if kind is None:
            raise converter.UnknownKindError("cannot tell")
        return converter.Converted(None, _mlp_forward, kind)

    monkeypatch.setattr(converter, "convert_source", fake_convert)
    model = _mlp()
    entry = model.metadata_props.add()
    entry.key, entry.value = "policyport.source_kind", "npz"
    (tmp_path / "w.bin").write_bytes(b"")  # named unlike any kind: read as the kind convert recorded
    pp.verify(model, OBS, source=tmp_path / "w.bin", trust=True)
    assert seen == [("npz", True)]


def test_given_tolerances_reach_every_comparison():
    def ten_percent_off(obs):
        h = obs @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 10)
        return {"h": h * np.float32(1.1)}

    obs = OBS + 1  # h well away from 0
    assert pp.verify(_mlp(), obs, backends=["numpy"], reference=ten_percent_off, atol=0.0, rtol=0.2, rounding=False).passed
    assert not pp.verify(_mlp(), obs, backends=["numpy"], reference=ten_percent_off, atol=0.0, rtol=0.05,
                         rounding=False).passed
    assert pp.verify(_mlp(), obs, backends=["numpy"], reference=ten_percent_off, atol=0.2, rtol=0.0, rounding=False).passed
    assert not pp.verify(_mlp(), obs, backends=["numpy"], reference=ten_percent_off, atol=0.05, rtol=0.0,
                         rounding=False).passed


def test_the_oracle_runs_only_for_finite_tolerance_failures():
    assert pp.verify(_mlp(), OBS).oracle is None  # everything passed
    wrong_shape = pp.verify(_mlp(), OBS, backends=["numpy"], reference=lambda obs: {"h": np.zeros((1, 2), np.float32)})
    assert not wrong_shape.passed and wrong_shape.oracle is None
    nodes = [helper.make_node("ArgMax", ["obs"], ["k"], name="k", axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("k", TensorProto.INT64, ["batch"])])
    argmax = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    argmax.ir_version = 8
    exact = pp.verify(argmax, OBS, backends=["numpy"], reference=lambda obs: {"k": np.zeros(len(obs), np.int64)})
    assert not exact.passed and exact.comparisons[0].rule == "exact" and exact.oracle is None
    off = pp.verify(_mlp(), OBS, backends=["numpy"], reference=lambda obs: {"h": obs[:, :2] * 0})
    assert not off.passed and off.oracle == ORACLE


def test_without_a_numpy_session_the_graph_is_read_from_the_model_and_a_missing_oracle_is_noted():
    nodes = [helper.make_node("FastGelu", ["obs"], ["g"], name="g", domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("g", TensorProto.FLOAT, ["batch", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    report = pp.verify(model, OBS, backends=["onnxruntime"], reference=lambda obs: {"g": obs})
    assert not report.passed and report.oracle is None
    assert len(report.notes) == 1 and report.notes[0].startswith("no float64 oracle for the rounding rule: ")
    assert "FastGelu" in report.notes[0]


@pytest.mark.parametrize("keyword, value, error, message", [
    ("atol", "x", pp.ArgumentTypeError, "atol (absolute tolerance) must be a number or None, not str 'x'"),
    ("rtol", -1e-5, InputMismatchError, "rtol (relative tolerance) must be a finite number >= 0, got -1e-05"),
    ("atol", float("nan"), InputMismatchError, "atol (absolute tolerance) must be a finite number >= 0, got nan"),
    ("samples", 0, InputMismatchError, "samples (observations to draw) must be a finite number >= 1, got 0"),
    ("seed", 1.5, pp.ArgumentTypeError, "seed (of the drawn observations) must be a whole number, not float 1.5"),
    ("samples", 2.5, pp.ArgumentTypeError, "samples (observations to draw) must be a whole number or None, not float 2.5"),
    ("seed", -1, InputMismatchError, "seed (of the drawn observations) must be a finite number >= 0, got -1"),
])
def test_numbers_given_to_verify_are_checked_before_anything_runs(keyword, value, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        pp.verify(_mlp(), **{keyword: value})
