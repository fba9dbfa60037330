"""What the tests of every RL library's checkpoints share: the CLI run without a traceback, and the round of
convert, verify against the source, pack and the packed folder's own run.py --verify."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from policyport.cli import app


def invoke(*args):
    """``policyport ARGS`` in process; the result, asserted free of a traceback."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def convert_verify_pack(source: Path, tmp_path: Path, *convert_args) -> list[str]:
    """Convert ``source`` on the command line, verify the model against it, pack it and run the packed folder's
    ``run.py --verify``, asserting each passes; returns the topics of the conversion's assumptions."""
    converted = invoke("convert", source, *convert_args, "-o", tmp_path / "a.onnx", "--json")
    assert converted.exit_code == 0, converted.output
    verified = invoke("verify", tmp_path / "a.onnx", "--source", source, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"] is True, verified.output
    packed = invoke("pack", tmp_path / "a.onnx", "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout
    return [a["topic"] for a in json.loads(converted.stdout)["assumptions"]]


def code_running_payload(marker: Path) -> dict:
    """Entries for a checkpoint that, unpickled by ``torch.load(weights_only=False)``, would create ``marker``
    (a ``__reduce__`` naming ``subprocess.call``), beside a plain ``collections.Counter``."""
    import collections

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    return {"hook": Payload(), "counter": collections.Counter(a=1)}
