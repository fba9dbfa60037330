"""PNG plots of recordings and verification reports (matplotlib, Agg: no display needed).

Of a recording (:func:`plot_recording`), into one new folder:

* ``histograms.png``: one panel per tensor, the distribution of all its values over every
  observation (counts accumulated block by block over the whole recording, log scale), with the
  layer's mean, std and saturated or active fraction on a line between the title and the axes;
* ``heatmap-<tensor>.png``: neuron × observation image of the first observations;
* ``neurons-<tensor>.png``: every neuron's mean ± std over the recording, min and max, with dead
  and always-saturated neurons marked.

Of a ``policyport verify --json`` report (:func:`plot_report`): ``errors.png``, the max abs error of
each tensor for each compared pair, against the tolerance.

Figures are built with matplotlib's object API (``Figure``), never pyplot's global state.
"""

from __future__ import annotations

import math
import contextlib
import hashlib
import re
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InputMismatchError, UnreadableFileError, require
from ..text import literal
from .folders import check_out_folder, commit_folder, building
from .recording import Recording, open_recording
from .statistics import RELU_LIKE, Statistics, block_rows, statistics

BINS = 80
_DPI = 110
#: Size and gap (points) of the line of figures above each histogram.
_NOTE_SIZE, _NOTE_GAP = 8, 3


#: The longest file-name part made from a tensor name; a longer name is cut and given a hash suffix.
MAX_SLUG = 80


def _figure(width: float, height: float):
    require("matplotlib", "analysis", "plotting")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


@contextlib.contextmanager
def _quiet_matplotlib():
    """matplotlib's warnings (a glyph the font lacks, a layout it cannot fit) kept from the terminal:
    they would print text from the recording raw, and a plot is written whatever they say."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="matplotlib")
        yield


def shown(name: str) -> str:
    """A tensor name as a plot draws it: control and format characters escaped (``\\x1b``), as on
    the terminal, and ``$`` escaped so that matplotlib never reads it as mathtext."""
    return literal(name).replace("$", r"\$")


def slug(name: str, taken: set[str]) -> str:
    """A file-name-safe form of a tensor name (``fc_1/tanh`` -> ``fc_1-tanh``), unique within ``taken``;
    a form longer than :data:`MAX_SLUG` is cut and ends in 10 hex digits of the name's sha256."""
    base = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-.") or "tensor"
    if len(base) > MAX_SLUG:
        base = base[:MAX_SLUG - 11].rstrip("-.") + "-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    taken.add(candidate)
    return candidate


def _title(name: str, op: str | None) -> str:
    return f"{shown(name)} ({shown(op)})" if op else shown(name)


def _histograms(rec: Recording, stats: Statistics, batch_size: int, progress) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Counts of every tensor's finite values in ``BINS`` bins over its range, in one more pass."""
    edges = {}
    for s in stats.tensors:
        layer = s.layer()
        lo, hi = layer["min"], layer["max"]
        if s.op_type == "Tanh":
            lo, hi = -1.0, 1.0
        elif s.op_type == "Sigmoid":
            lo, hi = 0.0, 1.0
        if lo is None or hi is None:
            lo, hi = 0.0, 1.0
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges[s.name] = np.linspace(lo, hi, BINS + 1)
    counts = {n: np.zeros(BINS, np.int64) for n in edges}
    done = 0
    for block in rec.iter_batches(batch_size, list(edges)):
        for name, values in block.items():
            v = values.reshape(-1).astype(np.float64)
            counts[name] += np.histogram(v[np.isfinite(v)], bins=edges[name])[0]
        done += len(next(iter(block.values())))
        if progress is not None:
            progress(rec.rows + done, 2 * rec.rows)
    return {n: (counts[n], edges[n]) for n in edges}


