"""Streaming a dataset's activations to disk: same values as a whole-batch record, bounded memory,
all or nothing."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.analysis import engines, open_recording, record_dataset
from policyport.analysis.recording import WRITERS

TENSORS = ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]


FORMATS = ["npz", "parquet", "npy"]


def output(tmp_path, fmt: str, stem: str = "rec"):
    """The output path of a recording in ``fmt``: a file with the format's suffix, or for ``npy``
    a folder named without one."""
    return tmp_path / (stem if fmt == "npy" else f"{stem}.{fmt}")


def size(path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_a_recording_holds_every_tensor_of_every_row(tmp_path, metadrive_onnx, metadrive_model, dataset, fmt, backend):
    path, obs = dataset
    out = output(tmp_path, fmt)
    summary = record_dataset(metadrive_onnx, path, out, batch_size=700, backend=backend)
    assert summary.rows == 3000 and [t.name for t in summary.tensors] == TENSORS and summary.skipped == []
    assert summary.format == fmt and summary.bytes == size(out) and sorted(os.listdir(tmp_path)) == [out.name]
    rec = open_recording(out)
    assert rec.rows == 3000
    assert [(t.name, t.op_type, t.dtype, t.shape) for t in rec.tensors] == [
        ("fc_1/linear", "Gemm", "float32", (256,)), ("fc_1/tanh", "Tanh", "float32", (256,)),
        ("fc_2/linear", "Gemm", "float32", (256,)), ("fc_2/tanh", "Tanh", "float32", (256,)),
        ("logits", "Gemm", "float32", (4,)), ("action", "Slice", "float32", (2,)), ("log_std", "Slice", "float32", (2,))]
    assert rec.metadata["format"] == "policyport.recording/1" and rec.metadata["backend"] == backend
    expected = pp.load(metadrive_model, backend=backend).record(obs)
    got = rec.head(3000)
    for name in TENSORS:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=0, err_msg=name)
    if fmt == "npz":  # plain numpy reads it too
        with np.load(out) as f:
            np.testing.assert_array_equal(f["fc_2/tanh"], got["fc_2/tanh"])
    if fmt == "npy":  # and maps each tensor of a folder without reading it
        files = rec.metadata["files"]
        assert sorted(os.listdir(out)) == sorted([*files.values(), "policyport.recording.json"])
        assert files["fc_2/tanh"] == "0003-fc_2.tanh.npy"
        mapped = np.load(out / files["fc_2/tanh"], mmap_mode="r")
        assert isinstance(mapped, np.memmap) and mapped.shape == (3000, 256)
        np.testing.assert_array_equal(mapped, got["fc_2/tanh"])


def test_tensor_globs_and_overrides_are_recorded_as_asked(tmp_path, metadrive_onnx, metadrive_model, dataset):
    path, obs = dataset
    out = tmp_path / "rec.parquet"
    record_dataset(metadrive_onnx, path, out, tensors="fc_2/*", batch_size=1024, overrides="fc_2/tanh[17]=1.0")
    rec = open_recording(out)
    assert [t.name for t in rec.tensors] == ["fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
    assert rec.metadata["overrides"] == ["fc_2/tanh[17]=1"]
    got = rec.head(3000)
    np.testing.assert_array_equal(got["fc_2/tanh"][:, 17], 1.0)
    expected = pp.load(metadrive_model).record(obs, "fc_2/*", overrides={"fc_2/tanh": {17: 1.0}})
    np.testing.assert_allclose(got["action"], expected["action"], atol=1e-5, rtol=0)


class Accounting:
    """Counts blocks read from the dataset and blocks handed to the writer, and the most in flight
    (the first row, read alone to tell which tensors have a row per observation, is not a block)."""

    def __init__(self, monkeypatch, fmt):
        self.read = self.written = self.most = 0
        table_iter = engines.open_table
        writer_cls = WRITERS[fmt]
        acc = self

        def open_table(path):
            table = table_iter(path)
            inner = table.iter_batches

            def iter_batches(batch_size, *args, **kwargs):
                if batch_size == 1:
                    yield from inner(batch_size, *args, **kwargs)
                    return
                for block in inner(batch_size, *args, **kwargs):
                    acc.read += 1
                    acc.most = max(acc.most, acc.read - acc.written)
                    yield block

            table.iter_batches = iter_batches
            return table

        class Counted(writer_cls):
            def append(self, block):
                super().append(block)
                acc.written += 1

        monkeypatch.setattr(engines, "open_table", open_table)
        monkeypatch.setitem(WRITERS, fmt, Counted)


@pytest.mark.parametrize("fmt", FORMATS)
def test_memory_is_bounded_by_the_block_not_the_dataset(tmp_path, metadrive_onnx, fmt, monkeypatch):
    """Chunk accounting: at most 5 blocks are alive (being read, read ahead, being computed, queued,
    being written), and the peak of traced allocations does not grow with the number of blocks. Both
    runs are long enough to fill the pipeline (a run of 4 blocks may never have 5 alive at once, and then
    peaks lower than a long run by the thread timing alone)."""
    rng = np.random.default_rng(5)
    batch = 256
    peaks = {}
    for blocks in (8, 24):
        data = tmp_path / f"obs{blocks}.npy"
        np.save(data, rng.uniform(0, 1, (batch * blocks, 275)).astype(np.float32))
        acc = Accounting(monkeypatch, fmt)
        tracemalloc.start()
        try:
            record_dataset(metadrive_onnx, data, output(tmp_path, fmt, f"rec{blocks}"), batch_size=batch)
            peaks[blocks] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert acc.read == acc.written == blocks
        assert acc.most <= 5, f"{acc.most} blocks in flight"
        monkeypatch.undo()
    block_bytes = batch * (4 * 256 + 4 + 2 + 2) * 4 + batch * 275 * 4  # one block of activations + observations
    dataset_bytes = 24 * block_bytes
    assert peaks[24] < peaks[8] + block_bytes, peaks  # no growth with the dataset
    assert peaks[24] < dataset_bytes / 2, (peaks, dataset_bytes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_interrupted_recording_leaves_nothing(tmp_path, metadrive_onnx, dataset, fmt):
    path, _ = dataset
    out = output(tmp_path, fmt)
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record_dataset(metadrive_onnx, path, out, batch_size=500, progress=interrupt)
    assert calls == [500, 1000] and os.listdir(tmp_path) == []


def test_data_that_does_not_fit_the_model_writes_nothing(tmp_path, metadrive_onnx):
    folder = tmp_path / "data"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((300, 275), np.float32))
    np.save(folder / "b.npy", np.zeros((300, 274), np.float32))
    with pytest.raises(pp.UnreadableFileError, match="does not match"):
        record_dataset(metadrive_onnx, folder, tmp_path / "rec.npz")
    np.save(folder / "b.npy", np.zeros((300, 275), np.float64))
    with pytest.raises(pp.UnreadableFileError, match="does not match"):
        record_dataset(metadrive_onnx, folder, tmp_path / "rec.npz")
    (folder / "b.npy").unlink()
    np.save(folder / "a.npy", np.zeros((300, 275), np.float64))
    with pytest.raises(pp.InputMismatchError, match="expects dtype float32, got float64"):
        record_dataset(metadrive_onnx, folder, tmp_path / "rec.npz")
    assert sorted(os.listdir(tmp_path)) == ["data"]


def test_an_existing_output_needs_force_and_the_format_must_be_known(tmp_path, metadrive_onnx, dataset):
    path, _ = dataset
    out = tmp_path / "rec.npz"
    out.write_bytes(b"precious")
    with pytest.raises(pp.OutputExistsError, match="--force"):
        record_dataset(metadrive_onnx, path, out)
    assert out.read_bytes() == b"precious"
    record_dataset(metadrive_onnx, path, out, force=True, tensors="logits")
    assert open_recording(out).rows == 3000
    with pytest.raises(pp.OptionError, match="cannot tell the recording format from -o"):
        record_dataset(metadrive_onnx, path, tmp_path / "rec.bin")
    with pytest.raises(pp.OptionError, match=r"ends in .npz but --format \(format=\) asks for parquet"):
        record_dataset(metadrive_onnx, path, tmp_path / "x.npz", format="parquet")
    with pytest.raises(pp.OutputExistsError, match="also an input"):
        record_dataset(metadrive_onnx, path, path, format="npz", force=True)


def test_tensors_without_a_batch_axis_are_left_out_and_said(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["B"], ["bias"]), helper.make_node("Add", ["obs", "bias"], ["y"])],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.array([1, 2, 3], np.float32), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    np.save(tmp_path / "obs.npy", np.ones((10, 3), np.float32))
    summary = record_dataset(model, tmp_path / "obs.npy", tmp_path / "rec.npz", batch_size=4)
    assert [t.name for t in summary.tensors] == ["y"] and summary.skipped == ["bias"]
    np.testing.assert_array_equal(open_recording(tmp_path / "rec.npz").head(10)["y"], np.tile([2, 3, 4], (10, 1)))


def _bias_model(obs_shape):
    """``y = obs + bias``: ``bias`` a constant of 3 values computed by a node, ``obs`` of ``obs_shape``."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["B"], ["bias"]), helper.make_node("Add", ["obs", "bias"], ["y"])],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, obs_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 2, 3], np.float32), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_run_record_is_described_so_that_a_constant_as_long_as_the_rows_is_left_out(tmp_path):
    import json

    from policyport.analysis.recording import described_run
    from policyport.analysis.tables import META_KEY
    from policyport.io.arrays import save_npz

    session = pp.load(_bias_model(["batch", 3]))
    feeds = {"obs": np.arange(9, dtype=np.float32).reshape(3, 3)}
    values = session.record(feeds)
    written = described_run(session, feeds, values, "*", None, model="m.onnx", overrides=[])
    assert list(written) == ["bias", "y", META_KEY] and written["bias"].shape == (3,)
    assert json.loads(str(written[META_KEY])) == {
        "format": "policyport.recording/1", "rows": 3, "model": "m.onnx", "overrides": [],
        "tensors": [{"name": "y", "op_type": "Add", "dtype": "float32", "shape": [3]}]}
    save_npz(tmp_path / "rec.npz", written)
    rec = open_recording(tmp_path / "rec.npz")
    assert [t.name for t in rec.tensors] == ["y"] and rec.left_out == {"bias": (3,)} and rec.rows == 3
    np.testing.assert_array_equal(rec.head(3)["y"], feeds["obs"] + [1, 2, 3])
    save_npz(tmp_path / "bare.npz", values)  # without the description, the bias passes for a tensor with rows
    assert [t.name for t in open_recording(tmp_path / "bare.npz").tensors] == ["bias", "y"]


