"""Writing a packed policy: one folder that runs and checks itself on a machine with numpy alone.

:func:`pack` builds the folder beside ``out_dir`` and renames it into place once it is complete and
reads back identical to the model. The folder format, and reading it, are described in
:mod:`policyport.runtime.packed` (numpy only); this module needs onnx and onnxruntime.

A folder carries, unless asked not to, the numpy runtime it needs: the policyport modules that the
numpy backend, the packed reader and ``run.py``'s command line import, found by following the
package-relative imports of :data:`RUNTIME_ENTRIES` through the installed package's sources
(:func:`runtime_sources`), and copied byte for byte into ``_policyport/``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..verification.compare import Report, tolerance_advice
from ..errors import BadModelError, OutputExistsError, PolicyportError, UnreadableFileError, VerificationError
from ..io.outputs import FolderBuild, FolderContents, check_parent
from ..io.limits import check_memory
from ..io.kinds import check_not_a_stream
from ..io.arrays import write_npz
from ..graph.folder import (
    BUNDLE_FORMAT,
    CONSTANTS_FILE,
    DATA_FILES,
    ENTRY_POINT,
    GOLDEN_FILE,
    GRAPH_FILE,
    MODEL_FILE,
    POLICY_FILE,
    RUNTIME_PACKAGE,
    WEIGHTS_FILE,
    folder_entries,
    open_bundle,
    runtime_digest,
)
from ..graph.model import Graph, recorded_assumptions
from ..io.schema import load_json
from ..runtime.base import count_observations
from ..runtime.packed import SOURCES_KEY, load_graph, place_initializer, same_bits

#: Modules (relative to the policyport package) whose imports, followed, make a folder's runtime.
RUNTIME_ENTRIES = ("runtime/packed.py", "handoff/folder_run.py", "handoff/golden.py", "runtime/numpy/ops/__init__.py")
#: Modules those imports reach that the runtime leaves out on purpose, and why.
RUNTIME_LEFT_OUT = {
    "runtime/ort.py": "the onnxruntime backend: a machine with onnxruntime installs policyport itself",
    "runtime/blas.py": "BLAS thread control through threadpoolctl: a folder's runtime runs row blocks on one thread",
    "runtime/batch.py": "freeing an exporter's fixed batch of 1 (needs onnx): a folder holds the graph pack freed",
}

DEFAULT_SAMPLES = 64

# --------------------------------------------------------------------------------------------- pack


def pack(model, out_dir: str | os.PathLike, *, samples: int = DEFAULT_SAMPLES, low: float = 0.0,
         high: float = 1.0, seed: int = 0, force: bool = False, source=None, trust: bool = False,
         runtime: bool = True, atol: float | None = None, rtol: float | None = None, rounding: bool = True,
         inputs: Mapping[str, np.ndarray] | None = None) -> Path:
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
        force: replace an existing ``out_dir`` — only an empty folder or one that is provably a
            bundle (its ``policy.json`` valid, every file it lists intact and regular, nothing else in
            it), and only after the new folder is complete.
        source: the policy the model was converted from (path or object, as for
            :func:`policyport.convert`); when given, its own forward pass is also compared with the
            numpy backend and the figure recorded in ``policy.json``.
        trust: let ``source`` be a file that runs code it holds when loaded (a TorchScript file, a
            SavedModel, a whole pickled torch module), as for :func:`policyport.verify` (default false).
        runtime: also write ``run.py`` and the numpy runtime it imports (``_policyport/``), so the
            folder runs where policyport is not installed (default); ``False`` writes the data
            files and ``policy.json`` only, for machines that install policyport.
        atol, rtol: the tolerances of the onnxruntime-vs-numpy (and source) check for floating
            tensors; ``None`` (default) follows the dtype (:data:`policyport.verification.compare.TOLERANCES`).
            A tensor that fails them still passes when a float64 run shows the difference is
            float32 rounding, as in :func:`policyport.verify`; ``rounding=False`` turns that off.
        inputs: the golden observations themselves (input name -> array), instead of drawing them
            (for inputs that cannot be drawn: strings, integers whose range the model does not
            record); ``samples``, ``low``, ``high`` and ``seed`` are then not read, and
            ``policy.json`` records ``low``, ``high`` and ``seed`` as null.

    Returns:
        ``out_dir`` as a ``Path``.

    Raises:
        OutputExistsError: ``out_dir`` exists and ``force`` is false, or it is not provably a bundle.
        UnreadableFileError: the parent folder does not exist, the model cannot be read, or writing
            fails (nothing is left behind).
        BadModelError: malformed parameter metadata, an initializer numpy cannot store without
            pickle, or a bundle that would not reproduce the model.
        InputMismatchError: a graph input observations cannot be drawn for (non-float dtype, unknown
            rank), ``samples < 1`` or ``low >= high``.
        UnsupportedOpError: the numpy backend lacks an op of the model.
        UntrustedFileError: ``source`` runs code when loaded and ``trust`` is false
            (:class:`~policyport.errors.TrustRequiredError`, exit 2, for a TorchScript file or a SavedModel).
        MissingDependencyError: onnx or onnxruntime is not installed (packing needs both).
    """
    from ..version import __version__
    from ..errors import require
    from .export_numpy import check_arguments
    from ..graph.onnx_files import ensure_model
    from ..graph.model import from_onnx
    from ..graph.passes import extract_weights, parameter_map
    from ..runtime import load
    from ..runtime.batch import free_checked
    from ..verification.verify import input_ranges, sample_inputs

    require("onnx", "onnx", "packing a policy")
    check_arguments(samples, low, high, seed)
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, force)
    # an exporter's fixed batch of 1, freed where the graph allows and checked against it at batch 1:
    # the folder then runs, and its golden data holds, any number of observations
    proto = free_checked(ensure_model(model), "numpy").model
    graph = from_onnx(proto)
    weights = extract_weights(proto)
    sources, constants = _initializer_sources(graph, parameter_map(proto), weights)

    drawn = inputs is None
    feeds = sample_inputs(graph.inputs, samples, low, high, seed, input_ranges(graph.metadata)) if drawn else dict(inputs)
    session = load(graph, backend="numpy")
    observations = count_observations(graph.inputs, feeds)
    check_memory(_golden_needs(session, feeds), f"recording the golden data of {observations:,} observations "
                 f"({len(session.tensor_names):,} tensors each) and reading it back")
    outputs = session.run(feeds)
    activations = session.record(feeds, "*")
    golden = {f"inputs/{k}": v for k, v in feeds.items()}
    golden.update({f"outputs/{k}": v for k, v in outputs.items()})
    golden.update({f"activations/{k}": v for k, v in activations.items()})
    parity, parity_report = _parity(proto, feeds, source, atol, rtol, rounding, trust)
    if not parity["passed"]:
        f = parity["first_divergence"]
        against = "the source disagrees with the numpy backend" if f["reference"] == "source" or f["candidate"] == "source" \
            else "the backends disagree"
        raise VerificationError(
            f"not packing {out_dir}: {against} on the golden observations; first diverging "
            f"tensor {f['tensor']!r} ({f['dtype']}, {f['candidate']} vs {f['reference']}), max abs "
            f"{f['max_abs']:.3g} > atol {f['atol']:g} + rtol {f['rtol']:g} * |{f['reference']}|"
            + (f", and not {f['dtype']} rounding against a float64 run" if f["rule"] == "rounding" else "")
            + tolerance_advice(parity_report, "pack with --atol/--rtol (atol=, rtol= in Python)")
            + " — run 'policyport verify' on the model for every figure"
        )

    graph_doc = json.loads(graph.to_json())
    graph_doc[SOURCES_KEY] = sources
    meta = graph.metadata
    policy: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "inputs": [v.to_dict() for v in graph.inputs],
        "outputs": [v.to_dict() for v in graph.outputs],
        "head": meta.get("policyport.head"),
        "observation_filter": _json_or_text(meta.get("policyport.observation_filter")),
        "assumptions": recorded_assumptions(meta),
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
            "low": float(low) if drawn else None,
            "high": float(high) if drawn else None,
            "seed": int(seed) if drawn else None,
            "distribution": "uniform [low, high) (an integer input: its recorded range, else the integers in [low, high)), "
                            "numpy default_rng(seed), as policyport.verification.verify.sample_inputs" if drawn
                            else "given to pack (-i, inputs=)",
            "keys": "inputs/<graph input>, outputs/<graph output>, activations/<tensor>",
        },
        "parity": parity,
    }

    code = runtime_sources() if runtime else {}
    with FolderBuild(out_dir, "packing") as build:
        try:
            writers = {
                MODEL_FILE: lambda f: f.write(proto.SerializeToString()),
                WEIGHTS_FILE: lambda f: write_npz(f, weights),
                CONSTANTS_FILE: lambda f: write_npz(f, constants),
                GRAPH_FILE: lambda f: f.write(json.dumps(graph_doc, indent=1).encode()),
                GOLDEN_FILE: lambda f: write_npz(f, golden),
            }
            policy["files"] = {name: _write(build, name, writers[name]) for name in DATA_FILES}
            if code:
                for name, data in code.items():
                    policy["files"][name] = _write(build, name, lambda f, data=data: f.write(data))
                digest = runtime_digest(policy["files"])
                run_py = RUN_PY.replace("@DIGEST@", repr(digest)).encode()
                policy["files"][ENTRY_POINT] = _write(build, ENTRY_POINT, lambda f: f.write(run_py))
                policy["runtime"] = {
                    "package": RUNTIME_PACKAGE,
                    "entry_point": ENTRY_POINT,
                    "policyport_version": __version__,
                    "digest": digest,
                    "requires_python": ">=3.10",
                    "requires": ["numpy>=1.24"],
                }
            _write(build, POLICY_FILE, lambda f: f.write(json.dumps(policy, indent=1).encode()))
        except OSError as e:
            raise UnreadableFileError(f"writing the bundle for {out_dir} failed: {e}; nothing was written") from e
        _check_round_trip(graph, load_graph(build.path, folder_fd=build.fd))
        build.commit(lambda found: _replaceable(out_dir, found, force))
    return out_dir


