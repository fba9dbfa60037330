"""``policyport pack``: a folder that runs and verifies itself with numpy alone."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..verification.compare import source_lines
from .core import app, emit_json, guard
from .inputs import graph_inputs, load_feeds, warn_of_nonfinite_rows
from .options import (
    AtolOpt,
    ForceOpt,
    HighOpt,
    JsonOpt,
    LowOpt,
    ModelArg,
    RoundingOpt,
    RtolOpt,
    SeedOpt,
    TrustOpt,
    check_range,
    drawing_advice,
    given_path,
    given_options,
)
from .render import add_row, counted, fits, literal, out, say, table


@app.command()
def pack(
    ctx: typer.Context,
    model: ModelArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="DIR", help="The bundle folder to write.")],
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", parser=given_path, metavar="OBS", help="The golden observations (.npy, or .npz keyed by graph input); drawn at random when omitted.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Golden observations to draw (with -i, how many of the file's first rows to use).")] = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    source: Annotated[Optional[Path], typer.Option(metavar="SRC", parser=given_path, help="The source the model was converted from; its parity is recorded too.")] = None,
    trust: TrustOpt = False,
    no_runtime: Annotated[bool, typer.Option("--no-runtime", help="Leave out run.py and the numpy runtime (for targets that install policyport).")] = False,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    rounding: RoundingOpt = True,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a folder that runs and verifies itself with numpy alone (model, weights, graph.json, golden data,
    and run.py with the numpy runtime it needs)."""

    def body():
        from ..handoff.pack import pack as run_pack
        from ..runtime.packed import read_policy

        check_range(low, high)
        feeds = None
        if inputs is not None:
            from ..graph.onnx_files import load_onnx
            from ..graph.model import from_onnx
            from ..verification.verify import first_rows

            drawn = given_options(ctx, "low", "high", "seed")
            if drawn:
                raise typer.BadParameter(f"-i gives the golden observations, so {', '.join(drawn)} (which shape random "
                                         "draws) do not apply; --samples N takes the first N rows of the file", param_hint="-i")
            proto = load_onnx(model)
            feeds = load_feeds(inputs, graph_inputs(proto))
            if given_options(ctx, "samples"):
                feeds = first_rows(from_onnx(proto).inputs, feeds, samples)
            warn_of_nonfinite_rows(feeds)  # they become golden data as they are
        with drawing_advice("pack", takes_inputs=True):
            folder = run_pack(model, output, samples=samples, low=low, high=high, seed=seed, force=force, source=source,
                              trust=trust, runtime=not no_runtime, atol=atol, rtol=rtol, rounding=rounding, inputs=feeds)
        policy = read_policy(folder)
        if as_json:
            emit_json({"output": str(folder), "policy": policy})
            return
        parity, runtime = policy["parity"], policy.get("runtime")
        say(f"wrote {folder}")
        rows = [(name, digest) for name, digest in policy["files"].items() if runtime is None or "/" not in name]
        if runtime is not None:
            count = sum("/" in name for name in policy["files"])
            rows.append((f"{runtime['package']}/ ({count} files)", f"{runtime['digest']} (runtime digest)"))
        for short in (False, True):  # whole digests when they fit, else their first 16 hex digits
            t = table(f"{folder}: runs with numpy alone" if runtime is not None else
                      f"{folder}: runs where policyport is installed (its core needs numpy alone)", ["file", "sha256" + (" (prefix; whole in policy.json)" if short else "")])
            for name, digest in rows:
                add_row(t, name, digest[:16] + "…" + digest[64:] if short else digest)
            if fits(t):
                break
        out.print(t)
        if runtime is not None:
            names = [i["name"] for i in policy["inputs"]]
            feeds = "OBS.npy" if len(names) == 1 else f"FEEDS.npz (one array per input: {', '.join(names)})"
            out.print(literal(f"on the target: python {folder}/run.py -i {feeds} -o ACTIONS.npz, or --verify "
                              f"(Python {runtime['requires_python']} and numpy alone)"))
        count = policy["golden"]["samples"]
        out.print(literal(f"golden data: {counted(count, 'observation')}, {counted(parity['tensors'], 'tensor')} "
                          f"each; onnxruntime vs numpy max abs {parity['onnxruntime_vs_numpy_max_abs']:.3g}"
                          + ("" if parity.get("source_vs_numpy_max_abs") is None else
                             f"; source vs numpy max abs {parity['source_vs_numpy_max_abs']:.3g}")))
        if count != samples and feeds is None:
            say(f"the inputs have no batch axis: {count} observation, not the {samples} asked")
        for r in parity["rounding"]:
            out.print(literal(f"{r['tensor']} ({r['candidate']} vs {r['reference']}): {r['max_abs']:.2g}, {r['dtype']} "
                              f"rounding: {r['candidate']} {r['candidate_vs_float64']:.2g} and {r['reference']} "
                              f"{r['reference_vs_float64']:.2g} from a float64 run"))
        for skipped in parity["skipped"]:
            out.print(literal(f"not compared: {skipped['tensor']} ({skipped['reason']})"))
        for line in source_lines(parity.get("source_oracle"), parity.get("assumptions") or []):
            out.print(literal(line))

    guard(as_json, body, "pack", source)

