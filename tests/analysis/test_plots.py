"""PNG plots: the files a person expects, drawn from the right figures, written all at once."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import policyport as pp
from policyport.analysis import plots, record_dataset

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.fixture(scope="module")
def recording(tmp_path_factory, metadrive_onnx, dataset):
    out = tmp_path_factory.mktemp("rec") / "rec.npz"
    record_dataset(metadrive_onnx, dataset[0], out, batch_size=1000)
    return out


def test_a_recording_gives_histograms_heatmaps_and_neuron_plots(tmp_path, recording):
    out = tmp_path / "plots"
    written = plots.plot_recording(recording, out, tensors="fc_2/*,action", heatmap_rows=50)
    assert [p.name for p in written] == ["histograms.png", "heatmap-fc_2-linear.png", "neurons-fc_2-linear.png",
                                         "heatmap-fc_2-tanh.png", "neurons-fc_2-tanh.png", "heatmap-action.png",
                                         "neurons-action.png"]
    assert sorted(os.listdir(out)) == sorted(p.name for p in written)
    width, height = png_size(out / "histograms.png")
    assert width > 1000 and height > 250  # three panels side by side
    assert all(png_size(p)[0] >= 400 for p in written)
    assert sorted(os.listdir(tmp_path)) == ["plots"]  # no temporary folder left


def test_histograms_count_every_value_of_the_recording(recording):
    rec = pp.analysis.open_recording(recording)
    stats = pp.analysis.statistics(rec, "fc_1/*")
    hists = plots._histograms(rec, stats, 512, None)
    values = rec.head(3000)
    for name, (counts, edges) in hists.items():
        assert counts.sum() == values[name].size
        np.testing.assert_array_equal(counts, np.histogram(values[name].astype(np.float64), bins=edges)[0])
    assert hists["fc_1/tanh"][1][0] == -1 and hists["fc_1/tanh"][1][-1] == 1  # a tanh's full range


def test_a_verification_report_gives_the_error_plot(tmp_path, metadrive_model):
    report = pp.verify(metadrive_model, samples=16)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report.to_dict()))
    written = plots.plot_report(path, tmp_path / "errors")
    assert [p.name for p in written] == ["errors.png"] and png_size(written[0])[0] > 500
    with pytest.raises(pp.UnreadableFileError, match="not a 'policyport verify --json' report"):
        plots.plot_report({"passed": True}, tmp_path / "other")


def test_an_existing_folder_is_kept_unless_it_holds_only_plots(tmp_path, recording):
    out = tmp_path / "plots"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for force in (False, True):  # a folder of other files: never offered --force, never replaced
        with pytest.raises(pp.OutputExistsError, match="is not a folder of .png files only .* never replaced") as e:
            plots.plot_recording(recording, out, tensors="logits", force=force)
        assert "--force" not in str(e.value)
    assert os.listdir(out) == ["notes.txt"]
    (out / "notes.txt").unlink()
    (out / "old.png").write_bytes(PNG)
    with pytest.raises(pp.OutputExistsError, match="exists; overwrite it with --force"):
        plots.plot_recording(recording, out, tensors="logits")
    plots.plot_recording(recording, out, tensors="logits", force=True)
    assert sorted(os.listdir(out)) == ["heatmap-logits.png", "histograms.png", "neurons-logits.png"]


def test_tensor_names_become_distinct_file_names():
    taken: set[str] = set()
    assert [plots.slug(n, taken) for n in ["fc_1/tanh", "fc_1:tanh", "../x", "é"]] == ["fc_1-tanh", "fc_1-tanh-2", "x", "tensor"]


def test_failing_comparisons_are_marked_and_named_in_a_legend_beside_the_bars(tmp_path, metadrive_model, monkeypatch):
    from matplotlib.figure import Figure

    report = pp.verify(metadrive_model, samples=16, atol=1e-7, rtol=0.0, rounding=False).to_dict()
    failing = [c["tensor"] for c in report["comparisons"] if not c["passed"]]
    assert failing and not report["passed"]
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, file, **kw: drawn.append(fig) or file.write(PNG))
    plots.plot_report(report, tmp_path / "errors")
    ax = drawn[0].axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["onnxruntime vs numpy", "atol 1e-07", "fails its tolerance"]
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1  # outside the axes, over no bar
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == len(failing) and all(p.get_facecolor()[:3] != (1, 1, 1) for p in hatched)


HOSTILE = {"esc": "\x1b[31mred\x1b]0;title\x07", "math": "cost $x^2$ / $", "long": "layer/" + "a" * 300,
           "long2": "layer/" + "a" * 299 + "b", "rtl": "fc\u202e1"}


def test_names_are_drawn_escaped_and_long_names_give_short_unique_files(tmp_path):
    import subprocess
    import sys

    from policyport.io.arrays import write_npz

    rng = np.random.default_rng(4)
    write_npz(tmp_path / "rec.npz", {name: rng.normal(size=(30, 3)).astype(np.float32) for name in HOSTILE.values()})
    proc = subprocess.run([sys.executable, "-m", "policyport", "plot", str(tmp_path / "rec.npz"), "-o", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARN")})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "\x07" not in proc.stderr and "Warning" not in proc.stderr
    files = sorted(os.listdir(tmp_path / "p"))
    assert len(files) == 1 + 2 * len(HOSTILE) and all(len(f.encode()) <= 100 for f in files)
    long_slugs = {f for f in files if f.startswith("heatmap-layer-aaa")}
    assert len(long_slugs) == 2  # cut to the same prefix, told apart by the hash suffix
    assert all(png_size(tmp_path / "p" / f)[0] > 0 for f in files)


def test_a_drawn_name_has_control_characters_and_dollars_escaped():
    assert plots.shown(HOSTILE["esc"]) == "\\x1b[31mred\\x1b]0;title\\x07"
    assert plots.shown(HOSTILE["math"]) == "cost \\$x^2\\$ / \\$"
    assert plots.shown(HOSTILE["rtl"]) == "fc\\u202e1"
    assert plots._title("a\nb", "Tanh") == "a\\nb (Tanh)"


def test_long_names_are_cut_with_a_hash_of_the_whole_name():
    import hashlib

    taken: set[str] = set()
    first, second = plots.slug(HOSTILE["long"], taken), plots.slug(HOSTILE["long2"], taken)
    assert len(first) == len(second) == plots.MAX_SLUG and first != second
    assert first.endswith(hashlib.sha256(HOSTILE["long"].encode()).hexdigest()[:10])
    assert plots.slug("fc_1/tanh", taken) == "fc_1-tanh"


def test_each_histograms_figures_sit_above_its_axes_clear_of_the_bars_and_the_title(recording):
    """The line of mean, std and saturated fraction once stood in the axes' top left corner, over
    the peak of any distribution that reaches there (a tanh layer's, saturated at -1)."""
    rec = pp.analysis.open_recording(recording)
    stats = pp.analysis.statistics(rec)
    hists = plots._histograms(rec, stats, 1000, None)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots._plot_histograms(stats, hists)
    FigureCanvasAgg(fig).draw()  # laid out as savefig lays it out
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(stats.tensors) == 7
    for ax, s in zip(panels, stats.tensors):
        (note,) = [t for t in ax.texts if t.get_text().startswith("mean ")]
        layer = s.layer()
        assert note.get_text().startswith(f"mean {layer['mean']:.3g}, std {layer['std']:.3g}")
        assert ("saturated" in note.get_text()) == (s.op_type == "Tanh")
        box = note.get_window_extent(renderer)
        counts, edges = hists[s.name]
        i = int(np.argmax(counts))
        bottom = ax.get_ylim()[0]
        tallest = ax.transData.transform([(edges[i], bottom), (edges[i + 1], counts[i])])
        assert not box.overlaps(type(box)(tallest)), s.name
        assert box.y0 >= ax.get_window_extent(renderer).y1  # above the axes: over no bar at all
        assert box.y1 <= ax.title.get_window_extent(renderer).y0  # under the title, not over it
    assert stats["fc_2/tanh"].layer()["saturated_fraction"] > 0  # a distribution that reaches the top corners
