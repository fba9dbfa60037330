"""verify in blocks of rows: a sample verified in many blocks gives the report it gives in one, and
the memory it plans for is one block's, so a large sample fits a small memory limit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
import policyport.verification.verify as verification
from policyport.verification.compare import ComparisonFold, compare
from policyport.errors import LimitExceededError
from test_stochastic import REASON, random_normal_like, sampled_policy  # noqa: F401  (a fixture; tests/ is on sys.path)

SOURCE_FREE = {"backends": ("numpy", "onnxruntime")}


@pytest.fixture
def blocks_asked(monkeypatch):
    """The messages of verify's memory checks before it compares (the checks still run); those of the
    rounding rule's float64 run are in its attribute ``oracle``."""
    asked = Asked()
    real = verification.check_memory

    def check(need, what):
        (asked.oracle if what.startswith("the rounding rule's") else asked).append(what)
        real(need, what)

    monkeypatch.setattr(verification, "check_memory", check)
    return asked


class Asked(list):
    def __init__(self):
        super().__init__()
        self.oracle = []


def in_blocks(monkeypatch, block_bytes: int, *args, **kwargs) -> dict:
    with monkeypatch.context() as m:
        m.setattr(verification, "BLOCK_BYTES", block_bytes)
        return pp.verify(*args, **kwargs).to_dict()


def same_report(a, b, path="report"):
    """Two reports equal but for their error figures, which may differ in float32's last bits: a block of rows
    and the whole batch are different BLAS calls, and some BLAS kernels (OpenBLAS's Haswell one) round them
    differently. Verdicts, names, shapes, counts and rules must be the same."""
    import math

    if isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), path
        for k in a:
            if (k == "rule" or "float64" in k or "rounding" in k) and a.get("passed") and b.get("passed"):
                continue  # which rule passed a comparison (within tolerance, or float32 rounding) follows the figures
            same_report(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_report(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        if not path.endswith("max_rel"):  # a relative error at values near 0: any rounding moves it a lot
            assert math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-5), (path, a, b)
    else:
        assert a == b, (path, a, b)


def row_wise_reference(model):
    """A source stand-in whose rows do not depend on the batch: the numpy backend's logits."""
    session = pp.load(model)
    return lambda obs: {"logits": session.run({"obs": obs})["logits"]}


@pytest.mark.parametrize("options", [{}, {"atol": 0.0, "rtol": 0.0}, {"atol": 0.0, "rtol": 0.0, "rounding": False},
                                     {"atol": 1e-7, "rtol": 0.0}])
def test_many_blocks_give_the_report_of_one(metadrive_model, monkeypatch, blocks_asked, options):
    reference = row_wise_reference(metadrive_model)
    whole = in_blocks(monkeypatch, 1 << 40, metadrive_model, samples=3000, reference=reference, **options)
    assert blocks_asked[-1].startswith("verifying 3,000 observations (3 sets") and "blocks" not in blocks_asked[-1]
    parts = in_blocks(monkeypatch, 40 << 20, metadrive_model, samples=3000, reference=reference, **options)
    assert " blocks of " in blocks_asked[-1]
    assert int(blocks_asked[-1].split(", in ")[1].split()[0]) >= 3
    same_report(parts, whole)
    assert whole["samples"] == 3000 and all(c["shape"][0] == 3000 for c in whole["comparisons"])
    if options.get("atol") == 0.0 and options.get("rounding", True):
        assert whole["oracle"] == "numpy float64" and any(c["rule"] == "rounding" for c in whole["comparisons"])
    if whole["oracle"]:  # its memory checked before it ran, in the blocks the comparison took
        assert blocks_asked.oracle[0] == "the rounding rule's float64 run over 3,000 observations"
        assert blocks_asked.oracle[1] == "the rounding rule's float64 run over 3,000 observations" + \
            blocks_asked[-1].split("comparison")[1][:-1]
    else:
        assert blocks_asked.oracle == []


def test_a_real_mismatch_reads_the_same_in_blocks(metadrive_model, monkeypatch):
    """The source's logits off by 0.01 on the last 300 rows only: the blocks before say nothing."""
    session = pp.load(metadrive_model)

    def reference(obs):
        logits = session.run({"obs": obs})["logits"].copy()
        logits[np.asarray(obs)[:, 0] > 0.85] += np.float32(0.01)
        return {"logits": logits}

    whole = in_blocks(monkeypatch, 1 << 40, metadrive_model, samples=2000, reference=reference)
    parts = in_blocks(monkeypatch, 30 << 20, metadrive_model, samples=2000, reference=reference)
    same_report(parts, whole)
    assert not whole["passed"]
    assert whole["first_divergence"]["tensor"] == "logits" and whole["first_divergence"]["reference"] == "source"
    assert whole["first_divergence"]["max_abs"] == pytest.approx(0.01, rel=1e-3)


def test_a_graph_that_is_not_row_wise_is_verified_whole(monkeypatch, blocks_asked, random_normal_like):
    """A random node draws per block: the stochastic graph stays one block, its skipped tensors as before."""
    whole = in_blocks(monkeypatch, 1 << 10, sampled_policy(), samples=500)
    assert blocks_asked[-1].startswith("verifying 500 observations") and "blocks" not in blocks_asked[-1]
    assert [s["tensor"] for s in whole["skipped"]] == ["noise", "scaled", "sampled"]
    assert all(s["reason"] == REASON for s in whole["skipped"]) and whole["passed"]


def test_a_large_sample_fits_a_memory_limit_one_block_would_not(metadrive_model, monkeypatch, blocks_asked):
    obs = np.random.default_rng(3).uniform(0, 1, (12_000, 275)).astype(np.float32)
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "250M")  # verifying 12,000 rows whole plans for about 800 MiB
    report = pp.verify(metadrive_model, obs)
    assert report.passed and report.samples == 12_000 and report.comparisons[0].shape == (12_000, 256)
    assert 4 <= int(blocks_asked[-1].split(", in ")[1].split()[0]) <= 12
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "1M")  # not even a row's verification fits
    with pytest.raises(LimitExceededError, match=r"^verifying 12,000 observations \(2 sets of recorded tensors and "
                                                 r"their comparison, in 12,000 blocks of 1 row\) "
                                                 r"needs about .*, more than 1 MiB"):
        pp.verify(metadrive_model, obs)


