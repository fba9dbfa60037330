"""The fixtures' ``make_fixtures.py`` scripts, imported by the tests that rerun a library's own forward:
each under a name of its own (``fixtures.<library>.make_fixtures``), so that two of them imported in one
test session do not replace each other in ``sys.modules``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def make_fixtures(folder: Path):
    """The module ``folder/make_fixtures.py``, imported once per session."""
    name = f"fixtures.{Path(folder).name}.make_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(folder) / "make_fixtures.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