def _golden_needs(session, feeds: dict[str, np.ndarray]) -> int:
    """The bytes :func:`pack` holds for its golden data: the numpy backend's run and record of every
    tensor on ``feeds``, and the folder check's reading of ``golden.npz`` back (its bytes, and its
    arrays apart from them) while those are still held. 0 when the sizes cannot be told."""
    sizes = session.tensor_sizes(feeds)
    if sizes is None:
        return 0
    nbytes = sizes.nbytes(sizes.rows)
    golden = sum(a.nbytes for a in feeds.values()) + sum(nbytes.values()) + sum(nbytes[v.name] for v in session.outputs)
    held = session.backend.memory_needed(sizes, sizes.rows, None)
    return held + session.backend.memory_needed(sizes, sizes.rows, session.tensor_names) + 2 * golden


def _parity(proto, feeds: dict[str, np.ndarray], source, atol: float | None, rtol: float | None,
            rounding: bool, trust: bool) -> tuple[dict[str, Any], Report]:
    """onnxruntime (and the source) against the numpy backend on the golden feeds, every tensor: the
    figures ``policy.json`` records, and the report."""
    from ..errors import require
    from ..verification.verify import verify

    ort = require("onnxruntime", "onnx", "packing a policy (its numpy-vs-onnxruntime check)")
    report = verify(proto, feeds, backends=("numpy", "onnxruntime"), source=source, atol=atol, rtol=rtol,
                    rounding=rounding, trust=trust)
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
        "source_oracle": report.source_oracle,
        "assumptions": report.assumptions,
        "first_divergence": None if first is None else
        {"tensor": first.tensor, "candidate": first.candidate, "reference": first.reference,
         "max_abs": first.max_abs, "dtype": first.dtype, "atol": first.atol, "rtol": first.rtol, "rule": first.rule},
    }, report


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


