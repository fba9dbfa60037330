"""The ``policyport`` command line: each command parses, calls the library and renders.

Exit codes: 0 ok; 1 verification found a mismatch; 2 usage error; 3 bad model or input; 4 missing
optional dependency. Messages go to stderr, data to stdout; ``--json`` makes stdout one JSON
document (on an error: ``{"error": ..., "exit_code": ...}``).
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import InputMismatchError, PolicyportError, UnsupportedOpError

app = typer.Typer(
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Carry trained policy networks across frameworks: convert to ONNX, extract weights, run on "
    "numpy or onnxruntime with every activation recorded, and verify parity tensor by tensor.",
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class BackendName(str, Enum):
    numpy = "numpy"
    onnxruntime = "onnxruntime"


def _fail(e: PolicyportError, as_json: bool, command: str = "", source_given: bool = False) -> None:
    message = str(e)
    if isinstance(e, UnsupportedOpError):  # a remedy in this command's own options
        message = e.message_for(command, source_given=source_given)
    if as_json:
        print(json.dumps({"error": message, "exit_code": e.exit_code}))
    err.print("[bold red]error:[/] ", markup=True, end="")
    err.print(message, markup=False)
    raise typer.Exit(e.exit_code)


def _guard(as_json: bool, body: Callable[[], int | None], command: str = "", source: Path | None = None) -> None:
    """Run ``body``; turn policyport's errors into a message and their exit code (``command`` and
    ``source``: what a remedy may suggest)."""
    try:
        code = body()
    except PolicyportError as e:
        _fail(e, as_json, command, source is not None)
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130) from None
    if code:
        raise typer.Exit(code)


def _emit_json(doc) -> None:
    print(json.dumps(doc, indent=1))


def _load_feeds(path: Path, names: list[str]) -> dict:
    """Feeds from an .npy (one array) or .npz; one array under any name feeds a single-input model."""
    from .files import load_arrays

    arrays = load_arrays(path)
    if list(arrays) == [""] or (len(arrays) == 1 and len(names) == 1 and names[0] not in arrays):
        if len(names) != 1:
            raise InputMismatchError(f"{path} holds one array but the model has inputs {names}; use an .npz keyed by input name")
        return {names[0]: next(iter(arrays.values()))}
    return arrays


def _input_names(model: Path) -> list[str]:
    """The graph inputs of an .onnx file or packed folder (its non-initializer graph inputs)."""
    from .files import load_onnx

    proto = load_onnx(model)
    inits = {t.name for t in proto.graph.initializer}
    return [v.name for v in proto.graph.input if v.name not in inits]


def _verification_table(report) -> Table:
    """One row per tensor, one column per (candidate vs reference) pair, cells = max abs error."""
    pairs = list(dict.fromkeys((c.candidate, c.reference) for c in report.comparisons))
    rows: dict[str, dict] = {}
    for c in report.comparisons:
        rows.setdefault(c.tensor, {"shape": c.shape})[(c.candidate, c.reference)] = c
    table = Table(title=f"max abs error on {report.samples} samples (atol {report.atol:g}, rtol {report.rtol:g})")
    table.add_column("tensor")
    table.add_column("shape")
    for cand, ref in pairs:
        table.add_column(f"{cand}\nvs {ref}", justify="right")
    for tensor, row in rows.items():
        cells = []
        for pair in pairs:
            c = row.get(pair)
            text = "" if c is None else c.detail or f"{c.max_abs:.2g}"
            cells.append(text if c is None or c.passed else f"[bold red]{text} ✗[/]")
        table.add_row(tensor, str(tuple(row["shape"])), *cells)
    return table


def _verdict(report) -> str:
    if report.passed:
        worst = max(report.comparisons, key=lambda c: c.max_abs, default=None)
        where = f"; worst {worst.max_abs:.3g} on {worst.tensor} ({worst.candidate} vs {worst.reference})" if worst else ""
        return f"PASS: {len(report.comparisons)} comparisons within atol {report.atol:g} + rtol {report.rtol:g}{where}"
    f = report.first_divergence
    bad = sum(not c.passed for c in report.comparisons)
    return (f"FAIL: {bad} of {len(report.comparisons)} comparisons exceed atol {report.atol:g} + rtol {report.rtol:g}; "
            f"first diverging tensor {f.tensor!r} ({f.candidate} vs {f.reference}): "
            + (f.detail or f"max abs {f.max_abs:.3g}, max rel {f.max_rel:.3g}"))


def _print_report(report, as_json: bool) -> int:
    if as_json:
        _emit_json(report.to_dict())
    else:
        out.print(_verification_table(report))
        out.print(_verdict(report))
    return 0 if report.passed else 1


AtolOpt = Annotated[float, typer.Option("--atol", min=0.0, help="Absolute tolerance.")]
RtolOpt = Annotated[float, typer.Option("--rtol", min=0.0, help="Relative tolerance.")]
SamplesOpt = Annotated[int, typer.Option("--samples", min=1, help="How many observations to draw uniformly from [--low, --high).")]
LowOpt = Annotated[float, typer.Option("--low", help="Lower end of the range observations are drawn from.")]
HighOpt = Annotated[float, typer.Option("--high", help="Upper end of the range observations are drawn from.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the drawn observations.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]


def _check_convert_options(kind, activation, head, opset, low, high) -> str | None:
    """Option values the library would refuse, refused here as usage errors (exit 2)."""
    from .converter import HEADS, KINDS, MIN_OPSET
    from .converter.activations import parse_activation
    from .errors import BadModelError, require

    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"{kind!r}; choose one of {', '.join(KINDS)}", param_hint="--from")
    try:
        parse_activation(activation)
    except BadModelError as e:
        raise typer.BadParameter(str(e), param_hint="--activation") from None
    if head is not None and head not in (*HEADS, "none"):
        raise typer.BadParameter(f"{head!r}; choose one of none, {', '.join(HEADS)}", param_hint="--head")
    newest = require("onnx", "onnx", "converting a policy").defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise typer.BadParameter(f"{opset}; policyport builds opset {MIN_OPSET} to {newest}", param_hint="--opset")
    if not low < high:
        raise typer.BadParameter(f"--low {low} must be below --high {high}", param_hint="--low/--high")
    return None if head in (None, "none") else head


@app.command()
def convert(
    src: Annotated[Path, typer.Argument(help="The trained policy: an .npz of weights in RLlib's TF layout.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .onnx file to write.")],
    kind: Annotated[Optional[str], typer.Option("--from", help="Source kind (npz); detected from SRC when omitted.")] = None,
    activation: Annotated[str, typer.Option(help="Hidden activation: tanh, relu, elu, selu, swish/silu, softplus, leaky_relu[:slope], gelu, linear.")] = "tanh",
    head: Annotated[Optional[str], typer.Option(help="Action head: none (logits only), diag-gaussian (adds action = mean, log_std) or categorical (adds action = argmax).")] = None,
    opset: Annotated[int, typer.Option(help="ONNX opset of the default domain.")] = 17,
    keep_value: Annotated[bool, typer.Option("--keep-value", help="Also export the value branch as output 'value'.")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check the result against the source before writing it.")] = True,
    samples: SamplesOpt = 1000,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    atol: AtolOpt = 1e-5,
    rtol: RtolOpt = 1e-5,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Convert a trained policy to ONNX, verify it against the source, then write it."""

    def body():
        from .converter import convert_source
        from .files import check_distinct, check_writable, save_onnx
        from .verification import verify as run_verify

        chosen_head = _check_convert_options(kind, activation, head, opset, low, high)
        check_writable(output, force)
        check_distinct(output, src)
        converted = convert_source(src, kind=kind, activation=activation, head=chosen_head, opset=opset,
                                   keep_value=keep_value)
        report = None
        if verify:
            report = run_verify(converted.model, reference=converted.reference, samples=samples, low=low,
                                high=high, seed=seed, atol=atol, rtol=rtol)
        if report is not None and not report.passed:
            err.print(f"not writing {output}: the converted model does not match the source")
            return _print_report(report, as_json)
        save_onnx(output, converted.model, force)
        if as_json:
            doc = {"output": str(output), "verification": report.to_dict() if report else None}
            _emit_json(doc)
        else:
            err.print(f"wrote {output}")
            if report is not None:
                out.print(_verification_table(report))
                out.print(_verdict(report))
        return 0

    _guard(as_json, body, "convert")


