"""A packed folder's golden check: the observations recorded at pack time re-run on this machine's
numpy backend, every tensor compared with what was recorded (numpy and the standard library only,
like the rest of the folder's runtime)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import BadModelError, listing
from ..graph.folder import GOLDEN_FILE, read_bundle
from ..graph.model import recorded_assumptions
from ..runtime.base import count_observations
from ..runtime import load
from ..verification.compare import Report, Skipped, compare


def read_golden(directory: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """The golden tensors of a packed folder, by group, after checking every file's sha256.

    Returns:
        ``{"inputs": {name: array}, "outputs": {...}, "activations": {...}}``; ``inputs["obs"]`` is
        float32, shape ``(samples, obs_dim)`` for a policy; activations are in node order.

    Raises:
        As :func:`load_graph`; BadModelError also for a key outside the three groups.
    """
    return read_bundle(directory)[3]


def verify_bundle(directory: str | os.PathLike, *, atol: float | None = None,
                  rtol: float | None = None) -> Report:
    """Re-run the golden observations on this machine's numpy and compare every tensor (numpy only).

    Every tensor ``Session.record(feeds, "*")`` returns (node outputs in node order, graph outputs
    included) is compared with ``activations/<name>`` of ``golden.npz``, and every graph output of
    ``Session.run`` with ``outputs/<name>``, by :func:`policyport.verification.compare.compare`: an element
    passes when ``|numpy - golden| <= atol + rtol * |golden|``. The report holds one comparison per
    tensor, in node order; a graph output's is the worse of its record and run comparisons.
    Tensors that depend on a random node are not compared; the report lists them as skipped.

    Args:
        directory: a folder written by :func:`policyport.handoff.pack.pack`.
        atol: absolute tolerance for floating tensors; ``None`` (default) follows the dtype
            (float32 1e-5, float16 1e-3 ...: :data:`policyport.verification.compare.TOLERANCES`).
        rtol: relative tolerance; ``None`` (default) follows the dtype.

    Returns:
        A :class:`~policyport.verification.verify.Report` with backends ``["numpy"]`` and reference ``"golden"``;
        it does not raise on a mismatch (check ``report.passed`` and ``report.first_divergence``).

    Raises:
        As :func:`load_graph`; BadModelError also when ``golden.npz`` does not hold exactly the
        graph's inputs, outputs and tensors.
        UnsupportedOpError: the numpy backend lacks an op of the model.
    """

    directory = Path(directory)
    _, _, graph, golden = read_bundle(directory)
    golden_path = directory / GOLDEN_FILE
    session = load(graph, backend="numpy")
    _expect_keys(golden_path, "inputs", golden["inputs"], [v.name for v in session.inputs])
    _expect_keys(golden_path, "outputs", golden["outputs"], [v.name for v in session.outputs])
    feeds = golden["inputs"]
    recorded = session.record(feeds, "*")
    _expect_keys(golden_path, "activations", golden["activations"], list(recorded))
    outputs = session.run(feeds)
    report = Report(["numpy"], "golden", count_observations(graph.inputs, feeds), atol, rtol)
    report.assumptions = [{**a, "checked": False} for a in recorded_assumptions(graph.metadata) or []]
    random = graph.stochastic_tensors()
    for name, value in recorded.items():
        if name in random:
            report.skipped.append(Skipped(name, f"depends on the random {random[name]}"))
            continue
        found = compare(name, "numpy", value, "golden", golden["activations"][name], atol, rtol)
        if name in outputs:
            ran = compare(name, "numpy", outputs[name], "golden", golden["outputs"][name], atol, rtol)
            if (ran.passed, -ran.max_abs) < (found.passed, -found.max_abs):
                found = ran
        report.comparisons.append(found)
    return report


def _expect_keys(path: Path, group: str, found: Mapping[str, np.ndarray], expected: list[str]) -> None:
    if set(found) != set(expected):
        raise BadModelError(
            f"{path}: expected {group}/ keys for [{listing(expected)}], found [{listing(found)}]; the golden file does "
            "not belong to this graph — re-pack the model"
        )
