"""``policyport convert``: a source to ONNX, verified against the source before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .core import app, emit_json, guard
from .inputs import graph_inputs, load_feeds
from .options import (
    AtolOpt,
    ForceOpt,
    ActionBoundMethodOpt,
    ActionBoundsOpt,
    DistributionOpt,
    FilterOpt,
    HighOpt,
    InputDtypeOpt,
    InputShapeOpt,
    JsonOpt,
    KeepValueOpt,
    LowOpt,
    ObsNormOpt,
    PolicyIdOpt,
    RtolOpt,
    SeedOpt,
    TrustOpt,
    WeightsDtypeOpt,
    check_onnx_output,
    check_range,
    drawing_advice,
    given_options,
    given_path,
)
from .render import say
from .verify import print_report
from ..converter.kinds import FILE_KINDS

#: The file source kinds as --from's help lists them.
_KIND_LIST = ", ".join(FILE_KINDS[:-1]) + " or " + FILE_KINDS[-1]


def check_convert_options(kind, activation, head, opset, exporter) -> str | None:
    """Option values the library would refuse, refused here as usage errors (exit 2)."""
    from ..converter import HEADS, KINDS, MIN_OPSET
    from ..converter.activations import parse_activation
    from ..errors import BadModelError, require

    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"{kind!r}; choose one of {', '.join(KINDS)}", param_hint="--from")
    if kind == "torch":
        raise typer.BadParameter("'torch' is a live nn.Module, given through the Python API (pp.convert(module)); "
                                 "for a file use torchscript, state-dict, or --trust with a whole pickled module",
                                 param_hint="--from")
    if activation is not None:
        try:
            for one in activation.split(","):  # one per parameter-free module of an nn.Sequential state_dict
                parse_activation(one)
        except BadModelError as e:
            raise typer.BadParameter(str(e), param_hint="--activation") from None
    if head is not None and head not in (*HEADS, "none"):
        raise typer.BadParameter(f"{head!r}; choose one of none, {', '.join(HEADS)}", param_hint="--head")
    newest = require("onnx", "onnx", "converting a policy").defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise typer.BadParameter(f"{opset}; policyport builds opset {MIN_OPSET} to {newest}", param_hint="--opset")
    if exporter not in EXPORTERS:
        raise typer.BadParameter(f"{exporter!r}; choose one of {', '.join(EXPORTERS)}", param_hint="--exporter")


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"2,3"`` -> ``(2, 3)``; a usage error (exit 2) unless positive integers."""
    if text is None:
        return None
    dims = [d.strip() for d in text.replace("x", ",").split(",")]
    if not all(d.isdigit() and int(d) > 0 for d in dims):
        raise typer.BadParameter(f"{text!r}; give positive integers separated by commas, e.g. 2,3", param_hint="--input-shape")
    return tuple(int(d) for d in dims)


def _named(texts: list[str], flag: str, example: str) -> dict[str, str]:
    """``["obs=8", "action_mask=4"]`` -> ``{"obs": "8", "action_mask": "4"}``; a usage error unless
    every text is NAME=VALUE with distinct names."""
    named: dict[str, str] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise typer.BadParameter(f"{text!r}; give NAME=VALUE for each input of the module's forward, e.g. "
                                     f"{example}", param_hint=flag)
        if name.strip() in named:
            raise typer.BadParameter(f"input {name.strip()!r} is given twice", param_hint=flag)
        named[name.strip()] = value.strip()
    return named


def parse_shapes(texts: list[str] | None) -> tuple[int, ...] | dict[str, tuple[int, ...]] | None:
    """``--input-shape`` as given: ``["2,3"]`` -> ``(2, 3)`` (the one observation), or one per
    ``forward`` parameter, ``["obs=8", "action_mask=4"]`` -> ``{"obs": (8,), "action_mask": (4,)}``;
    a usage error (exit 2) for anything else."""
    if not texts:
        return None
    if len(texts) == 1 and "=" not in texts[0]:
        return parse_shape(texts[0])
    named = _named(texts, "--input-shape", "--input-shape obs=8 --input-shape action_mask=4")
    return {name: parse_shape(value) for name, value in named.items()}