@app.command()
def extract(
    model: Annotated[Path, typer.Argument(help="An .onnx model.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .npz of weights to write.")],
    force: ForceOpt = False,
) -> None:
    """Write the model's parameters to .npz under the source's names, in the source's layout."""

    def body():
        from .files import check_distinct, check_writable, save_npz
        from .passes import extract_weights

        check_writable(output, force)
        check_distinct(output, model)
        weights = extract_weights(model)
        save_npz(output, weights, force)
        table = Table(title=f"{len(weights)} parameters written to {output}")
        for col in ("name", "dtype", "shape"):
            table.add_column(col)
        for k, v in weights.items():
            table.add_row(k, v.dtype.name, str(tuple(v.shape)))
        out.print(table)

    _guard(False, body)


@app.command()
def expose(
    model: Annotated[Path, typer.Argument(help="An .onnx model (left untouched).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .onnx file to write.")],
    tensors: Annotated[str, typer.Option(help="Comma-separated globs over node-output names.")] = "*",
    force: ForceOpt = False,
) -> None:
    """Write a copy of the model whose intermediate tensors are graph outputs too."""

    def body():
        from .files import check_distinct, check_writable, load_onnx, save_onnx
        from .passes import expose as expose_pass

        check_writable(output, force)
        check_distinct(output, model)
        exposed = expose_pass(load_onnx(model), tensors)
        save_onnx(output, exposed, force)
        out.print(f"wrote {output} with {len(exposed.graph.output)} graph outputs: "
                  + ", ".join(o.name for o in exposed.graph.output))

    _guard(False, body)