def test_a_run_record_of_a_model_without_a_batch_axis_is_written_without_a_description(tmp_path):
    import json

    from policyport.analysis.recording import described_run
    from policyport.analysis.tables import META_KEY

    session = pp.load(_bias_model([1, 3]), free=False)  # the batch of 1 as the file declares it
    feeds = {"obs": np.ones((1, 3), np.float32)}
    values = session.record(feeds)
    assert described_run(session, feeds, values) is values
    assert session.per_observation(feeds) is None
    # loaded as load does by default, the batch is freed (an Add computes each row alone): described
    freed = pp.load(_bias_model([1, 3]))
    written = described_run(freed, feeds, freed.record(feeds))
    assert json.loads(str(written[META_KEY]))["tensors"] == [{"name": "y", "op_type": "Add", "dtype": "float32",
                                                              "shape": [3]}]


def test_an_input_of_unknown_rank_counts_its_rows_by_axis_0():
    session = pp.load(_bias_model(None))
    rows, others = session.per_observation({"obs": np.ones((5, 3), np.float32)})
    assert rows == {"y": (np.dtype(np.float32), (3,))} and others == ["bias"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows, batch", [(2, 4096), (3, 4096), (600, 2), (600, 3), (1, 4096)])
def test_constants_and_shapes_are_left_out_whatever_the_rows_of_a_block(tmp_path, pendulum_onnx, pendulum_constants,
                                                                       fmt, rows, batch):
    """An SB3 Box policy computes a (2,) shape and (3,) statistics: a block of 2 or 3 rows must not
    take them for tensors with rows."""
    obs = np.random.default_rng(8).uniform(-1, 1, (rows, 3)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    summary = record_dataset(pendulum_onnx, tmp_path / "obs.npy", output(tmp_path, fmt), batch_size=batch)
    expected = pp.load(pendulum_onnx).record(obs)
    with_rows = [n for n in expected if n not in pendulum_constants]
    assert summary.skipped == list(pendulum_constants) and [t.name for t in summary.tensors] == with_rows
    got = open_recording(output(tmp_path, fmt)).head(rows)
    assert list(got) == with_rows
    for name in with_rows:  # blocks of 2 or 3 rows and one of 600: the BLAS kernel blocks its sums differently
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_empty_dataset_gives_an_empty_recording_with_its_tensors(tmp_path, metadrive_onnx):
    np.save(tmp_path / "obs.npy", np.zeros((0, 275), np.float32))
    summary = record_dataset(metadrive_onnx, tmp_path / "obs.npy", tmp_path / "rec.parquet")
    rec = open_recording(tmp_path / "rec.parquet")
    assert summary.rows == rec.rows == 0 and [t.name for t in rec.tensors] == TENSORS


def test_a_multi_input_model_takes_columns_by_name(tmp_path):
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["r"])],
                              "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2]) for n in "ab"],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, ["batch", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    a, b = np.arange(20, dtype=np.float32).reshape(10, 2), -np.ones((10, 2), np.float32) * 5
    np.savez(tmp_path / "feeds.npz", b=b, a=a, unused=np.zeros((10, 1)))
    record_dataset(model, tmp_path / "feeds.npz", tmp_path / "rec.npz", batch_size=3)
    np.testing.assert_array_equal(open_recording(tmp_path / "rec.npz").head(10)["r"], np.maximum(a + b, 0))
    np.savez(tmp_path / "wrong.npz", a=a, c=b)
    with pytest.raises(pp.InputMismatchError, match=r"no column for \['b'\]"):
        record_dataset(model, tmp_path / "wrong.npz", tmp_path / "rec2.npz")


