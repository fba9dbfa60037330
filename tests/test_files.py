"""Reading arrays within limits, telling unreadable inputs apart, and writing outputs together or not at all."""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.graph import onnx_files
from policyport.io import arrays, kinds, outputs
from policyport.io import limits as io_limits
from policyport.cli import app
from policyport.errors import InputMismatchError, LimitExceededError, OutputExistsError, UnreadableFileError
from policyport.io.limits import GIB, KIB, MIB, format_size, limits, parse_size, using_limits
from policyport.io.arrays import load_arrays

runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


# ------------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize("text,size", [("1000000", 10**6), ("1e9", 10**9), ("512K", 512 * KIB), ("4G", 4 * GIB),
                                       ("1.5GiB", 3 * GIB // 2), ("4GB", 4 * 10**9), ("2m", 2 * MIB), ("10 B", 10)])
def test_sizes_parse_binary_units_and_decimal_ones_when_spelt_so(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "lots", "4X", "1e999"])
def test_what_is_not_a_size_is_refused(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_sizes_print_for_people():
    assert [format_size(n) for n in (72, 1536, 2 * GIB, 4 * 10**12, 32 * 10**15)] == \
        ["72 B", "1.5 KiB", "2 GiB", "3.64 TiB", "29,104 TiB"]


def test_limits_come_from_using_limits_then_the_environment_then_the_defaults(monkeypatch):
    monkeypatch.delenv(io_limits.ENV_ARRAY_BYTES, raising=False)
    assert limits().array_bytes == GIB and limits().nodes == 200_000 and limits().memory_bytes is None
    monkeypatch.setenv(io_limits.ENV_ARRAY_BYTES, "2G")
    assert limits().array_bytes == 2 * GIB
    with using_limits(array_bytes=MIB, nodes=7):
        assert (limits().array_bytes, limits().nodes) == (MIB, 7)
    assert limits().array_bytes == 2 * GIB
    monkeypatch.setenv(io_limits.ENV_NODES, "many")
    with pytest.raises(InputMismatchError, match="POLICYPORT_MAX_NODES='many'"):
        limits()


# ------------------------------------------------------------------------------------------- arrays


def test_arrays_round_trip_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"obs": rng.standard_normal((5, 3)).astype(np.float32), "a/b": np.arange(4, dtype=np.int64),
              "flag": np.array([True, False]), "f64": np.array(np.pi)}
    np.savez(tmp_path / "x.npz", **arrays)
    np.save(tmp_path / "x.npy", arrays["obs"])
    loaded = load_arrays(tmp_path / "x.npz")
    assert list(loaded) == list(arrays)
    for k, v in arrays.items():
        assert loaded[k].dtype == v.dtype and loaded[k].tobytes() == v.tobytes()
    assert load_arrays(tmp_path / "x.npy")[""].tobytes() == arrays["obs"].tobytes()


def test_raw_two_byte_elements_as_numpy_stores_bfloat16_are_read(tmp_path):
    np.save(tmp_path / "b.npy", np.arange(6, dtype=np.uint16).view("V2"))
    assert load_arrays(tmp_path / "b.npy")[""].dtype == np.dtype("V2")


def test_a_file_above_the_limit_is_refused_naming_its_size_and_the_way_to_raise_it(tmp_path):
    np.save(tmp_path / "obs.npy", np.zeros((1000, 275), np.float32))  # 1.05 MiB of data
    with using_limits(array_bytes=MIB):
        with pytest.raises(LimitExceededError) as e:
            load_arrays(tmp_path / "obs.npy")
    assert "(float32, shape (1000, 275)) would take 1.05 MiB (1,100,000 bytes), above the limit of 1 MiB" in str(e.value)
    assert "--max-bytes 2M (or POLICYPORT_MAX_ARRAY_BYTES=2M)" in str(e.value)
    assert isinstance(e.value, MemoryError) and isinstance(e.value, pp.BadModelError)
    assert load_arrays(tmp_path / "obs.npy", max_bytes=2 * MIB)[""].shape == (1000, 275)