@app.command()
def run(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a folder written by 'policyport pack'.")],
    inputs: Annotated[Path, typer.Option("-i", "--input", help=".npy (single-input model) or .npz keyed by input name.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The .npz of graph outputs to write.")],
    backend: Annotated[BackendName, typer.Option(help="Runtime.")] = BackendName.numpy,
    record: Annotated[Optional[Path], typer.Option(help="Also write every recorded activation to this .npz.")] = None,
    tensors: Annotated[Optional[str], typer.Option(help="With --record: comma-separated globs over node-output names (default: all).")] = None,
    force: ForceOpt = False,
) -> None:
    """Run a model on observations; optionally record activations."""

    def body():
        from .files import check_distinct, check_writable, save_npz
        from .runtime import load

        if tensors is not None and record is None:
            raise typer.BadParameter("--tensors selects what --record writes; give --record too", param_hint="--tensors")
        check_writable(output, force)
        check_distinct(output, model, inputs)
        if record is not None:
            if record.resolve() == output.resolve():
                raise InputMismatchError("--record and -o name the same file")
            check_writable(record, force)
            check_distinct(record, model, inputs)
        session = load(str(model), backend=backend.value)
        feeds = _load_feeds(inputs, [v.name for v in session.inputs])
        if record is not None:
            values = session.record(feeds, tensors or "*")
            outputs = {v.name: values[v.name] for v in session.outputs}
        else:
            outputs = session.run(feeds)
        save_npz(output, outputs, force)
        if record is not None:
            save_npz(record, values, force)
        table = Table(title=f"{backend.value}: outputs written to {output}" + (f", {len(values)} tensors to {record}" if record else ""))
        for col in ("tensor", "dtype", "shape", "min", "max"):
            table.add_column(col, justify="right" if col in ("min", "max") else "left")
        for k, v in (values if record is not None else outputs).items():
            lo, hi = (f"{v.min():.4g}", f"{v.max():.4g}") if v.size else ("", "")
            table.add_row(k, v.dtype.name, str(tuple(v.shape)), lo, hi)
        out.print(table)

    _guard(False, body, "run")


