"""A damaged zip archive — an SB3 save, a torch file, a ``.keras`` file, an ``.npz`` — ends in exit 3
naming the file, whatever ``zipfile`` raises: a bad CRC or corrupt deflate data in a member, a member
name flagged UTF-8 that is not, a zip version it cannot extract (``NotImplementedError``)."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policyport.cli import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def damaged(data: bytes, how: str, member: str | None = None) -> bytes:
    """``data`` (a zip archive) with one thing broken: ``"crc"`` a byte in the middle of ``member``'s
    data, ``"deflate"`` its first block's header (a reserved block type); ``"name"`` the first central-directory name flagged UTF-8 and starting with byte 0xff;
    ``"version"`` the first member needing zip version 25.5 to extract."""
    if how == "deflate":  # the members compressed, as SB3 saves them (the fixtures hold them stored)
        with zipfile.ZipFile(io.BytesIO(data)) as zin:
            packed = io.BytesIO()
            with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zout:
                for info in zin.infolist():
                    zout.writestr(info.filename, zin.read(info))
        data = packed.getvalue()
    out = bytearray(data)
    if how in ("crc", "deflate"):
        info = zipfile.ZipFile(io.BytesIO(data)).getinfo(member)
        name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
        start = info.header_offset + 30 + name_length + extra_length
        if how == "crc":
            out[start + info.compress_size // 2] ^= 0xFF
        else:  # BFINAL 1, BTYPE 11: the block type deflate reserves
            out[start] = 0b111
        return bytes(out)
    end = data.rfind(b"PK\x05\x06")
    directory = struct.unpack("<I", data[end + 16: end + 20])[0]
    if how == "name":
        flags = struct.unpack("<H", data[directory + 8: directory + 10])[0] | 0x800
        out[directory + 8: directory + 10] = struct.pack("<H", flags)
        out[directory + 46] = 0xFF
    else:
        out[directory + 6: directory + 8] = struct.pack("<H", 255)
    return bytes(out)


NAME = "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"
CASES = [  # (fixture, extra convert options, damage, member, message after the path)
    ("sb3/ppo_pendulum.zip", [], "deflate", "data", "is not a readable zip archive: Error -3 while decompressing data: "
                                                    "invalid block type"),
    ("sb3/ppo_pendulum.zip", [], "name", None, f"is not a readable zip archive: {NAME}"),
    ("sb3/ppo_pendulum.zip", [], "version", None, "is not a readable zip archive: zip file version 25.5"),
    ("torch/gaussian.state_dict.pt", ["--activation", "tanh"], "name", None,
     f"is not a readable torch file (a damaged or truncated zip archive: {NAME})"),
    ("torch/gaussian.state_dict.pt", ["--activation", "tanh"], "version", None,
     "is not a readable torch file (a damaged or truncated zip archive: zip file version 25.5)"),
    ("torch/gaussian.torchscript.pt", [], "name", None,
     f"is not a readable torch file (a damaged or truncated zip archive: {NAME})"),
    ("torch/gaussian.torchscript.pt", [], "version", None,
     "is not a readable torch file (a damaged or truncated zip archive: zip file version 25.5)"),
    ("keras/mlp_norm.keras", [], "crc", "config.json",
     "is not a readable .keras archive (a damaged or truncated zip file: Bad CRC-32 for file 'config.json')"),
    ("keras/mlp_norm.keras", [], "crc", "model.weights.h5",
     "is not a readable Keras model: BadZipFile: Bad CRC-32 for file 'model.weights.h5'"),
    ("keras/mlp_norm.keras", [], "version", None,
     "is not a readable .keras archive (a damaged or truncated zip file: zip file version 25.5)"),
    ("real/metadrive_ppo_expert.npz", ["--activation", "tanh"], "version", None,
     "is a damaged .npz file: zip file version 25.5"),
]


@pytest.mark.slow
@pytest.mark.parametrize("fixture, options, how, member, message", CASES)
def test_a_damaged_archive_is_unreadable_in_convert_and_inspect(tmp_path, fixture, options, how, member, message):
    path = tmp_path / Path(fixture).name
    path.write_bytes(damaged((FIXTURES / fixture).read_bytes(), how, member))
    for args in (["convert", path, "-o", tmp_path / "m.onnx", *options], ["inspect", path]):
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 3, result.output
        assert " ".join(result.stderr.split()) == f"error: {path} {message}"
    assert not (tmp_path / "m.onnx").exists()


def test_a_torch_file_whose_pickle_fails_its_crc_names_no_global(tmp_path):
    """torch's reader does not check CRCs, policyport's search for the global torch refused does:
    a damaged data.pkl there means no global to name, not an error of its own."""
    from policyport.converter.readers.torch_files import _refused_global

    data = (FIXTURES / "torch" / "gaussian.state_dict.pt").read_bytes()
    path = tmp_path / "damaged.pt"
    path.write_bytes(damaged(data, "crc", "gaussian.state_dict/data.pkl"))
    assert _refused_global(str(path)) is None
