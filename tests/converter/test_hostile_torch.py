"""A hostile torch file is refused naming the global it asked for, whatever its format (legacy,
zip, a plain pickle) and wherever it sits (a file, an SB3 zip's policy.pth), and nothing from it runs."""

from __future__ import annotations

import collections
import os
import pickle
import struct

import numpy as np
import pytest
from torch_fixtures import TORCH_DIR
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter.readers.unpickle import load, pickled_globals, refused_global

runner = CliRunner()
HOSTILE = TORCH_DIR / "hostile"
#: pickle names os.system by the module that defines it
SYSTEM = f"{os.system.__module__}.system"


def _message(result) -> str:
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("name, what", [
    ("legacy.pt", "legacy.pt"),  # torch's own message names no global for the pre-1.6 format
    ("zip_format.pt", "zip_format.pt"),
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


@pytest.mark.parametrize("name, what", [
    ("plain_pickle.pt", "plain_pickle.pt"),
    ("sb3_plain_pickle.zip", "sb3_plain_pickle.zip:policy.pth"),
])
def test_a_plain_pickle_is_no_torch_file_and_is_refused_naming_its_global_without_advising_trust(
        tmp_path, monkeypatch, name, what):
    """torch.load reads a pickle only behind torch's magic number: with --trust it would run this one and
    then refuse it, so --trust is no remedy and is not advised."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["convert", str(HOSTILE / name), "-o", "out.onnx"])
    assert result.exit_code == 3, result.output
    assert _message(result).startswith(f"error: {HOSTILE / what} is a Python pickle, asking for {SYSTEM}, not a file "
                                       "torch.save wrote (torch.save writes a zip archive holding data.pkl")
    assert "--trust" not in result.output
    assert result.stdout == "" and not (tmp_path / "policyport-pickle-ran").exists()
    assert not (tmp_path / "out.onnx").exists()
    with pytest.raises(pp.UnreadableFileError, match=rf"is a Python pickle, asking for {SYSTEM}, not a file"):
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


def _text(opcode: str, text: str) -> bytes:
    """``text`` pushed by one of the pickle opcodes that push a string (every protocol has some)."""
    raw = text.encode()
    return {
        "SHORT_BINUNICODE": b"\x8c" + bytes([len(raw)]) + raw,
        "BINUNICODE": b"X" + struct.pack("<I", len(raw)) + raw,
        "BINUNICODE8": b"\x8d" + struct.pack("<Q", len(raw)) + raw,
        "UNICODE": b"V" + raw + b"\n",
        "STRING": b"S'" + raw + b"'\n",
        "BINSTRING": b"T" + struct.pack("<i", len(raw)) + raw,
        "SHORT_BINSTRING": b"U" + bytes([len(raw)]) + raw,
    }[opcode]


@pytest.mark.parametrize("opcode", ["SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                                    "SHORT_BINSTRING"])
def test_a_stack_global_is_read_whatever_opcode_pushed_its_names(opcode):
    data = b"\x80\x04" + _text(opcode, "posix") + _text(opcode, "system") + b"\x93."
    assert pickled_globals(data) == ["posix.system"] and refused_global(data) == "posix.system"
    with pytest.raises(pp.UntrustedFileError, match=r"^the pickle asks to call posix\.system while unpickling"):
        load(data)  # what the reader refuses is the global the opcodes name


#: (memo store, memo fetch) opcodes of each protocol: MEMOIZE numbers every object memoised in turn
MEMO = [(b"\x94", lambda i: b"h" + bytes([i])),
        (b"p%d\n", lambda i: b"g%d\n" % i),
        (b"q%c", lambda i: b"h" + bytes([i])),
        (b"r%c\x00\x00\x00", lambda i: b"j" + struct.pack("<I", i))]


@pytest.mark.parametrize("put, get", MEMO, ids=["MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"])
def test_a_module_name_fetched_from_the_memo_is_the_one_memoised_there(put, get):
    counter = iter(range(100))

    def memoise() -> bytes:
        index = next(counter)
        return put % index if b"%" in put else put

    # {} memoised at 0, "collections" at 1, "subprocess" at 2, "Popen" at 3, the class at 4, then a
    # fetch of 2 (the unpickler's subprocess) and of 1 (collections): a reader numbering only the
    # strings would name collections.Popen and OrderedDict.OrderedDict
    data = (b"\x80\x04}" + memoise() + _text("SHORT_BINUNICODE", "collections") + memoise()
            + _text("SHORT_BINUNICODE", "subprocess") + memoise() + _text("SHORT_BINUNICODE", "Popen") + memoise()
            + b"\x93" + memoise() + b"0" + get(2) + _text("SHORT_BINUNICODE", "Popen") + b"\x93" + b"0"
            + get(1) + _text("SHORT_BINUNICODE", "OrderedDict") + b"\x93.")
    assert pickled_globals(data) == ["subprocess.Popen", "subprocess.Popen", "collections.OrderedDict"]
    assert refused_global(data) == "subprocess.Popen"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_names_its_globals_as_the_unpickler_resolves_them(protocol):
    value = {"x": [os.system, os.getcwd, collections.OrderedDict, collections.Counter, np.float32]}
    data = pickle.dumps(value, protocol=protocol)
    assert pickled_globals(data) == [SYSTEM, SYSTEM.replace("system", "getcwd"), "collections.OrderedDict",
                                     "collections.Counter", "numpy.float32"]
    assert refused_global(data) == SYSTEM
    assert refused_global(pickle.dumps([collections.Counter, np.float32], protocol=protocol)) is None


def test_pickles_one_after_another_are_all_read_and_trailing_bytes_are_not():
    first, second = pickle.dumps(os.getcwd, protocol=2), pickle.dumps(collections.Counter, protocol=4)
    data = first + second + b"\x00raw storage bytes" + pickle.dumps(os.system)
    assert pickled_globals(data) == [SYSTEM.replace("system", "getcwd"), "collections.Counter"]
    assert refused_global(second + first, allowed_roots=("collections",)) == SYSTEM.replace("system", "getcwd")
    assert refused_global(first, allowed_roots=(SYSTEM.split(".")[0],)) is None


def test_a_pre_protocol_2_instance_names_its_class():
    data = b"(ipolicyport.fake\nModel\n(dS'w'\nI1\nsb."  # INST: how protocol 0 pickled old-style instances
    assert pickled_globals(data) == ["policyport.fake.Model"] and refused_global(data) is None
    assert refused_global(b"(iposix\nsystem\n.") == "posix.system"
