"""What the tests of the RL libraries' checkpoint sources share: the CLI run without a traceback, and
the round trip every source kind must pass (convert, verify --source, pack, the packed run.py --verify)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from typer.testing import CliRunner

from policyport.cli import app


def arrays(path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path`` (what a library's own policy returned, for instance)."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def fixture_script(folder):
    """The ``make_fixtures.py`` of a fixtures folder, imported under a name of its own (each library's
    script is called make_fixtures: a plain import would return whichever was imported first)."""
    import importlib.util

    name = f"make_fixtures_{folder.name}"
    if name not in sys.modules:  # registered, so that what it defines pickles (a dist_fn saved with a policy)
        spec = importlib.util.spec_from_file_location(name, folder / "make_fixtures.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def invoke(*args):
    """``policyport ARGS`` in process; asserts that no traceback reached the output."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def convert_verify_and_pack(source, tmp_path, *flags) -> list[str]:
    """``convert SOURCE FLAGS``, ``verify --source SOURCE``, ``pack`` and the packed folder's
    ``run.py --verify``, each asserted to pass; returns the topics of the conversion's assumptions."""
    converted = invoke("convert", source, *flags, "-o", tmp_path / "a.onnx", "--json")
    assert converted.exit_code == 0, converted.output
    topics = [a["topic"] for a in json.loads(converted.stdout)["assumptions"]]
    verified = invoke("verify", tmp_path / "a.onnx", "--source", source, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"] is True
    packed = invoke("pack", tmp_path / "a.onnx", "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout
    return topics