def parse_dtypes(texts: list[str] | None) -> dict[str, str] | None:
    """``--input-dtype`` as given: ``["action_mask=bool"]`` -> ``{"action_mask": "bool"}``; a usage
    error (exit 2) unless NAME=DTYPE with a dtype of :data:`~policyport.converter.options.INPUT_DTYPES`."""
    from ..converter.options import INPUT_DTYPES

    if not texts:
        return None
    named = _named(texts, "--input-dtype", "--input-dtype action_mask=bool")
    for name, dtype in named.items():
        if dtype not in INPUT_DTYPES:
            raise typer.BadParameter(f"{name}={dtype}; choose one of {', '.join(INPUT_DTYPES)}", param_hint="--input-dtype")
    return named


def parse_bounds(text: str | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``"-1:1"`` -> ``((-1.0,), (1.0,))``, ``"-1,-2:1,2"`` -> ``((-1.0, -2.0), (1.0, 2.0))``; a usage
    error unless LOW:HIGH of numbers."""
    if text is None:
        return None
    try:
        low, high = text.split(":")
        return tuple(tuple(float(v) for v in side.split(",")) for side in (low, high))
    except ValueError:
        raise typer.BadParameter(f"{text!r}; give LOW:HIGH, each one number or one per action dimension separated by "
                                 "commas, e.g. -1:1 or -1,-2:1,2", param_hint="--action-bounds") from None


def parse_names(text: str | None) -> tuple[str, ...] | None:
    """``"mean,value"`` -> ``("mean", "value")``; a usage error unless non-empty and distinct."""
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise typer.BadParameter(f"{text!r}; give distinct, non-empty names separated by commas", param_hint="--output-names")
    return names


#: Exporters for live torch modules (``--exporter``).
EXPORTERS = ("torchscript", "dynamo")


@app.command()
def convert(
    ctx: typer.Context,
    src: Annotated[Path, typer.Argument(metavar="SRC", parser=given_path, help="The trained policy: a file, a folder (RLlib checkpoint, TF SavedModel) or an .npz of weights.")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="OUT.onnx", help="The .onnx file to write.")],
    kind: Annotated[Optional[str], typer.Option("--from", metavar="KIND", help=f"Source kind: {_KIND_LIST} (see 'Sources' in the README)  [default: detected from SRC's name and layout]")] = None,
    activation: Annotated[Optional[str], typer.Option(metavar="NAME[,NAME...]", help="Hidden activation where the source does not record it (an .npz, a state_dict: required there): tanh, relu, elu, selu, swish/silu, softplus, leaky_relu[:slope], gelu, mish, hardswish, sigmoid, linear; an nn.Sequential state_dict takes one per parameter-free module, comma-separated (tanh,tanh when they are all tanh)  [default: the source's own]")] = None,
    head: Annotated[Optional[str], typer.Option(metavar="NAME", help="Action head: none (logits only, no action), diag-gaussian (adds action = mean, log_std, where the source says where the log_std is: a log_std parameter, or RLlib's layout), diag-gaussian:halves (states that the last layer's outputs are [mean, log_std] halves) or categorical (adds action = argmax); a source whose head is fixed (an SB3 zip, a torch module) refuses every value  [default: the source's own]")] = None,
    opset: Annotated[int, typer.Option(metavar="N", help="ONNX opset of the default domain.")] = 17,
    exporter: Annotated[str, typer.Option(metavar="NAME", help="For torch modules: torchscript or dynamo (torch.onnx.export's two exporters).")] = "torchscript",
    policy_id: PolicyIdOpt = None,
    keep_value: KeepValueOpt = False,
    obs_filter: FilterOpt = True,
    obs_norm: ObsNormOpt = None,
    trust: TrustOpt = False,
    input_shape: InputShapeOpt = None,
    input_dtype: InputDtypeOpt = None,
    output_names: Annotated[Optional[str], typer.Option("--output-names", metavar="NAME[,NAME...]", help="Comma-separated names for a torch module's outputs, in the order it returns them  [default: logits, or output_<i>, or the dict keys]")] = None,
    action_bounds: ActionBoundsOpt = None,
    action_bound_method: ActionBoundMethodOpt = None,
    distribution: DistributionOpt = None,
    weights_dtype: WeightsDtypeOpt = "keep",
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check the result against the source before writing it.")] = True,
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", parser=given_path, metavar="OBS", help="Observations to check the result on (.npy, or .npz keyed by graph input); drawn at random when omitted.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="How many observations to draw uniformly from [--low, --high) (integer inputs: from the range the source records); with -i, how many of the file's first rows to use.")] = 1000,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Convert a trained policy to ONNX, verify it against the source, then write it."""

    def body():
        from ..converter import ConvertOptions, convert_source
        from ..io.outputs import check_distinct, check_writable
        from ..graph.onnx_files import save_onnx
        from ..verification.verify import verify as run_verify

        check_convert_options(kind, activation, head, opset, exporter)
        unchecked = (["-i"] * (inputs is not None) + given_options(ctx, "samples", "low", "high", "seed", "atol", "rtol")
                     if not verify else [])
        if inputs is not None and not unchecked:
            drawn = given_options(ctx, "low", "high", "seed")
            if drawn:
                raise typer.BadParameter(f"-i gives the observations, so {', '.join(drawn)} (which shape random draws) "
                                         "do not apply; --samples N takes the first N rows of the file", param_hint="-i")
        if unchecked:
            raise typer.BadParameter(f"--no-verify skips the check against the source that {', '.join(unchecked)} "
                                     "would shape; drop one or the other", param_hint="--no-verify")
        check_range(low, high)
        check_onnx_output(output)
        check_writable(output, force)
        check_distinct(output, src, obs_norm, inputs)
        options = ConvertOptions(activation=activation, head=head, opset=opset, keep_value=keep_value,
                                 exporter=exporter, policy_id=policy_id, obs_filter=obs_filter,
                                 obs_norm=None if obs_norm is None else str(obs_norm), trust=trust,
                                 input_shape=parse_shapes(input_shape), input_dtypes=parse_dtypes(input_dtype),
                                 output_names=parse_names(output_names),
                                 action_bounds=parse_bounds(action_bounds), action_bound_method=action_bound_method,
                                 distribution=distribution, weights_dtype=weights_dtype)
        converted = convert_source(src, kind=kind, options=options)
        for note in converted.notes:
            say(note)
        if not verify:  # the verification report names them otherwise
            for assumption in converted.assumptions:
                say(f"assumed, not in {src.name}: {assumption}")
        report = None
        if verify:
            feeds = None if inputs is None else load_feeds(inputs, graph_inputs(converted.model))
            with drawing_advice("convert", takes_inputs=True):
                report = run_verify(converted.model, feeds, reference=converted.reference,
                                    reference_oracle=converted.oracle,
                                    samples=samples if inputs is None or given_options(ctx, "samples") else None,
                                    low=low, high=high, seed=seed, atol=atol, rtol=rtol)
        if report is not None and not report.passed:
            say(f"not writing {output}: the converted model does not match the source")
            return print_report(report, as_json)
        save_onnx(output, converted.model, force)
        if as_json:
            emit_json({"output": str(output), "kind": converted.kind, "notes": converted.notes,
                       "assumptions": [a.to_dict() for a in converted.assumptions],
                       "source_oracle": converted.oracle.to_dict(),
                       "verification": report.to_dict() if report else None})
        else:
            say(f"wrote {output}")
            if report is not None:
                print_report(report, as_json=False)
        return 0

    guard(as_json, body, "convert")
