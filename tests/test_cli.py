"""The policyport CLI: exit codes, --json, no-overwrite, no traceback, no partial output."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


@pytest.fixture(scope="module")
def converted(tmp_path_factory, metadrive_path):
    out = tmp_path_factory.mktemp("cli") / "md.onnx"
    result = invoke("convert", metadrive_path, "-o", out, "--activation", "tanh", "--head", "diag-gaussian")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def obs_file(tmp_path, metadrive_obs):
    path = tmp_path / "obs.npy"
    np.save(path, metadrive_obs[:16])
    return path


def test_convert_verifies_against_the_source_and_prints_the_figures(tmp_path, metadrive_path):
    out = tmp_path / "m.onnx"
    result = invoke("convert", metadrive_path, "-o", out, "--activation", "tanh", "--head", "diag-gaussian", "--samples", "64")
    assert result.exit_code == 0
    assert ("PASS against a reconstruction that assumes activation tanh at fc_1 and fc_2; head diagonal Gaussian, fc_out "
            "= [mean (2, the action), log_std (2)]; observation normalisation none: 21 comparisons") in result.stdout
    assert "fc_2/tanh" in result.stdout
    assert out.exists()


def test_convert_json_is_one_document(tmp_path, metadrive_path):
    result = invoke("convert", metadrive_path, "-o", tmp_path / "m.onnx", "--activation", "tanh", "--json", "--samples", "8")
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["verification"]["passed"] is True
    assert {c["tensor"] for c in doc["verification"]["comparisons"]} == {"fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits"}


def test_existing_output_is_not_overwritten_without_force(tmp_path, metadrive_path):
    out = tmp_path / "m.onnx"
    out.write_bytes(b"precious")
    result = invoke("convert", metadrive_path, "-o", out, "--activation", "tanh")
    assert result.exit_code == 3 and "exists" in result.stderr and "--force" in result.stderr
    assert out.read_bytes() == b"precious"
    assert invoke("convert", metadrive_path, "-o", out, "--activation", "tanh", "--force").exit_code == 0
    assert out.read_bytes() != b"precious"


def test_unplaceable_npz_exits_3_with_the_names_and_writes_nothing(tmp_path):
    src = tmp_path / "odd.npz"
    np.savez(src, **{"policy/encoder/w": np.zeros((3, 3), np.float32), "fc_out/kernel": np.zeros((3, 2), np.float32)})
    out = tmp_path / "m.onnx"
    result = invoke("convert", src, "-o", out)
    assert result.exit_code == 3
    assert "cannot place 1 array(s)" in result.stderr and "policy/encoder/w" in result.stderr
    assert list(tmp_path.iterdir()) == [src]


def test_missing_source_exits_3(tmp_path):
    result = invoke("convert", tmp_path / "nope.npz", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3 and "no such file" in result.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_pickled_npz_is_refused(tmp_path):
    src = tmp_path / "pickled.npz"
    np.savez(src, **{"fc_out/kernel": np.array([{"a": 1}], dtype=object)})
    result = invoke("convert", src, "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3 and "unpickling" in result.stderr


@pytest.mark.parametrize("args, code", [
    (["convert", "x.npz"], 2),  # missing -o
    (["run", "m.onnx", "-i", "x.npy", "-o", "o.npz", "--backend", "tensorrt"], 2),
    (["convert", "x.npz", "-o", "m.onnx", "--activation", "tanh", "--head", "beta"], 2),
    (["convert", "x.npz", "-o", "m.onnx", "--activation", "tanh", "--samples", "0"], 2),
    (["frobnicate"], 2),
])
def test_usage_errors_exit_2(args, code, tmp_path, metadrive_path):
    args = [str(metadrive_path) if a == "x.npz" else str(tmp_path / a) if a.endswith((".onnx", ".npy", ".npz")) else a for a in args]
    assert invoke(*args).exit_code == code


def test_extract_writes_the_source_arrays(converted, tmp_path, metadrive_weights):
    out = tmp_path / "w.npz"
    assert invoke("extract", converted, "-o", out).exit_code == 0
    with np.load(out) as f:
        assert f.files == list(metadrive_weights)
        assert all(f[k].tobytes() == metadrive_weights[k].tobytes() for k in f.files)


def test_expose_writes_a_new_file_and_leaves_the_input(converted, tmp_path):
    before = converted.read_bytes()
    out = tmp_path / "exposed.onnx"
    result = invoke("expose", converted, "-o", out, "--tensors", "*tanh")
    assert result.exit_code == 0 and converted.read_bytes() == before
    import onnx

    assert [o.name for o in onnx.load(out).graph.output] == ["logits", "action", "log_std", "fc_1/tanh", "fc_2/tanh"]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_run_with_record_writes_outputs_and_every_activation(converted, obs_file, tmp_path, backend, metadrive_obs):
    out, acts = tmp_path / "out.npz", tmp_path / "acts.npz"
    result = invoke("run", converted, "-i", obs_file, "-o", out, "--backend", backend, "--record", acts)
    assert result.exit_code == 0, result.output
    with np.load(out) as o, np.load(acts) as a:
        assert o.files == ["logits", "action", "log_std"]
        assert set(a.files) == {"fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std",
                                "policyport.recording"}  # the description stats and plot read
        described = json.loads(str(a["policyport.recording"]))
        assert [t["name"] for t in described["tensors"]] == [
            "fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
        assert described["rows"] == 16 and described["backend"] == backend
        np.testing.assert_allclose(a["fc_1/tanh"], np.tanh(a["fc_1/linear"]), atol=1e-6)
        assert o["action"].shape == (16, 2)


def test_run_reads_npz_feeds_by_input_name(converted, tmp_path, metadrive_obs):
    src = tmp_path / "feeds.npz"
    np.savez(src, obs=metadrive_obs[:3])
    assert invoke("run", converted, "-i", src, "-o", tmp_path / "o.npz").exit_code == 0


@pytest.mark.parametrize("bad, message", [
    (np.zeros((4, 274), np.float32), "expects shape (batch, 275), got (4, 274)"),
    (np.zeros((4, 275), np.float64), "expects dtype float32, got float64"),
])
def test_run_with_a_bad_observation_exits_3_and_writes_nothing(converted, tmp_path, bad, message):
    src = tmp_path / "bad.npy"
    np.save(src, bad)
    result = invoke("run", converted, "-i", src, "-o", tmp_path / "o.npz", "--record", tmp_path / "a.npz")
    assert result.exit_code == 3 and message in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy"]


def test_run_with_a_missing_input_file_exits_3(converted, tmp_path):
    result = invoke("run", converted, "-i", tmp_path / "none.npy", "-o", tmp_path / "o.npz")
    assert result.exit_code == 3 and "no such file" in result.stderr


def test_verify_json_pass_and_exit_1_on_mismatch(converted, obs_file, metadrive_path):
    ok = invoke("verify", converted, "-i", obs_file, "--source", metadrive_path, "--json")
    doc = json.loads(ok.stdout)
    assert ok.exit_code == 0 and doc["passed"] and doc["source"] == "source" and doc["samples"] == 16
    bad = invoke("verify", converted, "--samples", "32", "--atol", "0", "--rtol", "0", "--no-rounding", "--json")
    doc = json.loads(bad.stdout)
    assert bad.exit_code == 1 and not doc["passed"]
    assert doc["first_divergence"]["tensor"] == "fc_1/linear"
    rounded = json.loads(invoke("verify", converted, "--samples", "32", "--atol", "0", "--rtol", "0", "--json").stdout)
    assert rounded["passed"] and rounded["oracle"] == "numpy float64"
    assert rounded["comparisons"][0]["rule"] == "rounding" and rounded["comparisons"][0]["atol"] == 0


def test_verify_text_names_the_first_diverging_tensor(converted):
    result = invoke("verify", converted, "--samples", "32", "--atol", "0", "--rtol", "0", "--no-rounding")
    assert result.exit_code == 1 and "first diverging tensor 'fc_1/linear' (float32, onnxruntime vs numpy)" in result.stdout
    assert "loosen them with --atol/--rtol" in result.stdout


def test_verify_error_with_json_is_still_one_json_document(tmp_path):
    result = invoke("verify", tmp_path / "missing.onnx", "--json")
    assert result.exit_code == 3 and json.loads(result.stdout)["exit_code"] == 3


def test_inspect_json_lists_layers_parameters_and_op_support(converted, metadrive_path):
    doc = json.loads(invoke("inspect", converted, "--json").stdout)
    assert doc["opset"] == 17 and doc["parameter_count"] == 275 * 256 + 256 + 256 * 256 + 256 + 256 * 4 + 4
    assert doc["ops"] == ["Gemm", "Slice", "Tanh"] and doc["numpy_backend_lacks"] == []
    fc1 = doc["nodes"][0]
    assert fc1["outputs"][0] == {"name": "fc_1/linear", "dtype": "float32", "shape": ["batch", 256]}
    assert fc1["parameters"] == ["default_policy/fc_1/kernel", "default_policy/fc_1/bias"]
    from_source = json.loads(invoke("inspect", metadrive_path, "--json").stdout)
    assert from_source["parameter_count"] == doc["parameter_count"]


def test_inspect_counts_the_all_zero_parameters_an_exporter_dropped(tmp_path, metadrive_model):
    """As tf2onnx folds away a zero bias: the graph holds fc_2's bias no more, its metadata rebuilds it."""
    model = onnx.ModelProto()
    model.CopyFrom(metadrive_model)
    bias = "default_policy/fc_2/bias"
    kept = [t for t in model.graph.initializer if t.name != bias]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    gemm = next(n for n in model.graph.node if n.name == "fc_2/linear")
    del gemm.input[2]
    props = {p.key: p for p in model.metadata_props}
    mapping = json.loads(props["policyport.parameters"].value)
    mapping[bias] = {"name": bias, "zeros": {"shape": [256], "dtype": "float32"}}
    props["policyport.parameters"].value = json.dumps(mapping)
    onnx.save(model, tmp_path / "dropped.onnx")
    source = 275 * 256 + 256 + 256 * 256 + 256 + 256 * 4 + 4  # 137,476, the bias among them
    doc = json.loads(invoke("inspect", tmp_path / "dropped.onnx", "--json").stdout)
    assert doc["parameter_count"] == source == sum(a.size for a in pp.extract_weights(model).values())
    assert [p["name"] for p in doc["parameters"]] == list(pp.extract_weights(model))  # in the source's order
    assert doc["parameters"][3] == {"name": bias, "initializer": None, "dtype": "float32", "shape": [256], "size": 256}
    assert sum(n["parameter_count"] for n in doc["nodes"]) == source - 256  # the nodes hold what the graph holds
    result = invoke("inspect", tmp_path / "dropped.onnx")
    assert result.exit_code == 0 and "7 nodes, 137,476 parameters" in result.stdout
    assert "256 parameters in all-zero arrays the graph does not hold (the exporter dropped them; extract writes " \
           f"them back): {bias}" in result.stderr.replace("\n", " ")