def test_an_npz_is_refused_from_its_members_sizes_before_any_is_decompressed(tmp_path, monkeypatch):
    np.savez_compressed(tmp_path / "z.npz", a=np.zeros(300_000, np.float32), b=np.zeros(300_000, np.float32))
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: opened.append(a) or 1 / 0)
    with pytest.raises(LimitExceededError, match=r"the arrays of .*z\.npz would take 2.29 MiB"):
        load_arrays(tmp_path / "z.npz", max_bytes=2 * MIB)
    assert opened == []


def test_read_npz_reads_an_archive_held_in_memory(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, w=np.eye(3, dtype=np.float32))
    buf.seek(0)
    assert arrays.read_npz(buf, "weights.npz")["w"].tolist() == np.eye(3).tolist()
    buf.seek(0)
    with pytest.raises(LimitExceededError, match="weights.npz"):
        arrays.read_npz(buf, "weights.npz", max_bytes=16)


def _npz(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@pytest.mark.parametrize("members,message", [
    ({"a.npy": _npy(np.zeros(2)), "notes.txt": b"hi"}, "holds 'notes.txt', which is not an .npy array"),
    ({"a.npy": _npy(np.zeros(2))[:-3]}, "array 'a' is truncated or damaged"),
    ({"a.npy": b"\x93NUMPY\x01\x00\x10\x00{'descr': <f4}  \n"}, "array 'a' has a damaged .npy header"),
])
def test_damaged_npz_members_are_refused_for_what_they_are(tmp_path, members, message):
    with pytest.raises(UnreadableFileError, match=message):
        load_arrays(_npz(tmp_path / "x.npz", members))


def test_an_npz_naming_one_array_twice_is_refused(tmp_path):
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.npy", _npy(np.zeros(2)))
        with pytest.warns(UserWarning):  # zipfile warns about the duplicate name it writes
            zf.writestr("a.npy", _npy(np.ones(2)))
    with pytest.raises(UnreadableFileError, match="holds two arrays named 'a'"):
        load_arrays(path)


def test_each_kind_of_unreadable_input_is_told_for_what_it_is(tmp_path):
    import pickle

    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "obs.csv").write_text("1,2,3\n4,5,6\n")
    (tmp_path / "notes.txt").write_text("observations for run 3\n")
    (tmp_path / "obs.pkl").write_bytes(pickle.dumps([1.0, 2.0], protocol=4))
    (tmp_path / "obs.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(32))
    os.mkfifo(tmp_path / "pipe.npy")
    expected = {
        "/dev/null": "/dev/null is a character device, not a file",
        tmp_path: "is a folder, not a file",
        tmp_path / "pipe.npy": "pipe.npy is a FIFO (named pipe), not a file",
        tmp_path / "missing.npy": "missing.npy: no such file",
        tmp_path / "empty.npy": "empty.npy is empty (0 bytes)",
        tmp_path / "obs.csv": "obs.csv is a text file of comma-separated values (CSV), not an .npy or .npz file; "
                              f"convert it first, e.g. with numpy.save('{tmp_path}/obs.npy', numpy.loadtxt("
                              f"'{tmp_path}/obs.csv', delimiter=',', dtype=numpy.float32, ndmin=2))",
        tmp_path / "notes.txt": "notes.txt is a text file, not an .npy or .npz file",
        tmp_path / "obs.pkl": "obs.pkl is a Python pickle, which can only be loaded by running code from it",
        tmp_path / "obs.h5": "obs.h5 is an HDF5 file, not an .npy or .npz file",
    }
    for path, message in expected.items():
        with pytest.raises(UnreadableFileError) as e:
            load_arrays(path)
        assert message in str(e.value), str(e.value)
    assert "unpickling" not in str(pytest.raises(UnreadableFileError, load_arrays, tmp_path / "obs.csv").value)


def test_max_bytes_and_its_environment_variable_on_the_command_line(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Tanh", ["obs"], ["y"])], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx_files.save_onnx(tmp_path / "m.onnx", model)
    np.save(tmp_path / "obs.npy", np.zeros((512, 4), np.float32))  # 8 KiB
    base = ["run", tmp_path / "m.onnx", "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz"]
    refused = invoke(*base, "--max-bytes", "4K")
    assert refused.exit_code == 3 and "above the limit of 4 KiB" in refused.stderr
    refused = invoke("--max-bytes=4K", *base, env={io_limits.ENV_ARRAY_BYTES: "1G"})  # the option wins
    assert refused.exit_code == 3 and "above the limit of 4 KiB" in refused.stderr
    assert invoke(*base, env={io_limits.ENV_ARRAY_BYTES: "4K"}).exit_code == 3
    assert invoke(*base, "--max-bytes", "8K").exit_code == 0 and (tmp_path / "y.npz").is_file()
    bad = invoke(*base, "--max-bytes", "lots", "--json")
    assert bad.exit_code == 2 and "'lots' is not a size" in json.loads(bad.stdout)["error"]
    bad = invoke(*base, env={io_limits.ENV_ARRAY_BYTES: "lots"})
    assert bad.exit_code == 2 and "POLICYPORT_MAX_ARRAY_BYTES='lots'" in bad.stderr


# ------------------------------------------------------------------------------------------ outputs


def _writes(data: bytes):
    return lambda f: f.write(data)


def _fails(f):
    f.write(b"half")
    raise OSError(28, "No space left on device")


def test_outputs_are_written_together(tmp_path):
    paths = outputs.write_outputs({tmp_path / "a.bin": _writes(b"A"), tmp_path / "b.bin": _writes(b"B")})
    assert [p.read_bytes() for p in paths] == [b"A", b"B"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.bin"]


def test_a_failing_writer_leaves_no_output_and_no_temporary_file(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"old")
    with pytest.raises(UnreadableFileError, match="No space left on device; nothing was written"):
        outputs.write_outputs({tmp_path / "a.bin": _writes(b"A"), tmp_path / "b.bin": _fails}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"] and (tmp_path / "a.bin").read_bytes() == b"old"


def test_where_folders_have_no_descriptors_outputs_are_still_written_all_or_none(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "_AT_FOLDER", False)  # as on Windows
    (tmp_path / "a.bin").write_bytes(b"old")
    with pytest.raises(UnreadableFileError):
        outputs.write_outputs({tmp_path / "a.bin": _writes(b"A"), tmp_path / "b.bin": _fails}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"] and (tmp_path / "a.bin").read_bytes() == b"old"
    outputs.write_outputs({tmp_path / "a.bin": _writes(b"A"), tmp_path / "b.bin": _writes(b"B")}, force=True)
    assert [(tmp_path / n).read_bytes() for n in ("a.bin", "b.bin")] == [b"A", b"B"] and len(list(tmp_path.iterdir())) == 2


def test_a_failed_rename_puts_back_the_outputs_already_in_place(tmp_path, monkeypatch):
    (tmp_path / "a.bin").write_bytes(b"old A")
    real, calls = os.replace, []

    def second_fails(src, dst, **kw):
        calls.append(dst)
        if dst == "b.bin":
            raise OSError(5, "Input/output error")
        return real(src, dst, **kw)

    monkeypatch.setattr(outputs.os, "replace", second_fails)
    with pytest.raises(UnreadableFileError, match="Input/output error"):
        outputs.write_outputs({tmp_path / "a.bin": _writes(b"new A"), tmp_path / "b.bin": _writes(b"B")}, force=True)
    monkeypatch.setattr(outputs.os, "replace", real)
    assert (tmp_path / "a.bin").read_bytes() == b"old A"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_a_replaced_file_keeps_its_mode_and_a_new_one_gets_the_umask(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"old")
    os.chmod(tmp_path / "a.bin", 0o640)
    outputs.write_atomic(tmp_path / "a.bin", _writes(b"new"), force=True)
    outputs.write_atomic(tmp_path / "b.bin", _writes(b"new"))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o666 & ~umask


def test_an_output_that_appears_while_writing_is_not_replaced(tmp_path):
    def rival(f):
        f.write(b"ours")
        (tmp_path / "a.bin").write_bytes(b"theirs")

    with pytest.raises(OutputExistsError, match="appeared while writing"):
        outputs.write_atomic(tmp_path / "a.bin", rival)
    assert (tmp_path / "a.bin").read_bytes() == b"theirs" and len(list(tmp_path.iterdir())) == 1


def test_swapping_the_output_folder_for_a_symlink_cannot_redirect_the_output(tmp_path):
    """The folder is opened once: the file lands in the folder that was opened (now moved aside),
    nothing lands in the symlink's target, and no temporary file is left anywhere."""
    folder, moved, elsewhere = tmp_path / "out", tmp_path / "moved", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()

    def swap_then_write(f):
        folder.rename(moved)
        folder.symlink_to(elsewhere)
        f.write(b"data")

    outputs.write_outputs({folder / "a.npz": swap_then_write, folder / "b.npz": _writes(b"more")})
    assert sorted(p.name for p in moved.iterdir()) == ["a.npz", "b.npz"]
    assert list(elsewhere.iterdir()) == []


def test_a_folder_swapped_back_and_forth_while_writing_never_gets_stray_files(tmp_path):
    import threading

    folder, other = tmp_path / "out", tmp_path / "other"
    folder.mkdir()
    other.mkdir()
    stop = threading.Event()

    def swapper():  # replaces the folder by a symlink to another one and back, as fast as it can
        while not stop.is_set():
            try:
                folder.rename(tmp_path / "real")
                folder.symlink_to(other)
                folder.unlink()
                (tmp_path / "real").rename(folder)
            except OSError:
                pass

    thread = threading.Thread(target=swapper)
    thread.start()
    written = 0
    try:
        for i in range(200):
            try:
                outputs.write_atomic(folder / f"f{i}.bin", _writes(b"x"))
                written += 1
            except (UnreadableFileError, OutputExistsError):
                pass
    finally:
        stop.set()
        thread.join()
    if folder.is_symlink():
        folder.unlink()
    if not folder.exists():
        (tmp_path / "real").rename(folder)
    found = [p for d in (folder, other) for p in d.iterdir()]
    assert [p.name for p in found if p.name.startswith(".")] == []  # no temporary file anywhere
    assert len(found) == written and all(p.read_bytes() == b"x" for p in found)  # each write whole, once


# -------------------------------------------------------------------------------- run: -o and --record


@pytest.fixture
def tiny(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Tanh", ["obs"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx_files.save_onnx(tmp_path / "m.onnx", model)
    np.save(tmp_path / "obs.npy", np.ones((3, 4), np.float32))
    return tmp_path / "m.onnx", tmp_path / "obs.npy"


def test_an_existing_record_file_is_refused_before_the_outputs_are_written(tiny, tmp_path):
    model, obs = tiny
    (tmp_path / "acts.npz").write_bytes(b"keep")
    result = invoke("run", model, "-i", obs, "-o", tmp_path / "y.npz", "--record", tmp_path / "acts.npz")
    assert result.exit_code == 3 and "acts.npz exists" in result.stderr
    assert not (tmp_path / "y.npz").exists() and (tmp_path / "acts.npz").read_bytes() == b"keep"


def test_when_the_recording_cannot_be_written_the_outputs_are_not_written_either(tiny, tmp_path, monkeypatch):
    model, obs = tiny
    real = arrays.write_npz

    def fails_on_the_recording(file, arrays, *rest):
        if "h" in arrays:
            raise OSError(28, "No space left on device")
        real(file, arrays, *rest)

    monkeypatch.setattr(arrays, "write_npz", fails_on_the_recording)
    result = invoke("run", model, "-i", obs, "-o", tmp_path / "y.npz", "--record", tmp_path / "acts.npz")
    assert result.exit_code == 3 and "nothing was written" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "obs.npy"]


# ----------------------------------------------------------------------------------- memory estimates


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_tensor_sizes_are_exact_for_tensors_that_grow_with_the_batch(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    recorded = session.record(metadrive_obs)
    sizes = session.tensor_sizes(metadrive_obs)
    assert sizes.rows == 1000 and sizes.nbytes(1000) == {k: v.nbytes for k, v in recorded.items()}
    assert sizes.elements(1000) == {k: v.size for k, v in recorded.items()} and sizes.input_elements(1000) == 275_000
    assert session.tensor_sizes(metadrive_obs[:2]) is None  # too few rows to tell


def test_drawing_more_observations_than_memory_allows_is_refused_up_front(metadrive_model, monkeypatch):
    from policyport.verification.verify import sample_inputs

    monkeypatch.setenv(io_limits.ENV_MEMORY, "100M")
    inputs = pp.load(metadrive_model).inputs
    with pytest.raises(LimitExceededError, match=r"drawing 100,000 observations for 1 input\(s\) needs about 315 MiB, "
                                                 r"more than 100 MiB \(the limit POLICYPORT_MAX_MEMORY sets\)"):
        sample_inputs(inputs, 100_000)
    assert sample_inputs(inputs, 1000)["obs"].shape == (1000, 275)


@pytest.mark.parametrize("values, error, message", [
    ({"nodes": "x"}, pp.ArgumentTypeError, r"the limit nodes must be a whole number, not str 'x'"),
    ({"array_bytes": -1}, pp.InputMismatchError, r"the limit array_bytes must be a finite number >= 0, got -1"),
    ({"npz_arrays": 2.5}, pp.ArgumentTypeError, r"the limit npz_arrays must be a whole number, not float"),
    ({"colour": 1}, pp.ArgumentTypeError, r"unknown limit\(s\) \['colour'\]"),
])
def test_using_limits_checks_its_values(values, error, message):
    with pytest.raises(error, match=message):
        with using_limits(**values):
            pass


# ------------------------------------------------------------------------------------ what a file is


def _zip(path, *members):
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name in members:
            zf.writestr(name, b"x")
    return path


@pytest.mark.parametrize("make, what, source", [
    (lambda p: _zip(p, "data", "policy.pth", "pytorch_variables.pth"), "a Stable-Baselines3 save", "sb3"),
    (lambda p: _zip(p, "m/data.pkl", "m/constants.pkl", "m/code/m.py"), "a TorchScript file", "torchscript"),
    (lambda p: _zip(p, "archive/data.pkl", "archive/data/0"), "a PyTorch file (torch.save)", "state-dict"),
    (lambda p: _zip(p, "config.json", "metadata.json", "model.weights.h5"), "a Keras file (.keras)", "keras"),
    (lambda p: _zip(p, "a.npy", "b.npy"), "an .npz archive of arrays", "npz"),
    (lambda p: _zip(p, "readme.txt"), "a zip archive", None),
    (lambda p: p.write_bytes(b"PK\x03\x04" + b"\0" * 40), "a damaged zip archive", None),
    (lambda p: p.write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03."),
     "a PyTorch file (torch.save's legacy format)", "state-dict"),
    (lambda p: p.write_bytes(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01."), "a Python pickle", None),
    (lambda p: p.write_bytes((16).to_bytes(8, "little") + b'{"__metadata__":{}}'), "a safetensors file", "state-dict"),
    (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 40), "an HDF5 file (as Keras saves .h5 models)", "keras"),
    (lambda p: p.write_bytes(b"\x1f\x8b\x08\x00" + b"\0" * 20), "a gzip file", None),
    (lambda p: p.write_bytes(b"PAR1" + b"\0" * 20), "a Parquet file", None),
    (lambda p: np.save(p, np.zeros(3)), "a NumPy array (.npy)", None),
    (lambda p: p.write_text("obs_0,obs_1\n1,2\n"), "a text file", None),
])
def test_file_kind_tells_a_file_from_its_first_bytes_or_its_members(tmp_path, make, what, source):
    path = tmp_path / "f"
    make(path)
    path = path if path.exists() else path.with_suffix(".npy")  # numpy.save adds .npy
    assert kinds.file_kind(path) == kinds.FileKind(what, source, runs_code=source == "torchscript")


def test_file_kind_tells_nothing_of_an_onnx_model_a_missing_file_or_a_plain_folder(tmp_path, metadrive_model):
    import onnx

    onnx.save(metadrive_model, tmp_path / "m.onnx")
    (tmp_path / "plain").mkdir()
    assert [kinds.file_kind(tmp_path / n) for n in ("m.onnx", "missing", "plain")] == [None, None, None]
    (tmp_path / "plain" / "saved_model.pb").write_bytes(b"")
    assert kinds.file_kind(tmp_path / "plain") == kinds.FileKind("a TensorFlow SavedModel folder", "savedmodel",
                                                                  runs_code=True)


# ----------------------------------------------------------------------- compressed data, sized first


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def test_a_zlib_npy_round_trips_in_its_stored_order_and_byte_order():
    import zlib

    for array in (np.arange(12, dtype=">i4").reshape(3, 4), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
                  np.zeros((0, 3)), np.array(3.5), np.array(["ab", "c"]), np.ones(3, bool)):
        got = arrays.read_npy_zlib(zlib.compress(_npy(array)), "x")
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
        assert (got.flags.c_contiguous, got.flags.f_contiguous) == (array.flags.c_contiguous, array.flags.f_contiguous)
        with pytest.raises(UnreadableFileError, match=r"^x (is truncated or damaged|has a damaged \.npy header)"):
            arrays.read_npy_zlib(zlib.compress(_npy(array)[:-1]), "x")
    with pytest.raises(UnreadableFileError, match=r"^x is not a zlib-compressed \.npy file"):
        arrays.read_npy_zlib(b"not zlib", "x")
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(UnreadableFileError, match=r"^x is an object array"):
        arrays.read_npy_zlib(zlib.compress(buf.getvalue()), "x")


def test_a_zlib_npy_is_refused_by_its_header_and_inflates_no_further_than_its_data():
    import tracemalloc
    import zlib

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    with pytest.raises(LimitExceededError, match=r"^x \(float64, shape \(1000000000,\)\) would take 7\.45 GiB"):
        arrays.read_npy_zlib(zlib.compress(header.getvalue() + bytes(64)), "x")
    with using_limits(array_bytes=31), pytest.raises(LimitExceededError, match=r"above the limit of 31 B"):
        arrays.read_npy_zlib(zlib.compress(_npy(np.zeros(4))), "x")
    # four float64 and then 1 GiB of zeros in the same stream (1 MB of it, fully flushed identical blocks)
    deflate = zlib.compressobj()
    chunk = 1 << 20
    stream = deflate.compress(_npy(np.arange(4.0))) + deflate.flush(zlib.Z_FULL_FLUSH)
    stream += (deflate.compress(bytes(chunk)) + deflate.flush(zlib.Z_FULL_FLUSH)) * 1024
    tracemalloc.start()
    try:
        got = arrays.read_npy_zlib(stream, "x")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert peak < 4 * MIB, peak  # the stream itself is 1 MB; inflated whole it would be 1 GiB


def test_a_zip_member_is_refused_by_the_size_the_archive_declares_before_it_is_read(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data", b"{}" + b" " * 3000)
        zf.writestr("small", b"ok")
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert arrays.read_zip_member(zf, "small", "a.zip") == b"ok"
        with using_limits(array_bytes=3000):
            with pytest.raises(LimitExceededError, match=r"^a\.zip: its member data would take 2\.93 KiB \(3,002 bytes\), "
                                                         r"above the limit of 2\.93 KiB for data read from a file"):
                arrays.read_zip_member(zf, "data", "a.zip")
            with pytest.raises(LimitExceededError, match=r"^the members of a\.zip would take 2\.93 KiB \(3,004 bytes\)"):
                arrays.check_zip_members(zf, "a.zip")
        arrays.check_zip_members(zf, "a.zip")
        with pytest.raises(UnreadableFileError, match=r"^a\.zip lacks the member nothing$"):
            arrays.read_zip_member(zf, "nothing", "a.zip")