def test_the_npz_is_written_in_place_as_an_ordinary_archive_with_true_crcs(tmp_path):
    import zipfile

    from policyport.analysis.recording import NpzWriter, TensorInfo

    rng = np.random.default_rng(5)
    tensors = [TensorInfo("fc_1/tanh", "Tanh", "float32", (7,)), TensorInfo("action", "ArgMax", "int64", ()),
               TensorInfo("image", "Conv", "float64", (2, 3))]
    blocks = [{"fc_1/tanh": rng.standard_normal((n, 7)).astype(np.float32), "action": rng.integers(0, 9, n),
               "image": rng.standard_normal((n, 2, 3))} for n in (5, 0, 11, 1)]
    path = tmp_path / "rec.npz"
    with open(path, "w+b") as f:
        writer = NpzWriter(f, 17, tensors, {"rows": 17})
        for block in blocks:
            writer.append(block)
        writer.close()
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() is None  # every member's CRC-32 matches its bytes
        assert [i.compress_type for i in zf.infolist()] == [zipfile.ZIP_STORED] * 4
    with np.load(path) as got:
        assert got.files == ["fc_1/tanh", "action", "image", "policyport.recording"]
        for t in tensors:
            expected = np.concatenate([b[t.name] for b in blocks])
            assert got[t.name].dtype == expected.dtype and got[t.name].tobytes() == expected.tobytes()
    data = bytearray(path.read_bytes())
    data[data.index(blocks[0]["fc_1/tanh"].tobytes()) + 3] ^= 0xFF  # one flipped bit in the rows
    path.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
        np.load(path)["fc_1/tanh"]