def _check_out_dir(out_dir: Path, force: bool) -> list[str] | None:
    """What replacing ``out_dir`` deletes: ``None`` if it does not exist, else the files of the
    bundle it provably is (none for an empty folder). Anything else is refused; a device, FIFO or
    socket as a usage error (:func:`policyport.io.kinds.check_not_a_stream`)."""
    check_not_a_stream(out_dir)
    check_parent(out_dir)
    if not os.path.lexists(out_dir):
        return None
    if not force:
        raise OutputExistsError(f"{out_dir} exists; overwrite it with --force (force=True in Python)")
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise OutputExistsError(
            f"{out_dir} exists and is not a plain folder (a file or a symlink); force replaces only a "
            "bundle folder or an empty one — remove it yourself or choose another name"
        )
    files, folders, others = folder_entries(out_dir)
    if not (files or folders or others):
        return []
    if POLICY_FILE not in files:
        raise OutputExistsError(
            f"{out_dir} is a non-empty folder without {POLICY_FILE}, so not a policyport bundle; "
            "force replaces only bundles and empty folders — remove it yourself or choose another name"
        )
    try:
        policy, _ = open_bundle(out_dir)
    except PolicyportError as e:
        raise OutputExistsError(
            f"{out_dir} is not provably a policyport bundle ({e}); force replaces only intact bundles and "
            "empty folders — remove it yourself or choose another name"
        ) from None
    listed = [*policy["files"], POLICY_FILE]
    parents = {"/".join(n.split("/")[:i]) for n in listed for i in range(1, n.count("/") + 1)}
    foreign = sorted({*files} - {*listed} | {*folders} - parents | {*others})
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputExistsError(
            f"{out_dir} holds files a bundle does not write ({shown}); force would delete them "
            "— move them out first or choose another name"
        )
    return listed


