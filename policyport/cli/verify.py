"""``policyport verify``, and the verification table other commands print too."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..verification.compare import source_lines, tolerance_text, verdict
from .core import app, emit_json, guard
from .inputs import input_names, load_feeds
from .options import (
    AtolOpt,
    JsonOpt,
    ModelArg,
    RoundingOpt,
    RtolOpt,
    ThreadsOpt,
    check_range,
    drawing_advice,
    given_path,
    tensor_patterns,
)
from .render import add_row, cell, counted, literal, out, say, shape_text, table


def verification_table(report):
    """One row per tensor, one column per (candidate vs reference) pair, cells = max abs error.

    A comparison that passed by float32 rounding is marked ``≈`` (:func:`report_lines` gives its
    float64 figures), a failed one ``✗``; a tensor left out (random) reads ``skipped``.
    """
    pairs = list(dict.fromkeys((c.candidate, c.reference) for c in report.comparisons))
    rows: dict[str, dict] = {}
    for c in report.comparisons:
        rows.setdefault(c.tensor, {"shape": c.shape})[(c.candidate, c.reference)] = c
    t = table(f"max abs error on {counted(report.samples, 'observation')} "
              f"({tolerance_text(report)})",
              ["tensor", "shape", *((f"{cand}\nvs {ref}", "right") for cand, ref in pairs)])
    for tensor, row in rows.items():
        cells = []
        for pair in pairs:
            c = row.get(pair)
            text = "" if c is None else c.detail or f"{c.max_abs:.2g}"
            if c is not None and c.passed and c.rule == "rounding":
                text += " ≈"
            cells.append(cell(text) if c is None or c.passed else cell(f"{text} ✗", "bold red"))
        add_row(t, tensor, shape_text(row["shape"]), *cells)
    for skipped in report.skipped:
        add_row(t, skipped.tensor, "", *(["skipped"] * len(pairs)))
    return t


def report_lines(report) -> list[str]:
    """What the table cannot show: the float64 figures of rounding passes (and of failures the
    float64 run judged), and why tensors were skipped (the report's notes are status: stderr)."""
    lines = []
    for c in report.comparisons:
        if c.rule != "rounding":
            continue
        verdict = "within" if c.passed else "beyond"
        lines.append(
            f"{c.tensor} ({c.candidate} vs {c.reference}): {c.max_abs:.2g} exceeds the tolerance, {verdict} "
            f"{c.dtype} rounding: against a float64 run {c.candidate} is {c.candidate_vs_float64:.2g} off and "
            f"{c.reference} {c.reference_vs_float64:.2g}, bound {c.rounding_bound:.2g}")
    lines += [f"skipped {s.tensor}: {s.reason}" for s in report.skipped]
    return lines


def print_report(report, as_json: bool) -> int:
    """Render ``report`` (table, notes and verdict, or JSON); the exit code it calls for."""
    if as_json:
        emit_json(report.to_dict())
    else:
        out.print(verification_table(report))
        for note in report.notes:
            say(f"note: {note}")
        for line in report_lines(report) + source_lines(report.source_oracle, report.assumptions):
            out.print(literal(line))
        out.print(Text(literal(verdict(report)), style="" if report.passed else "bold red"))
    return 0 if report.passed else 1


@app.command("verify")
def verify_cmd(
    model: ModelArg,
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", parser=given_path, metavar="OBS", help=".npy or .npz of observations; drawn at random when omitted.")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, metavar="N", help="How many observations to draw uniformly from [--low, --high)  [default: 1000]")] = None,
    low: Annotated[Optional[float], typer.Option("--low", metavar="L", help="Lower end of the range observations are drawn from  [default: 0.0]")] = None,
    high: Annotated[Optional[float], typer.Option("--high", metavar="H", help="Upper end of the range observations are drawn from  [default: 1.0]")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", min=0, metavar="S", help="Seed of the drawn observations  [default: 0]")] = None,
    backends: Annotated[Optional[str], typer.Option(metavar="NAME,NAME", help="Comma-separated backends; the first is the baseline  [default: numpy,onnxruntime]")] = None,
    source: Annotated[Optional[Path], typer.Option(metavar="SRC", parser=given_path, help="The source the model was converted from, as a further reference.")] = None,
    trust: Annotated[bool, typer.Option("--trust", help="Allow loading a --source that runs code it holds: a TorchScript file, a SavedModel, a whole pickled torch module. Only for files you trust.")] = False,
    obs_norm: Annotated[Optional[Path], typer.Option("--obs-norm", metavar="FILE", parser=given_path, help="The observation-normalisation file to rebuild --source with, as convert took it (a path the model records is never opened).")] = None,
    tensors: Annotated[str, typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over node-output names to compare; graph outputs always are (name them alone to compare only them).")] = "*",
    outputs: Annotated[Optional[str], typer.Option("--outputs", metavar="NAMES", help="Comma-separated graph outputs to verify, on the graph pruned to what they need  [default: all]")] = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    rounding: RoundingOpt = True,
    as_json: JsonOpt = False,
    threads: ThreadsOpt = 0,
    observer: Annotated[bool, typer.Option("--observer", help="Check that recording and patch points change nothing they should not, on each backend: outputs of instrumented runs equal the plain run's (bit for bit on numpy), every node replayed from its recorded inputs gives its recorded outputs, and perturbing each tensor moves the outputs it feeds and no other (dead patch points are named). Exit 1 if not.")] = False,
) -> None:
    """Compare every tensor across backends (and the source); exit 1 on a mismatch.

    With -i, --samples N uses the first N observations of the file. A packed folder on its own is
    re-run on the numpy backend against the golden data it carries; with --backends naming two
    backends they are compared on its golden observations.
    """

    def body():
        from ..graph.onnx_files import check_model_folder
        from ..runtime import BACKENDS
        from ..verification.verify import verify as run_verify

        if observer:
            return _observer(model, inputs, samples, low, high, seed, backends, source, tensors, outputs, atol, rtol,
                             as_json)

        if obs_norm is not None and source is None:
            raise typer.BadParameter("it rebuilds the source the model was converted from; give --source too",
                                     param_hint="--obs-norm")
        check_model_folder(model)  # a source's folder or any other, not a packed one: say so before the options
        packed = model.is_dir() and inputs is None and source is None
        if packed and backends is None:  # a packed folder: its golden data
            from ..handoff.golden import verify_bundle

            given = [f"--{n}" for n, v in (("samples", samples), ("low", low), ("high", high), ("seed", seed),
                                            ("outputs", outputs)) if v is not None]
            if given or tensors != "*":
                raise typer.BadParameter(
                    f"a packed folder is checked on the numpy backend against its own golden data, so "
                    f"{_listed(given + (['--tensors'] if tensors != '*' else []))} apply; "
                    "give -i or --source to compare backends on other observations, or --backends to "
                    "compare them on the golden observations", param_hint="MODEL")
            return print_report(verify_bundle(model, atol=atol, rtol=rtol), as_json)
        backend_list = backends if backends is not None else "numpy,onnxruntime"
        names = [b.strip() for b in backend_list.split(",") if b.strip()]
        unknown = [b for b in names if b not in BACKENDS]
        if unknown or not names:
            raise typer.BadParameter(f"{unknown or backend_list!r}; choose from {', '.join(BACKENDS)}", param_hint="--backends")
        twice = list(dict.fromkeys(b for b in names if names.count(b) > 1))
        if twice:
            raise typer.BadParameter(f"{backend_list!r} names {' and '.join(twice)} more than once; the backends "
                                     "compared must differ, e.g. numpy,onnxruntime", param_hint="--backends")
        if len(names) < 2 and source is None:
            raise typer.BadParameter("name two backends, or give --source, to have something to compare", param_hint="--backends")
        lo, hi = (0.0 if low is None else low), (1.0 if high is None else high)
        check_range(lo, hi)
        feeds = None
        if packed:  # compare backends on the folder's golden observations
            from ..handoff.golden import read_golden

            drawn = [f"--{n}" for n, v in (("low", low), ("high", high), ("seed", seed)) if v is not None]
            if drawn:
                raise typer.BadParameter(f"{', '.join(drawn)} draw observations; a packed folder brings its own "
                                         "golden observations (give -i for others)", param_hint="MODEL")
            feeds = read_golden(model)["inputs"]
        elif inputs is not None:
            drawn = [f"--{n}" for n, v in (("low", low), ("high", high), ("seed", seed)) if v is not None]
            if drawn:
                raise typer.BadParameter(f"-i gives the observations, so {_listed(drawn)} apply (nothing is drawn); "
                                         "--samples N takes the first N rows of the file", param_hint="-i")
            feeds = load_feeds(inputs, input_names(model))
        with drawing_advice("verify", takes_inputs=True):
            report = run_verify(str(model), feeds, backends=names, source=source, samples=samples, low=lo, high=hi,
                                seed=0 if seed is None else seed, atol=atol, rtol=rtol, tensors=tensors, outputs=outputs,
                                rounding=rounding, trust=trust, threads=threads, obs_norm=obs_norm)
        return print_report(report, as_json)

    guard(as_json, body, "verify", source)


def _observer(model, inputs, samples, low, high, seed, backends, source, tensors, outputs, atol, rtol, as_json) -> int:
    """``verify --observer``: the observer check (:mod:`policyport.verification.observer`), rendered."""
    from ..runtime import BACKENDS
    from ..verification.observer import observer_check
    from ..verification.verify import first_rows, sample_inputs

    given = [f for f, v in (("--source", source), ("--outputs", outputs)) if v is not None]
    if given:
        raise typer.BadParameter(f"--observer checks the model on its backends, so {_listed(given)} apply",
                                 param_hint="--observer")
    if model.is_dir():
        raise typer.BadParameter("--observer checks an .onnx model; give the model a packed folder was made from",
                                 param_hint="MODEL")
    names = [b.strip() for b in (backends or "numpy,onnxruntime").split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if unknown or not names or len(set(names)) != len(names):
        raise typer.BadParameter(f"{backends!r}; name each of {', '.join(BACKENDS)} at most once", param_hint="--backends")
    if inputs is not None:
        drawn = [f"--{n}" for n, v in (("low", low), ("high", high), ("seed", seed)) if v is not None]
        if drawn:
            raise typer.BadParameter(f"-i gives the observations, so {_listed(drawn)} apply", param_hint="-i")
        from ..graph.model import from_onnx
        from ..graph.onnx_files import load_onnx

        declared = from_onnx(load_onnx(model)).inputs
        feeds = load_feeds(inputs, [v.name for v in declared])
        if samples is not None:
            feeds = first_rows(declared, feeds, samples)
    else:
        from ..graph.model import from_onnx
        from ..graph.onnx_files import load_onnx

        lo, hi = (0.0 if low is None else low), (1.0 if high is None else high)
        check_range(lo, hi)
        with drawing_advice("verify", takes_inputs=True):
            feeds = sample_inputs(from_onnx(load_onnx(model)).inputs, 64 if samples is None else samples, lo, hi,
                                  0 if seed is None else seed)
    report = observer_check(str(model), feeds, backends=names, tensors=tensors, atol=atol, rtol=rtol)
    if as_json:
        emit_json(report.to_dict())
        return 0 if report.passed else 1
    t = table(f"observer check on {counted(report.samples, 'observation')}",
              ["check", "backend", "subject", ("max abs", "right"), "verdict"])
    for c in report.transparency:
        add_row(t, f"{c.instrument} vs plain run", c.backend, c.output, f"{c.max_abs:.2g}",
                cell("bit for bit" if c.exact else "within tolerance" if c.passed else "differs ✗",
                     "" if c.passed else "bold red"))
    for r in report.replay:
        verdict_text = (f"skipped: {r.skipped}" if r.skipped else "bit for bit" if r.exact
                        else "within tolerance" if r.passed else "differs ✗")
        add_row(t, "node replayed", r.backend, f"{r.node} ({r.op_type})", "" if r.skipped else f"{r.max_abs:.2g}",
                cell(verdict_text, "" if r.passed else "bold red"))
    for s in report.sensitivity:
        text = {"moves": f"moves {', '.join(s.moved)}", "dead": f"dead: moves none of {', '.join(s.feeds)} ✗",
                "leaks": f"leaks: moves {', '.join(o for o in s.moved if o not in s.feeds)} ✗",
                "feeds no output": "feeds no output", "skipped": f"skipped: {s.reason}"}[s.status]
        add_row(t, "tensor perturbed", s.backend, s.tensor, "", cell(text, "" if s.passed else "bold red"))
    out.print(t)
    checks = len(report.transparency) + len(report.replay) + len(report.sensitivity)
    failed = [c for c in [*report.transparency, *report.replay, *report.sensitivity] if not c.passed]
    line = (f"PASS: {checks} observer checks on {', '.join(report.backends)}" if report.passed else
            f"FAIL: {len(failed)} of {checks} observer checks" +
            (f"; dead patch points: {', '.join(sorted({s.tensor for s in report.dead}))}" if report.dead else ""))
    out.print(Text(literal(line), style="" if report.passed else "bold red"))
    return 0 if report.passed else 1


def _listed(flags: list[str]) -> str:
    """``--low does not`` / ``--low, --seed do not``: options named as the subject of "apply"."""
    return f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not"
