"""Every hostile file of the corpus ends with its exit code and a true message, never a traceback, in a
process whose address space is limited to 2 GiB: a missing size check shows up as a different message
(numpy's MemoryError, or a crash), never as the limit's."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from make_corpus import make_corpus

resource = pytest.importorskip("resource")

ADDRESS_SPACE = 2 << 30  # bytes; a command with onnxruntime loaded maps well under 1 GiB of it
#: A case that does not end within this many seconds is a hang, not a slow machine.
HANG = 300

#: Linux enforces RLIMIT_AS (macOS does not), and the corpus holds a FIFO.
SUPPORTED = sys.platform.startswith("linux")

# Built once, when the module is collected (about two seconds: the bomb's CRC), removed at exit.
FOLDER = Path(tempfile.mkdtemp(prefix="policyport-hostile-"))
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
CASES = {c.name: c for c in make_corpus(FOLDER)} if SUPPORTED else {}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_limited(argv, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``policyport *argv`` in a subprocess limited to :data:`ADDRESS_SPACE`."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("POLICYPORT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "policyport", *argv], capture_output=True, text=True,
                          env=full_env, cwd=cwd, preexec_fn=_limited, timeout=HANG)


@pytest.mark.skipif(not SUPPORTED, reason="address-space limits and FIFOs as on Linux")
@pytest.mark.parametrize("name", list(CASES) or ["corpus"])
def test_every_hostile_case_ends_with_its_exit_code_and_message(name):
    case = CASES[name]
    proc = run_limited(case.argv, case.env, cwd=FOLDER)
    shown = proc.stdout + proc.stderr
    assert proc.returncode == case.exit_code, shown
    assert "Traceback" not in shown and "this is a bug" not in shown, shown
    assert case.message in " ".join(proc.stderr.split()), proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr  # one line, nothing raw
    for path in case.absent:
        assert not Path(path).exists(), f"{path} was written"
    assert not [p.name for p in FOLDER.rglob(".*.tmp")], "a temporary file was left behind"
