"""A whole pickled module whose class lives in the user's own ``.py`` file: with ``--trust`` every command
that loads a source imports it from the current folder or the file's folder, as the user's own script
did (the console script puts neither on ``sys.path``); without ``--trust`` nothing from it runs."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter.readers.unpickle import user_import_path

torch = pytest.importorskip("torch")

#: The user's module: a custom forward (not an nn.Sequential), and a trace of its import beside it.
MODULE = '''
import pathlib
import torch

pathlib.Path(__file__).with_name(__name__ + ".imported").write_text("imported")


class MyPolicy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 16)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, obs):
        return self.head(torch.tanh(self.body(obs)) * 2.0)
'''

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def write_project(folder: Path, name: str) -> torch.nn.Module:
    """``folder/<name>.py`` and ``folder/model.pt`` (``torch.save`` of its ``MyPolicy``), as a user's
    training script leaves them; returns the live module, whose forward is the expected output. The
    module is imported here from a path entry that is removed again, and dropped from ``sys.modules``,
    so that a later load must find the file itself."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(MODULE)
    sys.path.insert(0, str(folder))
    try:
        user = importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))
    torch.manual_seed(3)
    policy = user.MyPolicy().eval()
    torch.save(policy, folder / "model.pt")
    del sys.modules[name]
    (folder / f"{name}.imported").unlink()
    return policy


@pytest.fixture
def project(tmp_path):
    """(folder, module name, live module): a module name of its own per test, never imported before."""
    name = f"mypolicy_{uuid.uuid4().hex[:12]}"
    policy = write_project(tmp_path / "project", name)
    yield tmp_path / "project", name, policy
    sys.modules.pop(name, None)


def observations(n=32, seed=5) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, (n, 4)).astype(np.float32)


def check_matches_forward(onnx_path: Path, policy) -> None:
    """The ONNX model's logits on both backends equal the module's own forward."""
    obs = observations()
    with torch.no_grad():
        expected = policy(torch.from_numpy(obs)).numpy()
    for backend in ("numpy", "onnxruntime"):
        logits = pp.load(onnx_path, backend=backend).run({"obs": obs})["logits"]
        np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_console_script_imports_the_users_module_from_the_current_folder_with_trust(tmp_path):
    """The installed ``policyport`` command, run where the user trained (``mypolicy.py`` beside
    ``model.pt``), as a user runs it; then pack with the module as its source."""
    folder = tmp_path / "work"
    policy = write_project(folder, "mypolicy")
    script = Path(sys.executable).with_name("policyport")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args):
        return subprocess.run([str(script), *map(str, args)], cwd=folder, env=env, capture_output=True, text=True,
                              check=False, timeout=300)

    converted = run("convert", "model.pt", "-o", "m.onnx", "--trust", "--samples", "64")
    assert converted.returncode == 0, converted.stderr
    assert (folder / "mypolicy.imported").exists()
    check_matches_forward(folder / "m.onnx", policy)
    packed = run("pack", "m.onnx", "-o", "bundle", "--source", "model.pt", "--trust", "--json")
    assert packed.returncode == 0, packed.stderr
    parity = json.loads(packed.stdout)["policy"]["parity"]
    assert parity["passed"] and parity["source_vs_numpy_max_abs"] is not None


@pytest.mark.parametrize("where", ["current folder", "file's folder"])
def test_every_command_that_loads_a_source_finds_the_module_with_trust_and_restores_the_path(
        project, tmp_path, monkeypatch, where):
    folder, name, policy = project
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(folder if where == "current folder" else elsewhere)
    path_before = list(sys.path)
    src, out = folder / "model.pt", tmp_path / "m.onnx"

    converted = invoke("convert", src, "-o", out, "--trust", "--samples", "64", "--json")
    assert converted.exit_code == 0, converted.output
    assert json.loads(converted.stdout)["verification"]["passed"]
    assert sys.path == path_before
    check_matches_forward(out, policy)
    for args in (["inspect", src, "--trust", "--json"],
                 ["verify", out, "--source", src, "--trust", "--samples", "16", "--json"],
                 ["pack", out, "-o", tmp_path / "bundle", "--source", src, "--trust", "--json"]):
        sys.modules.pop(name)  # each command imports the module anew
        result = invoke(*args)
        assert result.exit_code == 0, (args[0], result.output)
        assert name in sys.modules and sys.path == path_before, args[0]
    inspected = json.loads(invoke("inspect", src, "--trust", "--json").stdout)
    assert inspected["parameter_count"] == 4 * 16 + 16 + 16 * 2 + 2 and {"Gemm", "Tanh", "Mul"} <= set(inspected["ops"])
    packed = json.loads(invoke("pack", out, "-o", tmp_path / "again", "--source", src, "--trust", "--json").stdout)
    assert packed["policy"]["parity"]["source_vs_numpy_max_abs"] < 1e-5