def test_a_float64_run_that_cannot_fit_leaves_the_rounding_rule_out_with_a_note(metadrive_model, monkeypatch):
    obs = np.random.default_rng(3).uniform(0, 1, (2000, 275)).astype(np.float32)
    real = verification.check_memory

    def no_room_for_the_oracle(need, what):
        real(need if not what.startswith("the rounding rule's") else 1 << 50, what)

    monkeypatch.setattr(verification, "check_memory", no_room_for_the_oracle)
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "8G")
    report = pp.verify(metadrive_model, obs, atol=0.0, rtol=0.0)
    assert report.oracle is None and not report.passed
    assert [n for n in report.notes if n.startswith("no float64 oracle")] == [
        "no float64 oracle for the rounding rule: the rounding rule's float64 run over 2,000 observations needs "
        "about 1,024 TiB, more than 8 GiB (the limit POLICYPORT_MAX_MEMORY sets); use fewer samples or a smaller "
        "input, or a machine with more memory (or set POLICYPORT_MAX_MEMORY)"]


def test_the_cli_refuses_a_verification_that_cannot_fit_with_exit_3(tmp_path, monkeypatch):
    from test_cli import invoke

    model = _attention_like()
    onnx.save(model, tmp_path / "m.onnx")
    monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "30M")
    result = invoke("verify", tmp_path / "m.onnx", "--samples", "20000")
    assert result.exit_code == 3
    assert "verifying 20,000 observations (2 sets of recorded tensors and their comparison) needs about" \
        in result.stderr and "(the limit POLICYPORT_MAX_MEMORY sets)" in result.stderr


def _attention_like() -> onnx.ModelProto:
    """obs (batch, 64) -> h = obs @ W (batch, 64) -> scores = h @ h^T (batch, batch): rows mix."""
    w = numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["h"], name="h"),
         helper.make_node("Transpose", ["h"], ["ht"], name="ht"),
         helper.make_node("MatMul", ["h", "ht"], ["scores"], name="scores")],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "batch"])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# ------------------------------------------------------------------------------------- the fold


