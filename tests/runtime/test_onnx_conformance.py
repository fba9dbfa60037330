"""ONNX's official node test cases, run on policyport's numpy backend through the public API.

Every case of ``onnx.backend.test.case.node.collect_testcases`` whose nodes all use default-domain
ops that the numpy registry implements is one test: the model is loaded with
``pp.load(model, backend="numpy")``, fed its inputs by graph-input name, and compared with the
expected outputs by the ONNX backend test runner's own comparison (shapes, dtypes, then
``assert_allclose`` with the case's rtol/atol, 1e-3/1e-7 for every node case).

Cases we deliberately do not run are in :data:`EXCLUSIONS` (reported as skipped, with the reason);
cases that fail because of code outside the op registry are in :data:`KNOWN_FAILURES` (strict
xfail, so a fix shows up). Both count as not passing in the summary figure, which
``test_conformance_summary`` prints and ``python tests/runtime/test_onnx_conformance.py`` prints too.
"""

from __future__ import annotations

import functools
import warnings

import pytest

onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.case.node import collect_testcases  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import policyport as pp  # noqa: E402
from policyport.runtime.numpy.registry import supported_ops  # noqa: E402

_NO_NUMPY_TYPE = (
    "{} tensors have no numpy dtype (only the ml_dtypes extension holds them), and the numpy "
    "backend runs on numpy alone: graph.onnx_dtype rejects the type"
)
_BFLOAT16 = _NO_NUMPY_TYPE.format("bfloat16")
_FLOAT8 = _NO_NUMPY_TYPE.format("float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0)")
_FLOAT4 = _NO_NUMPY_TYPE.format("float4e2m1")
_INT4 = _NO_NUMPY_TYPE.format("int4/uint4")
_INT2 = _NO_NUMPY_TYPE.format("int2/uint2")
_NOT_A_TENSOR = "{} values are not tensors; a policyport graph's inputs and outputs are tensors only"

