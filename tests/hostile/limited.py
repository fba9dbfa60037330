"""Running ``policyport`` in a subprocess whose address space is limited, as the hostile tests do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

resource = pytest.importorskip("resource")

#: Bytes of address space a hostile case runs in: a command with onnxruntime, or TensorFlow and
#: tf2onnx, loaded maps well under it (TensorFlow's import peaks at some 1.25 GB here).
ADDRESS_SPACE = 2 << 30
#: A case that does not end within this many seconds is a hang, not a slow machine.
HANG = 600
#: Linux enforces RLIMIT_AS (macOS does not).
SUPPORTED = sys.platform.startswith("linux")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_limited(argv, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``policyport *argv`` in a subprocess limited to :data:`ADDRESS_SPACE`, its output as text."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("POLICYPORT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "policyport", *map(str, argv)], capture_output=True, text=True,
                          env=full_env, cwd=cwd, preexec_fn=_limited, timeout=HANG)


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one-line message of a command that ended with exit 3 and no traceback (asserted)."""
    shown = proc.stdout + proc.stderr
    assert proc.returncode == 3, shown
    assert "Traceback" not in shown and "this is a bug" not in shown, shown
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    return " ".join(proc.stderr.split())
