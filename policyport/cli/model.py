"""Commands that look at a model or take it apart: ``inspect``, ``extract``, ``expose``, ``ops``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ..verification.compare import source_lines
from .core import app, emit_json, guard
from .options import (
    ForceOpt,
    InputDtypeOpt,
    InputShapeOpt,
    JsonOpt,
    ModelArg,
    TrustOpt,
    check_onnx_output,
    check_output_format,
    given_path,
    tensor_patterns,
)
from .render import add_row, counted, literal, out, say, shape_text, table


#: The most node rows ``inspect`` draws on a terminal; a pipe or a file gets every row.
TERMINAL_ROWS = 200


@app.command()
def inspect(
    model: Annotated[Path, typer.Argument(metavar="MODEL", parser=given_path, help="An .onnx model, a folder written by 'policyport pack', or a source to convert in memory with the defaults of 'policyport convert'.")],
    trust: TrustOpt = False,
    input_shape: InputShapeOpt = None,
    input_dtype: InputDtypeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Layers, shapes, dtypes, parameter counts, ops, opset, and ops the numpy backend lacks."""

    def body():
        from .convert import parse_dtypes, parse_shapes

        from ..errors import BadModelError
        from ..io.kinds import file_kind
        from ..graph.onnx_files import load_onnx
        from ..verification.summary import format_shape, summarize

        bundle = model.is_dir() and any(os.path.lexists(model / n) for n in ("policy.json", "model.onnx"))
        torch_inputs = {k: v for k, v in (("input_shape", parse_shapes(input_shape)),
                                          ("input_dtypes", parse_dtypes(input_dtype))) if v is not None}
        if bundle or model.suffix == ".onnx" or not model.exists():
            if torch_inputs:
                raise typer.BadParameter(f"{model} is a model already; --input-shape and --input-dtype are for a torch "
                                         "module converted in memory", param_hint="--input-shape")
            proto = load_onnx(model)
        else:
            from ..converter import FILE_KINDS, UnknownKindError

            try:
                proto = _convert_for_inspect(model, trust, **torch_inputs)
            except UnknownKindError:
                kind = file_kind(model)  # a source named unlike its kind, told from its contents
                if kind is not None and kind.source is not None:
                    proto = _convert_for_inspect(model, trust, kind=kind.source, **torch_inputs)
                else:
                    raise BadModelError(
                        f"{model} is not an .onnx model, a folder written by 'policyport pack', or a policy source whose "
                        f"kind policyport can tell from its name; convert a source of another name with 'policyport "
                        f"convert {model} --from KIND -o MODEL.onnx' ({', '.join(FILE_KINDS)}) and inspect MODEL.onnx"
                    ) from None
        s = summarize(proto)
        if as_json:
            emit_json(s)
            return
        out.print(literal(f"opset {s['opset']}, IR {s['ir_version']}, producer {s['producer'] or '?'}"))
        for kind in ("inputs", "outputs"):
            out.print(literal(f"{kind}: " + ", ".join(f"{v['name']} {v['dtype']}{format_shape(v['shape'])}" for v in s[kind])))
        if s["batch_note"]:
            out.print(literal(s["batch_note"]))
        t = table(f"{len(s['nodes']):,} nodes, {s['parameter_count']:,} parameters",
                  ["node", "op", "output", "dtype", "shape", ("parameters", "right")])
        rows = [[n["name"] if i == 0 else "", n["op_type"] if i == 0 else "", o["name"], o["dtype"] or "?",
                 format_shape(o["shape"]), f"{n['parameter_count']:,}" if i == 0 and n["parameters"] else ""]
                for n in s["nodes"] for i, o in enumerate(n["outputs"])]
        hidden = 0
        if out.is_terminal and len(rows) > TERMINAL_ROWS:  # a screenful, not minutes of drawing a huge graph
            head, tail = TERMINAL_ROWS - TERMINAL_ROWS // 10, TERMINAL_ROWS // 10
            hidden = len(rows) - head - tail
            rows = [*rows[:head], ["…"] * 6, *rows[-tail:]]
        for row in rows:
            add_row(t, *row)
        out.print(t)
        if hidden:
            say(f"{hidden:,} of {hidden + TERMINAL_ROWS:,} rows not shown on a terminal; a pipe, a file or --json "
                "gets every node")
        dropped = [p for p in s["parameters"] if p["initializer"] is None]
        if dropped:
            say(f"{counted(sum(p['size'] for p in dropped), 'parameter')} in all-zero arrays the graph does not hold "
                f"(the exporter dropped them; extract writes them back): {', '.join(p['name'] for p in dropped)}")
        out.print(literal("ops: " + ", ".join(s["ops"])))
        lacks, refusal = s["numpy_backend_lacks"], s["numpy_backend_refusal"]
        if lacks or refusal is None:
            out.print(literal("numpy backend lacks: " + (", ".join(lacks) if lacks else "nothing (runs on --backend numpy)")))
        else:
            out.print(literal(f"numpy backend lacks no op, but refuses the model: {refusal}"))
        from ..graph.model import recorded_assumptions

        for line in source_lines(None, recorded_assumptions(s["metadata"]) or []):
            out.print(literal(line))

    guard(as_json, body)