@pytest.mark.parametrize("command", [["convert", "{src}", "-o", "{out}/m.onnx"], ["inspect", "{src}"],
                                     ["verify", "{model}", "--source", "{src}", "--samples", "4"],
                                     ["pack", "{model}", "-o", "{out}/b", "--source", "{src}"]])
def test_without_trust_every_command_refuses_the_module_and_imports_nothing(project, tmp_path, monkeypatch, command):
    folder, name, policy = project
    monkeypatch.chdir(folder)
    model = tmp_path / "model.onnx"
    onnx.save(pp.convert(policy), model)
    out = tmp_path / "out"
    out.mkdir()
    result = invoke(*[a.format(src=folder / "model.pt", out=out, model=model) for a in command])
    assert result.exit_code == 3
    message = " ".join(result.stderr.split())
    assert f"asks for {name}.MyPolicy while unpickling" in message
    assert message.endswith("if you trust this file, pass --trust (trust=True)")  # its own option: no note
    assert name not in sys.modules and not (folder / f"{name}.imported").exists()
    assert not list(out.iterdir())


def test_a_module_found_nowhere_is_named_with_the_folders_searched(project, tmp_path, monkeypatch):
    folder, name, _ = project
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "model.pt").write_bytes((folder / "model.pt").read_bytes())
    monkeypatch.chdir(tmp_path)
    result = invoke("convert", alone / "model.pt", "-o", tmp_path / "m.onnx", "--trust")
    assert result.exit_code == 3
    assert " ".join(result.stderr.split()) == (
        f"error: {alone / 'model.pt'} needs module {name!r} to be unpickled, and Python cannot import it (the current "
        f"folder ({tmp_path}), the file's folder ({alone}) and the installed packages were searched): run policyport "
        f"from the folder that holds {name}.py (or the package {name}/), add that folder to PYTHONPATH, or install the "
        "package that provides it")
    with pytest.raises(pp.UnreadableFileError, match=f"needs module {name!r}"):
        pp.convert(alone / "model.pt", trust=True)


def test_a_class_of_the_saving_script_says_no_other_program_can_import_it(tmp_path, monkeypatch):
    """``torch.save`` of a module whose class the training script itself defined (``__main__``)."""
    monkeypatch.chdir(tmp_path)
    script = ("import torch\n"
              "class Policy(torch.nn.Module):\n"
              "    def __init__(self):\n        super().__init__(); self.fc = torch.nn.Linear(3, 2)\n"
              "    def forward(self, x):\n        return self.fc(x)\n"
              "torch.save(Policy(), 'main.pt')\n")
    saved = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert saved.returncode == 0, saved.stderr
    result = invoke("convert", "main.pt", "-o", "m.onnx", "--trust")
    assert result.exit_code == 3
    assert " ".join(result.stderr.split()) == (
        "error: main.pt pickles class 'Policy' of the script that saved it (module __main__), which no other program "
        "can import: define the class in a module of its own (a .py file the script imports) and save the model "
        "again, or save its state_dict (torch.save(model.state_dict())) and convert that")


def test_the_import_path_holds_the_current_and_the_files_folder_only_inside_and_even_on_an_error(tmp_path, monkeypatch):
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(here), str(there))])
    before = list(sys.path)
    with user_import_path(there / "model.pt"):
        assert sys.path[:2] == [str(here), str(there)] and sys.path[2:] == before
    assert sys.path == before
    with pytest.raises(RuntimeError), user_import_path(there / "model.pt"):
        raise RuntimeError("loading failed")
    assert sys.path == before
    monkeypatch.setattr(sys, "path", ["", *before])  # python -m and -c: "" is the current folder already
    with user_import_path(here / "model.pt"):
        assert sys.path == ["", *before]
    with user_import_path(None):
        assert sys.path == ["", *before]
    assert sys.path == ["", *before]
