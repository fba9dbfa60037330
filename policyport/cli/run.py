"""``policyport run``: a model on observations, optionally recording activations.

No ``from __future__ import annotations`` here: Typer reads the command's parameters from its
annotations, and evaluating them as strings on every start costs some 2 ms.
"""

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from .core import app, emit_json, guard
from .options import (
    ForceOpt,
    JsonOpt,
    ModelArg,
    OverrideOpt,
    OverridesFileOpt,
    SteerOpt,
    ThreadsOpt,
    check_output_format,
    given_path,
    overrides_from,
    tensor_patterns,
)
from . import render
from .render import add_row, literal, say, shape_text, table
from .inputs import load_feeds, warn_of_nonfinite_rows


class BackendName(str, Enum):
    numpy = "numpy"
    onnxruntime = "onnxruntime"


@app.command()
def run(
    model: ModelArg,
    inputs: Annotated[Path, typer.Option("-i", "--input", metavar="OBS", parser=given_path, help=".npy (single-input model) or .npz keyed by input name.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", metavar="OUT.npz", parser=given_path, help="The .npz of graph outputs to write; required unless --profile is given without --record.")] = None,
    backend: Annotated[BackendName, typer.Option(metavar="[numpy|onnxruntime]", help="Runtime.")] = BackendName.numpy,
    record: Annotated[Optional[Path], typer.Option(metavar="ACTS.npz", parser=given_path, help="Also write every recorded activation to this .npz.")] = None,
    tensors: Annotated[Optional[str], typer.Option(metavar="GLOBS", callback=tensor_patterns, help="With --record: comma-separated globs over node-output names; graph outputs are always recorded  [default: every tensor]")] = None,
    chosen: Annotated[Optional[str], typer.Option("--outputs", metavar="NAMES", help="Comma-separated graph outputs to compute, on the graph pruned to what they need (inputs it no longer reads are ignored)  [default: all]")] = None,
    override: OverrideOpt = None,
    steer: SteerOpt = None,
    overrides: OverridesFileOpt = None,
    force: ForceOpt = False,
    threads: ThreadsOpt = 0,
    profile: Annotated[bool, typer.Option("--profile", help="Print where the time goes, node by node (op, tensor, µs, % of the total), with onnxruntime's own profiler figures beside the numpy backend's when onnxruntime is installed.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a model on observations; optionally record activations and override neurons."""

    def body():
        from ..io.outputs import check_distinct, check_writable, write_outputs
        from ..io.limits import check_memory
        from ..io.arrays import npz_writer

        if tensors is not None and record is None:
            raise typer.BadParameter("--tensors selects what --record writes; give --record too", param_hint="--tensors")
        if profile and as_json:
            raise typer.BadParameter("--profile prints a table; leave out --json", param_hint="--profile")
        if output is None and (not profile or record is not None):
            raise typer.BadParameter("give the .npz to write the outputs to (-o), or --profile alone", param_hint="-o")
        if output is not None:
            check_output_format(output, ".npz")
            check_writable(output, force)
            check_distinct(output, model, inputs)
        if record is not None:
            if output is not None and record.resolve() == output.resolve():
                raise typer.BadParameter(f"{literal(record)} is also the -o file; give --record another file",
                                         param_hint="--record")
            check_output_format(record, ".npz", "--record")
            check_writable(record, force)
            check_distinct(record, model, inputs)
        session = _session(model, chosen, backend.value, threads)
        edits = overrides_from(override, steer, overrides, session)
        feeds = load_feeds(inputs, [v.name for v in session.inputs])
        if chosen is not None:  # inputs the pruned graph no longer reads
            known = {v.name for v in [*session.inputs, *session.optional_inputs]}
            feeds = {k: v for k, v in feeds.items() if k in known}
        warn_of_nonfinite_rows(feeds)
        selection = ("*" if tensors is None else tensors) if record is not None else None
        rows = max((len(v) for v in feeds.values() if getattr(v, "ndim", 0)), default=1)
        check_memory(session.memory_needed(feeds, selection),
                     f"{'recording' if record is not None else 'running'} {rows:,} rows of {inputs}")
        if profile:
            show_profile(session, model, chosen, feeds, threads, edits, rows)
            if output is None:
                return
        if record is not None:
            values = session.record(feeds, selection, overrides=edits)
            outputs = {v.name: values[v.name] for v in session.outputs}
        else:
            outputs = session.run(feeds, overrides=edits)
        writers = {output: npz_writer(outputs)}
        if record is not None:  # with the description of which tensors have rows, as record writes it
            from ..analysis.recording import described_run

            writers[record] = npz_writer(described_run(
                session, feeds, values, selection, edits, model=str(model), data=str(inputs), backend=backend.value,
                overrides=[e.spec for e in edits or ()]))
        write_outputs(writers, force)  # both files, or neither
        shown = values if record is not None else outputs
        if as_json:
            emit_json({"backend": backend.value, "output": str(output), "record": None if record is None else str(record),
                       "tensors": [array_summary(k, v) for k, v in shown.items()]})
            return
        rows = []
        for k, v in shown.items():
            lo, hi = (f"{v.min():.4g}", f"{v.max():.4g}") if v.size else ("", "")
            rows.append([k, v.dtype.name, shape_text(v.shape), lo, hi])
        render.print_table(f"{backend.value}: outputs written to {output}" + (f", {len(values)} tensors to {record}" if record else ""),
                           ["tensor", "dtype", "shape", ("min", "right"), ("max", "right")], rows)
        if edits:
            say("with overrides: " + "; ".join(e.spec for e in edits))

    guard(as_json, body, "run")


def array_summary(name: str, value) -> dict:
    """``{"name", "dtype", "shape", "min", "max"}`` of one array, for ``--json`` (min/max ``None``
    when the array is empty or holds no numbers; NaN and infinities as strings, which JSON lacks)."""
    import numpy as np

    lo = hi = None
    if value.size and (np.issubdtype(value.dtype, np.number) or value.dtype == bool):
        lo, hi = (_json_number(x) for x in (value.min(), value.max()))
    return {"name": name, "dtype": value.dtype.name, "shape": list(value.shape), "min": lo, "max": hi}


def _json_number(x):
    import math

    x = x.item()
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


def _session(model: Path, chosen: str | None, backend: str, threads: int):
    """``model`` loaded on ``backend``, pruned to the graph outputs ``chosen`` (``--outputs``) if given."""
    from ..runtime import load

    if chosen is None:
        return load(str(model), backend=backend, threads=threads)
    from ..graph.onnx_files import load_onnx
    from ..runtime.expose import prune

    return load(prune(load_onnx(model), chosen), backend=backend, threads=threads)


def show_profile(session, model: Path, chosen: str | None, feeds: dict, threads: int, edits, rows: int) -> None:
    """Print the per-node profile of ``session``'s backend, and onnxruntime's beside the numpy backend's
    (``rows``: the rows of the batch, for the title)."""
    from ..errors import MissingDependencyError
    from ..runtime.profile import profile_numpy, profile_onnxruntime

    if edits:
        raise typer.BadParameter("--profile times the model as it is; leave out --override/--steer", param_hint="--profile")
    profiles = []
    if session.backend.name == "numpy":
        profiles.append(profile_numpy(session, feeds))
        try:
            ort_session = _session(model, chosen, "onnxruntime", threads)
        except MissingDependencyError as e:
            say(f"onnxruntime's figures are left out: {e}")
        else:
            profiles.append(profile_onnxruntime(ort_session, feeds))
    else:
        profiles.append(profile_onnxruntime(session, feeds))
    columns = ["tensor", "op"]
    for p in profiles:
        columns += [(f"{p.backend} µs", "right"), (f"{p.backend} %", "right")]
    t = table(f"where the time goes: {rows:,} rows", columns)
    keyed = [{_node_key(n.node): n for n in p.nodes} for p in profiles]
    order = list(dict.fromkeys(k for by in keyed for k in by))
    for key in order:
        entries = [by.get(key) for by in keyed]
        first = next(e for e in entries if e is not None)
        cells = [first.tensor or key, " / ".join(dict.fromkeys(e.op_type for e in entries if e is not None))]
        for p, e in zip(profiles, entries):
            cells += ["", ""] if e is None else [f"{e.seconds * 1e6:,.1f}", f"{100 * e.seconds / p.node_seconds:.1f}"]
        add_row(t, *cells)
    totals = ["nodes, added up", ""]
    for p in profiles:
        totals += [f"{p.node_seconds * 1e6:,.1f}", "100.0"]
    add_row(t, *totals)
    render.out.print(t)
    for p in profiles:
        say(f"{p.backend}: run {p.run_seconds * 1e6:,.1f} µs (median of {p.runs} runs); {'; '.join(p.notes)}")


def _node_key(name: str) -> str:
    """A node's name as both backends know it (onnxruntime calls a node it fused with the next "fused NAME")."""
    return name.removeprefix("fused ")
