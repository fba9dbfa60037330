"""``policyport patch`` and ``direction``: activation patching and steering directions."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from .core import app, emit_json, guard
from .options import ForceOpt, JsonOpt, ModelArg, QuietOpt, ThreadsOpt, check_output_format, given_path, tensor_patterns
from .render import add_row, out, say, table


class Backend(str, Enum):
    numpy = "numpy"
    onnxruntime = "onnxruntime"


BackendOpt = Annotated[Backend, typer.Option(metavar="[numpy|onnxruntime]", help="Runtime.")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", metavar="NAME", help="The floating graph output to report 'restored' on (every floating one is measured)  [default: action if the model has a floating one, else the first]")]


def _plot_path(plot: Path | None, force: bool) -> None:
    from ..io.outputs import check_writable

    if plot is not None:
        check_output_format(plot, ".png", "--plot")
        check_writable(plot, force)


@app.command()
def patch(
    model: ModelArg,
    clean: Annotated[Path, typer.Option("--clean", metavar="A", parser=given_path, help="Clean observations (.npy, or .npz keyed by input name): the activations patched in.")],
    corrupt: Annotated[Path, typer.Option("--corrupt", metavar="B", parser=given_path, help="Corrupt observations, as many as A (or A holds one): the run patched.")],
    tensors: Annotated[str, typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over node-output names to patch.")] = "*",
    per_neuron: Annotated[bool, typer.Option("--per-neuron", help="Also patch each neuron (last-axis position) alone: one run per neuron.")] = False,
    output: OutputOpt = None,
    backend: BackendOpt = Backend.numpy,
    plot: Annotated[Optional[Path], typer.Option(metavar="OUT.png", parser=given_path, help="Write a heat map of the fractions restored (tensor × neuron with --per-neuron, else tensor × output).")] = None,
    threads: ThreadsOpt = 0,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Activation patching: per tensor (and neuron), the fraction of the clean-vs-corrupt output difference it restores."""

    def body():
        from ..analysis.patching import activation_patching, patching_png
        from ..io.outputs import write_outputs
        from ..runtime import load
        from .analysis import progress_bar
        from .inputs import load_feeds

        _plot_path(plot, force)
        session = load(str(model), backend=backend.value, threads=threads)
        names = [v.name for v in session.inputs]
        a, b = load_feeds(clean, names), load_feeds(corrupt, names)
        with progress_bar("patching", quiet or as_json) as callback:
            result = activation_patching(session, a, b, tensors, per_neuron=per_neuron, output=output,
                                         progress=None if callback is None else callback)
        if plot is not None:
            write_outputs({plot: patching_png(result)}, force)
        if as_json:
            emit_json({**result.to_dict(), "clean": str(clean), "corrupt": str(corrupt),
                       "plot": None if plot is None else str(plot)})
            return
        columns = ["tensor", ("restored", "right")] + [(f"on {o}", "right") for o in result.outputs if o != result.output]
        if per_neuron:
            columns.append("neurons restoring most")
        t = table(f"{backend.value}: fraction of the {result.output} difference (norm "
                  f"{result.difference[result.output]:.4g}) restored by patching from {clean} into {corrupt}", columns)
        for r in result.tensors:
            cells = [r.name, f"{r.restored[result.output]:.4f}"]
            cells += [f"{r.restored[o]:.4f}" for o in result.outputs if o != result.output]
            if per_neuron:
                import numpy as np

                scores = r.neurons[result.output]
                top = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")[:5]
                cells.append(", ".join(f"{i} ({scores[i]:.3f})" for i in top))
            add_row(t, *cells)
        out.print(t)
        if result.skipped:
            say(f"not patched (no row per observation): {', '.join(result.skipped)}")
        if plot is not None:
            say(f"heat map written to {plot}")

    guard(as_json, body, "patch")