def _replaceable(out_dir: Path, found: FolderContents, force: bool) -> list[str]:
    """The files of the folder found at ``out_dir`` when the new bundle is renamed into place (read
    through a descriptor of it) that replacing it deletes: those of the intact bundle it is, or none
    of an empty folder; anything else is refused, as :func:`_check_out_dir` refuses it."""
    if not force:
        raise OutputExistsError(f"{out_dir} appeared while packing; nothing was written (overwrite it with --force)")
    if not (found.files or found.folders or found.others):
        return []
    if POLICY_FILE not in found.files:
        raise OutputExistsError(f"{out_dir} is a non-empty folder without {POLICY_FILE}, so not a policyport bundle; "
                                "force replaces only bundles and empty folders — remove it yourself or choose another name")
    try:
        policy, _ = open_bundle(out_dir, folder_fd=found.fd)
    except PolicyportError as e:
        raise OutputExistsError(f"{out_dir} is not provably a policyport bundle ({e}); force replaces only intact "
                                "bundles and empty folders — remove it yourself or choose another name") from None
    listed = [*policy["files"], POLICY_FILE]
    parents = {"/".join(n.split("/")[:i]) for n in listed for i in range(1, n.count("/") + 1)}
    foreign = sorted({*found.files} - {*listed} | {*found.folders} - parents | {*found.others})
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputExistsError(f"{out_dir} holds files a bundle does not write ({shown}); force would delete them "
                                "— move them out first or choose another name")
    return listed


def runtime_sources() -> dict[str, bytes]:
    """The numpy runtime a packed folder carries: ``"_policyport/<module path>"`` -> the bytes of
    the installed module.

    Starts from :data:`RUNTIME_ENTRIES` and the package's ``__init__.py`` and follows every
    package-relative import (at module level or inside a function) to the module or package it
    names, except :data:`RUNTIME_LEFT_OUT`; every enclosing package's ``__init__.py`` is included.
    """
    root = Path(__file__).resolve().parent.parent  # the policyport package
    found: dict[str, bytes] = {}
    todo = ["__init__.py", *RUNTIME_ENTRIES]
    while todo:
        rel = todo.pop()
        if rel in found or rel in RUNTIME_LEFT_OUT:
            continue
        found[rel] = (root / rel).read_bytes()
        package = rel.rsplit("/", 1)[0].split("/") if "/" in rel else []
        todo += ["/".join(package[:i]) + "/__init__.py" for i in range(1, len(package) + 1)]
        for node in ast.walk(ast.parse(found[rel], rel)):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            target = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            for parts in [target, *(target + [alias.name] for alias in node.names)]:
                stem = "/".join(parts)
                for candidate in ((stem + ".py", stem + "/__init__.py") if stem else ("__init__.py",)):
                    if (root / candidate).is_file():
                        todo.append(candidate)
    return {f"{RUNTIME_PACKAGE}/{rel}": found[rel] for rel in sorted(found)}


