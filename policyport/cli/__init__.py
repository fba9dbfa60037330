"""The ``policyport`` command line: each command parses, calls the library and renders.

One module per group of commands; :mod:`.core` holds the Typer application and the one error edge
(exit codes, ``--json`` failures, ``--debug``), :mod:`.render` the literal-text rendering. The CLI
needs the ``cli`` extra (typer, rich, onnx, onnxruntime); without it :func:`main` says so and exits 4
instead of failing on an import (``policyport --version`` works with numpy alone).
"""

from __future__ import annotations

import sys


#: Command -> the module of this package that registers it. A command line that names a command
#: imports that module alone, so that ``policyport run`` starts without the others' imports; help
#: and anything else import them all.
COMMANDS = {
    "convert": "convert", "inspect": "model", "extract": "model", "expose": "model", "ops": "model",
    "run": "run", "record": "analysis", "stats": "analysis", "plot": "analysis", "importance": "analysis",
    "probe": "analysis", "verify": "verify",
    "pack": "pack", "export-numpy": "handoff", "to-torch": "handoff", "to-keras": "handoff", "to-sb3": "handoff",
    "patch": "interp", "direction": "interp",
}


#: How to install the command line's packages, from PyPI or in a clone of the repository.
INSTALL_CLI = "install it with: pip install 'policyport[cli]' (or pip install -e '.[cli]' in a clone of the repository)"


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is neither an option nor ``--max-bytes``'s value."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return None
        if word == "--max-bytes":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _app(argv: list[str] | None = None):
    """The Typer application with the commands ``argv`` may run registered (None: every command)."""
    import importlib
    import importlib.util

    command = None if argv is None else _command(argv)
    for module in [COMMANDS[command]] if command in COMMANDS else sorted(set(COMMANDS.values())):
        importlib.import_module(f".{module}", __name__)  # each registers its commands
    if importlib.util.find_spec("rich") is None:  # imported only once something is rendered (see .render)
        raise ImportError("No module named 'rich'", name="rich")
    from . import core

    core.register_every_command = _app
    return core.app


def main() -> None:
    """Console-script entry point (``policyport``, ``python -m policyport``)."""
    argv = sys.argv[1:]
    try:
        app = _app(argv)
    except ImportError as e:
        missing = (e.name or "").split(".")[0]  # pragma: no mutate (a nameless ImportError is re-raised whatever stands for its name)
        if missing not in ("typer", "rich", "click"):
            raise
        if _command(argv) is None and "--version" in argv[: argv.index("--") if "--" in argv else len(argv)]:
            from ..version import __version__  # the version needs numpy alone
            from ..io.outputs import stdout_reader_may_leave

            with stdout_reader_may_leave():
                print(f"policyport {__version__}")
            sys.exit(0)
        sys.stderr.write(f"error: the policyport command needs the Python package {missing!r}, which is not "
                         f"installed; {INSTALL_CLI}\n")
        sys.exit(4)
    app()


def __getattr__(name: str):
    if name == "app":
        return _app()
    raise AttributeError(f"module 'policyport.cli' has no attribute {name!r}")