#: Cases of our op set that we deliberately do not run: case name -> reason.
EXCLUSIONS: dict[str, str] = {
    "test_identity_sequence": _NOT_A_TENSOR.format("sequence"),
    "test_identity_opt": _NOT_A_TENSOR.format("optional"),
    # BFLOAT16
    "test_cast_FLOAT_to_BFLOAT16": _BFLOAT16,
    "test_cast_BFLOAT16_to_FLOAT": _BFLOAT16,
    "test_castlike_FLOAT_to_BFLOAT16": _BFLOAT16,
    "test_castlike_FLOAT_to_BFLOAT16_expanded": _BFLOAT16,
    "test_castlike_BFLOAT16_to_FLOAT": _BFLOAT16,
    "test_castlike_BFLOAT16_to_FLOAT_expanded": _BFLOAT16,
    "test_celu_bfloat16": _BFLOAT16,
    "test_celu_bfloat16_expanded": _BFLOAT16,
    "test_einsum_batch_matmul_bfloat16": _BFLOAT16,
    "test_einsum_sum_bfloat16": _BFLOAT16,
    "test_einsum_transpose_bfloat16": _BFLOAT16,
    "test_range_bfloat16_type_positive_delta": _BFLOAT16,
    # FLOAT8E4M3FN
    "test_cast_FLOAT_to_FLOAT8E4M3FN": _FLOAT8,
    "test_cast_FLOAT16_to_FLOAT8E4M3FN": _FLOAT8,
    "test_cast_FLOAT8E4M3FN_to_FLOAT": _FLOAT8,
    "test_cast_FLOAT8E4M3FN_to_FLOAT16": _FLOAT8,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN": _FLOAT8,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E4M3FN": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E4M3FN": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded": _FLOAT8,
    "test_castlike_FLOAT8E4M3FN_to_FLOAT": _FLOAT8,
    "test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded": _FLOAT8,
    "test_castlike_FLOAT8E4M3FN_to_FLOAT16": _FLOAT8,
    "test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded": _FLOAT8,
    # FLOAT8E4M3FNUZ
    "test_cast_FLOAT_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_cast_FLOAT16_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_cast_FLOAT8E4M3FNUZ_to_FLOAT": _FLOAT8,
    "test_cast_FLOAT8E4M3FNUZ_to_FLOAT16": _FLOAT8,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded": _FLOAT8,
    "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT": _FLOAT8,
    "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded": _FLOAT8,
    "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16": _FLOAT8,
    "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded": _FLOAT8,
    # FLOAT8E5M2
    "test_cast_FLOAT_to_FLOAT8E5M2": _FLOAT8,
    "test_cast_FLOAT16_to_FLOAT8E5M2": _FLOAT8,
    "test_cast_FLOAT8E5M2_to_FLOAT": _FLOAT8,
    "test_cast_FLOAT8E5M2_to_FLOAT16": _FLOAT8,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2": _FLOAT8,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E5M2": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E5M2_expanded": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E5M2": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E5M2_expanded": _FLOAT8,
    "test_castlike_FLOAT8E5M2_to_FLOAT": _FLOAT8,
    "test_castlike_FLOAT8E5M2_to_FLOAT_expanded": _FLOAT8,
    "test_castlike_FLOAT8E5M2_to_FLOAT16": _FLOAT8,
    "test_castlike_FLOAT8E5M2_to_FLOAT16_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded": _FLOAT8,
    # FLOAT8E5M2FNUZ
    "test_cast_FLOAT_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_cast_FLOAT16_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_cast_FLOAT8E5M2FNUZ_to_FLOAT": _FLOAT8,
    "test_cast_FLOAT8E5M2FNUZ_to_FLOAT16": _FLOAT8,
    "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded": _FLOAT8,
    "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT": _FLOAT8,
    "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded": _FLOAT8,
    "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16": _FLOAT8,
    "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ": _FLOAT8,
    "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded": _FLOAT8,
    # UINT4
    "test_cast_FLOAT_to_UINT4": _INT4,
    "test_cast_FLOAT16_to_UINT4": _INT4,
    "test_cast_UINT4_to_FLOAT": _INT4,
    "test_cast_UINT4_to_FLOAT16": _INT4,
    "test_cast_UINT4_to_UINT8": _INT4,
    "test_castlike_FLOAT_to_UINT4": _INT4,
    "test_castlike_FLOAT_to_UINT4_expanded": _INT4,
    "test_castlike_FLOAT16_to_UINT4": _INT4,
    "test_castlike_FLOAT16_to_UINT4_expanded": _INT4,
    "test_castlike_UINT4_to_FLOAT": _INT4,
    "test_castlike_UINT4_to_FLOAT_expanded": _INT4,
    "test_castlike_UINT4_to_FLOAT16": _INT4,
    "test_castlike_UINT4_to_FLOAT16_expanded": _INT4,
    "test_castlike_UINT4_to_UINT8": _INT4,
    "test_castlike_UINT4_to_UINT8_expanded": _INT4,
    # INT4
    "test_cast_FLOAT_to_INT4": _INT4,
    "test_cast_FLOAT16_to_INT4": _INT4,
    "test_cast_INT4_to_FLOAT": _INT4,
    "test_cast_INT4_to_FLOAT16": _INT4,
    "test_cast_INT4_to_INT8": _INT4,
    "test_castlike_FLOAT_to_INT4": _INT4,
    "test_castlike_FLOAT_to_INT4_expanded": _INT4,
    "test_castlike_FLOAT16_to_INT4": _INT4,
    "test_castlike_FLOAT16_to_INT4_expanded": _INT4,
    "test_castlike_INT4_to_FLOAT": _INT4,
    "test_castlike_INT4_to_FLOAT_expanded": _INT4,
    "test_castlike_INT4_to_FLOAT16": _INT4,
    "test_castlike_INT4_to_FLOAT16_expanded": _INT4,
    "test_castlike_INT4_to_INT8": _INT4,
    "test_castlike_INT4_to_INT8_expanded": _INT4,
    # FLOAT4E2M1
    "test_cast_FLOAT4E2M1_to_FLOAT": _FLOAT4,
    "test_cast_FLOAT4E2M1_to_FLOAT16": _FLOAT4,
    "test_cast_FLOAT_to_FLOAT4E2M1": _FLOAT4,
    "test_cast_FLOAT16_to_FLOAT4E2M1": _FLOAT4,
    "test_castlike_FLOAT4E2M1_to_FLOAT": _FLOAT4,
    "test_castlike_FLOAT4E2M1_to_FLOAT_expanded": _FLOAT4,
    "test_castlike_FLOAT4E2M1_to_FLOAT16": _FLOAT4,
    "test_castlike_FLOAT4E2M1_to_FLOAT16_expanded": _FLOAT4,
    "test_castlike_FLOAT_to_FLOAT4E2M1": _FLOAT4,
    "test_castlike_FLOAT_to_FLOAT4E2M1_expanded": _FLOAT4,
    "test_castlike_FLOAT16_to_FLOAT4E2M1": _FLOAT4,
    "test_castlike_FLOAT16_to_FLOAT4E2M1_expanded": _FLOAT4,
    # UINT2
    "test_cast_FLOAT_to_UINT2": _INT2,
    "test_cast_FLOAT16_to_UINT2": _INT2,
    "test_cast_UINT2_to_FLOAT": _INT2,
    "test_cast_UINT2_to_FLOAT16": _INT2,
    "test_cast_UINT2_to_UINT8": _INT2,
    "test_castlike_FLOAT_to_UINT2": _INT2,
    "test_castlike_FLOAT_to_UINT2_expanded": _INT2,
    "test_castlike_FLOAT16_to_UINT2": _INT2,
    "test_castlike_FLOAT16_to_UINT2_expanded": _INT2,
    "test_castlike_UINT2_to_FLOAT": _INT2,
    "test_castlike_UINT2_to_FLOAT_expanded": _INT2,
    "test_castlike_UINT2_to_FLOAT16": _INT2,
    "test_castlike_UINT2_to_FLOAT16_expanded": _INT2,
    "test_castlike_UINT2_to_UINT8": _INT2,
    "test_castlike_UINT2_to_UINT8_expanded": _INT2,
    # INT2
    "test_cast_FLOAT_to_INT2": _INT2,
    "test_cast_FLOAT16_to_INT2": _INT2,
    "test_cast_INT2_to_FLOAT": _INT2,
    "test_cast_INT2_to_FLOAT16": _INT2,
    "test_cast_INT2_to_INT8": _INT2,
    "test_castlike_FLOAT_to_INT2": _INT2,
    "test_castlike_FLOAT_to_INT2_expanded": _INT2,
    "test_castlike_FLOAT16_to_INT2": _INT2,
    "test_castlike_FLOAT16_to_INT2_expanded": _INT2,
    "test_castlike_INT2_to_FLOAT": _INT2,
    "test_castlike_INT2_to_FLOAT_expanded": _INT2,
    "test_castlike_INT2_to_FLOAT16": _INT2,
    "test_castlike_INT2_to_FLOAT16_expanded": _INT2,
    "test_castlike_INT2_to_INT8": _INT2,
    "test_castlike_INT2_to_INT8_expanded": _INT2,
    # FLOAT8E8M0
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0": _FLOAT8,
    "test_cast_e8m0_FLOAT16_to_FLOAT8E8M0": _FLOAT8,
    "test_cast_e8m0_FLOAT8E8M0_to_FLOAT": _FLOAT8,
    "test_cast_e8m0_FLOAT8E8M0_to_FLOAT16": _FLOAT8,
}

