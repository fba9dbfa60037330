"""Writing a packed policy: one folder that runs and checks itself on a machine with numpy alone.

:func:`pack` builds the folder beside ``out_dir`` and renames it into place once it is complete and
reads back identical to the model. The folder format, and reading it, are described in
:mod:`policyport.runtime.packed` (numpy only); this module needs onnx and onnxruntime.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .errors import BadModelError, OutputExistsError, UnreadableFileError, VerificationError
from .files import write_npz
from .graph import Graph
from .runtime.base import count_observations
from .runtime.packed import (
    BUNDLE_FILES,
    BUNDLE_FORMAT,
    CONSTANTS_FILE,
    GOLDEN_FILE,
    GRAPH_FILE,
    MODEL_FILE,
    POLICY_FILE,
    SOURCES_KEY,
    WEIGHTS_FILE,
    place_initializer,
    same_bits,
    sha256_file,
    load_graph,
)

DEFAULT_SAMPLES = 64

# --------------------------------------------------------------------------------------------- pack


def pack(model, out_dir: str | os.PathLike, *, samples: int = DEFAULT_SAMPLES, low: float = 0.0,
         high: float = 1.0, seed: int = 0, force: bool = False, source=None, atol: float | None = None,
         rtol: float | None = None, rounding: bool = True) -> Path:
    """Write a policy folder that runs with numpy alone (see the module docstring for its files).

    The folder is built in a temporary sibling of ``out_dir`` and renamed into place once every file
    is written and the graph it describes has been read back and found identical to the model's
    (initializers bit for bit). If anything fails, ``out_dir`` is left as it was.

    Args:
        model: an ``onnx.ModelProto`` or a path to an ``.onnx`` file.
        out_dir: the folder to create; its parent must exist.
        samples: how many golden observations to draw (default 64) along the inputs' batch axis; a
            model whose inputs have none (fixed shapes such as ``(1, 480)``) gets one, and
            ``policy.json`` records the number actually drawn.
        low, high: the observations are drawn uniformly from ``[low, high)``, in the observation's
            own units (default ``[0, 1)``).
        seed: numpy ``default_rng`` seed of the draw (default 0).
        force: replace an existing ``out_dir`` — only an empty folder or a policyport bundle (one with
            a ``policy.json``), and only after the new folder is complete.
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); when given, its own forward pass is also compared with the
            numpy backend and the figure recorded in ``policy.json``.
        atol, rtol: the tolerances of the onnxruntime-vs-numpy (and source) check for floating
            tensors; ``None`` (default) follows the dtype (:data:`policyport.compare.TOLERANCES`).
            A tensor that fails them still passes when a float64 run shows the difference is
            float32 rounding, as in :func:`policyport.verify`; ``rounding=False`` turns that off.

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
    observations = count_observations(graph.inputs, feeds)
    outputs = session.run(feeds)
    activations = session.record(feeds, "*")
    golden = {f"inputs/{k}": v for k, v in feeds.items()}
    golden.update({f"outputs/{k}": v for k, v in outputs.items()})
    golden.update({f"activations/{k}": v for k, v in activations.items()})
    parity = _parity(proto, feeds, source, atol, rtol, rounding)
    if not parity["passed"]:
        f = parity["first_divergence"]
        raise VerificationError(
            f"not packing {out_dir}: the backends disagree on the golden observations; first diverging "
            f"tensor {f['tensor']!r} ({f['dtype']}, {f['candidate']} vs {f['reference']}), max abs "
            f"{f['max_abs']:.3g} > atol {f['atol']:g} + rtol {f['rtol']:g} * |{f['reference']}|"
            + (f", and not {f['dtype']} rounding against a float64 run" if f["rule"] == "rounding" else "")
            + f"; if {f['dtype']} differences of this size are acceptable, pack with --atol/--rtol "
            "(atol=, rtol= in Python) — run 'policyport verify' on the model for every figure"
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
            "samples": int(observations),
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
            policy["files"] = {name: sha256_file(tmp / name) for name in
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


def _parity(proto, feeds: dict[str, np.ndarray], source, atol: float | None, rtol: float | None,
            rounding: bool) -> dict[str, Any]:
    """onnxruntime (and the source) against the numpy backend on the golden feeds, every tensor."""
    from .errors import require
    from .verification import verify

    ort = require("onnxruntime", "onnx", "packing a policy (its numpy-vs-onnxruntime check)")
    report = verify(proto, feeds, backends=("numpy", "onnxruntime"), source=source, atol=atol, rtol=rtol,
                    rounding=rounding)
    vs_ort = [c for c in report.comparisons if c.candidate == "onnxruntime" and c.reference == "numpy"]
    vs_source = [c for c in report.comparisons if c.candidate == "numpy" and c.reference == "source"]
    first = report.first_divergence
    return {
        "onnxruntime_version": getattr(ort, "__version__", None),
        "onnxruntime_vs_numpy_max_abs": max((c.max_abs for c in vs_ort), default=0.0),
        "source_vs_numpy_max_abs": max((c.max_abs for c in vs_source), default=0.0) if vs_source else None,
        "tensors": len(vs_ort),
        "atol": atol,
        "rtol": rtol,
        "rounding_rule": rounding,
        "tolerances": {k: {"atol": a, "rtol": r} for k, (a, r) in report.tolerances().items()},
        "rounding": [{"tensor": c.tensor, "dtype": c.dtype, "candidate": c.candidate, "reference": c.reference,
                      "max_abs": c.max_abs,
                      "candidate_vs_float64": c.candidate_vs_float64, "reference_vs_float64": c.reference_vs_float64}
                     for c in report.comparisons if c.rule == "rounding" and c.passed],
        "skipped": [{"tensor": s.tensor, "reason": s.reason} for s in report.skipped],
        "passed": report.passed,
        "first_divergence": None if first is None else
        {"tensor": first.tensor, "candidate": first.candidate, "reference": first.reference,
         "max_abs": first.max_abs, "dtype": first.dtype, "atol": first.atol, "rtol": first.rtol, "rule": first.rule},
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
            rebuilt = place_initializer(weights[spec["name"]], perm)
            if not same_bits(rebuilt, array):
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
        if not same_bits(packed.initializers[name], array):
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