def test_the_npz_writer_works_without_positioned_writes(tmp_path, monkeypatch):
    from policyport.analysis.recording import NpzWriter, TensorInfo

    monkeypatch.delattr("os.pwrite")  # as on Windows
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    with open(tmp_path / "rec.npz", "w+b") as f:
        writer = NpzWriter(f, 4, [TensorInfo("h", None, "float32", (3,))], {})
        writer.append({"h": rows[:1]})
        writer.append({"h": rows[1:]})
        writer.close()
    with np.load(tmp_path / "rec.npz") as got:
        assert got["h"].tobytes() == rows.tobytes()


def test_an_npy_recording_is_a_folder_named_without_a_suffix_replaced_only_when_it_is_one(tmp_path, metadrive_onnx,
                                                                                         dataset):
    path, obs = dataset
    out = tmp_path / "rec"
    assert record_dataset(metadrive_onnx, path, out, tensors="logits").format == "npy"
    with pytest.raises(pp.OutputExistsError, match="--force"):
        record_dataset(metadrive_onnx, path, out)
    record_dataset(metadrive_onnx, path, out, tensors="fc_1/tanh", force=True, batch_size=1000)
    assert [t.name for t in open_recording(out).tensors] == ["fc_1/tanh", "logits", "action", "log_std"]
    assert sorted(os.listdir(tmp_path)) == ["rec"]  # the replaced folder is gone, no temporary one is left
    (out / "notes.txt").write_text("mine")
    with pytest.raises(pp.OutputExistsError, match="never replaced"):
        record_dataset(metadrive_onnx, path, out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    with pytest.raises(pp.OptionError, match=r"or 'rec' \(no suffix\) for a folder of .npy files"):
        record_dataset(metadrive_onnx, path, tmp_path / "rec.npy")
    with pytest.raises(pp.OptionError, match=r"--format npy \(format='npy'\) writes a folder .* ends in .npz"):
        record_dataset(metadrive_onnx, path, tmp_path / "x.npz", format="npy")
    assert record_dataset(metadrive_onnx, path, tmp_path / "run.v2", format="npy", tensors="logits").format == "npy"
    assert (tmp_path / "run.v2").is_dir()


def test_the_npy_writer_writes_headers_rows_and_description_in_place(tmp_path):
    from policyport.analysis.recording import NpyFolderWriter, TensorInfo

    rows = np.arange(24, dtype=np.float64).reshape(4, 2, 3)
    names = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int16)
    tensors = [TensorInfo("a/b:0", "Tanh", "float64", (2, 3)), TensorInfo("../../evil", None, "int16", (2,))]
    writer = NpyFolderWriter(tmp_path, 4, tensors, {"rows": 4, "format": "policyport.recording/1"})
    writer.append({"a/b:0": rows[:3], "../../evil": names[:3]})
    writer.append({"a/b:0": rows[3:], "../../evil": names[3:]})
    writer.close()
    assert sorted(os.listdir(tmp_path)) == ["0000-a.b.0.npy", "0001-......evil.npy", "policyport.recording.json"]
    assert np.load(tmp_path / "0000-a.b.0.npy").tobytes() == rows.tobytes()
    assert np.load(tmp_path / "0001-......evil.npy").tobytes() == names.tobytes()
    rec = open_recording(tmp_path)
    assert rec.rows == 4 and [(t.name, t.dtype, t.shape) for t in rec.tensors] == [
        ("a/b:0", "float64", (2, 3)), ("../../evil", "int16", (2,))]
    got = rec.head(4)
    assert got["a/b:0"].tobytes() == rows.tobytes() and got["../../evil"].tobytes() == names.tobytes()
    assert rec.table.read_rows(1, 3, ["../../evil"])["../../evil"].tobytes() == names[1:3].tobytes()
    (tmp_path / "short").mkdir()
    short = NpyFolderWriter(tmp_path / "short", 4, tensors[:1], {})
    short.append({"a/b:0": rows[:3]})
    with pytest.raises(pp.BadModelError, match="got 3 rows, not the 4 announced"):
        short.close()
    assert not (tmp_path / "short" / "policyport.recording.json").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda d, f: d["files"].update({"fc": "../rec.npy"}), "not an .npy file in"),
    (lambda d, f: d["files"].update({"fc": "/etc/passwd"}), "not an .npy file in"),
    (lambda d, f: d["files"].update({"fc": "missing.npy"}), "not an .npy file in"),
    (lambda d, f: d["files"].update({"fc": ".hidden.npy"}), "not an .npy file in"),
    (lambda d, f: (f / "link.npy").symlink_to(f / "0000-fc.npy") or d["files"].update({"fc": "link.npy"}),
     "not an .npy file in"),
    (lambda d, f: d.update({"rows": 5}), "holds 4 rows; .* says 5"),
    (lambda d, f: d.update({"rows": "4"}), "needs 'rows'"),
    (lambda d, f: d.update({"files": ["0000-fc.npy"]}), "needs 'rows'"),
    (lambda d, f: d.pop("files"), "needs 'rows'"),
    (lambda d, f: (f / "0000-fc.npy").write_bytes((f / "0000-fc.npy").read_bytes()[:-4]), "is truncated"),
    (lambda d, f: np.save(f / "0000-fc.npy", np.array([object()] * 4)), "object array"),
])
def test_a_broken_or_hostile_npy_recording_is_refused_naming_what(tmp_path, edit, message):
    import json

    from policyport.analysis.recording import NpyFolderWriter, TensorInfo

    folder = tmp_path / "rec"
    folder.mkdir()
    (tmp_path / "rec.npy").write_bytes(b"outside")
    writer = NpyFolderWriter(folder, 4, [TensorInfo("fc", None, "float32", (3,))], {"rows": 4})
    writer.append({"fc": np.ones((4, 3), np.float32)})
    writer.close()
    meta = folder / "policyport.recording.json"
    doc = json.loads(meta.read_text())
    edit(doc, folder)
    meta.write_text(json.dumps(doc))
    with pytest.raises(pp.UnreadableFileError, match=message):
        open_recording(folder)