@app.command("verify")
def verify_cmd(
    model: Annotated[Path, typer.Argument(help="An .onnx model or a folder written by 'policyport pack'.")],
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", help=".npy or .npz of observations; drawn at random when omitted.")] = None,
    samples: Annotated[Optional[int], typer.Option("--samples", min=1, help="How many observations to draw uniformly from [--low, --high)  [default: 1000]")] = None,
    low: Annotated[Optional[float], typer.Option("--low", help="Lower end of the range observations are drawn from  [default: 0.0]")] = None,
    high: Annotated[Optional[float], typer.Option("--high", help="Upper end of the range observations are drawn from  [default: 1.0]")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the drawn observations  [default: 0]")] = None,
    backends: Annotated[Optional[str], typer.Option(help="Comma-separated backends; the first is the baseline  [default: numpy,onnxruntime]")] = None,
    source: Annotated[Optional[Path], typer.Option(help="The source the model was converted from, as a further reference.")] = None,
    tensors: Annotated[str, typer.Option(help="Comma-separated globs over node-output names to compare (graph outputs always are).")] = "*",
    atol: AtolOpt = 1e-5,
    rtol: RtolOpt = 1e-5,
    as_json: JsonOpt = False,
) -> None:
    """Compare every tensor across backends (and the source); exit 1 on a mismatch."""

    def body():
        from .runtime import BACKENDS
        from .verification import verify as run_verify

        if model.is_dir() and inputs is None and source is None:  # a packed folder: its golden data
            from .bundle import verify_bundle

            given = [f"--{n}" for n, v in (("samples", samples), ("low", low), ("high", high), ("seed", seed),
                                            ("backends", backends)) if v is not None]
            if given or tensors != "*":
                raise typer.BadParameter(
                    f"a packed folder is checked on the numpy backend against its own golden data, so "
                    f"{', '.join(given + (['--tensors'] if tensors != '*' else []))} do not apply; "
                    "give -i or --source to compare backends on other observations", param_hint="MODEL")
            return _print_report(verify_bundle(model, atol=atol, rtol=rtol), as_json)
        backend_list = backends if backends is not None else "numpy,onnxruntime"
        names = [b.strip() for b in backend_list.split(",") if b.strip()]
        unknown = [b for b in names if b not in BACKENDS]
        if unknown or not names:
            raise typer.BadParameter(f"{unknown or backend_list!r}; choose from {', '.join(BACKENDS)}", param_hint="--backends")
        if len(set(names)) < 2 and source is None:
            raise typer.BadParameter("name two backends, or give --source, to have something to compare", param_hint="--backends")
        lo, hi = (0.0 if low is None else low), (1.0 if high is None else high)
        if not lo < hi:
            raise typer.BadParameter(f"--low {lo} must be below --high {hi}", param_hint="--low/--high")
        feeds = None
        if inputs is not None:
            feeds = _load_feeds(inputs, _input_names(model))
        report = run_verify(str(model), feeds, backends=names, source=source,
                            samples=1000 if samples is None else samples, low=lo, high=hi,
                            seed=0 if seed is None else seed, atol=atol, rtol=rtol, tensors=tensors)
        return _print_report(report, as_json)

    _guard(as_json, body, "verify", source)


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(help="An .onnx model, a packed folder, or a source (converted in memory with defaults).")],
    as_json: JsonOpt = False,
) -> None:
    """Layers, shapes, dtypes, parameter counts, ops, opset, and ops the numpy backend lacks."""

    def body():
        from .files import load_onnx
        from .summary import format_shape, summarize

        if model.is_dir() or model.suffix == ".onnx" or not model.exists():  # a packed folder: its model.onnx
            proto = load_onnx(model)
        else:
            from .converter import convert

            proto = convert(model)
        s = summarize(proto)
        if as_json:
            _emit_json(s)
            return
        out.print(f"opset {s['opset']}, IR {s['ir_version']}, producer {s['producer'] or '?'}")
        for kind in ("inputs", "outputs"):
            out.print(f"{kind}: " + ", ".join(f"{v['name']} {v['dtype']}{format_shape(v['shape'])}" for v in s[kind]))
        table = Table(title=f"{len(s['nodes'])} nodes, {s['parameter_count']:,} parameters")
        for col in ("node", "op", "output", "dtype", "shape", "parameters"):
            table.add_column(col, justify="right" if col == "parameters" else "left")
        for n in s["nodes"]:
            for i, o in enumerate(n["outputs"]):
                table.add_row(n["name"] if i == 0 else "", n["op_type"] if i == 0 else "", o["name"],
                              o["dtype"] or "?", format_shape(o["shape"]),
                              f"{n['parameter_count']:,}" if i == 0 and n["parameters"] else "")
        out.print(table)
        out.print("ops: " + ", ".join(s["ops"]))
        lacks = s["numpy_backend_lacks"]
        out.print("numpy backend lacks: " + (", ".join(lacks) if lacks else "nothing (runs on --backend numpy)"))

    _guard(as_json, body)


@app.command()
def pack(
    model: Annotated[Path, typer.Argument(help="An .onnx model.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The bundle folder to write.")],
    samples: Annotated[int, typer.Option("--samples", min=1, help="Golden observations to record.")] = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    source: Annotated[Optional[Path], typer.Option(help="The source the model was converted from; its parity is recorded too.")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a folder that runs and verifies itself with numpy alone (model, weights, graph.json, golden data)."""

    def body():
        from .bundle import pack as run_pack
        from .bundle import read_policy

        folder = run_pack(model, output, samples=samples, low=low, high=high, seed=seed, force=force, source=source)
        policy = read_policy(folder)
        if as_json:
            _emit_json({"output": str(folder), "policy": policy})
            return
        parity = policy["parity"]
        err.print(f"wrote {folder}")
        table = Table(title=f"{folder}: runs with numpy alone")
        table.add_column("file")
        table.add_column("sha256")
        for name, digest in policy["files"].items():
            table.add_row(name, digest)
        out.print(table)
        out.print(f"golden data: {samples} observations, {parity['tensors']} tensors each; "
                  f"onnxruntime vs numpy max abs {parity['onnxruntime_vs_numpy_max_abs']:.3g}")

    _guard(as_json, body, "pack", source)


@app.command()
def ops(
    as_json: JsonOpt = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table (the README's op list).")] = False,
) -> None:
    """The ONNX ops the numpy backend implements, with the opset versions each implementation starts at."""
    from .runtime.numpy.registry import op_table_markdown, supported_ops

    if as_json and markdown:
        raise typer.BadParameter("choose one of --json and --markdown", param_hint="--json/--markdown")
    table = supported_ops()
    if as_json:
        _emit_json(table)
    elif markdown:
        print(op_table_markdown(), end="")
    else:
        t = Table(title=f"{len(table)} ONNX ops on the numpy backend (default domain)")
        t.add_column("op")
        t.add_column("implementations since opset")
        for name, since in table.items():
            t.add_row(name, ", ".join(map(str, since)))
        out.print(t)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
