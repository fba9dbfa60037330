"""The CLI's one error edge: exit codes for every way a command ends, --json on every failure, and
text from files and users shown literally (never as markup or terminal control sequences)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from policyport.cli import app
from policyport.cli.render import literal

runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def test_an_unexpected_exception_is_exit_70_naming_a_bug_without_a_traceback(monkeypatch, tmp_path):
    import policyport.verification.summary

    def broken(model):
        raise KeyError("nodes")

    monkeypatch.setattr(policyport.verification.summary, "summarize", broken)
    model = tmp_path / "m.onnx"
    _tiny_model(model)
    result = invoke("inspect", model)
    assert result.exit_code == 70
    assert "this is a bug in policyport: KeyError: 'nodes'" in result.stderr and "--debug" in result.stderr
    assert "Traceback" not in result.output
    as_json = invoke("inspect", model, "--json")
    assert as_json.exit_code == 70 and json.loads(as_json.stdout)["exit_code"] == 70
    debug = invoke("--debug", "inspect", model)
    assert debug.exit_code == 70 and "Traceback" in debug.stderr and "broken" in debug.stderr
    anywhere = invoke("inspect", model, "--debug")  # --debug after the command works too
    assert anywhere.exit_code == 70 and "Traceback" in anywhere.stderr
    after = invoke("inspect", model)  # --debug holds for its own invocation only
    assert after.exit_code == 70 and "Traceback" not in after.stderr


@pytest.mark.parametrize("args", [
    ["convert", "x.npz", "-o", "y.onnx", "--from", "nope", "--json"],
    ["verify", "m.onnx", "--samples", "0", "--json"],
    ["verify", "m.onnx", "--seed", "-1", "--json"],
    ["run", "m.onnx", "--json"],  # no such option on run: still one JSON document
])
def test_usage_errors_exit_2_and_json_gets_one_document(args):
    result = invoke(*args)
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 2 and doc["error"]


@pytest.mark.parametrize("low,high", [("-inf", "1"), ("0", "inf"), ("nan", "1"), ("1", "1")])
def test_sampling_ranges_must_be_finite_and_non_empty(low, high, tmp_path):
    model = tmp_path / "m.onnx"
    _tiny_model(model)
    result = invoke("verify", model, f"--low={low}", f"--high={high}")
    assert result.exit_code == 2 and "--low" in result.stderr


@pytest.mark.parametrize("name", ["x[/y].npy", "data[bold].npy", "[link=https://evil]click[/link].npy"])
def test_user_text_is_never_markup(name, tmp_path):
    model = tmp_path / "m.onnx"
    _tiny_model(model)
    result = invoke("run", model, "-i", tmp_path / name, "-o", tmp_path / "o.npz")
    assert result.exit_code == 3
    assert f"{tmp_path / name}: no such file" in result.stderr


def test_control_characters_in_names_are_escaped_in_tables_messages_and_json(tmp_path):
    hostile = "fc\x1b]0;pwned\x07\x1b[2J\nPASS fake row\u202e"
    model = tmp_path / "m.onnx"
    _tiny_model(model, tensor=hostile)
    shown = invoke("inspect", model)
    assert shown.exit_code == 0
    assert "\x1b" not in shown.output and "\x07" not in shown.output and "\u202e" not in shown.output
    assert literal(hostile) in shown.stdout and "\\x1b]0;pwned\\x07" in shown.stdout
    assert not any(line.startswith("PASS fake row") for line in shown.stdout.splitlines())
    doc = json.loads(invoke("inspect", model, "--json").stdout)
    assert hostile in [o["name"] for n in doc["nodes"] for o in n["outputs"]]  # JSON keeps it, escaped
    missing = invoke("run", model, "-i", tmp_path / "obs\x1b[2J.npy", "-o", tmp_path / "o.npz")
    assert missing.exit_code == 3 and "\x1b" not in missing.output and "obs\\x1b[2J.npy" in missing.stderr


def test_literal_escapes_only_what_a_terminal_would_act_on():
    assert literal("fc_1/tanh é 漢字 a b") == "fc_1/tanh é 漢字 a b"
    assert literal("a\tb\rc\nd\x00\x7f\x9b\u200b\u2028\udc80") == "a\\tb\\rc\\nd\\x00\\x7f\\x9b\\u200b\\u2028\\udc80"


def test_version_and_python_dash_m():
    assert invoke("--version").stdout.strip().startswith("policyport ")
    proc = subprocess.run([sys.executable, "-m", "policyport", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("policyport ")


def test_tables_are_not_cut_when_stdout_is_a_pipe(tmp_path):
    long = "actor/" + "very_long_layer_name/" * 6 + "linear"
    model = tmp_path / "m.onnx"
    _tiny_model(model, tensor=long)
    proc = subprocess.run([sys.executable, "-m", "policyport", "inspect", str(model)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "40"})
    assert proc.returncode == 0 and long in proc.stdout


SLOW_WRITE = """
import sys, time
import policyport.io.arrays as files
def slow_write(file, arrays, *rest):  # half a file, then a long wait: SIGTERM arrives mid-write
    file.write(b"PK partial")
    file.flush()
    print("writing", flush=True)
    time.sleep(60)
files.write_npz = slow_write
from policyport.cli import main
sys.argv = ["policyport", *sys.argv[1:]]
main()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_while_writing_exits_143_and_leaves_nothing(tmp_path):
    model = tmp_path / "m.onnx"
    _tiny_model(model)
    obs = tmp_path / "obs.npy"
    np.save(obs, np.zeros((1, 4), np.float32))
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, "run", str(model), "-i", str(obs), "-o",
                             str(tmp_path / "out.npz")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert "terminated" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "obs.npy"]  # no output, no temp file


def _tiny_model(path, tensor: str = "h"):
    """obs (batch, 4) -> Tanh named ``tensor`` -> Relu -> y."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Tanh", ["obs"], [tensor], name=tensor), helper.make_node("Relu", [tensor], ["y"], name="y")],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
