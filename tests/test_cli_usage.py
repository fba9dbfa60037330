"""The command line as a new user meets it: help that reads right, --json on every command, extras
that exist, shell completion, and the README's Python API."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from policyport.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke(*args, **kwargs):
    result = runner.invoke(app, [str(a) for a in args], **kwargs)
    assert "Traceback" not in result.output
    return result


def commands() -> dict:
    return get_command(app).commands


@pytest.fixture(scope="module")
def model(tmp_path_factory, metadrive_path):
    out = tmp_path_factory.mktemp("usage") / "md.onnx"
    result = invoke("convert", metadrive_path, "-o", out, "--activation", "tanh", "--head", "diag-gaussian", "--samples", "8")
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def obs(tmp_path_factory, metadrive_obs):
    path = tmp_path_factory.mktemp("usage_obs") / "obs.npy"
    np.save(path, metadrive_obs[:5])
    return path


# ---------------------------------------------------------------------------------------------- help


def test_every_command_has_help_whose_usage_names_its_arguments_plainly():
    assert len(commands()) >= 9
    for name, command in commands().items():
        result = invoke(name, "-h")
        assert result.exit_code == 0, name
        usage = result.stdout.splitlines()[0]
        arguments = [p.metavar or p.name.upper() for p in command.params if p.param_type_name == "argument"]
        assert usage == " ".join(["Usage: policyport", name, "[OPTIONS]", *arguments]), usage
        assert not re.search(r"\{[\w.-]+(,[\w.-]+)*\}|<(bool|path|str|int|float|text)[^>]*>", result.stdout), (name, result.stdout)


def test_flags_take_no_value_and_options_show_their_metavar():
    text = invoke("run", "-h").stdout
    assert re.search(r"^  -i, --input OBS\s", text, re.M)
    assert re.search(r"^  -o, --output OUT\.npz\s", text, re.M)
    assert re.search(r"^  --backend \[numpy\|onnxruntime\]\s", text, re.M)
    assert re.search(r"^  --force\s+Overwrite", text, re.M)
    assert re.search(r"^  --json\s+Print one JSON", text, re.M)
    assert re.search(r"^  -h, --help\s+Show this message", text, re.M)
    verify = invoke("verify", "-h").stdout
    assert re.search(r"^  --rounding / --no-rounding\s", verify, re.M)
    assert re.search(r"^  -h, --help\s", verify, re.M)  # short name first, every time


def test_every_option_that_takes_a_value_names_it_and_shows_its_default():
    for name, command in commands().items():
        for param in command.params:
            if param.param_type_name != "option" or param.is_flag:
                continue
            assert param.metavar, f"{name} {param.opts}: no metavar"
            record = param.get_help_record(get_command(app).make_context(name, [], resilient_parsing=True))
            required_or_optional = param.required or param.default is None
            assert required_or_optional or "default:" in record[1], f"{name} {param.opts}: no default shown"


def test_usage_error_shows_the_plain_usage_line():
    result = invoke("run", "m.onnx")
    assert result.exit_code == 2
    assert "Usage: policyport run [OPTIONS] MODEL" in result.stderr
    assert "Try 'policyport run -h' for help." in result.stderr
    assert "Missing option '-i' / '--input'" in result.stderr


def test_python_dash_m_is_named_policyport_in_its_usage():
    proc = subprocess.run([sys.executable, "-m", "policyport", "run", "-h"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: policyport run [OPTIONS] MODEL")


def test_help_says_a_packed_folder_is_accepted_where_it_is(model, tmp_path):
    folder = tmp_path / "bundle"
    assert invoke("pack", model, "-o", folder, "--samples", "4").exit_code == 0
    obs = tmp_path / "obs.npy"
    np.save(obs, np.zeros((2, 275), np.float32))
    runs_on_a_folder = {
        "run": ["-i", obs, "-o", tmp_path / "r.npz"],
        "verify": [],
        "inspect": [],
        "extract": ["-o", tmp_path / "w.npz"],
        "expose": ["-o", tmp_path / "e.onnx"],
        "pack": ["-o", tmp_path / "bundle2", "--samples", "2"],
        "export-numpy": ["-o", tmp_path / "p.py", "--samples", "2"],
    }
    for name, args in runs_on_a_folder.items():
        result = invoke(name, folder, *args)
        assert result.exit_code == 0, (name, result.output)
        assert "folder written by 'policyport pack'" in invoke(name, "-h").stdout.replace("\n", " "), name


# ---------------------------------------------------------------------------------------------- --json


def test_run_extract_expose_take_json(model, obs, tmp_path):
    ran = invoke("run", model, "-i", obs, "-o", tmp_path / "a.npz", "--record", tmp_path / "r.npz",
                 "--tensors", "fc_1/*", "--json")
    assert ran.exit_code == 0, ran.output
    doc = json.loads(ran.stdout)
    assert doc["backend"] == "numpy" and doc["output"] == str(tmp_path / "a.npz") and doc["record"] == str(tmp_path / "r.npz")
    assert [t["name"] for t in doc["tensors"]] == ["fc_1/linear", "fc_1/tanh", "logits", "action", "log_std"]
    with np.load(tmp_path / "r.npz") as f:
        tanh = f["fc_1/tanh"]
    row = doc["tensors"][1]
    assert row["shape"] == [5, 256] and row["dtype"] == "float32"
    assert row["min"] == float(tanh.min()) and row["max"] == float(tanh.max())

    extracted = invoke("extract", model, "-o", tmp_path / "w.npz", "--json")
    doc = json.loads(extracted.stdout)
    assert extracted.exit_code == 0 and doc["output"] == str(tmp_path / "w.npz")
    assert doc["parameters"][0] == {"name": "default_policy/fc_1/kernel", "dtype": "float32", "shape": [275, 256]}
    assert len(doc["parameters"]) == 6

    exposed = invoke("expose", model, "-o", tmp_path / "e.onnx", "--tensors", "*tanh", "--json")
    doc = json.loads(exposed.stdout)
    assert exposed.exit_code == 0
    assert [o["name"] for o in doc["outputs"]] == ["logits", "action", "log_std", "fc_1/tanh", "fc_2/tanh"]
    assert doc["outputs"][3] == {"name": "fc_1/tanh", "dtype": "float32", "shape": ["batch", 256]}


def test_json_min_max_of_non_finite_and_empty_arrays():
    from policyport.cli.run import array_summary

    assert array_summary("x", np.array([1.0, np.inf], np.float32))["max"] == "inf"
    assert array_summary("x", np.array([np.nan], np.float64))["min"] == "nan"
    assert array_summary("x", np.zeros((0, 3), np.float32)) == {"name": "x", "dtype": "float32", "shape": [0, 3],
                                                                 "min": None, "max": None}
    assert array_summary("i", np.array([3, -2], np.int64))["min"] == -2
    json.dumps(array_summary("x", np.array([np.nan, 1.0])))


def test_every_command_with_json_prints_one_document_on_failure_too(tmp_path):
    missing = tmp_path / "missing.onnx"
    cases = {
        "convert": [tmp_path / "missing.npz", "-o", tmp_path / "o.onnx"],
        "inspect": [missing],
        "extract": [missing, "-o", tmp_path / "w.npz"],
        "expose": [missing, "-o", tmp_path / "e.onnx"],
        "run": [missing, "-i", tmp_path / "obs.npy", "-o", tmp_path / "o.npz"],
        "verify": [missing],
        "pack": [missing, "-o", tmp_path / "b"],
        "export-numpy": [missing, "-o", tmp_path / "p.py"],
        "record": [missing, "-i", tmp_path / "obs.npy", "-o", tmp_path / "r.npz"],
        "stats": [tmp_path / "missing.npz"],
        "plot": [tmp_path / "missing.npz", "-o", tmp_path / "plots"],
        "patch": [missing, "--clean", tmp_path / "a.npy", "--corrupt", tmp_path / "b.npy"],
        "direction": [tmp_path / "missing.npz", tmp_path / "other.npz", "--tensor", "t", "-o", tmp_path / "d.npy"],
        "importance": [missing, "-i", tmp_path / "obs.npy"],
        "probe": [tmp_path / "missing.npz", "--labels", tmp_path / "y.npy"],
        "to-torch": [missing, "-o", tmp_path / "torch"],
        "to-keras": [missing, "-o", tmp_path / "policy.keras"],
        "to-sb3": [missing, "-o", tmp_path / "sb3.zip", "--algo", "ppo"],
    }
    assert set(cases) | {"ops"} == set(commands())
    for name, args in cases.items():
        result = invoke(name, *args, "--json")
        doc = json.loads(result.stdout)
        assert result.exit_code == 3 and doc["exit_code"] == 3, (name, result.output)
        assert "no such file" in doc["error"], (name, doc)
        usage = invoke(name, *args, "--json", "--no-such-option")
        assert usage.exit_code == 2 and json.loads(usage.stdout)["exit_code"] == 2, name


# ---------------------------------------------------------------------------------------------- extras


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _distributions(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """Every distribution an extra installs, following ``policyport[other]`` references."""
    names = set()
    for requirement in extras[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if name == "policyport":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                names |= _distributions(inner.strip(), extras)
        else:
            names.add(name)
    return names


#: Import name -> the distribution that provides it, where they differ.
DISTRIBUTION = {"tensorflow": "tensorflow-cpu", "keras": "tensorflow-cpu", "yaml": "pyyaml", "sklearn": "scikit-learn",
                "stable_baselines3": "stable-baselines3"}


def _install_hints() -> list[tuple[str, str | None, str, int]]:
    """(file, module or None, extra, line) of every require(module, extra, ...),
    MissingDependencyError(module, extra, ...) and "pip install 'policyport[extra]'" in the package."""
    hints = []
    for path in sorted((ROOT / "policyport").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("require", "MissingDependencyError") \
                    and len(node.args) >= 2:
                module, extra = node.args[0], node.args[1]
                extra = extra.value if isinstance(extra, ast.Constant) else constants.get(getattr(extra, "id", None))
                module = module.value if isinstance(module, ast.Constant) else None
                if extra is None and path.name == "errors.py":
                    continue  # require() passing its own arguments on
                hints.append((path.name, module, extra, node.lineno))
        for match in re.finditer(r"policyport\[(\w+|\{EXTRA\})\]", text):
            extra = constants.get("EXTRA") if match.group(1) == "{EXTRA}" else match.group(1)
            hints.append((path.name, None, extra, text[:match.start()].count("\n") + 1))
    return hints


def test_every_install_hint_names_an_extra_that_installs_the_module():
    extras = _extras()
    hints = _install_hints()
    assert len(hints) >= 20 and {h[2] for h in hints} >= {"onnx", "torch", "tf", "cli"}
    for file, module, extra, line in hints:
        assert extra in extras, f"{file}:{line}: policyport[{extra}] is not an extra of pyproject.toml"
        if module is not None:
            top = module.split(".")[0]
            assert DISTRIBUTION.get(top, top) in _distributions(extra, extras), \
                f"{file}:{line}: policyport[{extra}] does not install {top}"


def test_the_missing_dependency_message_names_the_extra_literally(monkeypatch, tmp_path):
    import policyport.runtime.ort as ort

    def missing(module, extra, purpose):
        from policyport.errors import MissingDependencyError

        raise MissingDependencyError(module, extra, purpose)

    monkeypatch.setattr(ort, "require", missing)
    src = tmp_path / "m.onnx"
    _tiny(src)
    np.save(tmp_path / "obs.npy", np.zeros((1, 4), np.float32))
    result = invoke("run", src, "-i", tmp_path / "obs.npy", "-o", tmp_path / "o.npz", "--backend", "onnxruntime")
    assert result.exit_code == 4
    assert "pip install 'policyport[onnx]'" in result.stderr
    assert not (tmp_path / "o.npz").exists()


def test_cli_without_typer_says_which_extra_and_still_tells_its_version(tmp_path):
    import policyport as pp

    blocker = tmp_path / "typer.py"
    blocker.write_text("raise ImportError('blocked', name='typer')\n")
    proc = subprocess.run([sys.executable, "-m", "policyport", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout == f"policyport {pp.__version__}\n" and proc.stderr == ""
    proc = subprocess.run([sys.executable, "-m", "policyport", "ops"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 4 and "pip install 'policyport[cli]'" in proc.stderr and "Traceback" not in proc.stderr
    assert "pip install -e '.[cli]' in a clone of the repository" in proc.stderr


# ---------------------------------------------------------------------------------------------- completion


def test_shell_completion_completes_commands_options_and_choices(monkeypatch):
    def complete(words: str, cword: int) -> list[str]:
        env = {**os.environ, "_POLICYPORT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        proc = subprocess.run([sys.executable, "-m", "policyport"], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("policyport ru", 1) == ["run"]
    assert complete("policyport run --ba", 2) == ["--backend"]
    assert complete("policyport run --backend ", 3) == ["numpy", "onnxruntime"]
    # typer's own switch: --show-completion takes the shell's name instead of detecting the shell from
    # the parent processes (which fails where none is a shell, as under nohup or a CI runner)
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    script = invoke("--show-completion", "bash")
    assert script.exit_code == 0 and "_POLICYPORT_COMPLETE=complete_bash" in script.stdout


def _tiny(path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Tanh", ["obs"], ["y"], name="y")], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def test_the_from_help_lists_the_kinds_a_file_can_be():
    from policyport.converter import FILE_KINDS, KINDS

    assert set(KINDS) - set(FILE_KINDS) == {"torch"}
    text = " ".join(invoke("convert", "-h").stdout.split())
    text = re.sub(r"(?<=\w-) (?=\w)", "", text)  # a kind's name (rl-games) the help wrapped after its hyphen
    assert f"Source kind: {', '.join(FILE_KINDS[:-1])} or {FILE_KINDS[-1]}" in text


def test_help_lists_every_command_in_the_order_of_the_workflow():
    from policyport.cli.core import WORKFLOW

    text = invoke("-h").stdout
    listed = [line.split()[0] for line in text.split("Commands:", 1)[1].splitlines() if line.strip()]
    assert listed == list(WORKFLOW) and sorted(listed) == sorted(commands())


def test_policyport_alone_prints_the_help_as_plain_lines_and_exits_2():
    alone = invoke()
    assert alone.exit_code == 2 and alone.stdout == ""
    lines = alone.stderr.splitlines()
    assert lines[0] == "Usage: policyport [OPTIONS] COMMAND [ARGS]..."
    assert "Options:" in lines and any(line.split()[:1] == ["verify"] for line in lines)
    assert alone.stderr == invoke("--help").stdout  # the same text --help prints, on stderr
    proc = subprocess.run([sys.executable, "-m", "policyport"], capture_output=True, text=True)  # and as a command
    assert proc.returncode == 2 and proc.stdout == "" and "\\n" not in proc.stderr
    assert proc.stderr.splitlines()[0] == lines[0] and any(line.startswith("Commands:") for line in proc.stderr.splitlines())
