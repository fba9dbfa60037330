"""Reading a packed policy folder, with numpy and the standard library alone.

:func:`policyport.bundle.pack` writes the folder; :func:`load_graph` reads it back into a :class:`~policyport.graph.Graph` for the numpy backend, after
checking every file's sha256; :func:`verify_bundle` re-runs the golden observations on this machine and
compares every tensor with what was recorded at pack time. Loading and verifying import nothing
beyond numpy and the standard library (no onnx, protobuf, onnxruntime, typer or rich).

The folder (format ``policyport.bundle/1``):

``model.onnx``
    The ONNX model, serialized (for onnxruntime and other ONNX tools; the numpy path never reads it).
``weights.npz``
    The parameters under the source's names in the source's layout, exactly
    :func:`policyport.passes.extract_weights` of the model (``default_policy/fc_1/kernel``: float32
    ``(275, 256)`` ...), bit for bit.
``constants.npz``
    The initializers that are not parameters (e.g. the int64 Slice bounds ``head/mid`` a head adds),
    under their initializer names, as stored in the model. Present, possibly empty, in every bundle.
``graph.json``
    :meth:`Graph.to_json` of the model, plus one key, ``"initializer_sources"``: initializer name ->
    ``{"file": "weights.npz", "key": <source parameter name>, "transpose": <perm> or null}`` or
    ``{"file": "constants.npz", "key": <initializer name>, "transpose": null}``. The initializer is
    ``numpy.transpose(array, perm)`` of the stored array (the inverse of the transpose
    ``extract_weights`` undoes), or the array itself. :meth:`Graph.from_json` ignores the extra key,
    so the file is also a plain policyport graph.
``golden.npz``
    ``samples`` observations drawn as :func:`policyport.verification.sample_inputs` draws them and what the
    numpy backend computed from them at pack time. Keys are ``<group>/<tensor name>``, the group being
    everything before the first ``/`` (tensor names may themselves contain ``/``):
    ``inputs/obs`` (the feeds), ``outputs/logits`` ... (what ``Session.run`` returned) and
    ``activations/fc_1/linear`` ... (what ``Session.record(feeds, "*")`` returned: every node output in
    node order, graph outputs included).
``policy.json``
    Written last. ``format``; ``inputs`` / ``outputs`` (name, dtype, shape; a string is a symbolic
    dimension such as ``"batch"``); ``head`` (model metadata ``policyport.head``); ``observation_filter``
    (``null``; reserved for RLlib's MeanStdFilter ``mean`` / ``std``); ``provenance`` (model metadata
    ``policyport.source`` and ``policyport.activation``, policyport and numpy versions, opset,
    creation time in UTC ISO 8601); ``golden`` (how the observations were drawn, and ``samples``: how
    many observations ``golden.npz`` holds — 1 for inputs without a batch axis, whatever was asked);
    ``parity`` (the largest onnxruntime-vs-numpy absolute difference over every tensor at pack time,
    and against the source when :func:`policyport.bundle.pack` was given it; the tolerances by dtype,
    the tensors that passed as float32 rounding with their float64 figures, and the random tensors
    left out); ``files`` (file name -> sha256 hex digest of every other file in the folder).

npz files are plain uncompressed numpy archives (``numpy.load(path, allow_pickle=False)`` reads them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..compare import Report, Skipped, compare
from ..errors import BadModelError, UnreadableFileError
from ..graph import Graph
from .base import count_observations

#: The value of ``policy.json``'s ``"format"`` key that this module writes and reads.
BUNDLE_FORMAT = "policyport.bundle/1"

MODEL_FILE = "model.onnx"
GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.npz"
CONSTANTS_FILE = "constants.npz"
GOLDEN_FILE = "golden.npz"
POLICY_FILE = "policy.json"
BUNDLE_FILES = frozenset({MODEL_FILE, GRAPH_FILE, WEIGHTS_FILE, CONSTANTS_FILE, GOLDEN_FILE, POLICY_FILE})

#: The files :func:`load_graph` needs; ``policy.json`` must list each with its sha256.
GRAPH_FILES = (GRAPH_FILE, WEIGHTS_FILE, CONSTANTS_FILE)

#: The key of ``graph.json`` that says where each initializer's array is stored.
SOURCES_KEY = "initializer_sources"

#: Key groups of ``golden.npz``: ``<group>/<tensor name>``.
GOLDEN_GROUPS = ("inputs", "outputs", "activations")



# --------------------------------------------------------------------------------------------- load


def load_graph(directory: str | os.PathLike) -> Graph:
    """Read a packed folder into a :class:`Graph` for the numpy backend (needs numpy only).

    Every file ``policy.json`` lists is checked against its sha256 first; the initializers are then
    rebuilt from ``weights.npz`` (transposed back to the model's layout where ``graph.json`` says so)
    and ``constants.npz``.

    Args:
        directory: a folder written by :func:`policyport.bundle.pack`.

    Returns:
        The graph, with initializers as numpy arrays exactly as the model stored them.

    Raises:
        UnreadableFileError: the folder or its ``policy.json`` is missing or unreadable.
        BadModelError: not a ``policyport.bundle/1`` folder, a listed file missing or with another
            sha256 than ``policy.json`` records (the message names the file), or an initializer
            missing or misshapen.
    """
    _, blobs = _open_bundle(Path(directory), GRAPH_FILES)
    return _graph_from(blobs, Path(directory))


def read_policy(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``policy.json`` of a packed folder (no hashes are checked).

    Raises:
        UnreadableFileError: the folder or its ``policy.json`` is missing or unreadable.
        BadModelError: the file is not JSON of format ``policyport.bundle/1``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UnreadableFileError(f"{directory}: no such folder (expected a bundle written by policyport pack)")
    path = directory / POLICY_FILE
    if not path.is_file():
        raise UnreadableFileError(f"{directory} is not a policyport bundle: it has no {POLICY_FILE}")
    try:
        policy = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UnreadableFileError(f"cannot read {path}: {e}") from e
    except ValueError as e:
        raise BadModelError(f"{path} is not valid JSON: {e}") from e
    found = policy.get("format") if isinstance(policy, dict) else type(policy).__name__
    if found != BUNDLE_FORMAT:
        raise BadModelError(
            f"{path}: expected format {BUNDLE_FORMAT!r}, found {found!r}; "
            "re-pack the model with this version of policyport"
        )
    return policy


def _open_bundle(directory: Path, needed: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``policy.json`` and the bytes of ``needed`` files, after checking every listed file's sha256."""
    policy = read_policy(directory)
    files = policy.get("files")
    if not isinstance(files, dict):
        raise BadModelError(f"{directory / POLICY_FILE}: expected a 'files' object of file name -> sha256")
    unlisted = [n for n in needed if n not in files]
    if unlisted:
        raise BadModelError(
            f"{directory / POLICY_FILE} lists no sha256 for {unlisted}; a bundle lists "
            f"{', '.join((MODEL_FILE, *GRAPH_FILES, GOLDEN_FILE))}"
        )
    blobs: dict[str, bytes] = {}
    for name, expected in files.items():
        if not isinstance(name, str) or name in ("", ".", "..", POLICY_FILE) or "/" in name or "\\" in name:
            raise BadModelError(f"{directory / POLICY_FILE}: {name!r} is not a file name of the bundle")
        path = directory / name
        if not path.is_file():
            raise BadModelError(f"{directory} is incomplete: {POLICY_FILE} lists {name}, which is missing")
        try:
            if name in needed:
                blobs[name] = path.read_bytes()
                found = hashlib.sha256(blobs[name]).hexdigest()
            else:
                found = sha256_file(path)
        except OSError as e:
            raise UnreadableFileError(f"cannot read {path}: {e}") from e
        if found != expected:
            raise BadModelError(
                f"{path}: sha256 is {found}, {POLICY_FILE} expects {expected}; the file was changed "
                "or damaged after packing — re-pack the model or restore the file"
            )
    return policy, blobs


def _graph_from(blobs: Mapping[str, bytes], directory: Path) -> Graph:
    text = blobs[GRAPH_FILE].decode("utf-8")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BadModelError(f"{directory / GRAPH_FILE} is not valid JSON: {e}") from e
    sources = doc.get(SOURCES_KEY) if isinstance(doc, dict) else None
    if not isinstance(sources, dict):
        raise BadModelError(
            f"{directory / GRAPH_FILE}: expected an {SOURCES_KEY!r} object (initializer -> stored array)"
        )
    stores = {
        WEIGHTS_FILE: _read_npz(blobs[WEIGHTS_FILE], directory / WEIGHTS_FILE),
        CONSTANTS_FILE: _read_npz(blobs[CONSTANTS_FILE], directory / CONSTANTS_FILE),
    }
    initializers: dict[str, np.ndarray] = {}
    for name, spec in sources.items():
        try:
            store, key, perm = spec["file"], spec["key"], spec.get("transpose")
        except (KeyError, TypeError):
            raise BadModelError(
                f"{directory / GRAPH_FILE}: initializer {name!r} has source {spec!r}; expected "
                "{'file': ..., 'key': ..., 'transpose': ...}"
            ) from None
        if store not in stores:
            raise BadModelError(
                f"{directory / GRAPH_FILE}: initializer {name!r} is stored in {store!r}; expected "
                f"{WEIGHTS_FILE} or {CONSTANTS_FILE}"
            )
        if key not in stores[store]:
            raise BadModelError(f"{directory / store} has no array {key!r}, which initializer {name!r} needs")
        array = stores[store][key]
        if perm is not None and sorted(perm) != list(range(array.ndim)):
            raise BadModelError(
                f"{directory / GRAPH_FILE}: initializer {name!r} has transpose {perm}, which is not a "
                f"permutation of the {array.ndim} axes of {key!r} {list(array.shape)}"
            )
        initializers[name] = place_initializer(array, perm)
    return Graph.from_json(text, initializers)


def _read_npz(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` held in memory; pickles refused."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise BadModelError(f"{path} is not a readable .npz of plain arrays: {e}") from e


def place_initializer(array: np.ndarray, perm: list[int] | None) -> np.ndarray:
    """The initializer from its stored array: ``numpy.transpose(array, perm)``, contiguous."""
    return array if perm is None else np.ascontiguousarray(np.transpose(array, perm))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------- verify


def read_golden(directory: str | os.PathLike) -> dict[str, dict[str, np.ndarray]]:
    """The golden tensors of a packed folder, by group, after checking every file's sha256.

    Returns:
        ``{"inputs": {name: array}, "outputs": {...}, "activations": {...}}``; ``inputs["obs"]`` is
        float32, shape ``(samples, obs_dim)`` for a policy; activations are in node order.

    Raises:
        As :func:`load_graph`; BadModelError also for a key outside the three groups.
    """
    directory = Path(directory)
    _, blobs = _open_bundle(directory, (GOLDEN_FILE,))
    return _split_golden(_read_npz(blobs[GOLDEN_FILE], directory / GOLDEN_FILE), directory / GOLDEN_FILE)


def _split_golden(arrays: Mapping[str, np.ndarray], path: Path) -> dict[str, dict[str, np.ndarray]]:
    groups: dict[str, dict[str, np.ndarray]] = {g: {} for g in GOLDEN_GROUPS}
    for key, array in arrays.items():
        group, sep, tensor = key.partition("/")
        if not sep or group not in groups:
            raise BadModelError(
                f"{path}: key {key!r} is not <group>/<tensor> with group one of {', '.join(GOLDEN_GROUPS)}"
            )
        groups[group][tensor] = array
    return groups


def verify_bundle(directory: str | os.PathLike, *, atol: float | None = None,
                  rtol: float | None = None) -> Report:
    """Re-run the golden observations on this machine's numpy and compare every tensor (numpy only).

    Every tensor ``Session.record(feeds, "*")`` returns (node outputs in node order, graph outputs
    included) is compared with ``activations/<name>`` of ``golden.npz``, and every graph output of
    ``Session.run`` with ``outputs/<name>``, by :func:`policyport.compare.compare`: an element
    passes when ``|numpy - golden| <= atol + rtol * |golden|``. The report holds one comparison per
    tensor, in node order; a graph output's is the worse of its record and run comparisons.
    Tensors that depend on a random node are not compared; the report lists them as skipped.

    Args:
        directory: a folder written by :func:`policyport.bundle.pack`.
        atol: absolute tolerance for floating tensors; ``None`` (default) follows the dtype
            (float32 1e-5, float16 1e-3 ...: :data:`policyport.compare.TOLERANCES`).
        rtol: relative tolerance; ``None`` (default) follows the dtype.

    Returns:
        A :class:`~policyport.verification.Report` with backends ``["numpy"]`` and reference ``"golden"``;
        it does not raise on a mismatch (check ``report.passed`` and ``report.first_divergence``).

    Raises:
        As :func:`load_graph`; BadModelError also when ``golden.npz`` does not hold exactly the
        graph's inputs, outputs and tensors.
        UnsupportedOpError: the numpy backend lacks an op of the model.
    """
    from . import load

    directory = Path(directory)
    _, blobs = _open_bundle(directory, (*GRAPH_FILES, GOLDEN_FILE))
    graph = _graph_from(blobs, directory)
    golden_path = directory / GOLDEN_FILE
    golden = _split_golden(_read_npz(blobs[GOLDEN_FILE], golden_path), golden_path)
    session = load(graph, backend="numpy")
    _expect_keys(golden_path, "inputs", golden["inputs"], [v.name for v in session.inputs])
    _expect_keys(golden_path, "outputs", golden["outputs"], [v.name for v in session.outputs])
    feeds = golden["inputs"]
    recorded = session.record(feeds, "*")
    _expect_keys(golden_path, "activations", golden["activations"], list(recorded))
    outputs = session.run(feeds)
    report = Report(["numpy"], "golden", count_observations(graph.inputs, feeds), atol, rtol)
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
            f"{path}: expected {group}/ keys for {expected}, found {list(found)}; the golden file does "
            "not belong to this graph — re-pack the model"
        )
