"""``policyport record``, ``stats`` and ``plot``: looking inside a policy over whole datasets."""

from __future__ import annotations

from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from ..errors import listing
from .core import app, emit_json, guard
from .options import (
    ForceOpt,
    JsonOpt,
    ModelArg,
    OverrideOpt,
    OverridesFileOpt,
    QuietOpt,
    SteerOpt,
    ThreadsOpt,
    check_output_format,
    given_path,
    overrides_from,
    tensor_patterns,
)
from .render import add_row, counted, err, fits, literal, out, say, shape_text, table


class RecordFormat(str, Enum):
    npz = "npz"
    parquet = "parquet"
    npy = "npy"


class Engine(str, Enum):
    local = "local"
    ray = "ray"


class RecordBackend(str, Enum):
    numpy = "numpy"
    onnxruntime = "onnxruntime"


@contextmanager
def progress_bar(label: str, quiet: bool):
    """A Rich progress bar on stderr fed by ``callback(done, total)`` (see :func:`row_progress`);
    nothing when ``quiet`` or stderr is not a terminal."""
    if quiet or not err.is_terminal:
        yield None
        return
    with row_progress(err) as bar:
        task = None

        def callback(done: int, total: int) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task(label, total=total)
            # the last block computed: what remains is flushing and closing the output file
            bar.update(task, completed=done, description=literal(f"{label}: finishing" if done >= total else label))

        yield callback