def test_an_oversized_npy_description_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from policyport.analysis import tables

    (tmp_path / "policyport.recording.json").write_text('{"rows": 0, "files": {}, "pad": "' + "x" * 200 + '"}')
    assert open_recording(tmp_path).rows == 0
    monkeypatch.setattr(tables, "META_FILE_BYTES", 100)
    with pytest.raises(pp.UnreadableFileError, match="more than a recording's description"):
        open_recording(tmp_path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_recorded_into_recycled_arrays_hold_their_own_rows(tmp_path, metadrive_onnx, metadrive_model, fmt,
                                                                  monkeypatch):
    from policyport.runtime.numpy.rows import SPLIT_ROWS, ResultPool

    taken = []

    class Counting(ResultPool):
        def take(self, shape, dtype):
            a = super().take(shape, dtype)
            taken.append(id(a))
            return a

    monkeypatch.setattr(engines, "ResultPool", Counting)
    obs = np.random.default_rng(8).uniform(0, 1, (5 * SPLIT_ROWS + 17, 275)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    out = output(tmp_path, fmt)
    record_dataset(metadrive_onnx, tmp_path / "obs.npy", out, batch_size=SPLIT_ROWS)
    assert len(taken) > len(set(taken))  # later blocks were written into earlier blocks' arrays
    got = open_recording(out).head(len(obs))
    session = pp.load(metadrive_model)
    for start in range(0, len(obs), SPLIT_ROWS):
        block = session.record(obs[start:start + SPLIT_ROWS])
        for name in TENSORS:
            assert got[name][start:start + SPLIT_ROWS].tobytes() == block[name].tobytes(), (name, start)


def test_a_result_pool_takes_back_only_what_it_handed_out():
    from policyport.runtime.numpy.rows import ResultPool

    pool = ResultPool()
    a, b = (pool.take((3, 4), np.float32) for _ in range(2))
    assert a is not b and a.shape == (3, 4) and a.dtype == np.float32
    stranger = np.empty((3, 4), np.float32)
    pool.give_back([a, stranger, a[1:]])  # a stranger and a view of a: not the pool's
    assert pool.take((3, 4), np.float32) is a
    fresh = pool.take((3, 4), np.float32)
    assert fresh is not b and fresh is not stranger  # b is still out; the stranger was never kept
    pool.give_back([a, a])  # given back twice: kept once
    assert pool.take((3, 4), np.float32) is a and pool.take((3, 4), np.float32) is not a
    assert pool.take((3, 4), np.float64).dtype == np.float64
    out = len(pool._out)
    del b, fresh
    assert len(pool._out) == out - 2  # arrays dropped by their holder are forgotten, not kept alive


def test_read_ahead_keeps_order_raises_where_the_source_did_and_stops_with_its_consumer():
    import threading

    from policyport.analysis.engines import read_ahead

    assert list(read_ahead(iter(range(50)))) == list(range(50))
    assert list(read_ahead(iter([]))) == []

    def failing():
        yield 1
        yield 2
        raise pp.UnreadableFileError("ends early")

    got = []
    with pytest.raises(pp.UnreadableFileError, match="ends early"):
        for x in read_ahead(failing()):
            got.append(x)
    assert got == [1, 2]

    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    reader = read_ahead(endless(), depth=2)
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()  # the consumer stops: the producer thread stops and closes its source
    assert closed.wait(5)
    assert not any(t.name == "policyport-reader" and t.is_alive() for t in threading.enumerate())
