"""``policyport verify``, and the verification table other commands print too."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import InputMismatchError
from .core import app, emit_json, guard
from .options import AtolOpt, JsonOpt, ModelArg, RtolOpt, check_range
from .render import add_row, cell, literal, out, shape_text, table


def load_feeds(path: Path, names: list[str]) -> dict:
    """Feeds from an .npy (one array) or .npz; one array under any name feeds a single-input model."""
    from ..files import load_arrays

    arrays = load_arrays(path)
    if list(arrays) == [""] or (len(arrays) == 1 and len(names) == 1 and names[0] not in arrays):
        if len(names) != 1:
            raise InputMismatchError(f"{path} holds one array but the model has inputs {names}; use an .npz keyed by input name")
        return {names[0]: next(iter(arrays.values()))}
    return arrays


def input_names(model: Path) -> list[str]:
    """The graph inputs of an .onnx file or packed folder (its non-initializer graph inputs)."""
    from ..files import load_onnx

    proto = load_onnx(model)
    inits = {t.name for t in proto.graph.initializer}
    return [v.name for v in proto.graph.input if v.name not in inits]


def verification_table(report):
    """One row per tensor, one column per (candidate vs reference) pair, cells = max abs error."""
    pairs = list(dict.fromkeys((c.candidate, c.reference) for c in report.comparisons))
    rows: dict[str, dict] = {}
    for c in report.comparisons:
        rows.setdefault(c.tensor, {"shape": c.shape})[(c.candidate, c.reference)] = c
    t = table(f"max abs error on {report.samples} samples (atol {report.atol:g}, rtol {report.rtol:g})",
              ["tensor", "shape", *((f"{cand}\nvs {ref}", "right") for cand, ref in pairs)])
    for tensor, row in rows.items():
        cells = []
        for pair in pairs:
            c = row.get(pair)
            text = "" if c is None else c.detail or f"{c.max_abs:.2g}"
            cells.append(cell(text) if c is None or c.passed else cell(f"{text} ✗", "bold red"))
        add_row(t, tensor, shape_text(row["shape"]), *cells)
    return t


def verdict(report) -> str:
    """The one-line PASS/FAIL summary of a report."""
    if report.passed:
        worst = max(report.comparisons, key=lambda c: c.max_abs, default=None)
        where = f"; worst {worst.max_abs:.3g} on {worst.tensor} ({worst.candidate} vs {worst.reference})" if worst else ""
        return f"PASS: {len(report.comparisons)} comparisons within atol {report.atol:g} + rtol {report.rtol:g}{where}"
    f = report.first_divergence
    bad = sum(not c.passed for c in report.comparisons)
    return (f"FAIL: {bad} of {len(report.comparisons)} comparisons exceed atol {report.atol:g} + rtol {report.rtol:g}; "
            f"first diverging tensor {f.tensor!r} ({f.candidate} vs {f.reference}): "
            + (f.detail or f"max abs {f.max_abs:.3g}, max rel {f.max_rel:.3g}"))


def print_report(report, as_json: bool) -> int:
    """Render ``report`` (table and verdict, or JSON); the exit code it calls for."""
    if as_json:
        emit_json(report.to_dict())
    else:
        out.print(verification_table(report))
        out.print(Text(literal(verdict(report)), style="" if report.passed else "bold red"))
    return 0 if report.passed else 1


@app.command("verify")
def verify_cmd(
    model: ModelArg,
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", help=".npy or .npz of observations; drawn at random when omitted.")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="How many observations to draw uniformly from [--low, --high)  [default: 1000]")] = None,
    low: Annotated[Optional[float], typer.Option("--low", help="Lower end of the range observations are drawn from  [default: 0.0]")] = None,
    high: Annotated[Optional[float], typer.Option("--high", help="Upper end of the range observations are drawn from  [default: 1.0]")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, help="Seed of the drawn observations  [default: 0]")] = None,
    backends: Annotated[Optional[str], typer.Option(help="Comma-separated backends; the first is the baseline  [default: numpy,onnxruntime]")] = None,
    source: Annotated[Optional[Path], typer.Option(help="The source the model was converted from, as a further reference.")] = None,
    trust: Annotated[bool, typer.Option("--trust", help="Allow loading a --source that runs code when unpickled (a whole pickled torch module). Only for files you trust.")] = False,
    tensors: Annotated[str, typer.Option(help="Comma-separated globs over node-output names to compare (graph outputs always are).")] = "*",
    atol: AtolOpt = 1e-5,
    rtol: RtolOpt = 1e-5,
    as_json: JsonOpt = False,
) -> None:
    """Compare every tensor across backends (and the source); exit 1 on a mismatch.

    A packed folder on its own is re-run on the numpy backend against the golden data it carries.
    """

    def body():
        from ..runtime import BACKENDS
        from ..verification import verify as run_verify

        if model.is_dir() and inputs is None and source is None:  # a packed folder: its golden data
            from ..runtime.packed import verify_bundle

            given = [f"--{n}" for n, v in (("samples", samples), ("low", low), ("high", high), ("seed", seed),
                                            ("backends", backends)) if v is not None]
            if given or tensors != "*":
                raise typer.BadParameter(
                    f"a packed folder is checked on the numpy backend against its own golden data, so "
                    f"{', '.join(given + (['--tensors'] if tensors != '*' else []))} do not apply; "
                    "give -i or --source to compare backends on other observations", param_hint="MODEL")
            return print_report(verify_bundle(model, atol=atol, rtol=rtol), as_json)
        backend_list = backends if backends is not None else "numpy,onnxruntime"
        names = [b.strip() for b in backend_list.split(",") if b.strip()]
        unknown = [b for b in names if b not in BACKENDS]
        if unknown or not names:
            raise typer.BadParameter(f"{unknown or backend_list!r}; choose from {', '.join(BACKENDS)}", param_hint="--backends")
        if len(set(names)) < 2 and source is None:
            raise typer.BadParameter("name two backends, or give --source, to have something to compare", param_hint="--backends")
        lo, hi = (0.0 if low is None else low), (1.0 if high is None else high)
        check_range(lo, hi)
        feeds = None
        if inputs is not None:
            feeds = load_feeds(inputs, input_names(model))
        report = run_verify(str(model), feeds, backends=names, source=source,
                            samples=1000 if samples is None else samples, low=lo, high=hi,
                            seed=0 if seed is None else seed, atol=atol, rtol=rtol, tensors=tensors, trust=trust)
        return print_report(report, as_json)

    guard(as_json, body)
