"""A packed folder's command line (run.py, policyport.handoff.folder_run) run in this process: its outputs,
tables and JSON, usage errors, and every way it ends with its exit code and message."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.handoff import folder_run as entry
from policyport.handoff.golden import read_golden


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """obs (batch, 3) -> h = obs @ W -> y = Tanh(h), packed with 4 golden observations."""
    w = numpy_helper.from_array(np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.5]], np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "W"], ["h"], name="h"), helper.make_node("Tanh", ["h"], ["y"], name="y")],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    out = tmp_path_factory.mktemp("entry") / "bundle"
    pp.pack(model, out, samples=4, runtime=False)
    return out


@pytest.fixture
def obs(tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.array([[1.0, 0.0, 0.0], [0.0, 1.0, -1.0]], np.float32))
    return path


def test_run_writes_outputs_and_prints_a_table(folder, obs, tmp_path, capsys):
    out = tmp_path / "y.npz"
    assert entry.main(folder, ["-i", str(obs), "-o", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"numpy: outputs written to {out}"
    assert lines[1].split() == ["tensor", "dtype", "shape", "min", "max"]
    y = np.load(out)["y"]
    assert y.shape == (2, 2) and lines[2].split() == ["y", "float32", "(2,", "2)", f"{y.min():.4g}", f"{y.max():.4g}"]
    assert lines[2].endswith(f"{y.max():.4g}") and len(lines) == 3


def test_run_warns_on_stderr_of_rows_holding_nan_or_inf(folder, tmp_path, capsys):
    path, out = tmp_path / "bad.npy", tmp_path / "y.npz"
    np.save(path, np.array([[1.0, np.nan, 0.0], [0.0, 1.0, -1.0], [np.inf, 0.0, 0.0]], np.float32))
    assert entry.main(folder, ["-i", str(path), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ("warning: 2 of 3 rows of input 'obs' hold NaN or Inf; the outputs of those rows are "
                            "likely NaN too\n")
    assert "warning" not in captured.out and np.isfinite(np.load(out)["y"][1]).all()


def test_run_records_chosen_tensors_and_speaks_json(folder, obs, tmp_path, capsys):
    out, acts = tmp_path / "y.npz", tmp_path / "acts.npz"
    assert entry.main(folder, ["-i", str(obs), "-o", str(out), "--record", str(acts), "--tensors", "h", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["output"] == str(out) and doc["record"] == str(acts)
    assert [t["name"] for t in doc["tensors"]] == ["h", "y"] and doc["tensors"][0]["shape"] == "(2, 2)"
    with np.load(acts) as f:
        assert sorted(f.files) == ["h", "y"] and np.allclose(f["h"], [[0.5, -1.0], [1.0, 1.5]])
    assert list(np.load(out).files) == ["y"]
    assert entry.main(folder, ["-i", str(obs), "-o", str(out), "--force"]) == 0  # replaced with --force
    only = tmp_path / "only_y.npz"
    assert entry.main(folder, ["-i", str(obs), "-o", str(out), "--force", "--record", str(only), "--tensors", "y"]) == 0
    with np.load(only) as f:
        assert f.files == ["y"]  # what --tensors chose, not every tensor


def test_verify_passes_with_a_table_and_json(folder, capsys):
    assert entry.main(folder, ["--verify"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "max abs error on 4 observations (atol 1e-05, rtol 1e-05)"
    assert [line.split()[0] for line in lines[2:4]] == ["h", "y"] and lines[2].split()[-1] == "0"
    assert len({len(line) for line in lines[1:4]}) == 1 and lines[3].endswith(" 0")  # the error column right-aligned
    assert lines[-1] == "PASS: 2 comparisons within atol 1e-05, rtol 1e-05; worst 0 on h (numpy vs golden)"
    assert entry.main(folder, ["--verify", "--json", "--atol", "0.5", "--rtol", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["passed"] is True and (doc["atol"], doc["rtol"]) == (0.5, 0.0)


def with_golden(folder, copy, changes):
    """A copy of the packed ``folder`` whose golden.npz has ``changes`` (key -> value added), re-signed."""
    import shutil

    shutil.copytree(folder, copy)
    golden = dict(np.load(copy / "golden.npz"))
    for key, delta in changes.items():
        golden[key] = golden[key] + np.float32(delta)
    np.savez(copy / "golden.npz", **golden)
    policy = json.loads((copy / "policy.json").read_text())
    policy["files"]["golden.npz"] = hashlib.sha256((copy / "golden.npz").read_bytes()).hexdigest()
    (copy / "policy.json").write_text(json.dumps(policy))
    return copy


@pytest.mark.parametrize("changes, worst", [
    ({"outputs/y": 0.25}, 0.25), ({"activations/y": 0.5}, 0.5), ({"outputs/y": 0.25, "activations/y": 0.5}, 0.5),
    ({"outputs/y": 0.5, "activations/y": 0.25}, 0.5),
])
def test_a_graph_outputs_comparison_is_the_worse_of_its_run_and_its_record(folder, tmp_path, changes, worst):
    from policyport.handoff.golden import verify_bundle

    report = verify_bundle(with_golden(folder, tmp_path / "copy", changes))
    h, y = report.comparisons
    assert (h.tensor, h.passed, y.tensor, y.passed) == ("h", True, "y", False)
    assert y.max_abs == pytest.approx(worst) and report.samples == 4 and not report.passed


def test_the_tolerances_given_judge_the_graph_outputs_too(folder, tmp_path):
    from policyport.handoff.golden import verify_bundle

    copy = with_golden(folder, tmp_path / "copy", {"outputs/y": 0.25})
    assert not verify_bundle(copy).passed
    report = verify_bundle(copy, atol=0.5, rtol=0.0)
    assert report.passed and [c.passed for c in report.comparisons] == [True, True]
    assert report.comparisons[1].max_abs == pytest.approx(0.25)


def test_verify_fails_when_the_golden_data_disagrees(folder, tmp_path, capsys):
    copy = with_golden(folder, tmp_path / "copy", {"activations/h": 0.01})
    assert read_golden(copy)["inputs"]["obs"].shape == (4, 3)
    assert entry.main(copy, ["--verify"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[-1] == "FAIL" and lines[2].split()[0] == "h"
    assert lines[-1].startswith("FAIL: 1 of 2 comparisons fail; first diverging tensor 'h' (float32, numpy vs golden): "
                                "max abs 0.01")
    assert lines[-1].endswith("* |golden|; that is more than 100 times the float32 tolerance: the values disagree "
                              "beyond rounding — look at the node that computes 'h', not at the tolerances")
    assert entry.main(copy, ["--verify", "--json"]) == 1 and json.loads(capsys.readouterr().out)["passed"] is False


@pytest.mark.parametrize("argv,message", [
    (["-i", "x.npy"], "give -i INPUT and -o OUTPUT to run the policy, or --verify to re-check it"),
    (["-o", "x.npz"], "give -i INPUT and -o OUTPUT"),
    (["--verify", "-o", "x.npz", "--record", "r.npz"], "so -o, --record do not apply"),
    (["--verify", "--tensors", "h"], "run.py: error: --verify re-runs the folder's own golden observations, so --tensors "
                                     "does not apply"),
    (["-i", "a", "-o", "b", "--tensors", "h"], "--tensors selects what --record writes; give --record too"),
    (["--verify", "--atol", "nan"], "--atol must be a finite number >= 0, not nan"),
    (["--verify", "--rtol", "-1"], "--rtol must be a finite number >= 0, not -1.0"),
])
def test_usage_errors_exit_2(folder, argv, message, capsys):
    with pytest.raises(SystemExit) as ended:
        entry.main(folder, argv)
    assert ended.value.code == 2 and message in capsys.readouterr().err


def test_bad_input_existing_outputs_and_the_folder_itself_exit_3(folder, obs, tmp_path, capsys):
    (tmp_path / "y.npz").write_bytes(b"mine")
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz")]) == 3
    assert "exists; overwrite it with --force" in capsys.readouterr().err
    assert entry.main(folder, ["-i", str(obs), "-o", str(folder / "y.npz")]) == 3
    assert capsys.readouterr().err.startswith(f"error: {folder / 'y.npz'} is inside the packed folder {folder}")
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "a.npz"), "--record", str(tmp_path / "a.npz")]) == 2
    assert capsys.readouterr().err == f"error: --record {tmp_path / 'a.npz'} is also the -o file; give --record another file\n"
    assert entry.main(folder, ["-i", str(obs), "-o", str(obs), "--force"]) == 3
    np.save(tmp_path / "bad.npy", np.zeros((2, 4), np.float32))
    assert entry.main(folder, ["-i", str(tmp_path / "bad.npy"), "-o", str(tmp_path / "z.npz"), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 3 and doc["error"].startswith("input 'obs' expects shape (batch, 3), got (2, 4)")
    assert not (tmp_path / "z.npz").exists()


@pytest.mark.parametrize("existing", [None, b"old outputs"])
def test_a_failed_record_leaves_every_output_as_it_was(folder, obs, tmp_path, monkeypatch, capsys, existing):
    import policyport.io.arrays as files

    out, acts = tmp_path / "y.npz", tmp_path / "acts.npz"
    if existing is not None:
        out.write_bytes(existing)
    real = files.npz_writer

    def fail_the_record(arrays):
        if "h" not in arrays:
            return real(arrays)

        def write(file):
            file.write(b"partial")
            raise files.UnreadableFileError("disk full")

        return write

    monkeypatch.setattr(files, "npz_writer", fail_the_record)
    assert entry.main(folder, ["-i", str(obs), "-o", str(out), "--record", str(acts), "--force"]) == 3
    assert capsys.readouterr().err == "error: disk full\n"
    assert (out.read_bytes() if out.exists() else None) == existing and not acts.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["obs.npy"] + (["y.npz"] if existing else []))


@pytest.mark.parametrize("error,code,message", [
    (KeyboardInterrupt(), 130, "interrupted; nothing was written"),
    (entry._Terminated(), 143, "terminated; nothing was written"),
    (MemoryError(), 3, "not enough memory to finish; nothing was written — use a smaller input"),
    (ValueError("odd"), 70, "this is a bug in policyport: ValueError: odd. Nothing was written. Re-run with --debug "
                            "for the traceback, and please report it."),
])
def test_every_other_end_has_its_code(folder, obs, tmp_path, monkeypatch, capsys, error, code, message):
    def broken(folder, args):
        raise error

    monkeypatch.setattr(entry, "_run", broken)
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz")]) == code
    assert capsys.readouterr().err == f"error: {message}\n"
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz"), "--json"]) == code
    assert json.loads(capsys.readouterr().out) == {"error": message, "exit_code": code}


@pytest.mark.parametrize("error,code,message", [
    (entry._Terminated(), 143, "terminated after writing {out}, which is complete"),
    (MemoryError(), 3, "not enough memory to finish; {out} had been written and is complete — use a smaller input"),
    (ValueError("odd"), 70, "this is a bug in policyport: ValueError: odd. It came after writing {out}, which is "
                            "complete. Re-run with --debug for the traceback, and please report it."),
])
def test_an_end_after_the_outputs_are_in_place_names_them(folder, obs, tmp_path, monkeypatch, capsys, error, code,
                                                         message):
    from policyport.io import outputs as files

    real = files.write_outputs

    def place_then_fail(writers, force=False):  # the outputs in place, then the run ends
        real(writers, force)
        raise error

    monkeypatch.setattr(files, "write_outputs", place_then_fail)
    out = tmp_path / "y.npz"
    assert entry.main(folder, ["-i", str(obs), "-o", str(out)]) == code
    assert capsys.readouterr().err == f"error: {message.format(out=out)}\n"
    w = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.5]], np.float32)
    with np.load(out) as f:  # complete: the model's output on every observation
        assert f.files == ["y"]
        np.testing.assert_allclose(f["y"], np.tanh(np.load(obs) @ w), rtol=1e-6)


def test_debug_prints_the_traceback_literally(folder, obs, tmp_path, monkeypatch, capsys):
    def broken(folder, args):
        raise ValueError("x\x1by")

    monkeypatch.setattr(entry, "_run", broken)
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz"), "--debug"]) == 70
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "Traceback (most recent call last):" and "ValueError: x\\x1by" in err
    assert err[-1] == "error: this is a bug in policyport: ValueError: x\\x1by. Nothing was written."


def test_sigterm_is_handled_only_while_main_runs(folder, monkeypatch):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    seen = []
    monkeypatch.setattr(entry, "_verify", lambda folder, args: seen.append(signal.getsignal(signal.SIGTERM)) or 0)
    assert entry.main(folder, ["--verify"]) == 0
    assert seen == [entry._on_sigterm] and signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(entry._Terminated):
        entry._on_sigterm(signal.SIGTERM, None)


def test_the_parser_and_table():
    p = entry.parser("go.py")
    assert p.prog == "go.py" and "exit codes: 0 ok; 1 the golden data does not match" in p.epilog
    args = p.parse_args(["--verify"])
    assert (args.atol, args.rtol, args.force, args.json, args.debug) == (1e-5, 1e-5, False, False, False)
    assert entry.literal("a\x1bb é") == "a\\x1bb é" and entry.literal("plain") == "plain"


def test_table_layout(capsys):
    entry._table(("name", "n"), [("a", "1"), ("long\x07", "100")], right=(1,))
    assert capsys.readouterr().out.splitlines() == ["name        n", "a           1", "long\\x07  100"]


def test_max_bytes_limits_what_the_run_reads(folder, obs, tmp_path, monkeypatch, capsys):
    from policyport.io.limits import limits

    seen = []
    monkeypatch.setattr(entry, "_verify", lambda folder, args: seen.append(limits().array_bytes) or 0)
    assert entry.main(folder, ["--verify", "--max-bytes", "1.5K"]) == 0 and seen == [1536]
    assert entry.main(folder, ["--verify"]) == 0 and seen[1] == limits().array_bytes  # the default outside
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz"), "--max-bytes", "8"]) == 3
    err = capsys.readouterr().err
    assert err == (f"error: {obs} (float32, shape (2, 3)) would take 24 B (24 bytes), above the limit of 8 B for arrays "
                   "read from a file; if you trust it and have the memory, raise the limit with --max-bytes 1M (or "
                   "POLICYPORT_MAX_ARRAY_BYTES=1M)\n")  # --max-bytes is run.py's own option: no note
    assert not (tmp_path / "y.npz").exists()
    with pytest.raises(SystemExit) as ended:
        entry.main(folder, ["--verify", "--max-bytes", "lots"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("run.py: error: --max-bytes: 'lots' is not a size; write e.g. "
                                                        "4G, 512M, 1.5GiB or 1000000 (bytes)")


@pytest.mark.parametrize("message, shown", [
    ("run it with --backend onnxruntime", "run it with --backend onnxruntime (--backend is an option of the policyport "
                                          "command, not of run.py)"),
    ("use --backend x or --max-nodes, --backend again, or --force", "use --backend x or --max-nodes, --backend again, "
     "or --force (--backend, --max-nodes are options of the policyport command, not of run.py)"),
    ("replace it with --force or --max-bytes", "replace it with --force or --max-bytes"),
    ("a-b x--backend, -backend and --Backend", "a-b x--backend, -backend and --Backend"),
])
def test_a_message_naming_policyports_options_says_run_py_lacks_them(folder, obs, tmp_path, monkeypatch, capsys,
                                                                     message, shown):
    def refuse(folder, args):
        raise pp.BadModelError(message)

    monkeypatch.setattr(entry, "_run", refuse)
    assert entry.main(folder, ["-i", str(obs), "-o", str(tmp_path / "y.npz")]) == 3
    assert capsys.readouterr().err == f"error: {shown}\n"


def test_main_off_the_main_thread_leaves_sigterm_alone(folder):
    import signal
    import threading

    before, seen = signal.getsignal(signal.SIGTERM), []

    def verify(folder, args):
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    original = entry._verify
    entry._verify = verify
    try:
        worker = threading.Thread(target=lambda: seen.append(entry.main(folder, ["--verify"])))
        worker.start()
        worker.join()
    finally:
        entry._verify = original
    assert seen == [before, 0]


def test_the_help_names_every_option_with_its_meaning_and_default(capsys):
    p = entry.parser()
    assert p.description == ("Run the policy packed in this folder on the numpy backend, or re-check it against the golden "
                             "data it carries. Needs Python and numpy only.")
    assert p.epilog == ("exit codes: 0 ok; 1 the golden data does not match; 2 usage error; 3 bad model or input "
                        "(including a changed or damaged file of the folder); 4 missing dependency; 70 a bug in policyport")
    helps = {a.option_strings[-1]: (a.help, a.default, a.metavar) for a in p._actions}
    assert helps == {
        "--help": ("show this help message and exit", "==SUPPRESS==", None),
        "--input": (".npy (single-input model) or .npz keyed by input name", None, None),
        "--output": ("the .npz of graph outputs to write", None, None),
        "--record": ("also write every recorded activation to this .npz", None, None),
        "--tensors": ("with --record: comma-separated globs over tensor names (default: all)", None, None),
        "--override": ("set, scale or clamp neurons: TENSOR[INDEX]=VALUE, TENSOR[INDEX]*=FACTOR, "
                       "TENSOR[INDEX]=clip(LO,HI); repeatable", None, "SPEC"),
        "--steer": ("apply the named set of --overrides FILE", None, "NAME"),
        "--overrides": ("intervention file (JSON; YAML with PyYAML) of named sets: overrides, directions, ablations, "
                        "patches", None, "FILE"),
        "--force": ("replace existing output files", False, None),
        "--verify": ("re-run the golden observations and compare every tensor; exit 1 on a mismatch", False, None),
        "--atol": ("with --verify: absolute tolerance", 1e-5, None),
        "--rtol": ("with --verify: relative tolerance", 1e-5, None),
        "--max-bytes": ("the most the arrays of the input file may take, and one tensor the model sizes from a value in "
                        "it: 4G, 512M, 1.5GiB or a number of bytes (default 1 GiB, or POLICYPORT_MAX_ARRAY_BYTES)",
                        None, "SIZE"),
        "--json": ("print one JSON document on stdout and nothing else", False, None),
        "--debug": ("print the traceback of an unexpected error (exit 70)", False, None),
    }
    assert [a.option_strings for a in p._actions][:3] == [["-h", "--help"], ["-i", "--input"], ["-o", "--output"]]
    assert entry.EXIT_BUG == 70 and entry.EXIT_INTERRUPTED == 130 and entry.EXIT_TERMINATED == 143


def test_one_observation_and_empty_tensors_read_right(tmp_path, capsys):
    w = numpy_helper.from_array(np.array([[2.0], [-1.0]], np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["obs", "W"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    one = tmp_path / "one"
    pp.pack(model, one, samples=1, runtime=False)
    assert entry.main(one, ["--verify"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "max abs error on 1 observation (atol 1e-05, rtol 1e-05)"
    np.save(tmp_path / "none.npy", np.zeros((0, 2), np.float32))
    assert entry.main(one, ["-i", str(tmp_path / "none.npy"), "-o", str(tmp_path / "y.npz")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["tensor  dtype    shape   min  max", "y       float32  (0, 1)"]
    assert entry.main(one, ["-i", str(tmp_path / "none.npy"), "-o", str(tmp_path / "y.npz"), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tensors"] == [
        {"name": "y", "dtype": "float32", "shape": "(0, 1)", "min": "", "max": ""}]