def _write(build: FolderBuild, name: str, write) -> str:
    """Write the new file ``name`` of the folder being built through ``write(file)``; its sha256."""
    with os.fdopen(build.create(name), "w+b") as f:
        write(f)
        f.flush()
        f.seek(0)
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _json_or_text(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return load_json(text, "a model metadata value")
    except BadModelError:
        return text




#: ``run.py`` of a folder that carries its runtime; ``@DIGEST@`` becomes the repr of the runtime digest.
RUN_PY = '''"""Run the policy packed in this folder, with Python (>= 3.10) and numpy alone.

    python run.py -i obs.npy -o actions.npz [--record activations.npz] [--tensors GLOBS] [--force]
    python run.py --verify       # re-run the golden observations here; exit 1 on a mismatch
    python run.py -h             # every option and the exit codes

From another program:

    import runpy
    policy = runpy.run_path("path/to/this/folder/run.py")["load"]()   # a policyport Session
    actions = policy.run({"obs": obs})                                 # {"logits": ..., ...}

Written by policyport pack. Before anything from the folder is used, every file it holds is checked
against the sha256 that policy.json records. The code it runs is the copy of policyport's numpy
runtime in _policyport/, imported under a private name (_policyport_<digest>): an installed
policyport is neither used nor shadowed, and nothing is written into the folder. Python puts a
script's folder first on sys.path; before importing anything, run.py takes this folder off sys.path,
so a file beside it (hashlib.py, numpy.py) never stands in for the module it names, and it never
reads bytecode (__pycache__) from the folder.
"""

import os  # frozen into the interpreter, as sys is built in: neither is looked up on sys.path
import sys

FOLDER = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.realpath(FOLDER)]

import importlib  # noqa: E402 - only once the folder is off sys.path
import importlib.util  # noqa: E402

PACKAGE = "_policyport"
#: Where bytecode is looked for while the runtime is imported: a path that cannot exist (below a
#: file), so a __pycache__ planted in the folder is never read; nothing is written either.
NO_BYTECODE = os.path.join(os.path.realpath(__file__), "no-bytecode")
RUNTIME_DIGEST = @DIGEST@


def runtime():
    """The folder's runtime package, imported once per process after the folder is checked."""
    name = "_policyport_" + RUNTIME_DIGEST[:16]
    fresh = name not in sys.modules
    if fresh:
        location = os.path.join(FOLDER, PACKAGE)
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(location, "__init__.py"), submodule_search_locations=[location])
        sys.modules[name] = importlib.util.module_from_spec(spec)  # executed after the check below
    package = sys.modules[name]
    writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    prefix, sys.pycache_prefix = sys.pycache_prefix, NO_BYTECODE
    try:
        folder = importlib.import_module(name + ".graph.folder")
        policy = folder.read_policy(FOLDER)  # sizes, regular files, every sha256, the runtime digest
        if policy.get("runtime", {}).get("digest") != RUNTIME_DIGEST:
            raise folder.BadModelError(f"{FOLDER}: run.py belongs to another runtime than policy.json lists")
        if fresh:
            spec.loader.exec_module(package)
            for module in folder.runtime_modules(policy):
                importlib.import_module(f"{name}.{module}")
        if package.__version__ != policy["runtime"]["policyport_version"]:
            raise folder.BadModelError(f"{FOLDER}: the runtime is policyport {package.__version__}, "
                                       f"policy.json says {policy['runtime']['policyport_version']}")
    except BaseException:
        if fresh:
            for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[module]
        raise
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = writes_bytecode, prefix
    return package


def load():
    """This folder's policy as a policyport Session on the numpy backend (run, record, observe)."""
    return runtime().load(FOLDER, backend="numpy")


def verify(atol=1e-5, rtol=1e-5):
    """Re-run the golden observations; a report with .passed, .first_divergence and .to_dict()."""
    return runtime().verify_bundle(FOLDER, atol=atol, rtol=rtol)


def main(argv=None):
    """The command line (see the module docstring); returns the exit code."""
    if sys.version_info < (3, 10):
        sys.stderr.write("error: this policy needs Python 3.10 or newer\\n")
        return 4
    try:
        package = runtime()
    except ModuleNotFoundError as e:
        if e.name != "numpy":
            raise
        sys.stderr.write("error: this policy needs numpy, which is not installed; install it with: pip install numpy\\n")
        return 4
    except Exception as e:  # noqa: BLE001 - a damaged or refused folder: say so, no traceback
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e))
        if getattr(e, "exit_code", None) is None:
            message = f"cannot import the runtime in {PACKAGE}/ ({type(e).__name__}: {message}); copy the folder again"
        sys.stderr.write(f"error: {message}\\n")
        return getattr(e, "exit_code", 3)
    return importlib.import_module(package.__name__ + ".handoff.folder_run").main(FOLDER, argv)


if __name__ == "__main__":
    sys.exit(main())
'''