@app.command()
def extract(
    model: ModelArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="OUT.npz", help="The .npz of weights to write.")],
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the model's parameters to .npz under the source's names, in the source's layout."""

    def body():
        from ..io.outputs import check_distinct, check_writable, weights_comment
        from ..io.arrays import save_npz
        from ..graph.onnx_files import ensure_model
        from ..graph.passes import extract_weights, folded_stds

        check_output_format(output, ".npz")
        check_writable(output, force)
        check_distinct(output, model)
        proto = ensure_model(model)
        weights = extract_weights(proto)
        folds = folded_stds(proto)
        save_npz(output, weights, force, weights_comment("policyport extract"))  # stats and plot refuse it by that
        if as_json:
            emit_json({"output": str(output), "parameters": [{"name": k, "dtype": v.dtype.name, "shape": list(v.shape)}
                                                             for k, v in weights.items()],
                       "folded": [{"initializer": f.initializer, "is": f"{f.source_name} + {f.epsilon:g}",
                                   "written_as": f.source_name if f.std is not None else f.initializer,
                                   "bit_exact": f.std is not None, "ambiguous": f.ambiguous, "size": f.size,
                                   "note": f.describe()} for f in folds]})
            return
        t = table(f"{counted(len(weights), 'parameter')} written to {output}", ["name", "dtype", "shape"])
        for k, v in weights.items():
            add_row(t, k, v.dtype.name, shape_text(v.shape))
        out.print(t)
        for f in folds:
            say(f.describe())

    guard(as_json, body)


@app.command()
def expose(
    model: Annotated[Path, typer.Argument(metavar="MODEL", parser=given_path, help="An .onnx model or a folder written by 'policyport pack' (left untouched).")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="OUT.onnx", help="The .onnx file to write.")],
    tensors: Annotated[str, typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over node-output names.")] = "*",
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a copy of the model whose intermediate tensors are graph outputs too."""

    def body():
        from ..io.outputs import check_distinct, check_writable
        from ..graph.onnx_files import load_onnx, save_onnx
        from ..graph.model import from_onnx
        from ..runtime.expose import expose as expose_pass
        from ..verification.summary import format_shape

        check_onnx_output(output)
        check_writable(output, force)
        check_distinct(output, model)
        exposed = expose_pass(load_onnx(model), tensors)
        save_onnx(output, exposed, force)
        described = [v.to_dict() for v in from_onnx(exposed).outputs]
        if as_json:
            emit_json({"output": str(output), "outputs": described})
            return
        say(f"wrote {output}")
        t = table(f"{len(described)} graph outputs of {output}", ["tensor", "dtype", "shape"])
        for v in described:
            add_row(t, v["name"], v["dtype"] or "?", format_shape(v["shape"]))
        out.print(t)

    guard(as_json, body)


@app.command()
def ops(
    as_json: JsonOpt = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print a Markdown table (the README's op list).")] = False,
) -> None:
    """The ONNX ops the numpy backend implements, with the opset versions each implementation starts at."""

    def body():
        from ..runtime.numpy.registry import op_table_markdown, supported_ops

        if as_json and markdown:
            raise typer.BadParameter("choose one of --json and --markdown", param_hint="--json/--markdown")
        registered = supported_ops()
        if as_json:
            emit_json(registered)
        elif markdown:
            print(op_table_markdown(), end="")
        else:
            t = table(f"{len(registered)} ONNX ops on the numpy backend (default domain)", ["op", "implementations since opset"])
            for name, since in registered.items():
                add_row(t, name, ", ".join(map(str, since)))
            out.print(t)

    guard(as_json, body)


def _convert_for_inspect(model: Path, trust: bool, **given):
    """``model`` converted with ``convert``'s defaults; where the file does not settle an option that
    ``convert`` requires (the activation, a head, a distribution), with a stand-in for it under which
    the layers and their shapes show, saying so: the graph is inspected, not offered as the policy.

    Raises:
        the conversion's errors, an :class:`~policyport.errors.OptionNeeded` among them when its stand-in
        does not settle it either.
    """
    from ..converter import convert_source
    from ..converter.options import flag_list
    from ..errors import OptionNeeded

    stand_ins: dict[str, str] = {}
    while True:
        try:
            proto = convert_source(model, trust=trust, **given, **stand_ins).model
            break
        except OptionNeeded as e:
            if e.field in stand_ins or e.placeholder() is None:
                raise
            stand_ins[e.field] = e.placeholder()
    if list(stand_ins) == ["activation"]:  # the layers and their shapes do not depend on it
        say(f"{model} does not record its activation: its layers are shown without one "
            "('policyport convert' needs --activation)")
    elif stand_ins:
        shown = ", ".join(f"{flag_list([k])} {v}" for k, v in stand_ins.items())
        say(f"{model} does not record what {flag_list(stand_ins)} settle: its layers are shown with {shown}, "
            f"which may not be the policy's ('policyport convert' needs {flag_list(stand_ins)})")
    return proto
