"""What each command writes and says: an output refused when its name says another format, status
text on stderr and tables on stdout, option values that select nothing refused, messages that say
what is wrong. Exit codes: 2 usage (including values policyport refuses), 3 bad model or input."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from policyport.cli import app

runner = CliRunner()
DISCRETE = Path(__file__).parent.parent / "fixtures" / "rllib" / "ray" / "ppo_old_torch_discrete"


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def fails(code: int, message: str, *args):
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    assert result.stderr.rstrip("\n").split("\n")[-1] == f"error: {message}", result.stderr
    return result


# ------------------------------------------------------------------------- output names and formats


def _writers(place, tmp_path) -> dict[str, list]:
    """Each writing command, its -o (or --record) given as ``OUT``."""
    model, obs = place / "md.onnx", place / "obs.npy"
    return {
        "convert": ["convert", place / "src.npz", "--activation", "tanh", "-o", "OUT"],
        "extract": ["extract", model, "-o", "OUT"],
        "expose": ["expose", model, "-o", "OUT"],
        "run": ["run", model, "-i", obs, "-o", "OUT"],
        "run --record": ["run", model, "-i", obs, "-o", tmp_path / "out.npz", "--record", "OUT"],
        "record": ["record", model, "-i", obs, "-o", "OUT"],
        "stats -o": ["stats", tmp_path / "rec.npz", "-o", "OUT"],
        "plot": ["plot", tmp_path / "rec.npz", "-o", "OUT"],
        "export-numpy": ["export-numpy", model, "-o", "OUT"],
        "pack": ["pack", model, "-o", "OUT"],
    }


DEVICE = ("is a character device: policyport writes each output whole to a temporary file beside it and then renames "
          "it into place (all of a command's outputs or none), which a device cannot take; write to a path in a folder "
          "instead (to discard the output, in a temporary folder you remove after)")
PIPE = ("is a FIFO (named pipe): policyport writes each output whole to a temporary file beside it and then renames it "
        "into place (all of a command's outputs or none), which a pipe cannot take; write to a path in a folder and "
        "read the output from there")


@pytest.mark.skipif(not os.path.exists("/dev/null") or not hasattr(os, "mkfifo"), reason="needs /dev/null and FIFOs")
@pytest.mark.parametrize("command", list(_writers(Path("p"), Path("t"))))
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_every_writing_command_refuses_a_device_or_a_fifo_as_usage(place, tmp_path, command, force):
    """/dev/null, a link to it (named as the output's format) and a FIFO: exit 2 saying why, and the
    path left as it was."""
    assert invoke("record", place / "md.onnx", "-i", place / "obs.npy", "-o", tmp_path / "rec.npz").exit_code == 0
    fifo = tmp_path / ("pipe.py" if command == "export-numpy" else "pipe")
    os.mkfifo(fifo)
    link = tmp_path / {"convert": "null.onnx", "expose": "null.onnx", "stats -o": "null.json",
                       "export-numpy": "null.py"}.get(command, "null.npz")
    link.symlink_to("/dev/null")
    before = sorted(p.name for p in tmp_path.iterdir())
    paths = ([] if command == "export-numpy" else [(Path("/dev/null"), "/dev/null", DEVICE)]) + [
        (link, str(link), DEVICE), (fifo, str(fifo), PIPE)]
    for path, shown, message in paths:
        args = [path if a == "OUT" else a for a in _writers(place, tmp_path)[command]]
        fails(2, f"{shown} {message}", *args, *force)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert os.path.realpath(link) == "/dev/null" and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_export_numpy_refuses_dev_null_for_its_name():
    """/dev/null is no module name: refused before the path is looked at."""
    result = invoke("export-numpy", "m.onnx", "-o", "/dev/null")
    assert result.exit_code == 2 and "the module's file name must end in .py" in result.stderr


@pytest.mark.parametrize("name", ["act.npy", "act.onnx", "act.PT", "act.zip", "act.parquet", "act.json"])
@pytest.mark.parametrize("option", ["-o", "--record"])
def test_run_refuses_an_output_named_as_another_format_than_npz(place, tmp_path, option, name):
    named = tmp_path / name
    args = ["-o", named] if option == "-o" else ["-o", tmp_path / "out.npz", "--record", named]
    fails(2, f"Invalid value for {option}: {named} is named as a {named.suffix} file, but the output is an .npz "
             "archive of arrays; name it .npz", "run", place / "md.onnx", "-i", place / "obs.npy", *args)
    assert list(tmp_path.iterdir()) == []


def test_run_and_extract_keep_npz_and_any_name_no_format_claims(place, tmp_path):
    for name in ("out.npz", "out", "out.acts"):
        assert invoke("run", place / "md.onnx", "-i", place / "obs.npy", "-o", tmp_path / name).exit_code == 0
        assert isinstance(np.load(tmp_path / name), np.lib.npyio.NpzFile)
    for name in ("weights.npz", "weights"):
        assert invoke("extract", place / "md.onnx", "-o", tmp_path / name).exit_code == 0
    with np.load(tmp_path / "weights.npz") as named, np.load(tmp_path / "weights") as bare:
        assert named.files and named.files == bare.files


@pytest.mark.parametrize("name", ["kw.onnx", "kw.npy", "kw.pth", "kw.safetensors"])
def test_extract_refuses_an_output_named_as_another_format_than_npz(place, tmp_path, name):
    named = tmp_path / name
    fails(2, f"Invalid value for -o: {named} is named as a {named.suffix} file, but the output is an .npz archive "
             "of arrays; name it .npz", "extract", place / "md.onnx", "-o", named)
    assert not named.exists()


def test_stats_refuses_a_json_output_named_as_another_format(place, tmp_path):
    rec = tmp_path / "rec.npz"
    assert invoke("record", place / "md.onnx", "-i", place / "obs.npy", "-o", rec, "-q").exit_code == 0
    named = tmp_path / "stats.npz"
    fails(2, f"Invalid value for -o: {named} is named as a .npz file, but the output is a JSON document; "
             "name it .json", "stats", rec, "-o", named)
    assert not named.exists()


@pytest.mark.parametrize("command,args", [
    ("convert", ["SRC", "-o", ""]),
    ("extract", ["MODEL", "-o", ""]),
    ("expose", ["MODEL", "-o", ""]),
    ("run", ["MODEL", "-i", "OBS", "-o", ""]),
    ("record", ["MODEL", "-i", "OBS", "-o", ""]),
    ("pack", ["MODEL", "-o", ""]),
    ("export-numpy", ["MODEL", "-o", ""]),
])
def test_an_empty_output_name_is_called_empty_not_the_current_folder(place, command, args):
    given = {"SRC": place / "src.npz", "MODEL": place / "md.onnx", "OBS": place / "obs.npy"}
    fails(2, "Invalid value for '-o' / '--output': the name is empty; give a file name",
          command, *[given.get(a, a) for a in args])


def test_an_empty_input_or_model_name_is_called_empty(place, tmp_path):
    fails(2, "Invalid value for '-i' / '--input': the name is empty; give a file name",
          "run", place / "md.onnx", "-i", "", "-o", tmp_path / "a.npz")
    fails(2, "Invalid value for 'MODEL': the name is empty; give a file name", "verify", "")


@pytest.mark.parametrize("option, command, args", [
    ("--source", "verify", ["MODEL"]),
    ("--source", "pack", ["MODEL", "-o", "OUT"]),
    ("--obs-norm", "convert", ["SRC", "-o", "OUT"]),
    ("--record", "run", ["MODEL", "-i", "OBS", "-o", "OUT"]),
    ("--overrides", "run", ["MODEL", "-i", "OBS", "-o", "OUT"]),
])
def test_every_other_empty_file_name_is_called_empty(place, tmp_path, option, command, args):
    given = {"SRC": place / "src.npz", "MODEL": place / "md.onnx", "OBS": place / "obs.npy", "OUT": tmp_path / "out.npz"}
    if command != "run":
        given["OUT"] = tmp_path / ("out.onnx" if command == "convert" else "bundle")
    fails(2, f"Invalid value for '{option}': the name is empty; give a file name",
          command, *[given.get(a, a) for a in args], option, "")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ stdout and stderr


def test_a_range_that_reaches_no_input_is_said_on_stderr_and_plainly(tmp_path):
    result = invoke("convert", DISCRETE, "-o", tmp_path / "x.onnx", "--samples", "20", "--low", "-2", "--high", "2")
    assert result.exit_code == 0, result.output
    note = ("note: [-2, 2) (--low/--high, low=/high=) applies to no input: 'obs' takes the integers 0..3 the model "
            "records")
    assert note in result.stderr.splitlines() and "note:" not in result.stdout
    assert "PASS against a reconstruction of the source that assumes nothing the file does not record: " in result.stdout
    result = invoke("verify", tmp_path / "x.onnx", "--samples", "20", "--low", "-2", "--high", "2")
    assert result.exit_code == 0 and note in result.stderr.splitlines() and "note:" not in result.stdout
    doc = json.loads(invoke("verify", tmp_path / "x.onnx", "--samples", "20", "--low", "-2", "--high", "2",
                            "--json").stdout)
    assert doc["notes"] == [note.removeprefix("note: ")]


def test_verify_notes_go_to_stderr(place):
    result = invoke("verify", place / "md.onnx", "-i", place / "obs.npy", "--samples", "3")
    assert result.exit_code == 0
    assert "note: using the first 3 of the 5 observations given" in result.stderr.splitlines()
    assert "note:" not in result.stdout and "PASS: " in result.stdout


# ---------------------------------------------------------------------------- values refused


@pytest.mark.parametrize("patterns", [",,", "", " , ", ","])
@pytest.mark.parametrize("command", ["run", "record", "expose", "verify", "stats", "plot"])
def test_a_tensor_list_of_no_pattern_is_refused(place, tmp_path, command, patterns):
    model, obs = place / "md.onnx", place / "obs.npy"
    args = {"run": [model, "-i", obs, "-o", tmp_path / "s.npz", "--record", tmp_path / "a.npz"],
            "record": [model, "-i", obs, "-o", tmp_path / "r.npz"],
            "expose": [model, "-o", tmp_path / "x.onnx"],
            "verify": [model],
            "stats": [obs],
            "plot": [obs, "-o", tmp_path / "plots"]}[command]
    fails(2, f"Invalid value for '--tensors': {patterns!r} holds no tensor name or glob; give comma-separated names "
             "or globs, e.g. 'fc_1/*,logits' (the graph outputs alone: their names)",
          command, *args, "--tensors", patterns)
    assert list(tmp_path.iterdir()) == []


def test_recording_the_graph_outputs_alone_names_them(place, tmp_path):
    result = invoke("run", place / "md.onnx", "-i", place / "obs.npy", "-o", tmp_path / "s.npz", "--record",
                    tmp_path / "a.npz", "--tensors", "logits,action,log_std")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "a.npz") as recorded:  # the tensors, and the description that names them
        assert sorted(recorded.files) == ["action", "log_std", "logits", "policyport.recording"]
        described = json.loads(str(recorded["policyport.recording"]))
    assert [t["name"] for t in described["tensors"]] == ["logits", "action", "log_std"] and described["rows"] == 5


@pytest.mark.parametrize("backends,twice", [("numpy,numpy", "numpy"), ("onnxruntime, onnxruntime", "onnxruntime"),
                                            ("numpy,onnxruntime,numpy", "numpy")])
def test_verify_refuses_a_backend_named_twice_saying_they_must_differ(place, backends, twice):
    fails(2, f"Invalid value for --backends: {backends!r} names {twice} more than once; the backends compared must "
             "differ, e.g. numpy,onnxruntime", "verify", place / "md.onnx", "--backends", backends)


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_record_says_what_a_device_or_fifo_input_is(place, tmp_path):
    fails(3, "/dev/null is a character device, not a file; expected an .npy, .npz or .parquet file, or a folder of "
             "them", "record", place / "md.onnx", "-i", "/dev/null", "-o", tmp_path / "r.npz")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fails(3, f"{fifo} is a FIFO (named pipe), not a file; expected an .npy, .npz or .parquet file, or a folder of "
             "them", "record", place / "md.onnx", "-i", fifo, "-o", tmp_path / "r.npz")
    fails(3, f"{tmp_path / 'none.npy'}: no such file or folder", "record", place / "md.onnx", "-i",
          tmp_path / "none.npy", "-o", tmp_path / "r.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_pack_warns_of_golden_observations_holding_nan_or_inf(place, tmp_path):
    obs = np.load(place / "obs.npy").copy()
    obs[1, 3] = np.nan
    np.save(tmp_path / "nan.npy", obs)
    result = invoke("pack", place / "md.onnx", "-o", tmp_path / "bundle", "-i", tmp_path / "nan.npy")
    assert result.exit_code == 0, result.output
    assert (f"warning: 1 of {len(obs)} rows of input 'obs' hold NaN or Inf; the outputs of those rows are likely "
            "NaN too") in " ".join(result.stderr.split())
