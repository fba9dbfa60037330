"""Reading datasets block by block: every format gives back the rows exactly, bad files are refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import policyport as pp
from policyport.analysis.tables import open_table


def concat(table, batch, names=None):
    blocks = list(table.iter_batches(batch, names))
    return blocks, {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


@pytest.fixture
def rows():
    rng = np.random.default_rng(7)
    return rng.standard_normal((1000, 6)).astype(np.float32), rng.integers(0, 9, (1000, 2, 3)).astype(np.int64)


def test_npy_is_read_in_blocks_exactly(tmp_path, rows):
    np.save(tmp_path / "x.npy", rows[0])
    table = open_table(tmp_path / "x.npy")
    assert table.rows == 1000 and list(table.columns) == [""] and table.columns[""].shape == (6,)
    blocks, whole = concat(table, 300)
    assert [len(b[""]) for b in blocks] == [300, 300, 300, 100]
    assert whole[""].tobytes() == rows[0].tobytes()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_members_are_streamed_stored_or_deflated(tmp_path, rows, save):
    save(tmp_path / "x.npz", obs=rows[0], grid=rows[1])
    table = open_table(tmp_path / "x.npz")
    assert {n: (c.dtype.name, c.shape) for n, c in table.columns.items()} == {"obs": ("float32", (6,)), "grid": ("int64", (2, 3))}
    _, whole = concat(table, 333)
    np.testing.assert_array_equal(whole["obs"], rows[0])
    np.testing.assert_array_equal(whole["grid"], rows[1])


def test_parquet_list_columns_become_arrays(tmp_path, rows):
    flat = pa.array(rows[0].reshape(-1))
    table = pa.table({"obs": pa.FixedSizeListArray.from_arrays(flat, 6),
                      "ragged_free": pa.array([list(r) for r in rows[0][:, :2]], pa.list_(pa.float32())),
                      "reward": pa.array(np.arange(1000, dtype=np.float64))})
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=128)
    t = open_table(tmp_path / "x.parquet")
    assert t.rows == 1000 and t.columns["obs"].shape == (6,) and t.columns["reward"].shape == ()
    _, whole = concat(t, 250)
    np.testing.assert_array_equal(whole["obs"], rows[0])
    np.testing.assert_array_equal(whole["ragged_free"], rows[0][:, :2])
    np.testing.assert_array_equal(whole["reward"], np.arange(1000))


def test_a_folder_is_its_files_in_name_order(tmp_path, rows):
    folder = tmp_path / "data"
    folder.mkdir()
    np.save(folder / "b.npy", rows[0][600:])
    np.save(folder / "a.npy", rows[0][:600])
    (folder / "notes.txt").write_text("ignored")
    table = open_table(folder)
    assert table.rows == 1000
    _, whole = concat(table, 256)
    np.testing.assert_array_equal(whole[""], rows[0])
    np.save(folder / "c.npy", rows[0][:5, :5])
    with pytest.raises(pp.UnreadableFileError, match="c.npy does not match .*a.npy"):
        open_table(folder)


@pytest.mark.parametrize("make, message", [
    (lambda p: np.save(p / "x.npy", np.asfortranarray(np.ones((4, 3), np.float32))), "Fortran order"),
    (lambda p: np.save(p / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True), "refuses that"),
    (lambda p: np.save(p / "x.npy", np.float32(3)), "holds a scalar"),
    (lambda p: (p / "x.npy").write_bytes(b"\x93NUMPY garbage"), "not a readable .npy"),
    (lambda p: (p / "x.npz").write_bytes(b"PK not a zip"), "not a readable .npz"),
    (lambda p: (p / "x.parquet").write_bytes(b"PAR1 nope"), "not a readable .parquet"),
    (lambda p: (p / "x.csv").write_text("1,2"), "expected an .npy, .npz or .parquet"),
])
def test_unreadable_data_is_refused_with_the_reason(tmp_path, make, message):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(pp.UnreadableFileError, match=message):
        table = open_table(path)
        list(table.iter_batches(2))


def test_a_truncated_npy_is_refused(tmp_path, rows):
    np.save(tmp_path / "x.npy", rows[0])
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[:-100])
    with pytest.raises(pp.UnreadableFileError, match="truncated"):
        open_table(tmp_path / "x.npy")


def test_rows_are_read_from_the_middle_without_the_rest(tmp_path, rows):
    np.save(tmp_path / "x.npy", rows[0])
    flat = pa.array(rows[0].reshape(-1))
    pq.write_table(pa.table({"obs": pa.FixedSizeListArray.from_arrays(flat, 6)}), tmp_path / "x.parquet", row_group_size=128)
    for path, key in ((tmp_path / "x.npy", ""), (tmp_path / "x.parquet", "obs")):
        table = open_table(path)
        for start, stop in ((0, 1), (100, 300), (127, 129), (990, 1000)):
            np.testing.assert_array_equal(table.read_rows(start, stop)[key], rows[0][start:stop])
    np.savez(tmp_path / "x.npz", obs=rows[0])
    with pytest.raises(pp.UnreadableFileError, match="cannot be read from the middle"):
        open_table(tmp_path / "x.npz").read_rows(5, 10)


def test_npz_arrays_of_different_row_counts_are_refused_by_name_and_count(tmp_path, rows):
    np.savez(tmp_path / "x.npz", obs=rows[0], grid=rows[1], mask=np.ones(3, bool))
    with pytest.raises(pp.UnreadableFileError) as refused:
        open_table(tmp_path / "x.npz")
    assert str(refused.value) == (f"{tmp_path / 'x.npz'}: the arrays have different numbers of rows ('obs', 'grid': "
                                  "1,000 rows; 'mask': 3 rows); each needs one row per observation")


def test_an_npz_read_as_a_recording_leaves_out_the_arrays_without_its_rows(tmp_path, rows):
    """``policyport run --record`` writes constants and shapes beside the tensors with rows."""
    np.savez(tmp_path / "x.npz", obs=rows[0], shape=np.array([1000, 6]), grid=rows[1], std=np.ones(3),
             gain=np.float32(2))
    table = open_table(tmp_path / "x.npz", per_observation=True)
    assert table.rows == 1000 and list(table.columns) == ["obs", "grid"]
    assert dict(table.left_out) == {"shape": (2,), "std": (3,), "gain": ()}
    _, whole = concat(table, 300)
    np.testing.assert_array_equal(whole["obs"], rows[0])
    np.testing.assert_array_equal(whole["grid"], rows[1])
    folder = tmp_path / "parts"  # a folder of such files: the same for each
    folder.mkdir()
    for part in ("a", "b"):
        np.savez(folder / f"{part}.npz", obs=rows[0][:10], grid=rows[1][:10], shape=np.array([10, 6]))
    table = open_table(folder, per_observation=True)
    assert table.rows == 20 and list(table.columns) == ["obs", "grid"] and dict(table.left_out) == {"shape": (2,)}


@pytest.mark.parametrize("arrays, message", [
    ({"action": np.zeros((2, 1)), "shape": np.array([2, 1, 5])}, r"as many arrays have each row count \('action': "
                                                                   r"2 rows; 'shape': 3 rows\)"),
    ({"gain": np.float32(2), "bias": np.float32(1)}, r"holds only scalars \('gain', 'bias'\)"),
])
def test_a_recording_whose_rows_cannot_be_told_is_refused_naming_its_arrays(tmp_path, arrays, message):
    np.savez(tmp_path / "x.npz", **arrays)
    with pytest.raises(pp.UnreadableFileError, match=message):
        open_table(tmp_path / "x.npz", per_observation=True)


@pytest.mark.parametrize("arrays, refused", [
    ({"0.weight": np.ones((8, 3)), "0.bias": np.ones(8), "2.weight": np.ones((2, 8)), "2.bias": np.ones(2)}, True),
    ({"dense/kernel:0": np.ones((3, 8)), "dense/bias:0": np.ones(8), "obs_rms.mean": np.ones(3)}, True),
    ({"bias": np.ones((5, 2)), "mean": np.ones((5, 2))}, False),  # no matrix named as one: rows of activations
    ({"pi/mean": np.ones((5, 2)), "action": np.ones((5, 2)), "fc/weight": np.ones((5, 2))}, False),  # an output among them
])
def test_a_weights_npz_is_not_read_as_a_recording(tmp_path, arrays, refused):
    from policyport.analysis import open_recording

    np.savez(tmp_path / "f.npz", **arrays)
    if refused:
        with pytest.raises(pp.UnreadableFileError, match=r"holds a model's weights \(.*each named as a parameter\), "
                                                          r"not a recording"):
            open_recording(tmp_path / "f.npz")
        return
    assert [t.name for t in open_recording(tmp_path / "f.npz").tensors] == list(arrays)
    assert open_table(tmp_path / "f.npz").rows == 5  # as observations (record -i), nothing is refused


def test_a_description_says_it_is_a_recording_whatever_the_names(tmp_path):
    import json

    from policyport.analysis import open_recording
    from policyport.analysis.recording import TensorInfo, describe
    from policyport.io.arrays import save_npz

    description = describe(4, [TensorInfo("fc/kernel", "Gemm", "float32", (3,))])
    save_npz(tmp_path / "r.npz", {"fc/kernel": np.ones((4, 3), np.float32), "policyport.recording": np.array(json.dumps(description))})
    assert [t.name for t in open_recording(tmp_path / "r.npz").tensors] == ["fc/kernel"]
