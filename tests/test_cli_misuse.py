"""Misuse of every command as a new user tries it: each gets its exit code and a message that is true,
never a traceback. Exit codes: 2 usage (including values policyport refuses), 3 bad model or input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

runner = CliRunner()
LONG = "a" * 300  # longer than any file system allows one name to be


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    assert result.exit_code != 70, result.output
    return result


def fails(code: int, message: str, *args):
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert message in result.stderr.replace("\n", " "), result.stderr
    last = result.stderr.split("Try 'policyport ")[-1].split("\n", 1)[-1] if code == 2 else result.stderr
    assert last.startswith("error: "), result.stderr  # usage errors: after the usage lines
    return result


# ------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("command", ["verify", "convert", "pack", "export-numpy"])
def test_a_range_whose_width_overflows_is_a_usage_error(place, command, tmp_path):
    outputs = {"verify": [], "convert": ["-o", tmp_path / "x.onnx"], "pack": ["-o", tmp_path / "b"],
               "export-numpy": ["-o", tmp_path / "p.py"]}[command]
    source = place / ("src.npz" if command == "convert" else "md.onnx")
    fails(2, "must be finite numbers, and so must --high minus --low", command, source, *outputs,
          "--low", "-1e308", "--high", "1e308", "--samples", "2")
    assert list(tmp_path.iterdir()) == []


def test_a_range_beyond_the_input_dtype_is_refused_naming_it(place):
    fails(3, "float32 holds at most ±3.403e+38; narrow --low/--high", "verify", place / "md.onnx",
          "--high", "1e39", "--samples", "2")


@pytest.mark.parametrize("option,value,why", [("--atol", "nan", "nan is not a finite number"),
                                              ("--rtol", "inf", "inf is not a finite number"),
                                              ("--atol", "-inf", "-inf is not in the range x>=0.0")])
def test_tolerances_must_be_finite(place, option, value, why):
    fails(2, f"Invalid value for '{option}': {why}", "verify", place / "md.onnx", f"{option}={value}", "--samples", "2")


def test_negative_zero_tolerance_reads_as_zero(place):
    result = invoke("verify", place / "md.onnx", "--atol", "-0.0", "--rtol", "-0.0", "--samples", "2", "--json")
    assert result.exit_code in (0, 1) and json.loads(result.stdout)["atol"] == 0.0


@pytest.mark.parametrize("args,message", [
    (["--samples", "0"], "0 is not in the range x>=1"),
    (["--samples", "-5"], "-5 is not in the range x>=1"),
    (["--samples", "abc"], "'abc' is not a valid"),
    (["--seed", "-1"], "-1 is not in the range x>=0"),
    (["--low", "1", "--high", "0"], "Invalid value for --low/--high: --low 1.0 must be below --high 0.0"),
    (["--low", "0", "--high", "inf"], "Invalid value for --low/--high: --low 0.0 and --high inf must be finite"),
    (["--backends", "numpy"], "name two backends, or give --source"),
    (["--backends", "numpy,tf"], "['tf']; choose from numpy, onnxruntime"),
    (["--backends", ","], "choose from numpy, onnxruntime"),
])
def test_verify_refuses_values_as_usage_errors(place, args, message):
    fails(2, message, "verify", place / "md.onnx", *args)


def test_a_huge_sample_count_names_the_memory_it_would_need(place, tmp_path):
    fails(3, "needs about 300 TiB", "verify", place / "md.onnx", "--samples", "100000000000")
    fails(3, "observations for 1 input(s) needs about", "pack", place / "md.onnx", "-o", tmp_path / "b",
          "--samples", "100000000")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,message", [
    (["--opset", "5"], "Invalid value for --opset: 5; policyport builds opset 11 to"),
    (["--opset", "-1"], "Invalid value for --opset: -1; policyport builds opset 11 to"),
    (["--opset", "99999999999999999999"], "policyport builds opset 11 to"),
    (["--input-shape", "0"], "Invalid value for --input-shape: '0'; give positive integers separated by commas, e.g. 2,3"),
    (["--output-names", "a,a"], "Invalid value for --output-names: 'a,a'; give distinct, non-empty names"),
    (["--activation", "leaky_relu:abc"], "Invalid value for --activation: leaky_relu slope must be a number"),
    (["--from", "torch"], "Invalid value for --from: 'torch' is a live nn.Module, given through the Python API "
                          "(pp.convert(module)); for a file use torchscript, state-dict, or --trust with a whole "
                          "pickled module"),
    (["--from", "nope"], "Invalid value for --from: 'nope'; choose one of npz, torch, torchscript, state-dict, sb3, "
                         "rllib-torch, keras, savedmodel, rllib, rl-games, skrl, ml-agents, tianshou, sample-factory, "
                         "torchrl, cleanrl, brax, rsl-rl"),
    (["--head", "nope"], "Invalid value for --head: 'nope'; choose one of none, diag-gaussian, diag-gaussian:halves, "
                         "categorical"),
    (["--exporter", "nope"], "Invalid value for --exporter: 'nope'; choose one of torchscript, dynamo"),
])
def test_convert_refuses_values_as_usage_errors(place, args, message, tmp_path):
    fails(2, message, "convert", place / "src.npz", "-o", tmp_path / "x.onnx", *args)
    assert not (tmp_path / "x.onnx").exists()


# ------------------------------------------------------------------------------------ contradictions


@pytest.mark.parametrize("given", [["--samples", "5"], ["--seed", "3"], ["--atol", "1e-3"], ["--low", "-1"]])
def test_convert_no_verify_refuses_the_options_of_the_check_it_skips(place, tmp_path, given):
    result = fails(2, f"--no-verify skips the check against the source that {given[0]}", "convert", place / "src.npz",
                   "-o", tmp_path / "x.onnx", "--no-verify", *given)
    assert "Usage: policyport convert [OPTIONS] SRC" in result.stderr
    assert not (tmp_path / "x.onnx").exists()
    assert invoke("convert", place / "src.npz", "-o", tmp_path / "x.onnx", "--activation", "tanh", "--no-verify").exit_code == 0


@pytest.mark.parametrize("given", [["--low", "-1"], ["--high", "2"], ["--seed", "3"]])
def test_verify_with_observations_refuses_the_options_that_draw_them(place, given):
    fails(2, f"-i gives the observations, so {given[0]} does not apply (nothing is drawn)",
          "verify", place / "md.onnx", "-i", place / "obs.npy", *given)


def test_verify_with_observations_takes_samples_as_their_first_rows(place):
    doc = json.loads(invoke("verify", place / "md.onnx", "-i", place / "obs.npy", "--samples", "3", "--json").stdout)
    assert doc["samples"] == 3 and doc["passed"]


def test_tensors_without_record_and_the_same_file_twice_on_run(place, tmp_path):
    fails(2, "--tensors selects what --record writes; give --record too", "run", place / "md.onnx",
          "-i", place / "obs.npy", "-o", tmp_path / "o.npz", "--tensors", "fc*")
    fails(2, f"{tmp_path / 'o.npz'} is also the -o file; give --record another file", "run", place / "md.onnx", "-i", place / "obs.npy",
          "-o", tmp_path / "o.npz", "--record", tmp_path / "o.npz")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_record_file_is_refused_before_anything_is_written(place, tmp_path):
    (tmp_path / "acts.npz").write_bytes(b"precious")
    fails(3, "acts.npz exists; overwrite it with --force", "run", place / "md.onnx", "-i", place / "obs.npy",
          "-o", tmp_path / "out.npz", "--record", tmp_path / "acts.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acts.npz"]  # -o was not written either
    assert (tmp_path / "acts.npz").read_bytes() == b"precious"


def test_convert_writes_nothing_and_exits_1_when_the_source_check_fails(place, tmp_path, monkeypatch):
    import policyport.converter as converter

    real = converter.convert_source

    def off_by_a_little(*args, **kwargs):  # the source's forward pass disagrees with the graph by 1e-2
        converted = real(*args, **kwargs)
        reference = converted.reference
        converted.reference = lambda obs: {k: (v + 1e-2 if k == "logits" else v) for k, v in reference(obs).items()}
        return converted

    monkeypatch.setattr(converter, "convert_source", off_by_a_little)
    result = invoke("convert", place / "src.npz", "-o", tmp_path / "x.onnx", "--activation", "tanh", "--samples", "8")
    assert result.exit_code == 1
    assert f"not writing {tmp_path / 'x.onnx'}: the converted model does not match the source" in result.stderr
    assert ("FAIL against a reconstruction that assumes activation tanh at fc_1 and fc_2; observation normalisation "
            "none: ") in result.stdout and "'logits'" in result.stdout
    as_json = invoke("convert", place / "src.npz", "-o", tmp_path / "x.onnx", "--activation", "tanh", "--samples", "8",
                     "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["passed"] is False
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ paths


def test_paths_with_spaces_unicode_and_a_leading_dash(place, tmp_path):
    odd = tmp_path / "sp ace é 漢.onnx"
    shutil.copy(place / "md.onnx", odd)
    out = tmp_path / "out put ü.npz"
    assert invoke("run", odd, "-i", place / "obs.npy", "-o", out).exit_code == 0 and out.exists()
    dashed = tmp_path / "-dash.onnx"
    shutil.copy(place / "md.onnx", dashed)
    os.chdir(tmp_path)
    try:
        fails(2, "No such option: -d", "run", "-dash.onnx", "-i", place / "obs.npy", "-o", "x.npz")
        assert invoke("run", "./-dash.onnx", "-i", place / "obs.npy", "-o", "y.npz").exit_code == 0
        assert invoke("run", "-i", place / "obs.npy", "-o", "z.npz", "--", "-dash.onnx").exit_code == 0
    finally:
        os.chdir(place)


@pytest.mark.parametrize("args_of", [
    lambda p, t: ["run", p / "md.onnx", "-i", p / "obs.npy", "-o", t / f"{LONG}.npz"],
    lambda p, t: ["run", p / "md.onnx", "-i", p / "obs.npy", "-o", t / "o.npz", "--record", t / f"{LONG}.npz"],
    lambda p, t: ["run", t / f"{LONG}.onnx", "-i", p / "obs.npy", "-o", t / "o.npz"],
    lambda p, t: ["run", p / "md.onnx", "-i", t / f"{LONG}.npy", "-o", t / "o.npz"],
    lambda p, t: ["inspect", t / f"{LONG}.onnx"],
    lambda p, t: ["verify", t / f"{LONG}.onnx"],
    lambda p, t: ["verify", p / "md.onnx", "--source", t / f"{LONG}.npz"],
    lambda p, t: ["convert", t / f"{LONG}.npz", "-o", t / "x.onnx"],
    lambda p, t: ["convert", p / "src.npz", "-o", t / f"{LONG}.onnx"],
    lambda p, t: ["pack", t / f"{LONG}.onnx", "-o", t / "b"],
    lambda p, t: ["pack", p / "md.onnx", "-o", t / LONG],
    lambda p, t: ["export-numpy", p / "md.onnx", "-o", t / f"{LONG}.py"],
    lambda p, t: ["extract", t / f"{LONG}.onnx", "-o", t / "w.npz"],
    lambda p, t: ["expose", p / "md.onnx", "-o", t / f"{LONG}.onnx"],
])
def test_a_name_too_long_for_the_file_system_is_bad_input_not_a_bug(place, tmp_path, args_of):
    result = invoke(*args_of(place, tmp_path))
    assert result.exit_code == 3 and "File name too long" in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []


def test_an_output_beneath_a_file_says_that_it_is_not_a_folder(place, tmp_path):
    fails(3, f"cannot write {place / 'obs.npy' / 'o.npz'}: {place / 'obs.npy'} is not a folder",
          "run", place / "md.onnx", "-i", place / "obs.npy", "-o", place / "obs.npy" / "o.npz")
    fails(3, f"{tmp_path / 'no'} does not exist", "extract", place / "md.onnx", "-o", tmp_path / "no" / "w.npz")
    fails(3, f"{place / 'obs.npy'} is not a folder", "pack", place / "md.onnx", "-o", place / "obs.npy" / "b")
    fails(3, f"{place / 'obs.npy'} is not a folder", "export-numpy", place / "md.onnx", "-o", place / "obs.npy" / "p.py")


@pytest.mark.parametrize("make,message", [
    (lambda t: _made(t / "d", None), "is a folder, not a file; expected an .npy or .npz file"),
    (lambda t: _made(t / "e.npy", b""), "is empty (0 bytes)"),
    (lambda t: _made(t / "o.csv", b"1,2\n"), "comma-separated values (CSV)"),
    (lambda t: Path("/dev/null"), "/dev/null is a character device, not a file"),
    (lambda t: t / "missing.npy", "missing.npy: no such file"),
])
def test_wrong_kinds_of_observation_file(place, tmp_path, make, message):
    fails(3, message, "run", place / "md.onnx", "-i", make(tmp_path), "-o", tmp_path / "o.npz")
    assert not (tmp_path / "o.npz").exists()


def _made(path: Path, content: bytes | None) -> Path:
    """``path`` created as a folder (``content`` None) or a file holding ``content``."""
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


def test_a_model_where_observations_go_and_weights_where_a_model_goes(place, tmp_path):
    fails(3, "is not an .npy or .npz file: it starts with", "run", place / "md.onnx", "-i", place / "md.onnx",
          "-o", tmp_path / "o.npz")
    fails(3, "unexpected ['default_policy/fc_1/kernel'", "run", place / "md.onnx", "-i", place / "src.npz",
          "-o", tmp_path / "o.npz")
    fails(3, f"{place / 'src.npz'} is an .npz archive of arrays, not an ONNX model: convert it first with policyport "
             f"convert {place / 'src.npz'} -o {place / 'src.onnx'}", "run", place / "src.npz", "-i", place / "obs.npy",
          "-o", tmp_path / "o.npz")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: Files given where an ONNX model goes: fixture, the name it is given, what the refusal calls it, and
#: the --from its convert command needs (None: its name tells; "" no converter reads it).
NOT_ONNX = [
    ("real/sb3_ppo_cartpole.zip", "x.zip", "a Stable-Baselines3 save", None),
    ("real/sb3_ppo_cartpole.zip", "x.onnx", "a Stable-Baselines3 save", "sb3"),  # named as what it is not
    ("torch/gaussian.state_dict.pt", "x.pt", "a PyTorch file (torch.save)", None),
    ("torch/gaussian.torchscript.pt", "x.pth", "a TorchScript file", None),
    ("torch/gaussian.torchscript.pt", "x.bin", "a TorchScript file", "torchscript"),
    ("keras/three_heads.keras", "x.keras", "a Keras file (.keras)", None),
    ("keras/mlp_norm.h5", "x.h5", "an HDF5 file (as Keras saves .h5 models)", None),
    ("real/metadrive_ppo_expert.npz", "x.npz", "an .npz archive of arrays", None),
    ("keras/savedmodel", "saved", "a TensorFlow SavedModel folder", None),
    ("rllib/ray/ppo_new", "ckpt", "an RLlib checkpoint folder", None),
    ("rllib/malicious/checkpoint-1", "checkpoint-7", "an RLlib checkpoint (a pickle)", None),
    (None, "obs.npy", "a NumPy array (.npy)", ""),
    (None, "notes.onnx", "a text file", ""),
]
#: Every command that takes an ONNX model, with the rest of its command line (``{tmp}``: a scratch folder).
MODEL_COMMANDS = {
    "extract": ["-o", "{tmp}/w.npz"], "expose": ["-o", "{tmp}/e.onnx"], "run": ["-i", "{obs}", "-o", "{tmp}/y.npz"],
    "record": ["-i", "{obs}", "-o", "{tmp}/r.npz"], "verify": ["--samples", "4"], "pack": ["-o", "{tmp}/b"],
    "export-numpy": ["-o", "{tmp}/p.py"], "patch": ["--clean", "{obs}", "--corrupt", "{obs}"],
}


def _not_onnx(place, tmp_path, fixture, name) -> Path:
    path = tmp_path / "given" / name
    path.parent.mkdir()
    if fixture is None:
        shutil.copy(place / "obs.npy", path) if name.endswith(".npy") else path.write_text("not a model\n")
    elif (FIXTURES / fixture).is_dir():
        shutil.copytree(FIXTURES / fixture, path)
    else:
        shutil.copy(FIXTURES / fixture, path)
    return path


@pytest.mark.parametrize("fixture, name, what, kind", NOT_ONNX, ids=[case[1] + ":" + case[2] for case in NOT_ONNX])
@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
def test_a_command_given_a_source_or_another_file_for_a_model_says_what_it_is_and_how_to_convert_it(
        place, tmp_path, command, fixture, name, what, kind):
    path = _not_onnx(place, tmp_path, fixture, name)
    args = [a.format(tmp=tmp_path, obs=place / "obs.npy") for a in MODEL_COMMANDS[command]]
    result = fails(3, f"{path} is {what}, not an ONNX model", command, path, *args)
    text = result.stderr.replace("\n", " ")
    if kind == "":
        assert "give an .onnx model or a folder written by 'policyport pack'" in text
    else:
        onnx_path = path.parent / f"{path.name}.onnx" if path.is_dir() else path.with_suffix(".onnx")
        flag = f" --from {kind}" if kind else ""
        if "TorchScript" in what or "SavedModel" in what:  # loading them runs code: converting them needs --trust
            assert (f"not an ONNX model, and loading it runs code it holds: if you trust it, convert it first with "
                    f"policyport convert {path}{flag} -o {onnx_path} --trust (pp.convert(..., trust=True) in Python)") in text
        else:
            assert f"convert it first with policyport convert {path}{flag} -o {onnx_path} (pp.convert in Python)" in text
    assert "is an option of" not in text  # the --from it names is convert's, in convert's command line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given"]  # nothing written


@pytest.mark.parametrize("fixture, name, what, kind", NOT_ONNX[:3], ids=[case[1] for case in NOT_ONNX[:3]])
def test_the_api_given_a_source_for_a_model_says_what_it_is(place, tmp_path, fixture, name, what, kind):
    import policyport as pp

    path = _not_onnx(place, tmp_path, fixture, name)
    for call in (pp.load, lambda p: pp.load(p, backend="onnxruntime"), pp.extract_weights, pp.expose):
        with pytest.raises(pp.UnreadableFileError, match=f"is {re.escape(what)}, not an ONNX model: convert it first"):
            call(path)


def test_inspect_converts_a_source_named_unlike_its_kind_as_what_its_contents_say(tmp_path):
    shutil.copy(FIXTURES / "real" / "sb3_ppo_cartpole.zip", tmp_path / "policy.bin")
    doc = json.loads(invoke("inspect", tmp_path / "policy.bin", "--json").stdout)
    assert doc["metadata"]["policyport.source_kind"] == "sb3" and doc["parameter_count"] > 0


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_an_unrecognised_source_lists_the_kinds_and_the_remedy_of_its_command(place, tmp_path, command):
    args = [place / "obs.npy"] + (["-o", tmp_path / "x.onnx"] if command == "convert" else [])
    result = invoke(command, *args)
    assert result.exit_code == 3
    text = result.stderr.replace("\n", " ")
    assert "npz, torchscript, state-dict, sb3, rllib-torch, keras, savedmodel, rllib" in text
    assert "torch," not in text.replace("rllib-torch,", "")  # a live module is no file kind
    if command == "inspect":  # inspect has no --from: it says how to convert first
        assert "policyport convert" in text and f"{place / 'obs.npy'} --from KIND -o MODEL.onnx" in text
    else:
        assert "--from KIND" in text


def test_verify_source_of_an_unrecognised_name_uses_the_kind_convert_recorded(place, tmp_path):
    weights = tmp_path / "weights.bin"
    shutil.copy(place / "src.npz", weights)
    fails(3, "cannot tell what kind of policy the file", "convert", weights, "-o", tmp_path / "m.onnx")
    assert invoke("convert", weights, "-o", tmp_path / "m.onnx", "--from", "npz", "--activation", "tanh", "--samples",
                  "4").exit_code == 0
    doc = json.loads(invoke("verify", tmp_path / "m.onnx", "--source", weights, "--samples", "4", "--json").stdout)
    assert doc["passed"] and {c["reference"] for c in doc["comparisons"]} >= {"source"}


@pytest.mark.parametrize("options", [[], ["--samples", "5"], ["--tensors", "fc*"], ["--low", "0"], ["--outputs", "action"],
                                     ["--backends", "numpy,onnxruntime"], ["-i", "OBS"], ["--source", "SRC"]])
def test_verify_of_a_plain_folder_says_what_it_expected(place, tmp_path, options):
    """Not taken for a packed folder (whose options it would name), whatever the options."""
    plain = tmp_path / "models"
    plain.mkdir()
    shutil.copy(place / "md.onnx", plain / "md.onnx")
    args = [{"OBS": place / "obs.npy", "SRC": place / "src.npz"}.get(a, a) for a in options]
    expected = (f"{plain} is a folder without policy.json, so not one written by policyport pack; expected an .onnx "
                "model or a folder written by policyport pack; it holds md.onnx: give that file itself")
    result = fails(3, expected, "verify", plain, *args)
    assert result.stderr == f"error: {expected}\n"
    as_json = invoke("verify", plain, *args, "--json")
    assert as_json.exit_code == 3 and json.loads(as_json.stdout) == {"error": expected, "exit_code": 3}


def test_a_plain_folder_as_the_model_of_any_command_says_what_was_expected(place, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    expected = (f"{empty} is a folder without policy.json, so not one written by policyport pack; expected an .onnx "
                "model or a folder written by policyport pack")
    for args in (["verify"], ["run", "-i", place / "obs.npy", "-o", tmp_path / "o.npz"], ["extract", "-o", tmp_path / "w.npz"],
                 ["record", "-i", place / "obs.npy", "-o", tmp_path / "r.npz"], ["expose", "-o", tmp_path / "e.onnx"]):
        result = fails(3, expected, args[0], empty, *args[1:])
        assert result.stderr == f"error: {expected}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_export_numpy_needs_a_module_name(place, tmp_path):
    for name in ("p.txt", ".py"):
        fails(2, "the module's file name must end in .py after a name", "export-numpy", place / "md.onnx",
              "-o", tmp_path / name)


# ------------------------------------------------------------------------------------ signals

def stalling(module: str, function: str, word: str) -> str:
    """A script running the policyport command of its arguments with ``module.function`` replaced by
    a stall: it prints ``word`` and waits a minute, for a signal to come then."""
    return "\n".join([
        "import sys, time", f"import {module} as stalled", "def stall(*args, **kwargs):",
        f"    print({word!r}, flush=True)", "    time.sleep(60)", f"stalled.{function} = stall",
        "from policyport.cli import main", 'sys.argv = ["policyport", *sys.argv[1:]]', "main()"])


SLOW_RUN = stalling("policyport.runtime", "load", "running")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_and_sigterm_exit_with_their_codes_and_write_nothing(place, tmp_path, sig, code, word, as_json):
    args = ["run", str(place / "md.onnx"), "-i", str(place / "obs.npy"), "-o", str(tmp_path / "o.npz")]
    # Ctrl-C reaches a command in the foreground; a job a shell starts in the background (as some CI
    # runners start the suite) inherits SIGINT ignored, so the child starts with it at its default
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RUN, *args, *(["--json"] if as_json else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stderr
    assert f"{word}; nothing was written" in stderr and "Traceback" not in stderr
    if as_json:
        assert json.loads(stdout) == {"error": f"{word}; nothing was written", "exit_code": code}
    assert list(tmp_path.iterdir()) == []


SLOW_TABLE = stalling("policyport.cli.render", "print_table", "written")  # the files are in place by then


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_after_the_outputs_are_in_place_names_them_as_complete(place, tmp_path, metadrive_model, metadrive_obs):
    out, acts = tmp_path / "o.npz", tmp_path / "a.npz"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_TABLE, "run", str(place / "md.onnx"), "-i", str(place / "obs.npy"),
                             "-o", str(out), "--record", str(acts)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "written"  # the table is printed after both files are in place
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert stderr == f"terminated after writing {out} and {acts}, which are complete\n"
    expected = pp.load(metadrive_model).record(metadrive_obs[:5])
    with np.load(out) as outputs, np.load(acts) as recorded:
        np.testing.assert_allclose(outputs["action"], expected["action"], atol=1e-5)
        np.testing.assert_allclose(recorded["fc_2/tanh"], expected["fc_2/tanh"], atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "o.npz"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_model_is_refused(place, tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copy(place / "md.onnx", model)
    model.chmod(0)
    fails(3, "ermission denied", "inspect", model)


def test_the_newest_opset_is_accepted_and_one_past_it_refused():
    import onnx
    import typer

    from policyport.cli.convert import check_convert_options

    newest = onnx.defs.onnx_opset_version()
    check_convert_options(None, None, None, newest, "torchscript")
    check_convert_options(None, None, None, 11, "torchscript")
    for opset in (newest + 1, 10):
        with pytest.raises(typer.BadParameter):
            check_convert_options(None, None, None, opset, "torchscript")


def test_convert_without_onnx_says_which_extra(monkeypatch, tmp_path, place):
    import policyport.errors as errors

    def missing(module, extra, purpose):
        raise errors.MissingDependencyError(module, extra, purpose)

    monkeypatch.setattr(errors, "require", missing)
    fails(4, "converting a policy needs the Python package 'onnx', which is not installed; install it with: "
             "pip install 'policyport[onnx]'", "convert", place / "src.npz", "-o", tmp_path / "x.onnx")


@pytest.mark.parametrize("command", ["convert", "expose"])
@pytest.mark.parametrize("name", ["out.npz", "out.PT", "policy.zip", "weights.keras"])
def test_an_onnx_output_named_as_another_format_is_refused_and_nothing_is_written(place, tmp_path, command, name):
    source = place / ("src.npz" if command == "convert" else "md.onnx")
    out = tmp_path / name
    fails(2, f"{out} is named as a {out.suffix} file, but the output is an ONNX model; name it .onnx",
          command, source, "-o", out)
    assert not out.exists()
    needs = ["--activation", "tanh"] if command == "convert" else []  # what the .npz does not record
    assert invoke(command, source, "-o", tmp_path / "no_suffix", *needs).exit_code == 0  # any other name is the user's