def test_a_real_process_prints_no_traceback_and_imports_no_framework(tmp_path, converted):
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 3), np.float32))
    code = ("import sys, runpy; sys.argv = ['policyport', 'run', %r, '-i', %r, '-o', %r];"
            "\ntry:\n    from policyport.cli import main; main()\nexcept SystemExit as e:\n"
            "    assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')]\n    raise")
    proc = subprocess.run([sys.executable, "-c", code % (str(converted), str(bad), str(tmp_path / "o.npz"))],
                          capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "expects shape (batch, 275), got (2, 3)" in proc.stderr


def test_pack_then_verify_the_folder_against_its_golden_data(converted, tmp_path):
    folder = tmp_path / "bundle"
    result = invoke("pack", converted, "-o", folder, "--samples", "8")
    assert result.exit_code == 0, result.output
    assert {p.name for p in folder.iterdir()} >= {"model.onnx", "weights.npz", "graph.json", "policy.json", "golden.npz"}
    doc = json.loads(invoke("verify", folder, "--json").stdout)
    assert doc["passed"] and doc["source"] == "golden" and doc["samples"] == 8
    assert invoke("pack", converted, "-o", folder).exit_code == 3  # exists


def test_pack_says_what_the_folder_needs_and_the_source_parity(converted, tmp_path, metadrive_path):
    lib = invoke("pack", converted, "-o", tmp_path / "lib", "--samples", "4", "--no-runtime", "--source", metadrive_path)
    assert lib.exit_code == 0, lib.output
    assert "lib: runs where policyport is installed (its core needs numpy alone)" in lib.stdout
    assert "runs with numpy alone" not in lib.stdout and "on the target:" not in lib.stdout
    parity = json.loads((tmp_path / "lib" / "policy.json").read_text())["parity"]
    assert f"; source vs numpy max abs {parity['source_vs_numpy_max_abs']:.3g}" in lib.stdout
    whole = invoke("pack", converted, "-o", tmp_path / "whole", "--samples", "4")
    assert "whole: runs with numpy alone" in whole.stdout and "source vs numpy" not in whole.stdout


def test_verify_folder_with_source_compares_backends(converted, tmp_path, metadrive_path):
    folder = tmp_path / "bundle"
    assert invoke("pack", converted, "-o", folder, "--samples", "4").exit_code == 0
    doc = json.loads(invoke("verify", folder, "--source", metadrive_path, "--samples", "16", "--json").stdout)
    assert doc["passed"] and doc["source"] == "source"


def test_ops_lists_the_registry(tmp_path):
    from policyport.runtime.numpy.registry import supported_ops

    doc = json.loads(invoke("ops", "--json").stdout)
    assert doc == supported_ops()
    assert doc["Softmax"] == [1, 13] and doc["Clip"] == [6, 11] and doc["Gelu"] == [20] and "Mod" not in doc
    assert invoke("ops", "--json", "--markdown").exit_code == 2


def test_force_never_replaces_a_fifo_or_a_folder(tmp_path, converted):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = invoke("extract", converted, "-o", fifo, "--force")
    assert result.exit_code == 2 and f"{fifo} is a FIFO (named pipe): policyport writes each output whole" in result.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    folder = tmp_path / "d"
    folder.mkdir()
    result = invoke("extract", converted, "-o", folder, "--force")
    assert result.exit_code == 3 and "is a folder" in result.stderr and folder.is_dir()


def test_an_output_may_not_be_an_input(tmp_path, converted, obs_file):
    obs = tmp_path / "obs.npz"  # a name run may write (an .npz), so that what refuses it is its being the input
    np.savez(obs, obs=np.load(obs_file))
    before = obs.read_bytes()
    result = invoke("run", converted, "-i", obs, "-o", obs, "--force")
    assert result.exit_code == 3 and "also an input" in result.stderr and obs.read_bytes() == before
    model_bytes = converted.read_bytes()
    assert invoke("expose", converted, "-o", converted, "--force").exit_code == 3
    bare = tmp_path / "model"  # a model named as no format, which extract may write
    shutil.copy(converted, bare)
    assert invoke("extract", bare, "-o", bare, "--force").exit_code == 3
    assert converted.read_bytes() == model_bytes == bare.read_bytes()


def test_outputs_get_the_umask_mode(tmp_path, converted):
    old = os.umask(0o022)
    try:
        assert invoke("extract", converted, "-o", tmp_path / "w.npz").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.npz").stat().st_mode) == 0o644


def test_an_empty_onnx_file_is_not_a_model(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    for args in (["inspect", empty], ["extract", empty, "-o", tmp_path / "w.npz"]):
        result = invoke(*args)
        assert result.exit_code == 3 and "holds no graph" in result.stderr
    assert not (tmp_path / "w.npz").exists()


def test_verify_refuses_to_compare_nothing(converted, tmp_path):
    assert invoke("verify", converted, "--backends", "numpy").exit_code == 2
    assert invoke("verify", converted, "--backends", "numpy,numpy").exit_code == 2
    empty = tmp_path / "none.npy"
    np.save(empty, np.zeros((0, 275), np.float32))
    result = invoke("verify", converted, "-i", empty)
    assert result.exit_code == 3 and "0 rows" in result.stderr


def test_verify_with_a_source_that_does_not_fit_exits_3(converted, tmp_path):
    small = tmp_path / "small.npz"
    rng = np.random.default_rng(0)
    np.savez(small, **{"fc_1/kernel": rng.random((10, 8), np.float32), "fc_1/bias": np.zeros(8, np.float32),
                       "fc_out/kernel": rng.random((8, 4), np.float32), "fc_out/bias": np.zeros(4, np.float32)})
    result = invoke("verify", converted, "--samples", "5", "--source", small)
    assert result.exit_code == 3 and "the source does not fit the model" in result.stderr


def test_verify_of_a_folder_rejects_options_that_do_not_apply(converted, tmp_path):
    folder = tmp_path / "bundle"
    assert invoke("pack", converted, "-o", folder, "--samples", "4").exit_code == 0
    result = invoke("verify", folder, "--samples", "5", "--seed", "1")
    assert result.exit_code == 2 and "--samples, --seed do not apply" in result.output
    result = invoke("verify", folder, "--backends", "onnxruntime")
    assert result.exit_code == 2 and "name two backends" in result.output
    result = invoke("verify", folder, "--backends", "numpy,onnxruntime", "--low", "-1")
    assert result.exit_code == 2 and "--low draw observations" in result.output


def test_verify_of_a_folder_compares_backends_on_its_golden_observations(converted, tmp_path):
    folder = tmp_path / "bundle"
    assert invoke("pack", converted, "-o", folder, "--samples", "6").exit_code == 0
    doc = json.loads(invoke("verify", folder, "--backends", "numpy,onnxruntime", "--json").stdout)
    assert doc["passed"] and doc["backends"] == ["numpy", "onnxruntime"] and doc["samples"] == 6
    assert {(c["candidate"], c["reference"]) for c in doc["comparisons"]} == {("onnxruntime", "numpy")}
    assert {c["shape"][0] for c in doc["comparisons"]} == {6}
    doc = json.loads(invoke("verify", folder, "--backends", "numpy,onnxruntime", "--samples", "2", "--json").stdout)
    assert doc["samples"] == 2 and doc["notes"] == ["using the first 2 of the 6 observations given"]


def test_pack_force_keeps_foreign_files(converted, tmp_path):
    folder = tmp_path / "bundle"
    assert invoke("pack", converted, "-o", folder, "--samples", "4").exit_code == 0
    (folder / "notes.txt").write_text("precious")
    result = invoke("pack", converted, "-o", folder, "--force")
    assert result.exit_code == 3 and "notes.txt" in result.stderr
    assert (folder / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("args", [
    ["--activation", "bogus"], ["--activation", "leaky_relu:nan"], ["--opset", "99"], ["--opset", "10"],
    ["--from", "torch"], ["--low", "1", "--high", "0"], ["--head", "beta"],
])
def test_bad_convert_option_values_are_usage_errors(args, tmp_path, metadrive_path):
    given = args if "--activation" in args else ["--activation", "tanh", *args]  # the option the .npz needs is given
    result = invoke("convert", metadrive_path, "-o", tmp_path / "m.onnx", *given)
    assert result.exit_code == 2 and "--activation NAME" not in result.stderr and not (tmp_path / "m.onnx").exists()


def test_head_none_is_accepted(tmp_path, metadrive_path):
    result = invoke("convert", metadrive_path, "-o", tmp_path / "m.onnx", "--activation", "tanh", "--head", "none", "--samples",
                    "4", "--json")
    assert result.exit_code == 0
    import onnx

    assert [o.name for o in onnx.load(tmp_path / "m.onnx").graph.output] == ["logits"]


def test_tensors_without_record_is_a_usage_error(converted, obs_file, tmp_path):
    assert invoke("run", converted, "-i", obs_file, "-o", tmp_path / "o.npz", "--tensors", "fc_1/*").exit_code == 2


@pytest.fixture
def trig_model(tmp_path):
    """An .onnx with two ops the numpy backend lacks (Cos twice, Sin) that onnxruntime runs."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cos", ["obs"], ["a"], name="cos_1"), helper.make_node("Sin", ["a"], ["b"], name="sin"),
             helper.make_node("Cos", ["b"], ["y"], name="cos_2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    path = tmp_path / "trig.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


LACKS = ('the numpy backend lacks 2 ops of this model: Cos nodes "cos_1", "cos_2" (opset 17; no Cos at any opset); '
         'Sin node "sin" (opset 17; no Sin at any opset) — ')


def test_run_names_every_missing_op_and_the_backend_option_that_works(trig_model, tmp_path):
    obs = tmp_path / "obs.npy"
    np.save(obs, np.zeros((2, 3), np.float32))
    result = invoke("run", trig_model, "-i", obs, "-o", tmp_path / "y.npz")
    assert result.exit_code == 3 and not (tmp_path / "y.npz").exists()
    assert LACKS + "use --backend onnxruntime" in " ".join(result.stderr.split())
    assert invoke("run", trig_model, "-i", obs, "-o", tmp_path / "y.npz", "--backend", "onnxruntime").exit_code == 0


def test_verify_suggests_what_verify_can_do_without_the_numpy_backend(trig_model, metadrive_path):
    result = invoke("verify", trig_model, "--samples", "4")
    assert result.exit_code == 3
    assert LACKS + ("verify onnxruntime against the source the model came from (--backends onnxruntime --source SRC); "
                    "with no source, 'policyport run --backend onnxruntime' runs it") in " ".join(result.stderr.split())
    doc = json.loads(invoke("verify", trig_model, "--samples", "4", "--json").stdout)
    assert doc["exit_code"] == 3 and doc["error"].startswith(LACKS + "verify onnxruntime against the source")
    with_source = invoke("verify", trig_model, "--samples", "4", "--source", metadrive_path)
    assert with_source.exit_code == 3
    assert "add --backends onnxruntime" in " ".join(with_source.stderr.split())


def test_pack_says_the_model_cannot_be_packed(trig_model, tmp_path):
    result = invoke("pack", trig_model, "-o", tmp_path / "bundle")
    assert result.exit_code == 3 and not (tmp_path / "bundle").exists()
    assert LACKS + "a packed policy runs on numpy alone, so this model cannot be packed; run it on onnxruntime with " \
                   "'policyport run --backend onnxruntime'" in " ".join(result.stderr.split())
    assert json.loads(invoke("inspect", trig_model, "--json").stdout)["numpy_backend_lacks"] == ["Cos", "Sin"]


def test_verify_input_file_with_samples_uses_the_first_rows_and_says_so(converted, obs_file):
    doc = json.loads(invoke("verify", converted, "-i", obs_file, "--samples", "5", "--json").stdout)
    assert doc["passed"] and doc["samples"] == 5
    assert doc["notes"] == ["using the first 5 of the 16 observations given"]
    assert {c["shape"][0] for c in doc["comparisons"]} == {5}
    doc = json.loads(invoke("verify", converted, "-i", obs_file, "--samples", "50", "--json").stdout)
    assert doc["samples"] == 16 and doc["notes"] == ["using the first 16 of the 16 observations given (50 asked)"]
    result = invoke("verify", converted, "-i", obs_file, "--samples", "5")
    assert "note: using the first 5 of the 16 observations given" in result.stderr
    assert "note:" not in result.stdout
    assert "max abs error on 5 observations (float32: atol 1e-05, rtol 1e-05)" in result.stdout


def test_verify_table_marks_rounding_and_gives_both_float64_figures(converted):
    result = invoke("verify", converted, "--samples", "32", "--atol", "0", "--rtol", "0")
    assert result.exit_code == 0
    assert "≈" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("fc_1/linear (onnxruntime vs numpy)"))
    assert "exceeds the tolerance, within float32 rounding: against a float64 run onnxruntime is" in line
    assert re.search(r"PASS: 7 comparisons within atol 0, rtol 0, [1-7] by rounding against a float64 run",
                     result.stdout)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_run_on_an_input_of_no_rows_writes_empty_outputs(converted, tmp_path, backend):
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros((0, 275), np.float32))
    result = invoke("run", converted, "-i", empty, "-o", tmp_path / "out.npz", "--backend", backend,
                    "--record", tmp_path / "acts.npz")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as out, np.load(tmp_path / "acts.npz") as acts:
        assert out["logits"].shape == (0, 4) and out["action"].shape == (0, 2)
        assert acts["fc_1/tanh"].shape == (0, 256)


def test_inspect_draws_a_screenful_of_a_huge_graph_on_a_terminal_and_every_node_elsewhere(tmp_path, monkeypatch):
    import io

    import onnx
    from onnx import TensorProto, helper
    from rich.console import Console

    import policyport.cli.model as model_cli

    n = 450
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "x"], [f"t{i + 1}" if i < n - 1 else "y"], name=f"r{i}")
             for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)

    piped = invoke("inspect", path)
    assert piped.exit_code == 0 and "450 nodes" in piped.stdout
    assert sum(line.startswith("│ r") for line in piped.stdout.splitlines()) == n

    screen = io.StringIO()
    monkeypatch.setattr(model_cli, "out", Console(file=screen, width=100, force_terminal=True, color_system=None,
                                                  markup=False, highlight=False))
    shown = invoke("inspect", path)
    lines = screen.getvalue().splitlines()
    assert shown.exit_code == 0
    assert [line.split()[1] for line in lines if line.startswith("│ r")] == [f"r{i}" for i in (*range(180), *range(430, 450))]
    assert sum(line.startswith("│ …") for line in lines) == 1
    assert "250 of 450 rows not shown on a terminal; a pipe, a file or --json gets every node" in shown.stderr
