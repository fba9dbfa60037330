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

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.case.node import collect_testcases  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import policyport as pp  # noqa: E402
from policyport.runtime.numpy.registry import supported_ops  # noqa: E402

_NOT_A_TENSOR = "{} values are not tensors; a policyport graph's inputs and outputs are tensors only"
_RANDOM = ("random draws: the expected values were drawn from numpy's unseeded global generator, and the "
           "case's source says implementations may draw other values even with a seed; "
           "tests/runtime/test_sampling.py checks shapes, dtypes, distributions and seeding instead")

#: Cases of our op set that we deliberately do not run: case name -> reason.
#: (bfloat16, float8, float4, int4 and int2 cases run when ml_dtypes is installed, as it is wherever
#: onnx is: onnx depends on it.)
EXCLUSIONS: dict[str, str] = {
    "test_identity_sequence": _NOT_A_TENSOR.format("sequence"),
    "test_identity_opt": _NOT_A_TENSOR.format("optional"),
    **{name: _RANDOM for name in (
        "test_bernoulli", "test_bernoulli_double", "test_bernoulli_seed",
        "test_bernoulli_expanded", "test_bernoulli_double_expanded", "test_bernoulli_seed_expanded",
    )},
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


#: Range of each 2- and 4-bit integer type.
_SMALL_INTEGER_RANGE = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _undefined_elements(case, inputs, expected) -> np.ndarray | None:
    """Where a Cast/CastLike case from a float to a 2- or 4-bit integer type has inputs out of the
    target's range: the Cast page leaves those undefined, and the generator's expected values for
    them are whatever the installed ml_dtypes gives (0.5 wraps, 0.7 gives 0). None elsewhere."""
    (node,) = case.model.graph.node if len(case.model.graph.node) == 1 else (None,)
    if node is None or node.op_type not in ("Cast", "CastLike") or len(expected) != 1:
        return None
    x, y = _array(inputs[0]), _array(expected[0])
    if y.dtype.name not in _SMALL_INTEGER_RANGE or x.dtype.kind != "f" and x.dtype.name not in (
            "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn"):
        return None
    low, high = _SMALL_INTEGER_RANGE[y.dtype.name]
    wide = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        return ~((np.trunc(wide) >= low) & (np.trunc(wide) <= high))


def run_case(case) -> None:
    """Run one case on the numpy backend; raise (AssertionError or the backend's error) if it fails.

    Elements the operator page leaves undefined (see :func:`_undefined_elements`) are left out of
    the comparison; tests/runtime/test_ops.py pins policyport's documented values for them.
    """
    sess = pp.load(case.model, backend="numpy")
    names = [v.name for v in case.model.graph.input]
    for inputs, expected in case.data_sets:
        out = list(sess.run({n: _array(x) for n, x in zip(names, inputs)}).values())
        expected = [_array(e) for e in expected]
        undefined = _undefined_elements(case, inputs, expected)
        if undefined is not None:
            assert undefined.sum() < undefined.size, f"{case.name}: every element is out of range"
            out = [out[0][~undefined]]
            expected = [expected[0][~undefined]]
        Runner.assert_similar_outputs(expected, out, rtol=case.rtol, atol=case.atol)


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
    types = sum("no numpy dtype" in reason for reason in EXCLUSIONS.values())  # none since ml_dtypes
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