#: Cases that fail because of code outside the op registry: case name -> the defect.
KNOWN_FAILURES: dict[str, str] = {}


def _collect():
    """The node test cases whose every node is a default-domain op the numpy registry implements."""
    ops = supported_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' own overflow/cast warnings
        cases = collect_testcases(None)
    return [
        c for c in cases if all(n.domain in ("", "ai.onnx") and n.op_type in ops for n in c.model.graph.node)
    ]


CASES = _collect()
_BY_NAME = {c.name: c for c in CASES}


def _array(value):
    """A data-set entry as the ONNX runner normalizes it (some are TensorProtos)."""
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def run_case(case) -> None:
    """Run one case on the numpy backend; raise (AssertionError or the backend's error) if it fails."""
    sess = pp.load(case.model, backend="numpy")
    names = [v.name for v in case.model.graph.input]
    for inputs, expected in case.data_sets:
        out = sess.run({n: _array(x) for n, x in zip(names, inputs)})
        Runner.assert_similar_outputs(
            [_array(e) for e in expected], list(out.values()), rtol=case.rtol, atol=case.atol
        )


@functools.lru_cache(maxsize=None)
def _outcome(name: str) -> str | None:
    """None if case ``name`` passes, else its error as one line (each case runs once per process)."""
    try:
        run_case(_BY_NAME[name])
    except Exception as e:  # noqa: BLE001  (any failure is the case's result)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return None


def _param(case):
    if case.name in EXCLUSIONS:
        return pytest.param(case, id=case.name, marks=pytest.mark.skip(reason=EXCLUSIONS[case.name]))
    if case.name in KNOWN_FAILURES:
        xfail = pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[case.name])
        return pytest.param(case, id=case.name, marks=xfail)
    return pytest.param(case, id=case.name)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_node_case(case):
    error = _outcome(case.name)
    assert error is None, error


def test_exclusions_name_cases_of_our_op_set():
    names = {c.name for c in CASES}
    stale = sorted((set(EXCLUSIONS) | set(KNOWN_FAILURES)) - names)
    assert not stale, f"EXCLUSIONS/KNOWN_FAILURES name cases not (or no longer) in our op set: {stale}"
    assert not set(EXCLUSIONS) & set(KNOWN_FAILURES)


def summary() -> tuple[str, list[str]]:
    """The summary line ("conformance: N/M cases pass (P %) ...") and the unexpected failures."""
    failures, passed = [], 0
    for case in CASES:
        if case.name in EXCLUSIONS:
            continue
        error = _outcome(case.name)
        if error is None:
            passed += 1
        elif case.name not in KNOWN_FAILURES:
            failures.append(f"{case.name}: {error}")
    total, excluded = len(CASES), len(EXCLUSIONS)
    types = sum("no numpy dtype" in reason for reason in EXCLUSIONS.values())
    runnable = total - excluded
    line = (
        f"conformance: {passed}/{total} cases pass ({100 * passed / total:.1f} %); "
        f"{excluded} excluded ({types} for element types numpy cannot hold), "
        f"{len(KNOWN_FAILURES)} known failure(s) outside the op registry; "
        f"{passed}/{runnable} of the cases not excluded pass ({100 * passed / runnable:.1f} %)"
    )
    return line, failures


def test_conformance_summary(capsys):
    line, failures = summary()
    with capsys.disabled():
        print("\n" + line)
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    line, failures = summary()
    print("\n".join([line, *failures]))
