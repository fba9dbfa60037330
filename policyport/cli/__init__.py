"""The ``policyport`` command line: each command parses, calls the library and renders.

One module per group of commands; :mod:`.core` holds the Typer application and the one error edge
(exit codes, ``--json`` failures, ``--debug``), :mod:`.render` the literal-text rendering. The CLI
needs the ``cli`` extra (typer, rich, onnx, onnxruntime); without it :func:`main` says so and exits 4
instead of failing on an import.
"""

from __future__ import annotations

import sys


def _app():
    from . import analysis, convert, handoff, model, pack, run, verify  # noqa: F401  (each registers its commands)
    from .core import app

    return app


def main() -> None:
    """Console-script entry point (``policyport``, ``python -m policyport``)."""
    try:
        app = _app()
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in ("typer", "rich", "click"):
            raise
        sys.stderr.write(f"error: the policyport command needs the Python package {missing!r}, which is not "
                         "installed; install it with: pip install 'policyport[cli]'\n")
        sys.exit(4)
    app()


def __getattr__(name: str):
    if name == "app":
        return _app()
    raise AttributeError(f"module 'policyport.cli' has no attribute {name!r}")
