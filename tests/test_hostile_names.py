"""Names from a model, from an input file and from paths reach the terminal literally, in every command.

Each name below holds what a terminal would act on — OSC set-window-title, clear-screen, a newline that
would add a fake table row, a right-to-left override — and what Rich would take as markup (``[red]``,
a closing tag ``[/x]`` that would crash it, a hidden link). Every command must print them escaped
(``\\x1b``, ``\\n``), never interpret them, and keep them exact in ``--json``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from policyport.cli import app
from policyport.cli.render import literal

EVIL = "\x1b]0;pwned\x07\x1b[2J\n[red]FAKE[/red][/x][link=https://evil.example]l[/link]\u202e"
RAW = ("\x1b", "\x07", "\u202e", "\nFAKE", "\n[red]")

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def shows_nothing_raw(result) -> str:
    """The command's whole output, after checking that no character of EVIL reached it unescaped."""
    shown = result.stdout + result.stderr
    for raw in RAW:
        assert raw not in shown, f"{raw!r} reached the terminal: {shown!r}"
    assert "Traceback" not in shown and "this is a bug" not in shown, shown
    return shown


def name(part: str) -> str:
    return f"{part}{EVIL}"


@pytest.fixture(scope="module")
def evil_model(tmp_path_factory):
    """obs-like input, a MatMul with a weight, a Tanh: every name (input, initializer, nodes, tensors,
    outputs, producer, metadata) hostile."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), name("w"))
    nodes = [helper.make_node("MatMul", [name("in"), name("w")], [name("mid")], name=name("dense")),
             helper.make_node("Tanh", [name("mid")], [name("out")], name=name("tanh"))]
    graph = helper.make_graph(nodes, name("graph"), [helper.make_tensor_value_info(name("in"), TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(name("out"), TensorProto.FLOAT, ["batch", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name=name("producer"))
    model.ir_version = 8
    entry = model.metadata_props.add()
    entry.key, entry.value = name("key"), name("value")
    path = tmp_path_factory.mktemp("evil") / "m.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture
def obs(tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4))
    return path


def test_inspect(evil_model):
    shown = shows_nothing_raw(invoke("inspect", evil_model))
    for part in ("in", "out", "mid", "dense", "producer"):
        assert literal(name(part)) in shown
    doc = json.loads(invoke("inspect", evil_model, "--json").stdout)
    assert doc["inputs"][0]["name"] == name("in") and doc["metadata"] == {name("key"): name("value")}


def test_expose_lists_its_outputs_literally_and_to_a_hostile_path(evil_model, tmp_path):
    target = tmp_path / f"exposed{EVIL.replace('/', '')}.onnx"
    result = invoke("expose", evil_model, "-o", target)
    assert result.exit_code == 0, result.output
    shown = shows_nothing_raw(result)
    assert literal(name("mid")) in shown and literal(target) in shown


def test_verify_table_and_json(evil_model):
    result = invoke("verify", evil_model, "--samples", "8")
    assert result.exit_code == 0, result.output
    shown = shows_nothing_raw(result)
    assert literal(name("mid")) in shown and literal(name("out")) in shown
    doc = json.loads(invoke("verify", evil_model, "--samples", "8", "--json").stdout)
    assert {c["tensor"] for c in doc["comparisons"]} == {name("mid"), name("out")}


def test_a_failing_report_names_its_tensor_literally_in_table_verdict_and_json(capsys):
    from policyport.cli.verify import print_report
    from policyport.verification.compare import Report, compare

    report = Report(["numpy", "onnxruntime"], None, 2, 1e-5, 1e-5)
    report.comparisons.append(compare(name("mid"), "onnxruntime", np.ones(2), "numpy", np.zeros(2), 1e-5, 1e-5))
    assert print_report(report, as_json=False) == 1
    shown = capsys.readouterr()
    for raw in RAW:
        assert raw not in shown.out + shown.err
    assert f"first diverging tensor {literal(repr(name('mid')))}" in shown.out
    assert print_report(report, as_json=True) == 1
    assert json.loads(capsys.readouterr().out)["comparisons"][0]["tensor"] == name("mid")


def test_verify_names_the_keys_of_an_input_file_literally(evil_model, tmp_path):
    wrong = tmp_path / "obs.npz"
    np.savez(wrong, **{name("stranger"): np.zeros((2, 4), np.float32), "other": np.zeros((2, 4), np.float32)})
    result = invoke("verify", evil_model, "-i", wrong)  # keys of an input file are names too
    assert result.exit_code == 3
    assert literal(repr(name("stranger"))) in shows_nothing_raw(result)


def test_run_records_every_hostile_tensor(evil_model, obs, tmp_path):
    out, record = tmp_path / f"y{EVIL.replace('/', '')}.npz", tmp_path / "acts.npz"
    result = invoke("run", evil_model, "-i", obs, "-o", out, "--record", record)
    assert result.exit_code == 0, result.output
    shown = shows_nothing_raw(result)
    assert literal(name("mid")) in shown and literal(out) in shown
    with np.load(record) as f:
        assert sorted(f.files) == sorted([name("mid"), name("out"), "policyport.recording"])
        assert [t["name"] for t in json.loads(str(f["policyport.recording"]))["tensors"]] == [name("mid"), name("out")]


def test_run_with_an_exact_hostile_name_in_tensors(evil_model, obs, tmp_path):
    result = invoke("run", evil_model, "-i", obs, "-o", tmp_path / "y.npz", "--record", tmp_path / "a.npz",
                    "--tensors", name("mid"))
    shown = shows_nothing_raw(result)
    assert result.exit_code == 0, shown
    with np.load(tmp_path / "a.npz") as f:
        assert sorted(f.files) == sorted([name("mid"), name("out"), "policyport.recording"])


def test_extract_names_the_parameters_literally(evil_model, tmp_path):
    result = invoke("extract", evil_model, "-o", tmp_path / "w.npz")
    assert result.exit_code == 0, result.output
    assert literal(name("w")) in shows_nothing_raw(result)


def test_pack_to_a_hostile_folder_name(evil_model, tmp_path):
    target = tmp_path / f"bundle{EVIL.replace('/', '')}"
    result = invoke("pack", evil_model, "-o", target, "--samples", "4")
    assert result.exit_code == 0, result.output
    assert literal(target) in shows_nothing_raw(result)
    checked = invoke("verify", target)
    assert checked.exit_code == 0 and literal(name("mid")) in shows_nothing_raw(checked)


def test_convert_refuses_hostile_keys_literally(tmp_path):
    weights = tmp_path / "w.npz"
    np.savez(weights, **{"fc_1/kernel": np.ones((4, 8), np.float32), "fc_1/bias": np.zeros(8, np.float32),
                         "fc_out/kernel": np.ones((8, 2), np.float32), "fc_out/bias": np.zeros(2, np.float32),
                         name("stray"): np.zeros(1, np.float32)})
    result = invoke("convert", weights, "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3 and literal(name("stray")) in shows_nothing_raw(result)
    doc = json.loads(invoke("convert", weights, "-o", tmp_path / "m.onnx", "--json").stdout)
    assert name("stray") in doc["error"]


def test_convert_to_a_hostile_path_prints_it_and_the_table_literally(tmp_path):
    weights, scope = tmp_path / "w.npz", name("scope").replace("/", "").replace("\n", "")  # one line, no "/"
    np.savez(weights, **{f"{scope}/fc_1/kernel": np.ones((4, 8), np.float32),
                         f"{scope}/fc_1/bias": np.zeros(8, np.float32),
                         f"{scope}/fc_out/kernel": np.ones((8, 2), np.float32),
                         f"{scope}/fc_out/bias": np.zeros(2, np.float32)})
    target = tmp_path / f"m{EVIL.replace('/', '')}.onnx"
    result = invoke("convert", weights, "-o", target, "--activation", "tanh", "--samples", "8")
    assert result.exit_code == 0, result.output
    assert literal(target) in shows_nothing_raw(result)
    extracted = invoke("extract", target, "-o", tmp_path / "w2.npz")
    assert literal(f"{scope}/fc_1/kernel") in shows_nothing_raw(extracted)