def _cases():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((12, 3)).astype(np.float32)
    b = a + rng.standard_normal((12, 3)).astype(np.float32) * 1e-5
    oracle = (a.astype(np.float64) + b) / 2
    nan_a, nan_b = a.copy(), b.copy()
    nan_a[[1, 7], 0] = np.nan
    nan_b[[7, 9], 2] = np.nan
    inf_a, inf_b = a.copy(), b.copy()
    inf_a[4, 1] = inf_b[4, 1] = np.inf
    inf_a[10, 2] = np.inf
    ints = rng.integers(-5, 5, (12, 3))
    other = ints.copy()
    other[[2, 11], 1] += 3
    words = np.array([f"w{i}" for i in range(12)])
    return {
        "close": (a, b, None), "rounding": (a, b, oracle), "far": (a, b * 2, oracle), "nan": (nan_a, nan_b, None),
        "inf": (inf_a, inf_b, None), "ints": (ints, other, None), "same ints": (ints, ints.copy(), None),
        "strings": (words, np.where(np.arange(12) % 5 == 0, "x", words), None),
        "dtype": (a, ints, None), "empty": (a[:0], b[:0], None), "float16 vs float32": (a.astype(np.float16), b, None),
    }


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("cuts", [[12], [5, 12], [1, 2, 3, 9, 12]])
def test_a_fold_over_blocks_is_the_comparison_of_the_whole(case, cuts):
    a, b, oracle = _cases()[case]
    for atol, rtol in ((None, None), (0.0, 0.0)):
        want = compare("t", "cand", a, "ref", b, atol, rtol, oracle)
        fold = ComparisonFold("t", "cand", "ref", atol, rtol)
        starts = [0, *cuts[:-1]]
        for start, stop in zip(starts, cuts):
            fold.add(a[start:stop], b[start:stop])
        if oracle is not None and fold.wants_rounding:
            for start, stop in zip(starts, cuts):
                fold.add_rounding(a[start:stop], b[start:stop], oracle[start:stop])
        assert fold.result() == want, (case, cuts, atol)


def test_a_shape_mismatch_reports_the_whole_shapes():
    fold = ComparisonFold("t", "cand", "ref")
    for start, stop in ((0, 4), (4, 10)):
        fold.add(np.zeros((stop - start, 3), np.float32), np.zeros((stop - start, 2), np.float32))
    got = fold.result()
    assert (got.shape, got.detail, got.passed, got.max_abs) == ((10, 3), "shape (10, 3) vs (10, 2)", False, np.inf)


B, C, D = (np.random.default_rng(seed).standard_normal(64).astype(np.float32) for seed in (12, 13, 14))


def _with_a_constant_branch() -> onnx.ModelProto:
    """obs (batch, 3) -> h = obs @ w; bias = (b + c) + d (from constants alone: the same in every
    block); y = h + bias."""
    w = np.random.default_rng(11).standard_normal((3, 64)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(B, "b"), numpy_helper.from_array(C, "c"),
             numpy_helper.from_array(D, "d")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["h"], name="h"),
         helper.make_node("Add", ["b", "c"], ["bc"], name="bc"),
         helper.make_node("Add", ["bc", "d"], ["bias2"], name="bias2"),
         helper.make_node("Add", ["h", "bias2"], ["y"], name="y")],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("options", [{}, {"atol": 0.0, "rtol": 0.0}])
def test_a_tensor_of_constants_alone_is_compared_once_in_blocks(monkeypatch, blocks_asked, options):
    model = _with_a_constant_branch()
    split = pp.load(model).backend.plan.row_split
    assert "bias2" in split.whole and "h" not in split.whole
    session = pp.load(model)
    rounded = B + (C + D)  # added in another order: float32 rounding apart

    def reference(obs):  # every tensor, as a source would name them
        return {**session.record({"obs": obs}), "bias2": rounded}

    whole = in_blocks(monkeypatch, 1 << 40, model, samples=40, reference=reference, **options)
    parts = in_blocks(monkeypatch, 1 << 10, model, samples=40, reference=reference, **options)
    assert int(blocks_asked[-1].split(", in ")[1].split()[0]) >= 10
    same_report(parts, whole)
    shapes = {(c["tensor"], c["reference"]): c["shape"] for c in whole["comparisons"]}
    assert shapes["bias2", "source"] == [64] and shapes["h", "source"] == [40, 64]
    if options:  # atol 0: the two orders of adding are float32 rounding apart
        assert {(c["tensor"], c["rule"], c["passed"]) for c in whole["comparisons"] if c["reference"] == "source"
                and c["tensor"] == "bias2"} == {("bias2", "rounding", True)}


