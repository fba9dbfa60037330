"""`pip install` of the repository into a fresh venv that holds numpy alone: the core installs with
nothing more, loads and verifies a packed folder, and the `policyport` command says which extra to
install instead of failing with a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import policyport as pp
from numpy_venv import make_venv, run

ROOT = Path(__file__).parents[1]
EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh numpy-only venv into which ``pip install <repository>`` was run.

    numpy is linked in (with its dist-info, so pip counts it as installed and downloads nothing for
    it); the build backend (setuptools) comes from pip's configured index, as for any user.
    """
    tmp = tmp_path_factory.mktemp("install")
    python = make_venv(tmp / "venv", pip=True)
    source = tmp / "repo"  # the files a source install reads; the worktree stays untouched by the build
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "policyport", source / "policyport", ignore=shutil.ignore_patterns("__pycache__"))
    result = run(python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", source)
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def test_the_install_brings_nothing_but_numpy(installed):
    listing = json.loads(run(installed, "-m", "pip", "list", "--format=json", "--disable-pip-version-check").stdout)
    names = {p["name"].lower() for p in listing}
    assert names - {"pip", "setuptools"} == {"numpy", "policyport"}
    versions = {p["name"].lower(): p["version"] for p in listing}
    assert versions["policyport"] == pp.__version__


def test_policyport_load_runs_and_verifies_a_folder_there(installed, metadrive_model, tmp_path):
    folder = pp.pack(metadrive_model, tmp_path / "bundle", samples=8, runtime=False)
    script = (
        "import json, sys, numpy as np, policyport as pp\n"
        "session = pp.load(sys.argv[1], backend='numpy')\n"
        "obs = np.full((3, 275), 0.5, np.float32)\n"
        "out = session.run({'obs': obs})\n"
        "report = pp.verify_bundle(sys.argv[1])\n"
        "blocked = [m for m in ('onnx', 'onnxruntime', 'typer', 'rich') if m in sys.modules]\n"
        "print(json.dumps({'action': out['action'].tolist(), 'passed': report.passed, 'loaded': blocked,\n"
        "                  'file': pp.__file__}))\n"
    )
    result = run(installed, "-c", script, folder)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["passed"] is True and doc["loaded"] == [] and "site-packages" in doc["file"]
    want = pp.load(metadrive_model, backend="numpy").run({"obs": __import__("numpy").full((3, 275), 0.5, "float32")})
    assert doc["action"] == want["action"].tolist()


@pytest.mark.parametrize("args", [["policyport", "pack", "m.onnx", "-o", "b"], ["-m", "policyport", "verify", "b"],
                                  ["policyport", "--debug", "--help"]])
def test_the_command_names_the_extra_to_install_and_exits_4(installed, args):
    command = installed.with_name("policyport") if args[0] == "policyport" else installed
    result = run(command, *args[1:]) if args[0] == "policyport" else run(installed, *args)
    assert result.returncode == 4, result.stderr
    assert result.stderr == ("error: the policyport command needs the Python package 'typer', which is not "
                             "installed; install it with: pip install 'policyport[cli]' (or pip install -e "
                             "'.[cli]' in a clone of the repository)\n")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["policyport", "--version"], ["-m", "policyport", "--debug", "--version"]])
def test_the_version_needs_numpy_alone(installed, args):
    result = run(installed.with_name("policyport"), *args[1:]) if args[0] == "policyport" else run(installed, *args)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"policyport {pp.__version__}\n", "")
