"""The ray engine gives the same recording and statistics as the local one (a local Ray instance)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import policyport as pp
from policyport.analysis import open_recording, record_dataset, statistics

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def parquet_folder(tmp_path_factory, dataset):
    """The observations as two .parquet files of fixed-size lists, column 'obs'."""
    folder = tmp_path_factory.mktemp("parquet") / "obs"
    folder.mkdir()
    obs = dataset[1]
    for i, part in enumerate(np.array_split(obs, [1800])):
        pq.write_table(pa.table({"obs": pa.FixedSizeListArray.from_arrays(pa.array(part.reshape(-1)), 275)}),
                       folder / f"part-{i}.parquet")
    return folder


@pytest.mark.parametrize("source", ["npy", "parquet"])
def test_the_ray_engine_records_what_the_local_engine_records(tmp_path, local_ray, metadrive_onnx, dataset,
                                                              parquet_folder, source):
    data = dataset[0] if source == "npy" else parquet_folder
    out = tmp_path / "ray_rec"
    summary = record_dataset(metadrive_onnx, data, out, engine="ray", batch_size=512,
                             overrides={"fc_2/tanh": {17: 1.0}})
    assert summary.rows == 3000 and summary.format == "parquet" and out.is_dir()
    assert summary.nonfinite_rows == 0 and 0 < summary.seconds < 600  # each field in its place
    assert summary.bytes == sum(p.stat().st_size for p in out.iterdir()) > 3000 * 4 * 256
    assert all(p.suffix == ".parquet" for p in out.iterdir()) and sorted(os.listdir(tmp_path)) == ["ray_rec"]
    local = tmp_path / "local.parquet"
    # one BLAS thread, as each Ray worker runs (Ray sets OMP_NUM_THREADS=1 there): a block of 512 rows runs whole
    # on the BLAS's own threads, and some kernels (OpenBLAS's Haswell one) round a product on two differently
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        record_dataset(metadrive_onnx, data, local, batch_size=512, overrides={"fc_2/tanh": {17: 1.0}}, threads=1)
    a, b = open_recording(out), open_recording(local)
    assert a.rows == b.rows == 3000 and a.tensors == b.tensors
    assert a.metadata["engine"] == "ray" and a.metadata["overrides"] == ["fc_2/tanh[17]=1"]
    assert sorted(os.listdir(out))[:3] == ["part-000000000000.parquet", "part-000000000512.parquet",
                                           "part-000000001024.parquet"]
    got, expected = a.head(3000), b.head(3000)
    for name in expected:  # the same rows in the same order, in the same blocks: bit for bit
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    np.testing.assert_array_equal(got["fc_2/tanh"][:, 17], 1.0)


def test_ray_statistics_merge_to_the_local_ones(tmp_path, local_ray, metadrive_onnx, dataset):
    out = tmp_path / "rec.parquet"
    record_dataset(metadrive_onnx, dataset[0], out, batch_size=1000)
    local, distributed = statistics(out, batch_size=700), statistics(out, batch_size=700, engine="ray")
    values = open_recording(out).head(3000)
    for a, b in zip(local.tensors, distributed.tensors):
        assert a.name == b.name and a.dead == b.dead and a.always_saturated == b.always_saturated
        for field in ("count", "nan", "inf", "active", "saturated", "minimum", "maximum"):
            np.testing.assert_array_equal(getattr(a.moments, field), getattr(b.moments, field), err_msg=field)
        np.testing.assert_allclose(b.moments.mean, a.moments.mean, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(b.moments.std, a.moments.std, rtol=1e-9)
        np.testing.assert_allclose(b.moments.std, values[a.name].astype(np.float64).std(0), rtol=1e-6)


def test_ray_refuses_npz_data(tmp_path, local_ray, metadrive_onnx, dataset):
    np.savez(tmp_path / "obs.npz", obs=dataset[1][:10])
    with pytest.raises(pp.InputMismatchError, match="the ray engine reads .npy and .parquet"):
        record_dataset(metadrive_onnx, tmp_path / "obs.npz", tmp_path / "out", engine="ray")
    assert sorted(os.listdir(tmp_path)) == ["obs.npz"]


def test_the_commands_take_engine_ray(tmp_path, local_ray, metadrive_onnx, dataset):
    import json

    from typer.testing import CliRunner

    from policyport.cli import app

    runner = CliRunner()
    out = tmp_path / "rec"
    result = runner.invoke(app, ["record", str(metadrive_onnx), "-i", str(dataset[0]), "-o", str(out), "--engine", "ray",
                                 "--tensors", "logits", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 3000
    stats = runner.invoke(app, ["stats", str(out), "--engine", "ray", "--json"])
    doc = json.loads(stats.stdout)
    assert stats.exit_code == 0 and doc["rows"] == 3000 and [t["name"] for t in doc["tensors"]][0] == "logits"
    again = runner.invoke(app, ["record", str(metadrive_onnx), "-i", str(dataset[0]), "-o", str(out), "--engine", "ray"])
    assert again.exit_code == 3 and "exists" in again.stderr


def test_the_ray_engine_leaves_out_a_shape_as_long_as_its_probe(tmp_path, local_ray, pendulum_onnx, pendulum_constants):
    """An SB3 Box policy's ``action_net/mean_shape`` is (2,): two observations alone cannot tell it
    from a tensor with rows."""
    obs = np.random.default_rng(4).uniform(-1, 1, (700, 3)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    summary = record_dataset(pendulum_onnx, tmp_path / "obs.npy", tmp_path / "rec", engine="ray", batch_size=256)
    expected = pp.load(pendulum_onnx).record(obs)
    assert summary.skipped == list(pendulum_constants)
    got = open_recording(tmp_path / "rec").head(700)
    assert list(got) == [n for n in expected if n not in pendulum_constants]
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)
