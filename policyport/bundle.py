"""A packed policy: one folder that runs and checks itself on a machine with numpy alone.

:func:`pack` writes the folder (building it beside ``out_dir`` and renaming it into place);
:func:`load_graph` reads it back into a :class:`~policyport.graph.Graph` for the numpy backend, after
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
    creation time in UTC ISO 8601); ``golden`` (how the observations were drawn); ``parity`` (the
    largest onnxruntime-vs-numpy absolute difference over every tensor at pack time, and against the
    source when :func:`pack` was given it); ``files`` (file name -> sha256 hex digest of every other
    file in the folder).

npz files are plain uncompressed numpy archives (``numpy.load(path, allow_pickle=False)`` reads them).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import shutil
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .errors import BadModelError, OutputExistsError, UnreadableFileError, VerificationError
from .files import write_npz
from .graph import Graph
from .verification import DEFAULT_ATOL, DEFAULT_RTOL, Report, compare

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

DEFAULT_SAMPLES = 64


# --------------------------------------------------------------------------------------------- pack


def pack(model, out_dir: str | os.PathLike, *, samples: int = DEFAULT_SAMPLES, low: float = 0.0,
         high: float = 1.0, seed: int = 0, force: bool = False, source=None) -> Path:
    """Write a policy folder that runs with numpy alone (see the module docstring for its files).

    The folder is built in a temporary sibling of ``out_dir`` and renamed into place once every file
    is written and the graph it describes has been read back and found identical to the model's
    (initializers bit for bit). If anything fails, ``out_dir`` is left as it was.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file.
        out_dir: the folder to create; its parent must exist.
        samples: how many golden observations to draw (default 64).
        low, high: the observations are drawn uniformly from ``[low, high)``, in the observation's
            own units (default ``[0, 1)``).
        seed: numpy ``default_rng`` seed of the draw (default 0).
        force: replace an existing ``out_dir`` — only an empty folder or a policyport bundle (one with
            a ``policy.json``), and only after the new folder is complete.
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); when given, its own forward pass is also compared with the
            numpy backend and the figure recorded in ``policy.json``.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        OutputExistsError: ``out_dir`` exists and ``force`` is false, or it is not a bundle folder.
        UnreadableFileError: the parent folder does not exist, the model cannot be read, or writing
            fails (nothing is left behind).
        BadModelError: malformed parameter metadata, an initializer numpy cannot store without
            pickle, or a bundle that would not reproduce the model.
        InputMismatchError: a graph input observations cannot be drawn for (non-float dtype, unknown
            rank), ``samples < 1`` or ``low >= high``.
        UnsupportedOpError: the numpy backend lacks an op of the model.
        MissingDependencyError: onnx or onnxruntime is not installed (packing needs both).
    """
    from . import __version__
    from .errors import require
    from .files import ensure_model
    from .graph import from_onnx
    from .passes import extract_weights, parameter_map
    from .runtime import load
    from .verification import sample_inputs

    require("onnx", "onnx", "packing a policy")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, force)
    proto = ensure_model(model)
    graph = from_onnx(proto)
    weights = extract_weights(proto)
    sources, constants = _initializer_sources(graph, parameter_map(proto), weights)

    feeds = sample_inputs(graph.inputs, samples, low, high, seed)
    session = load(graph, backend="numpy")
    outputs = session.run(feeds)
    activations = session.record(feeds, "*")
    golden = {f"inputs/{k}": v for k, v in feeds.items()}
    golden.update({f"outputs/{k}": v for k, v in outputs.items()})
    golden.update({f"activations/{k}": v for k, v in activations.items()})
    parity = _parity(proto, feeds, source)
    if not parity["passed"]:
        f = parity["first_divergence"]
        raise VerificationError(
            f"not packing {out_dir}: the backends disagree on the golden observations; first diverging "
            f"tensor {f['tensor']!r} ({f['candidate']} vs {f['reference']}), max abs {f['max_abs']:.3g} "
            f"> atol {DEFAULT_ATOL:g} — run 'policyport verify' on the model for every figure"
        )

    graph_doc = json.loads(graph.to_json())
    graph_doc[SOURCES_KEY] = sources
    meta = graph.metadata
    policy: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "inputs": [v.to_dict() for v in graph.inputs],
        "outputs": [v.to_dict() for v in graph.outputs],
        "head": meta.get("policyport.head"),
        "observation_filter": None,
        "provenance": {
            "source": _json_or_text(meta.get("policyport.source")),
            "activation": meta.get("policyport.activation"),
            "policyport_version": __version__,
            "numpy_version": np.__version__,
            "opset": graph.opset,
            "opsets": graph.opsets,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        },
        "golden": {
            "file": GOLDEN_FILE,
            "samples": int(samples),
            "low": float(low),
            "high": float(high),
            "seed": int(seed),
            "distribution": "uniform [low, high), numpy default_rng(seed), as policyport.verification.sample_inputs",
            "keys": "inputs/<graph input>, outputs/<graph output>, activations/<tensor>",
        },
        "parity": parity,
    }

    tmp = _sibling(out_dir, "packing")
    committed = False
    try:
        try:
            (tmp / MODEL_FILE).write_bytes(proto.SerializeToString())
            write_npz(tmp / WEIGHTS_FILE, weights)
            write_npz(tmp / CONSTANTS_FILE, constants)
            (tmp / GRAPH_FILE).write_text(json.dumps(graph_doc, indent=1), encoding="utf-8")
            write_npz(tmp / GOLDEN_FILE, golden)
            policy["files"] = {name: _sha256_file(tmp / name) for name in
                               (MODEL_FILE, GRAPH_FILE, WEIGHTS_FILE, CONSTANTS_FILE, GOLDEN_FILE)}
            (tmp / POLICY_FILE).write_text(json.dumps(policy, indent=1), encoding="utf-8")
        except OSError as e:
            raise UnreadableFileError(f"writing the bundle for {out_dir} failed: {e}; nothing was written") from e
        _check_round_trip(graph, load_graph(tmp))
        _commit(tmp, out_dir, force)
        committed = True
    finally:
        if not committed:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _parity(proto, feeds: dict[str, np.ndarray], source) -> dict[str, Any]:
    """onnxruntime (and the source) against the numpy backend on the golden feeds, every tensor."""
    from .errors import require
    from .verification import verify

    ort = require("onnxruntime", "onnxruntime", "packing a policy (its numpy-vs-onnxruntime check)")
    report = verify(proto, feeds, backends=("numpy", "onnxruntime"), source=source,
                    atol=DEFAULT_ATOL, rtol=DEFAULT_RTOL)
    vs_ort = [c for c in report.comparisons if c.candidate == "onnxruntime" and c.reference == "numpy"]
    vs_source = [c for c in report.comparisons if c.candidate == "numpy" and c.reference == "source"]
    first = report.first_divergence
    return {
        "onnxruntime_version": getattr(ort, "__version__", None),
        "onnxruntime_vs_numpy_max_abs": max((c.max_abs for c in vs_ort), default=0.0),
        "source_vs_numpy_max_abs": max((c.max_abs for c in vs_source), default=0.0) if vs_source else None,
        "tensors": len(vs_ort),
        "atol": DEFAULT_ATOL,
        "rtol": DEFAULT_RTOL,
        "passed": report.passed,
        "first_divergence": None if first is None else
        {"tensor": first.tensor, "candidate": first.candidate, "reference": first.reference,
         "max_abs": first.max_abs},
    }


def _initializer_sources(graph: Graph, mapping: Mapping[str, dict], weights: Mapping[str, np.ndarray]
                         ) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """Where each initializer is stored, and the non-parameter initializers (the constants).

    Checks that rebuilding each initializer from ``weights`` gives it back bit for bit.
    """
    sources: dict[str, dict] = {}
    constants: dict[str, np.ndarray] = {}
    for name, array in graph.initializers.items():
        spec = mapping.get(name)
        if spec is not None and spec["name"] in weights:
            perm = None if spec["transpose"] is None else [int(p) for p in spec["transpose"]]
            sources[name] = {"file": WEIGHTS_FILE, "key": spec["name"], "transpose": perm}
            rebuilt = _place(weights[spec["name"]], perm)
            if not _same_bits(rebuilt, array):
                raise BadModelError(
                    f"initializer {name!r} is not reproduced by its source parameter {spec['name']!r} "
                    f"(transpose {perm}): expected {array.dtype.name}{list(array.shape)}, rebuilt "
                    f"{rebuilt.dtype.name}{list(rebuilt.shape)} with different values; the model's "
                    "'policyport.parameters' metadata is wrong"
                )
        else:
            sources[name] = {"file": CONSTANTS_FILE, "key": name, "transpose": None}
            constants[name] = array
    return sources, constants


def _check_round_trip(expected: Graph, packed: Graph) -> None:
    if packed.to_json() != expected.to_json():
        raise BadModelError("the packed graph.json does not describe the model's graph (policyport bug)")
    for name, array in expected.initializers.items():
        if not _same_bits(packed.initializers[name], array):
            raise BadModelError(f"the packed initializer {name!r} differs from the model's (policyport bug)")


def _check_out_dir(out_dir: Path, force: bool) -> None:
    if not out_dir.parent.is_dir():
        raise UnreadableFileError(f"cannot write {out_dir}: folder {out_dir.parent} does not exist")
    if not (out_dir.exists() or out_dir.is_symlink()):
        return
    if not force:
        raise OutputExistsError(f"{out_dir} exists; overwrite it with --force (force=True in Python)")
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise OutputExistsError(
            f"{out_dir} exists and is not a plain folder (a file or a symlink); force replaces only a "
            "bundle folder or an empty one — remove it yourself or choose another name"
        )
    present = {p.name for p in out_dir.iterdir()}
    if present and POLICY_FILE not in present:
        raise OutputExistsError(
            f"{out_dir} is a non-empty folder without {POLICY_FILE}, so not a policyport bundle; "
            "force replaces only bundles and empty folders — remove it yourself or choose another name"
        )
    foreign = sorted(present - BUNDLE_FILES)
    if foreign:
        raise OutputExistsError(
            f"{out_dir} holds files a bundle does not write ({', '.join(foreign)}); force would delete them "
            "— move them out first or choose another name"
        )


def _commit(tmp: Path, out_dir: Path, force: bool) -> None:
    """Rename the finished ``tmp`` onto ``out_dir``; an old ``out_dir`` is moved aside first."""
    _check_out_dir(out_dir, force)  # again: it may have appeared while we packed
    if not out_dir.exists():
        try:
            os.rename(tmp, out_dir)
        except OSError as e:
            raise OutputExistsError(f"cannot move the new bundle to {out_dir}: {e}") from e
        return
    old = _sibling(out_dir, "replaced", create=False)
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError as e:
        os.rename(old, out_dir)
        raise OutputExistsError(f"cannot move the new bundle to {out_dir}: {e}; the old one is unchanged") from e
    shutil.rmtree(old, ignore_errors=True)


def _sibling(path: Path, purpose: str, create: bool = True) -> Path:
    """A fresh hidden name beside ``path`` (``.<name>.<purpose>-<hex>``), created as a folder if asked."""
    for _ in range(100):
        candidate = path.parent / f".{path.name}.{purpose}-{secrets.token_hex(4)}"
        if create:
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            except OSError as e:
                raise UnreadableFileError(f"cannot create a folder beside {path}: {e}") from e
            return candidate
        if not (candidate.exists() or candidate.is_symlink()):
            return candidate
    raise OutputExistsError(f"cannot find a free temporary name beside {path}")


def _json_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


# --------------------------------------------------------------------------------------------- load


def load_graph(directory: str | os.PathLike) -> Graph:
    """Read a packed folder into a :class:`Graph` for the numpy backend (needs numpy only).

    Every file ``policy.json`` lists is checked against its sha256 first; the initializers are then
    rebuilt from ``weights.npz`` (transposed back to the model's layout where ``graph.json`` says so)
    and ``constants.npz``.

    Args:
        directory: a folder written by :func:`pack`.

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
                found = _sha256_file(path)
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
        initializers[name] = _place(array, perm)
    return Graph.from_json(text, initializers)


def _read_npz(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` held in memory; pickles refused."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise BadModelError(f"{path} is not a readable .npz of plain arrays: {e}") from e


def _place(array: np.ndarray, perm: list[int] | None) -> np.ndarray:
    """The initializer from its stored array: ``numpy.transpose(array, perm)``, contiguous."""
    return array if perm is None else np.ascontiguousarray(np.transpose(array, perm))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _sha256_file(path: Path) -> str:
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


def verify_bundle(directory: str | os.PathLike, *, atol: float = DEFAULT_ATOL,
                  rtol: float = DEFAULT_RTOL) -> Report:
    """Re-run the golden observations on this machine's numpy and compare every tensor (numpy only).

    Every tensor ``Session.record(feeds, "*")`` returns (node outputs in node order, graph outputs
    included) is compared with ``activations/<name>`` of ``golden.npz``, and every graph output of
    ``Session.run`` with ``outputs/<name>``, by :func:`policyport.verification.compare`: an element
    passes when ``|numpy - golden| <= atol + rtol * |golden|``. The report holds one comparison per
    tensor, in node order; a graph output's is the worse of its record and run comparisons.

    Args:
        directory: a folder written by :func:`pack`.
        atol: absolute tolerance (default 1e-5). rtol: relative tolerance (default 1e-5).

    Returns:
        A :class:`~policyport.verification.Report` with backends ``["numpy"]`` and reference ``"golden"``;
        it does not raise on a mismatch (check ``report.passed`` and ``report.first_divergence``).

    Raises:
        As :func:`load_graph`; BadModelError also when ``golden.npz`` does not hold exactly the
        graph's inputs, outputs and tensors.
        UnsupportedOpError: the numpy backend lacks an op of the model.
    """
    from .runtime import load

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
    first = next(iter(feeds.values()), None)
    samples = int(first.shape[0]) if first is not None and first.ndim else 1
    report = Report(["numpy"], "golden", samples, atol, rtol)
    for name, value in recorded.items():
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
