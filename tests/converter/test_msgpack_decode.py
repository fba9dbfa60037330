"""The MessagePack decoder against the format's specification, byte by byte: every type family with the
value it must give (https://github.com/msgpack/msgpack/blob/master/spec.md), msgpack-numpy arrays,
and each malformed input refused with its reason."""

from __future__ import annotations

import numpy as np
import pytest

from policyport.converter.readers.msgpack_decode import load
from policyport.errors import UnreadableFileError

SPEC = [
    ("00", 0), ("7f", 127), ("e0", -32), ("ff", -1),
    ("81 a1 61 01", {"a": 1}), ("80", {}), ("92 01 02", [1, 2]), ("90", []),
    ("a3 61 62 63", "abc"), ("a0", ""), ("bf" + " 7a" * 31, "z" * 31),
    ("c0", None), ("c2", False), ("c3", True),
    ("c4 02 78 79", b"xy"), ("c5 00 02 78 79", b"xy"), ("c6 00 00 00 02 78 79", b"xy"),
    ("c7 02 05 61 62", ("ext", 5, b"ab")), ("c8 00 02 05 61 62", ("ext", 5, b"ab")),
    ("c9 00 00 00 02 05 61 62", ("ext", 5, b"ab")),
    ("ca 3f c0 00 00", 1.5), ("cb 3f f8 00 00 00 00 00 00", 1.5), ("cb c0 00 00 00 00 00 00 00", -2.0),
    ("cc ff", 255), ("cd 01 00", 256), ("ce 00 01 00 00", 65536), ("cf 00 00 00 01 00 00 00 00", 2**32),
    ("d0 80", -128), ("d1 ff 00", -256), ("d2 ff ff 00 00", -65536), ("d3 ff ff ff ff 00 00 00 00", -(2**32)),
    ("d0 7f", 127),
    ("d4 07 aa", ("ext", 7, b"\xaa")), ("d5 07 aa bb", ("ext", 7, b"\xaa\xbb")),
    ("d6 07" + " 01" * 4, ("ext", 7, b"\x01" * 4)), ("d7 07" + " 01" * 8, ("ext", 7, b"\x01" * 8)),
    ("d8 07" + " 01" * 16, ("ext", 7, b"\x01" * 16)),
    ("d9 03 61 62 63", "abc"), ("da 00 03 61 62 63", "abc"), ("db 00 00 00 03 61 62 63", "abc"),
    ("dc 00 02 01 02", [1, 2]), ("dd 00 00 00 02 01 02", [1, 2]),
    ("de 00 01 a1 61 01", {"a": 1}), ("df 00 00 00 01 a1 61 01", {"a": 1}),
    ("81 92 01 02 c3", {(1, 2): True}), ("82 01 a1 61 c4 01 62 c0", {1: "a", b"b": None}),
    ("93 91 91 90 81 a1 6b 92 c2 c3 a0", [[[[]]], {"k": [False, True]}, ""]),
]


@pytest.mark.parametrize("hexed,value", SPEC, ids=[h[:11] for h, _ in SPEC])
def test_every_messagepack_type_decodes_as_the_specification_says(hexed, value):
    decoded = load(bytes.fromhex(hexed))
    assert decoded == value and type(decoded) is type(value)


def test_msgpack_numpy_maps_become_arrays_with_either_key_type():
    data = np.arange(6, dtype="<f4").tobytes()
    with_bytes = (bytes.fromhex("84 c4 02") + b"nd" + b"\xc3" + bytes.fromhex("c4 04") + b"type" + bytes.fromhex("a3") + b"<f4"
                  + bytes.fromhex("c4 05") + b"shape" + bytes.fromhex("92 02 03") + bytes.fromhex("c4 04") + b"data"
                  + bytes.fromhex("c4 18") + data)
    array = load(with_bytes)
    assert array.dtype == np.float32 and array.shape == (2, 3) and array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert array.flags.writeable  # a copy, not a view of the file's bytes
    with_str = (bytes.fromhex("84 a2") + b"nd" + b"\xc3" + bytes.fromhex("a4") + b"type" + bytes.fromhex("c4 03") + b"<i2"
                + bytes.fromhex("a5") + b"shape" + bytes.fromhex("91 02") + bytes.fromhex("a4") + b"data"
                + bytes.fromhex("c4 04") + np.array([7, -1], "<i2").tobytes())
    assert load(with_str).tolist() == [7, -1] and load(with_str).dtype == np.int16
    not_an_array = bytes.fromhex("81 a2") + b"nd" + b"\xc2"
    assert load(not_an_array) == {"nd": False}


def _array_map(type_: bytes, shape: list[int] | bytes, data: bytes) -> bytes:
    """A msgpack-numpy map; ``shape`` a list of small dimensions, or the MessagePack bytes of any value."""
    shape = shape if isinstance(shape, bytes) else bytes([0x90 | len(shape)]) + bytes(shape)
    return (bytes.fromhex("84 a2") + b"nd" + b"\xc3" + bytes.fromhex("a4") + b"type" + bytes([0xA0 | len(type_)]) + type_
            + bytes.fromhex("a5") + b"shape" + shape + bytes.fromhex("a4") + b"data"
            + bytes([0xC4, len(data)]) + data)