def _alphas(value: Optional[str]) -> Optional[list[float]]:
    """``--alphas``' parser: comma-separated finite numbers."""
    import math

    if value is None:
        return None
    try:
        numbers = [float(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a comma-separated list of numbers", param_hint="--alphas") from None
    if not numbers or not all(math.isfinite(x) for x in numbers):
        raise typer.BadParameter(f"{value!r}: give finite numbers, e.g. -2,-1,0,1,2", param_hint="--alphas")
    return numbers


@app.command()
def direction(
    recording_a: Annotated[Path, typer.Argument(metavar="REC_A", parser=given_path, help="A recording (policyport record or run --record).")],
    recording_b: Annotated[Path, typer.Argument(metavar="REC_B", parser=given_path, help="Another recording of the same model.")],
    tensor: Annotated[str, typer.Option("--tensor", metavar="T", help="The tensor: the direction is its mean over REC_A minus its mean over REC_B.")],
    out_path: Annotated[Path, typer.Option("-o", "--output", metavar="DIR.npy", parser=given_path, help="The .npy to write the direction to.")],
    model: Annotated[Optional[Path], typer.Option("--model", metavar="MODEL", parser=given_path, help="With --alphas: the model to steer.")] = None,
    inputs: Annotated[Optional[Path], typer.Option("-i", "--input", metavar="OBS", parser=given_path, help="With --alphas: the observations to run.")] = None,
    alphas: Annotated[Optional[str], typer.Option("--alphas", metavar="A,B,...", help="Run --model on -i with alpha × the direction added to T, for each alpha; report the output's mean.")] = None,
    output: Annotated[Optional[str], typer.Option("--measure", metavar="NAME", help="With --alphas: the floating graph output to measure  [default: action if the model has it, else the first]")] = None,
    plot: Annotated[Optional[Path], typer.Option(metavar="OUT.png", parser=given_path, help="With --alphas: write the output versus alpha.")] = None,
    backend: BackendOpt = Backend.numpy,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """A steering direction from two recordings (difference of mean activations), and the action along it."""

    def body():
        from ..analysis.directions import alpha_sweep, mean_difference, npy_writer, sweep_png
        from ..io.outputs import check_distinct, check_writable, write_outputs

        strengths = _alphas(alphas)
        sweep_given = [o for o, v in (("--model", model), ("-i", inputs)) if v is not None]
        if strengths is None and (sweep_given or plot is not None or output is not None):
            raise typer.BadParameter(f"{', '.join(sweep_given + (['--plot'] if plot else []) + (['--measure'] if output else []))} "
                                     "go with --alphas, which runs the model along the direction", param_hint="--alphas")
        if strengths is not None and (model is None or inputs is None):
            raise typer.BadParameter("--alphas runs a model on observations: give --model MODEL and -i OBS", param_hint="--alphas")
        check_output_format(out_path, ".npy", "-o")
        check_writable(out_path, force)
        check_distinct(out_path, recording_a, recording_b)
        _plot_path(plot, force)
        if plot is not None and plot.resolve() == out_path.resolve():
            raise typer.BadParameter("--plot and -o name the same file", param_hint="--plot")
        found = mean_difference(recording_a, recording_b, tensor)
        sweep = None
        if strengths is not None:
            from ..runtime import load
            from .inputs import load_feeds

            session = load(str(model), backend=backend.value)
            feeds = load_feeds(inputs, [v.name for v in session.inputs])
            sweep = alpha_sweep(session, feeds, tensor, found.vector, strengths, output=output)
        writers = {out_path: npy_writer(found.vector)}
        if plot is not None:
            writers[plot] = sweep_png(sweep, tensor)
        write_outputs(writers, force)
        means = None if sweep is None else sweep.mean()
        if as_json:
            emit_json({"tensor": tensor, "output_file": str(out_path), "shape": list(found.vector.shape),
                       "dtype": found.vector.dtype.name, "norm": found.norm, "rows": list(found.rows),
                       "sweep": None if sweep is None else {
                           "output": sweep.output, "alphas": sweep.alphas, "backend": backend.value,
                           "mean": means.reshape(len(sweep.alphas), -1).tolist()},
                       "plot": None if plot is None else str(plot)})
            return
        say(f"direction of {tensor} (mean over {found.rows[0]:,} rows of {recording_a} minus mean over "
            f"{found.rows[1]:,} rows of {recording_b}): shape {tuple(found.vector.shape)}, norm {found.norm:.4g}, "
            f"written to {out_path}")
        if sweep is not None:
            flat = means.reshape(len(sweep.alphas), -1)
            t = table(f"{backend.value}: mean {sweep.output} over {sweep.values.shape[1]:,} observations of {inputs} "
                      f"with alpha × the direction added to {tensor}",
                      [("alpha", "right")] + [(f"{sweep.output}[{j}]", "right") for j in range(flat.shape[1])])
            for alpha, row in zip(sweep.alphas, flat):
                add_row(t, f"{alpha:g}", *[f"{x:.4f}" for x in row])
            out.print(t)
        if plot is not None:
            say(f"plot written to {plot}")

    guard(as_json, body, "direction")