def _planned(session, obs, rows: int, many: bool) -> int:
    """What verify plans for a block of ``rows`` rows of ``obs`` on the numpy backend alone against a
    source (two sides), both passes."""
    memory = verification._BlockMemory({"numpy": session}, session.tensor_sizes(obs), session.selection("*"), 2)
    return max(memory.compare(rows, many), memory.oracle(rows, many))


@pytest.mark.parametrize("budget", ["BLOCK_BYTES", "POLICYPORT_MAX_MEMORY"])
def test_blocks_are_as_few_as_the_budget_allows_and_even(metadrive_model, monkeypatch, budget):
    """Each block's planned memory fits the budget (BLOCK_BYTES, or half the memory limit), and one
    block fewer would not; blocks tile the rows in order and differ by one row at most."""
    asked = []
    monkeypatch.setattr(verification, "check_memory", lambda need, what: asked.append((need, what)))
    if budget == "BLOCK_BYTES":
        monkeypatch.setattr(verification, "BLOCK_BYTES", 20 << 20)
    else:
        monkeypatch.setenv("POLICYPORT_MAX_MEMORY", "40M")
    target = 20 << 20
    session = pp.load(metadrive_model)
    obs = np.random.default_rng(5).uniform(0, 1, (1000, 275)).astype(np.float32)

    bounds = verification._blocks(session.backend.graph, {"numpy": session}, {"obs": obs}, "*", 1000, 2, True).bounds
    need, what = asked[-1]
    sizes = [stop - start for start, stop in bounds]
    assert len(bounds) >= 3 and what.endswith(f", in {len(bounds):,} blocks of {max(sizes):,} rows)")
    assert [start for start, _ in bounds] == [0, *(stop for _, stop in bounds[:-1])] and bounds[-1][1] == 1000
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert need <= _planned(session, obs, max(sizes), True) <= target
    assert _planned(session, obs, -(-1000 // (len(bounds) - 1)), True) > target  # one block fewer would not fit
    assert _planned(session, obs, 1000, False) > target  # nor one block


@pytest.mark.parametrize("rows, n, said", [(1, 3, "in 3 blocks of 1 row"), (2, 4, "in 2 blocks of 2 rows"),
                                           (5, 12, "in 3 blocks of 4 rows")])
def test_a_budget_of_exactly_k_rows_makes_blocks_of_k_rows(metadrive_model, monkeypatch, rows, n, said):
    asked = []
    monkeypatch.setattr(verification, "check_memory", lambda need, what: asked.append((need, what)))
    session = pp.load(metadrive_model)
    obs = np.random.default_rng(6).uniform(0, 1, (n, 275)).astype(np.float32)
    monkeypatch.setattr(verification, "BLOCK_BYTES", _planned(session, obs, rows, True))  # a block of `rows` rows
    bounds = verification._blocks(session.backend.graph, {"numpy": session}, {"obs": obs}, "*", n, 2, True).bounds
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) <= rows and len(sizes) == -(-n // rows)
    assert asked[-1][1].endswith(f", {said})")


def _two_inputs(batch_axis) -> onnx.ModelProto:
    """y = obs * scale: obs (batch_axis, 3) holds the rows, scale (3,) is the same for every row."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["obs", "scale"], ["y"], name="y")], "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [batch_axis, 3]),
         helper.make_tensor_value_info("scale", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_axis, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("batch_axis", ["batch", None])
@pytest.mark.parametrize("backends", [("numpy", "onnxruntime"), ("onnxruntime",)])
def test_blocks_cut_the_batched_inputs_only_whatever_the_batch_axis_is_called(monkeypatch, blocks_asked, batch_axis,
                                                                              backends):
    """An unnamed batch axis is cut too; an input of fixed shape goes whole to every block; without the
    numpy backend the blocks are still planned (from the numpy plan of the graph)."""
    model = _two_inputs(batch_axis)
    feeds = {"obs": np.random.default_rng(8).uniform(0, 1, (300, 3)).astype(np.float32),
             "scale": np.array([0.5, 2.0, -1.0], np.float32)}
    reference = lambda obs: {"y": obs["obs"] * obs["scale"]}  # noqa: E731
    whole = in_blocks(monkeypatch, 1 << 40, model, feeds, backends=backends, reference=reference)
    parts = in_blocks(monkeypatch, 1 << 12, model, feeds, backends=backends, reference=reference)
    assert int(blocks_asked[-1].split(", in ")[1].split()[0]) >= 3
    same_report(parts, whole)
    assert whole["passed"] and whole["samples"] == 300
