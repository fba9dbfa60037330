"""Fresh virtual environments that hold numpy and nothing else, for the hand-off tests.

A venv is made without system site-packages and without pip (fast, no network); numpy (with its
bundled libraries and its dist-info, so pip sees it as installed) is linked in from the environment
running the tests. Nothing else of that environment — policyport, onnx, protobuf, onnxruntime,
typer, rich — is reachable from it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

#: Modules a numpy-only target does not have; the tests make sure the venv cannot import them.
ABSENT = ("policyport", "onnx", "google.protobuf", "onnxruntime", "typer", "rich", "click", "torch", "tensorflow")


def make_venv(folder: Path, *, numpy: bool = True, pip: bool = False) -> Path:
    """Create a venv at ``folder``; return its python. ``numpy`` links numpy in; ``pip`` bootstraps
    pip from the interpreter's bundled wheel (ensurepip, offline)."""
    args = [sys.executable, "-m", "venv", str(folder)] + ([] if pip else ["--without-pip"])
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    python = folder / "bin" / "python"
    if numpy:
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        source = Path(np.__file__).resolve().parent
        for path in [source, source.with_name("numpy.libs"), *source.parent.glob("numpy-*.dist-info")]:
            if path.exists():
                (site / path.name).symlink_to(path, target_is_directory=path.is_dir())
    return python


def run(python: Path, *args, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python args...`` in ``cwd`` (default: the venv's folder, so the repository is not on sys.path)."""
    return subprocess.run([str(python), *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd or python.parent.parent, env=env)