@pytest.mark.parametrize("raw,message", [
    (b"", "the MessagePack data is empty: it holds no MessagePack value"),
    (b"\x92\x01", "the MessagePack data is truncated: a MessagePack value runs past the end of the file"),
    (bytes.fromhex("92 01"), "is truncated"),
    (bytes.fromhex("c1"), "the MessagePack data holds byte 0xc1 at offset 0, which starts no MessagePack value"),
    (bytes.fromhex("92 01 c1"), "holds byte 0xc1 at offset 2"),
    (bytes.fromhex("01 02"), "the MessagePack data has 1 bytes after its MessagePack value"),
    (bytes.fromhex("a2 ff fe"), "holds a MessagePack string that is not UTF-8"),
    (bytes.fromhex("81 81 01 01 01"), "holds a MessagePack map key that cannot be a key"),
    (_array_map(b"|O", [1], b"\x00" * 8),
     "the MessagePack data holds an array of dtype object; only numeric arrays are read"),
    (_array_map(b"zz", [1], b"\x00"), "the MessagePack data holds an array of unknown dtype 'zz'"),
    # the dtype written as bin (msgpack-numpy's older writers), named as text
    (_array_map(b"zz", [1], b"\x00").replace(b"\xa2zz", b"\xc4\x02zz"),
     "the MessagePack data holds an array of unknown dtype 'zz'"),
    (_array_map(b"<f4", [2], b"\x00" * 4),
     "the MessagePack data holds an array whose data does not fit its shape (2,) and dtype float32"),
    (_array_map(b"<f4", bytes.fromhex("92 02 a1 61"), b"\x00" * 8),
     "the MessagePack data holds an array whose shape [2, 'a'] is not a list of whole numbers"),
    (_array_map(b"<f4", bytes.fromhex("91 ff"), b""),
     "the MessagePack data holds an array whose shape [-1] is not a list of whole numbers"),
    (_array_map(b"<f4", bytes.fromhex("a2 61 62"), b""),
     "the MessagePack data holds an array whose shape 'ab' is not a list of whole numbers"),
    # 2**32 x 2**32 elements: counted in int64 they wrap around to 0, the length of the empty data
    (_array_map(b"<f4", bytes.fromhex("92 cf 00 00 00 01 00 00 00 00 cf 00 00 00 01 00 00 00 00"), b""),
     "the MessagePack data holds an array whose data does not fit its shape (4294967296, 4294967296) and dtype "
     "float32"),
    (_array_map(b"zz", [1], b"\x00").replace(b"\xa2zz", b"\xc4\x02\xff\xfe"),
     "the MessagePack data holds an array of unknown dtype b'\\xff\\xfe'"),
    (b"\x81" * 202 + b"\x00" * 203, "the MessagePack data nests MessagePack values deeper than 200"),  # through keys
])
def test_malformed_data_is_refused_with_the_reason(raw, message):
    with pytest.raises(UnreadableFileError) as caught:
        load(raw)
    assert message in str(caught.value)


def test_nesting_is_bounded_and_files_are_named(tmp_path):
    for deep in (b"\x91" * 201 + b"\x00", b"\x81\x00" * 201 + b"\x00", b"\x91" * 100_000):
        with pytest.raises(UnreadableFileError, match="nests MessagePack values deeper than 200"):
            load(deep)  # refused before Python's own recursion limit is reached
    assert load(b"\x91" * 200 + b"\x00") is not None and load(b"\x81\x00" * 200 + b"\x00") is not None
    path = tmp_path / "state.msgpack"
    path.write_bytes(bytes.fromhex("c1"))
    with pytest.raises(UnreadableFileError, match=f"^{path} holds byte 0xc1"):
        load(path)
    with pytest.raises(UnreadableFileError, match="^policy state holds byte 0xc1"):
        load(path, what="policy state")
    with pytest.raises(UnreadableFileError, match=f"^cannot read {tmp_path / 'missing'}"):
        load(tmp_path / "missing")


def test_fixmaps_and_fixarrays_of_fifteen_entries_and_arrays_16_and_32_nest_within_the_bound():
    fixmap = bytes([0x8F]) + b"".join(bytes([i, i]) for i in range(15))
    assert load(fixmap) == {i: i for i in range(15)}
    assert load(bytes([0x9F]) + bytes(range(15))) == list(range(15))
    for head in (bytes.fromhex("dc 00 01"), bytes.fromhex("dd 00 00 00 01"), bytes.fromhex("de 00 01 00")):
        assert load(head * 200 + b"\x00") is not None
        with pytest.raises(UnreadableFileError, match="nests MessagePack values deeper than 200"):
            load(head * 201 + b"\x00")