@_quiet_matplotlib()
def plot_recording(recording, out_dir, *, tensors: str | None = None, heatmap_rows: int = 200,
                   batch_size: int = 16384, force: bool = False,
                   progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write the PNG plots of a recording (see the module docstring) into the new folder ``out_dir``.

    Args:
        recording: a path or a :class:`Recording`.
        out_dir: the folder to create; built beside it and renamed into place when complete.
        tensors: ``fnmatch`` globs over the recorded tensors (default: all).
        heatmap_rows: observations shown in each heatmap (the first ones; default 200).
        batch_size: rows read per block (the memory a pass takes).
        force: replace an existing ``out_dir`` that holds only PNG files.
        progress: ``progress(done, total)`` over the two passes (statistics, histograms).

    Returns:
        The written files, in ``out_dir``.

    Raises:
        UnreadableFileError: the recording cannot be read.
        OutputExistsError: ``out_dir`` exists and may not be replaced.
        MissingDependencyError: matplotlib is not installed.
    """
    require("matplotlib", "analysis", "plotting")
    out_dir = Path(out_dir)
    check_out_folder(out_dir, force, (".png",))
    rec = recording if isinstance(recording, Recording) else open_recording(recording)
    if rec.rows == 0:
        raise InputMismatchError(f"{rec.path} holds no observations; there is nothing to plot")
    half = None if progress is None else (lambda done, total: progress(done, 2 * total))
    stats = statistics(rec, tensors, batch_size=batch_size, progress=half)
    plotted = {s.name for s in stats.tensors}
    batch_size = block_rows(rec, [t for t in rec.tensors if t.name in plotted], batch_size)  # as the statistics read
    hists = _histograms(rec, stats, batch_size, progress)
    head = rec.head(min(heatmap_rows, batch_size), [s.name for s in stats.tensors])
    with building(out_dir, "plots") as build:
        taken: set[str] = set()
        names = ["histograms.png"]
        _save(_plot_histograms(stats, hists), build, names[0])
        for s in stats.tensors:
            key = slug(s.name, taken)
            names.append(f"heatmap-{key}.png")
            _save(_plot_heatmap(s, head[s.name]), build, names[-1])
            names.append(f"neurons-{key}.png")
            _save(_plot_neurons(s, rec.rows), build, names[-1])
        commit_folder(build, out_dir, force, (".png",))
    return [out_dir / n for n in names]


def _save(fig, build, name: str, **options) -> None:
    """``fig`` as the PNG ``name`` of the folder being built (created relative to its descriptor)."""
    with build.open(name) as f:
        fig.savefig(f, format="png", **options)


def _plot_histograms(stats: Statistics, hists) -> object:
    n = len(stats.tensors)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = _figure(4.2 * cols, 2.9 * rows)
    fig.suptitle(f"activation histograms over {stats.rows:,} observations")
    for i, s in enumerate(stats.tensors):
        ax = fig.add_subplot(rows, cols, i + 1)
        counts, edges = hists[s.name]
        ax.stairs(counts, edges, fill=True, color="#4C72B0", alpha=0.85)
        ax.set_yscale("log" if counts.max(initial=0) > 0 else "linear")
        layer = s.layer()
        figures = [f"mean {layer['mean']:.3g}, std {layer['std']:.3g}" if layer["mean"] is not None else "no finite values"]
        if layer["saturated_fraction"] is not None:
            figures.append(f"saturated {100 * layer['saturated_fraction']:.1f}%")
        if s.op_type in RELU_LIKE:
            figures.append(f"active {100 * layer['active_fraction']:.1f}%")
        # the figures go between the title and the axes, never over a bar: the title is lifted by their line
        ax.annotate(", ".join(figures), (0.5, 1.0), xycoords="axes fraction", xytext=(0, _NOTE_GAP),
                    textcoords="offset points", ha="center", va="bottom", fontsize=_NOTE_SIZE, color="#444444")
        ax.set_title(_title(s.name, s.op_type), fontsize=10, pad=2 * _NOTE_GAP + 1.25 * _NOTE_SIZE)
        ax.set_xlabel("value", fontsize=8)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(which="both", labelsize=7)  # a log axis may label minor ticks too
    return fig


def _plot_heatmap(s, values: np.ndarray) -> object:
    data = values.reshape(len(values), -1).astype(np.float64).T  # neurons x observations
    finite = data[np.isfinite(data)]
    if s.op_type == "Tanh":
        vmin, vmax, cmap = -1.0, 1.0, "RdBu_r"
    elif s.op_type == "Sigmoid":
        vmin, vmax, cmap = 0.0, 1.0, "viridis"
    elif finite.size and finite.min() >= 0:
        vmin, vmax, cmap = 0.0, float(finite.max()) or 1.0, "viridis"
    else:
        bound = float(np.abs(finite).max()) if finite.size else 1.0
        vmin, vmax, cmap = -(bound or 1.0), bound or 1.0, "RdBu_r"
    neurons, observations = data.shape
    fig = _figure(min(12.0, 4 + observations / 25), min(9.0, 2.5 + neurons / 40))
    ax = fig.add_subplot()
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_title(f"{_title(s.name, s.op_type)}: first {observations:,} observations", fontsize=10)
    ax.set_xlabel("observation")
    ax.set_ylabel("neuron")
    _integer_ticks(ax.yaxis)
    fig.colorbar(image, ax=ax, label="activation")
    return fig


def _plot_neurons(s, rows: int) -> object:
    m = s.moments
    neurons = np.arange(len(m.count))
    mean = np.where(m.count > 0, m.mean, np.nan)
    std = m.std
    fig = _figure(min(14.0, 7 + len(neurons) / 40), 3.8)
    ax = fig.add_subplot()
    if len(neurons) > 32:  # bands over many neurons
        ax.fill_between(neurons, m.minimum, m.maximum, step="mid", color="#DDDDDD", label="min … max")
        ax.fill_between(neurons, mean - std, mean + std, step="mid", color="#8FB3DE", label="mean ± std")
        ax.plot(neurons, mean, drawstyle="steps-mid", color="#1F4E8C", linewidth=0.9, label="mean")
    else:  # a bar per neuron
        ax.vlines(neurons, m.minimum, m.maximum, color="#BBBBBB", linewidth=6, label="min … max")
        ax.errorbar(neurons, mean, yerr=std, fmt="o", color="#1F4E8C", ecolor="#5A8AC6", elinewidth=2, capsize=4,
                    label="mean ± std")
        _integer_ticks(ax.xaxis)
    dead, saturated = s.dead, s.always_saturated
    if dead:
        ax.scatter(dead, mean[dead], marker="x", color="#C44E52", zorder=3, label=f"dead ({len(dead)})")
    if saturated:
        ax.scatter(saturated, mean[saturated], marker="^", color="#DD8452", zorder=3,
                   label=f"always saturated ({len(saturated)})")
    ax.set_xlim(-0.5, len(neurons) - 0.5)
    ax.set_title(f"{_title(s.name, s.op_type)}: per-neuron mean ± std over {rows:,} observations", fontsize=10)
    ax.set_xlabel("neuron")
    ax.set_ylabel("activation")
    ax.legend(loc="upper right", fontsize=8, ncols=2, framealpha=0.9)
    return fig


def _integer_ticks(axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


@_quiet_matplotlib()
def plot_report(report, out_dir, *, force: bool = False) -> list[Path]:
    """``errors.png``: the per-tensor max abs error of a verification report, one bar per compared
    pair, log scale, with each comparison's ``atol`` marked (one line when they share one; the
    tolerance follows the compared dtype unless the report set one) and failing comparisons in red.

    Args:
        report: a path to the JSON ``policyport verify --json`` prints, or that document as a dict
            (``Report.to_dict()``).
        out_dir: the folder to create.
        force: replace an existing ``out_dir`` that holds only PNG files.

    Raises:
        UnreadableFileError: the file is not such a report.
    """
    out_dir = Path(out_dir)
    check_out_folder(out_dir, force, (".png",))
    doc = report if isinstance(report, dict) else _read_report(report)
    try:
        comparisons = doc["comparisons"]
        atols = [float(doc["atol"]) if doc.get("atol") is not None else float(c["atol"]) for c in comparisons]
        tensors = list(dict.fromkeys(c["tensor"] for c in comparisons))
        pairs = list(dict.fromkeys((c["candidate"], c["reference"]) for c in comparisons))
    except (KeyError, TypeError, ValueError) as e:
        raise UnreadableFileError(f"{report} is not a 'policyport verify --json' report: missing {e}") from e
    if not comparisons:
        raise InputMismatchError(f"{report} holds no comparisons; there is nothing to plot")
    positive = [a for a in atols if a > 0]
    floor = min(positive) / 1e4 if positive else 1e-12
    fig = _figure(8.0, 1.2 + 0.42 * len(tensors) * max(1, len(pairs)) ** 0.6)
    ax = fig.add_subplot()
    height = 0.8 / len(pairs)
    colours = ["#4C72B0", "#55A868", "#8172B2", "#937860", "#64B5CD"]
    by_key = {(c["tensor"], c["candidate"], c["reference"]): (c, a) for c, a in zip(comparisons, atols)}
    marks_y, marks_x = [], []
    for j, (cand, ref) in enumerate(pairs):
        ys, widths, failing = [], [], []
        for i, t in enumerate(tensors):
            found = by_key.get((t, cand, ref))
            if found is None:
                continue
            c, atol = found
            value = float(c["max_abs"]) if not isinstance(c["max_abs"], str) else math.inf
            ys.append(i + (j - (len(pairs) - 1) / 2) * height)
            marks_y.append(ys[-1])
            marks_x.append(max(atol, floor))
            widths.append(min(max(value, floor), 1e30))
            failing.append(not c["passed"])
        bars = ax.barh(ys, widths, height=height * 0.9, color=colours[j % len(colours)],
                       label=f"{shown(cand)} vs {shown(ref)}")
        for bar, fails in zip(bars, failing):
            if fails:  # the pair's colour stays; a red outline and hatch mark the failure
                bar.set(edgecolor="#C44E52", hatch="///", linewidth=1.5)
    if len(set(atols)) == 1:
        ax.axvline(max(atols[0], floor), color="#C44E52", linestyle="--", linewidth=1, label=f"atol {atols[0]:g}")
    else:  # tolerances by dtype: one mark per comparison
        ax.scatter(marks_x, marks_y, marker="|", s=120, color="#C44E52", label="atol (by dtype)", zorder=3)
    ax.set_xscale("log")
    ax.set_yticks(range(len(tensors)), [shown(t) for t in tensors])
    ax.invert_yaxis()
    ax.set_xlabel(f"max abs error (0 drawn at {floor:g})")
    verdict = "PASS" if doc.get("passed") else "FAIL"
    tolerance = (f"atol {doc['atol']:g}, rtol {doc['rtol']:g}" if doc.get("atol") is not None and doc.get("rtol") is not None
                 else "tolerances by dtype")
    ax.set_title(f"verification: {verdict}, {doc.get('samples', '?')} samples, {tolerance}")
    # the legend built by hand: a pair's entry in its plain colour, whatever its first bar looks like
    from matplotlib.patches import Patch

    marks = [(h, label) for h, label in zip(*ax.get_legend_handles_labels()) if label.startswith("atol")]
    handles = [Patch(facecolor=colours[j % len(colours)]) for j in range(len(pairs))] + [h for h, _ in marks]
    labels = [f"{shown(c)} vs {shown(r)}" for c, r in pairs] + [label for _, label in marks]
    if any(not c["passed"] for c in comparisons):
        handles.append(Patch(facecolor="white", edgecolor="#C44E52", hatch="///", linewidth=1.5))
        labels.append("fails its tolerance")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # beside, never over a bar
    with building(out_dir, "plots") as build:
        _save(fig, build, "errors.png", bbox_inches="tight")
        commit_folder(build, out_dir, force, (".png",))
    return [out_dir / "errors.png"]


def _read_report(path) -> dict:
    from ..io.kinds import read_json

    doc = read_json(path)
    if not isinstance(doc, dict):
        raise UnreadableFileError(f"{path} is not a 'policyport verify --json' report")
    return doc
