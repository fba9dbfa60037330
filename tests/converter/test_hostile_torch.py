"""A hostile torch file is refused naming the global it asked for, whatever its format (legacy,
zip, a plain pickle) and wherever it sits (a file, an SB3 zip's policy.pth), and nothing from it runs."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from torch_fixtures import TORCH_DIR
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter.unpickle import pickled_globals, refused_global

runner = CliRunner()
HOSTILE = TORCH_DIR / "hostile"
#: pickle names os.system by the module that defines it
SYSTEM = f"{os.system.__module__}.system"


def _message(result) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("name, what", [
    ("legacy.pt", "legacy.pt"),  # torch's own message names no global for the pre-1.6 format
    ("zip_format.pt", "zip_format.pt"),
    ("plain_pickle.pt", "plain_pickle.pt"),
    ("sb3_plain_pickle.zip", "sb3_plain_pickle.zip:policy.pth"),
])
def test_a_hostile_torch_file_is_refused_naming_the_global_and_nothing_runs(tmp_path, monkeypatch, name, what):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["convert", str(HOSTILE / name), "-o", "out.onnx"])
    assert result.exit_code == 3, result.output
    assert _message(result).startswith(f"error: {HOSTILE / what} asks for {SYSTEM} while unpickling; "
                                       "torch.load(weights_only=True) rebuilds only tensors and plain containers")
    assert result.stdout == "" and not (tmp_path / "policyport-pickle-ran").exists()
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(pp.UntrustedFileError, match=rf"asks for {SYSTEM} while unpickling"):
        pp.convert(HOSTILE / name)


def test_the_globals_of_pickles_are_read_from_their_opcodes_without_running_them():
    legacy = (HOSTILE / "legacy.pt").read_bytes()
    found = pickled_globals(legacy)  # five pickles one after another, then raw storage bytes
    assert SYSTEM in found and "torch._utils._rebuild_tensor_v2" in found and "torch.FloatStorage" in found
    assert refused_global(legacy, allowed_roots=("torch",)) == SYSTEM
    assert refused_global(legacy) == "torch._utils._rebuild_tensor_v2"  # without torch's own rebuilders allowed
    memoised = pickle.dumps([os.system, os.system], protocol=4)  # the second one a memo reference
    assert pickled_globals(memoised) == [SYSTEM]
    assert refused_global(pickle.dumps({"a": np.zeros(2)}, protocol=2)) is None
    assert pickled_globals(b"not a pickle") == []