def row_progress(console):
    """A transient Rich ``Progress`` on ``console`` that counts rows, on one line:

    ``recording ━━━━━━━━━╸      1,234,567/25,000,000 rows 9,019 rows/s elapsed 0:02:16, remaining 0:43:54``

    counts with thousands separators and each time labelled; the bar takes the width the figures
    leave. When a line cannot hold the figures and a bar of 10 characters, the figures go on a line
    of their own under the bar, never wrapped inside a number or a word.
    """
    from rich.progress import (BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    from rich.table import Column

    class Rows(ProgressColumn):
        def render(self, task):
            total = "?" if task.total is None else f"{int(task.total):,}"
            return Text(f"{int(task.completed):>{len(total)},}/{total} rows")  # as wide as it will be

    class Rate(ProgressColumn):
        def render(self, task):
            return Text(f"{task.speed:,.0f} rows/s" if task.speed else "… rows/s")

    class Times(ProgressColumn):
        max_refresh = 0.5  # as Rich's own time columns: an estimate that does not flicker

        def __init__(self):
            super().__init__(table_column=Column(no_wrap=True))
            self.elapsed, self.remaining = TimeElapsedColumn(), TimeRemainingColumn()

        def render(self, task):
            return Text(f"elapsed {self.elapsed.render(task)}, remaining {self.remaining.render(task)}")

    whole = Column(no_wrap=True)
    head = (TextColumn("{task.description}", markup=False, table_column=whole), BarColumn(bar_width=None))
    figures = (Rows(table_column=whole), Rate(table_column=whole), Times())

    class RowProgress(Progress):
        def get_renderables(self):
            tasks = [t for t in self.tasks if t.visible]
            shown = [(t.description, [column(t) for column in figures]) for t in tasks]
            if all(len(label) + sum(len(f) + 1 for f in parts) + 11 <= console.width for label, parts in shown):
                yield self.make_tasks_table(tasks)  # one line, with a bar of 10 at least
                return
            self.columns = head
            try:
                for task, (_, parts) in zip(tasks, shown):
                    yield self.make_tasks_table([task])
                    yield _flow(parts, console.width)
            finally:
                self.columns = (*head, *figures)

    return RowProgress(*head, *figures, console=console, transient=True)


def _flow(parts: list[Text], width: int) -> Text:
    """``parts`` on as few lines of ``width`` as hold them whole, one space apart (a part wider
    than a line has one of its own)."""
    lines: list[list[Text]] = [[]]
    used = 0
    for part in parts:
        if lines[-1] and used + 1 + len(part) > width:
            lines.append([])
        used = len(part) if not lines[-1] else used + 1 + len(part)
        lines[-1].append(part)
    return Text("\n").join(Text(" ").join(line) for line in lines)


def _size(n: int) -> str:
    """``n`` bytes in B, KB, MB, GB or TB (powers of 1,000), to three significant figures."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


@app.command()
def record(
    model: ModelArg,
    data: Annotated[Path, typer.Option("-i", "--input", parser=given_path, metavar="DATA", help="Observations: .npy, .npz, .parquet, or a folder of them; any size.")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="OUT", help="The recording: .npz, .parquet, or a name without a suffix for a folder of .npy files (a folder of .parquet files with --engine ray).")],
    tensors: Annotated[str, typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over node-output names (graph outputs always).")] = "*",
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N", help="Rows per block; memory is bounded by one block.")] = 4096,
    fmt: Annotated[Optional[RecordFormat], typer.Option("--format", metavar="[npz|parquet|npy]", help="Output format; npy is a folder of one .npy per tensor, the fastest to write  [default: from the suffix of -o]")] = None,
    engine: Annotated[Engine, typer.Option(metavar="[local|ray]", help="local: this process; ray: Ray Data (numpy backend on every worker).")] = Engine.local,
    backend: Annotated[RecordBackend, typer.Option(metavar="[numpy|onnxruntime]", help="Runtime of the local engine.")] = RecordBackend.numpy,
    override: OverrideOpt = None,
    steer: SteerOpt = None,
    overrides: OverridesFileOpt = None,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    threads: ThreadsOpt = 0,
) -> None:
    """Stream every activation of a whole dataset to disk, block by block, with bounded memory."""

    def body():
        from ..analysis import record_dataset

        if engine is Engine.ray and backend is not RecordBackend.numpy:
            raise typer.BadParameter("the ray engine runs the numpy backend on every worker", param_hint="--backend")
        def session():  # for a set that runs the model (dataset statistics, patches)
            from ..runtime import load

            return load(str(model), backend=backend.value, threads=threads)

        edits = overrides_from(override, steer, overrides, session)
        with progress_bar("recording", quiet or as_json) as callback:
            summary = record_dataset(str(model), data, output, tensors=tensors, batch_size=batch_size,
                                     format=None if fmt is None else fmt.value, engine=engine.value,
                                     backend=backend.value, overrides=edits, force=force, progress=callback,
                                     threads=threads)
        rate = summary.rows / summary.seconds if summary.seconds else 0.0
        if as_json:
            emit_json({"output": str(summary.path), "format": summary.format, "rows": summary.rows,
                       "seconds": summary.seconds, "rows_per_second": rate, "bytes": summary.bytes,
                       "tensors": [{"name": t.name, "op_type": t.op_type, "dtype": t.dtype, "shape": list(t.shape)}
                                   for t in summary.tensors], "skipped": summary.skipped,
                       "nonfinite_rows": summary.nonfinite_rows,
                       "overrides": [e.spec for e in edits or []]})
            return
        say(f"recorded {summary.rows:,} rows × {len(summary.tensors)} tensors to {summary.path} "
            f"({summary.format}, {_size(summary.bytes)}) in {summary.seconds:.{1 if summary.seconds >= 1 else 2}f} s, {rate:,.0f} rows/s")
        if edits:
            say("with overrides: " + "; ".join(e.spec for e in edits))
        if summary.nonfinite_rows:
            say(f"warning: {summary.nonfinite_rows:,} of {summary.rows:,} observations hold NaN or Inf; "
                "'policyport stats' counts what they became in every tensor")
        say_left_out(dict.fromkeys(summary.skipped))
        t = table("", ["tensor", "op", "dtype", "shape"])
        for info in summary.tensors:
            add_row(t, info.name, info.op_type or "", info.dtype, shape_text((summary.rows, *info.shape)))
        out.print(t)

    guard(as_json, body)


def say_left_out(arrays: dict[str, tuple[int, ...] | None]) -> None:
    """Name on stderr the tensors left out of a recording because they have no batch axis (name ->
    shape, if known); nothing when there are none."""
    if arrays:
        shown = listing(arrays, show=lambda n: n if arrays[n] is None else f"{n} {shape_text(arrays[n])}")
        say(f"left out (no batch axis, not one row per observation): {shown}")


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def _fig(value) -> str:
    return "" if value is None else f"{value:.4g}"


@app.command()
def stats(
    recording: Annotated[Path, typer.Argument(metavar="REC", parser=given_path, help="A recording: .npz, .parquet, a folder of .npy files (npy) or of .parquet files.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", parser=given_path, metavar="STATS.json", help="Also write every per-neuron figure to this JSON file.")] = None,
    tensors: Annotated[Optional[str], typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over the recorded tensors  [default: all]")] = None,
    engine: Annotated[Engine, typer.Option(metavar="[local|ray]", help="local: this process; ray: Ray workers reduce blocks, moments merged.")] = Engine.local,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N", help="Rows read per block.")] = 16384,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Per-layer and per-neuron statistics of a recording, in one pass: mean, std, min, max, NaN/Inf,
    fraction active (> 0), fraction saturated (tanh |x| > 0.99; sigmoid < 0.01 or > 0.99), dead and
    always-saturated neurons."""

    def body():
        from ..analysis.statistics import statistics, write_json
        from ..io.outputs import check_distinct, check_writable

        if output is not None:
            check_output_format(output, ".json")
            check_writable(output, force)
            check_distinct(output, recording)
        with progress_bar("statistics", quiet or as_json) as callback:
            result = statistics(recording, tensors, batch_size=batch_size, engine=engine.value, progress=callback)
        if output is not None:
            write_json(output, result, force)
        if as_json:
            emit_json(result.to_dict())
            return
        say_left_out(result.left_out)
        title = f"{recording}: {result.rows:,} observations" + (f" (per-neuron figures in {output})" if output else "")
        values = ["mean", "std", "min", "max"]
        behaviour = ["NaN", "Inf", "active", "saturated", "dead", "always sat."]
        rows = []
        for s in result.tensors:
            layer = s.layer()
            rows.append([s.name, s.op_type or "", f"{s.neurons:,}", _fig(layer["mean"]), _fig(layer["std"]),
                         _fig(layer["min"]), _fig(layer["max"]), f"{layer['nan']:,}", f"{layer['inf']:,}",
                         _pct(layer["active_fraction"]), _pct(layer["saturated_fraction"]), f"{layer['dead']:,}",
                         "" if layer["always_saturated"] is None else f"{layer['always_saturated']:,}"])
        whole = table(title, ["tensor", "op", *((c, "right") for c in ["neurons", *values, *behaviour])])
        for row in rows:
            add_row(whole, *row)
        if fits(whole):
            out.print(whole)
            return
        # a narrow terminal: the figures as two tables rather than numbers wrapped over lines
        first = table(title, ["tensor", "op", *((c, "right") for c in ["neurons", *values])])
        second = table("", ["tensor", *((c, "right") for c in behaviour)])
        for row in rows:
            add_row(first, *row[:7])
            add_row(second, row[0], *row[7:])
        out.print(first)
        out.print(second)

    guard(as_json, body)


@app.command()
def plot(
    source: Annotated[Path, typer.Argument(metavar="REC|REPORT", parser=given_path, help="A recording, or the JSON of 'policyport verify --json'.")],
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="DIR", help="The folder of PNG files to create.")],
    tensors: Annotated[Optional[str], typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over the recorded tensors  [default: all]")] = None,
    rows: Annotated[int, typer.Option("--rows", min=1, metavar="N", help="Observations shown in each heatmap (the first N).")] = 200,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """PNG plots: per-layer activation histograms, neuron × observation heatmaps and per-neuron
    mean ± std of a recording; or the per-tensor error of a verification report."""

    def body():
        from ..analysis import plots

        from ..analysis import open_recording

        left_out = None  # a recording's arrays without a row per observation
        if source.suffix == ".json":
            written = plots.plot_report(source, output, force=force)
        else:
            rec = open_recording(source)
            with progress_bar("plotting", quiet or as_json) as callback:
                written = plots.plot_recording(rec, output, tensors=tensors, heatmap_rows=rows, force=force,
                                               progress=callback)
            left_out = rec.left_out_among(tensors)
        if as_json:
            doc = {"output": str(output), "files": [str(path) for path in written]}
            if left_out is not None:
                doc["left_out"] = [{"name": n, "shape": list(shape)} for n, shape in left_out.items()]
            emit_json(doc)
            return
        say_left_out(left_out or {})
        say(f"wrote {counted(len(written), 'PNG file')} to {output}")
        for path in written:
            out.print(literal(str(path)))

    guard(as_json, body)


def check_png(path: Path) -> None:
    """Refuse a ``--plot`` path not named ``.png``: the plot is a PNG image whatever its name.

    Raises:
        typer.BadParameter: another suffix, or none (exit 2).
    """
    if path.suffix.lower() != ".png":
        raise typer.BadParameter(f"{literal(str(path))}: the plot is a PNG image; name it "
                                 f"{literal(path.with_suffix('.png').name)}", param_hint="--plot")


class Ablation(str, Enum):
    zero = "zero"
    mean = "mean"


@app.command()
def importance(
    model: ModelArg,
    data: Annotated[Path, typer.Option("-i", "--input", parser=given_path, metavar="OBS", help="Observations: .npy, .npz, .parquet, or a folder of them; any size.")],
    tensors: Annotated[str, typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over node-output names: the tensors whose neurons are ablated.")] = "*",
    ablation: Annotated[Ablation, typer.Option(metavar="[zero|mean]", help="zero: set the neuron to 0; mean: to its mean over the dataset (a first pass, or --means).")] = Ablation.zero,
    means: Annotated[Optional[Path], typer.Option("--means", parser=given_path, metavar="REC", help="With --ablation mean: a recording of the selected tensors to take the means from, instead of a first pass over OBS.")] = None,
    output_name: Annotated[Optional[str], typer.Option("--output", metavar="NAME", help="The graph output whose change is measured, NAME or NAME[INDEX] (positions on its last axis, e.g. action[0])  [default: action, or the only output]")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, metavar="N", help="Observations per block; memory is bounded by the block.")] = 1024,
    engine: Annotated[Engine, typer.Option(metavar="[local|ray]", help="local: this process; ray: Ray Data (numpy backend on every worker).")] = Engine.local,
    backend: Annotated[RecordBackend, typer.Option(metavar="[numpy|onnxruntime]", help="Runtime of the local engine.")] = RecordBackend.numpy,
    top: Annotated[int, typer.Option("--top", min=1, metavar="K", help="Neurons listed (and plotted) per tensor.")] = 10,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", parser=given_path, metavar="PNG", help="Also write a bar chart of each tensor's top neurons.")] = None,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
    threads: ThreadsOpt = 0,
) -> None:
    """Rank every neuron of the selected tensors by how much the output changes when it is ablated
    (set to 0 or to its mean), averaged over a whole dataset streamed block by block."""

    def body():
        from ..analysis.importance import importance as ablation_importance, plot_importance
        from ..io.outputs import check_distinct, check_writable

        if engine is Engine.ray and backend is not RecordBackend.numpy:
            raise typer.BadParameter("the ray engine runs the numpy backend on every worker", param_hint="--backend")
        if plot_path is not None:
            check_png(plot_path)
            check_writable(plot_path, force)
            check_distinct(plot_path, data, model, *([means] if means is not None else []))
        label = "ablating" if ablation is Ablation.zero or means is not None else "means, then ablating"
        with progress_bar(label, quiet or as_json) as callback:
            result = ablation_importance(str(model), data, tensors=tensors, ablation=ablation.value, output=output_name,
                                         means=means, batch_size=batch, engine=engine.value, backend=backend.value,
                                         progress=callback, threads=threads)
        if plot_path is not None:
            plot_importance(result, plot_path, top=top, force=force)
        if as_json:
            doc = result.to_dict(top)
            if plot_path is not None:
                doc["plot"] = str(plot_path)
            emit_json(doc)
            return
        rate = result.rows / result.seconds if result.seconds else 0.0
        say(f"{result.ablation}-ablated {counted(sum(t.neurons for t in result.tensors), 'neuron')} of "
            f"{counted(len(result.tensors), 'tensor')} over {result.rows:,} observations in {result.seconds:.1f} s "
            f"({rate:,.0f} observations/s); score: mean |change| of {result.measured}")
        if result.skipped:
            say("left out: " + "; ".join(f"{n} ({why})" for n, why in result.skipped.items()))
        for t in result.tensors:
            shown = table(f"{t.name}: top {min(top, t.neurons)} of {t.neurons} neurons",
                          [("rank", "right"), ("neuron", "right"), ("score", "right"), ("mean change", "right"),
                           ("set to", "right")])
            for rank, r in enumerate(t.ranked(top), 1):
                add_row(shown, str(rank), str(r["neuron"]), f"{r['score']:.4g}", f"{r['mean_change']:+.4g}",
                        f"{r['value']:.4g}")
            out.print(shown)
        if plot_path is not None:
            say(f"wrote {plot_path}")

    guard(as_json, body)


class ProbeKind(str, Enum):
    ridge = "ridge"
    logistic = "logistic"


@app.command()
def probe(
    recording: Annotated[Path, typer.Argument(metavar="REC", parser=given_path, help="A recording: .npz, .parquet, a folder of .npy files (npy) or of .parquet files.")],
    labels: Annotated[Path, typer.Option("--labels", parser=given_path, metavar="LABELS.npy", help="One label per observation of the recording, in its order: numbers (ridge) or classes (logistic).")],
    tensors: Annotated[Optional[str], typer.Option(metavar="GLOBS", callback=tensor_patterns, help="Comma-separated globs over the recorded tensors  [default: all]")] = None,
    kind: Annotated[ProbeKind, typer.Option(metavar="[ridge|logistic]", help="ridge: held-out R²; logistic: held-out accuracy.")] = ProbeKind.ridge,
    test_fraction: Annotated[float, typer.Option("--test-fraction", metavar="F", help="Share of the observations held out to score the probes.")] = 0.25,
    seed: Annotated[int, typer.Option("--seed", min=0, metavar="S", help="Seed of the split into fitted and held-out observations.")] = 0,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", parser=given_path, metavar="PNG", help="Also write a bar chart of the score per tensor.")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Fit a linear probe (ridge or logistic, scikit-learn) from each recorded tensor to a label and
    report its score on held-out observations: R² or accuracy per layer."""

    def body():
        from ..analysis.probe import plot_probes, probe as fit_probes
        from ..io.outputs import check_distinct, check_writable

        if plot_path is not None:
            check_png(plot_path)
            check_writable(plot_path, force)
            check_distinct(plot_path, recording, labels)
        result = fit_probes(recording, labels, tensors=tensors, kind=kind.value, test_fraction=test_fraction, seed=seed)
        if plot_path is not None:
            plot_probes(result, plot_path, force=force)
        if as_json:
            doc = result.to_dict()
            if plot_path is not None:
                doc["plot"] = str(plot_path)
            emit_json(doc)
            return
        metric = "R²" if result.metric == "r2" else "accuracy"
        chance = "" if result.chance is None else f" (chance {result.chance:.3f})"
        shown = table(f"{kind.value} probes: held-out {metric} on {result.test_rows:,} of {result.rows:,} "
                      f"observations{chance}", ["tensor", ("features", "right"), (metric, "right"),
                                                (f"training {metric}", "right"), ("penalty", "right")])
        for t in result.tensors:
            add_row(shown, t.name, f"{t.features:,}", f"{t.score:.4f}", f"{t.train_score:.4f}", f"{t.penalty:g}")
        out.print(shown)
        if plot_path is not None:
            say(f"wrote {plot_path}")

    guard(as_json, body)
