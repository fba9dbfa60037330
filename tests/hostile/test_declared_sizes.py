"""Sizes a small file declares, directly or through a config, are checked against policyport's limits
before anything that large is allocated: each hostile file is made here, at test time, and the
command that reads it runs under a 2 GiB address space (:mod:`limited`), where a missing check shows
up as another message (a MemoryError, onnxruntime's or TensorFlow's own), never as the limit's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from limited import SUPPORTED, refused, run_limited

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="address-space limits as on Linux")

ARRAY_LIMIT = "above the limit of 1 GiB for"


def _model(nodes, initializers=(), opset=17, output="y"):
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", 4])],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _save(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def test_onnxruntime_is_not_handed_a_constant_of_shape_above_the_array_limit(tmp_path):
    from onnx import helper, numpy_helper

    # 194 bytes: ConstantOfShape of 2.125e9 float32 zeros (8.5 GB), summed and added to the observation
    path = _save(_model([helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
                         helper.make_node("ReduceSum", ["big"], ["total"], name="sum", keepdims=0),
                         helper.make_node("Add", ["obs", "total"], ["y"], name="add")],
                        [numpy_helper.from_array(np.array([2_125_000_000], np.int64), "shape")]), tmp_path / "fill.onnx")
    np.save(tmp_path / "obs.npy", np.zeros((2, 4), np.float32))
    for backend in ("onnxruntime", "numpy"):  # the same limit, the same words
        message = refused(run_limited(["run", path, "-i", tmp_path / "obs.npy", "-o", tmp_path / "out.npz",
                                       "--backend", backend]))
        assert f'ConstantOfShape node "fill" on the {backend} backend: its output (float32, shape (2125000000,)) ' \
               f"would take 7.92 GiB (8,500,000,000 bytes), {ARRAY_LIMIT} one tensor sized from a value" in message
    assert not (tmp_path / "out.npz").exists()


def test_inspect_refuses_a_graph_above_the_node_limit_before_describing_it(tmp_path):
    from onnx import helper

    count = 300_000  # a chain of Relu nodes: 10 MB; described, 1.3 GB and 25 s (--json), minutes as a table
    nodes = [helper.make_node("Relu", [f"t{i}" if i else "obs"], [f"t{i + 1}" if i < count - 1 else "y"], name=f"r{i}")
             for i in range(count)]
    path = _save(_model(nodes), tmp_path / "deep.onnx")
    message = refused(run_limited(["inspect", path]))
    assert "the graph has 300,000 nodes, more than the limit of 200,000 nodes (the numpy backend's" in message
    assert "POLICYPORT_MAX_NODES=300000" in message


# ------------------------------------------------------------------------------------- recordings


def _sparse_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """An ``.npy`` of float32 zeros of ``shape`` as a sparse file: its header, then a hole."""
    from policyport.analysis.recording import npy_header

    header = npy_header("float32", shape)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * int(np.prod(shape)))
    return path


@pytest.mark.parametrize("command", ["stats", "plot"])
def test_statistics_are_not_sized_from_a_recording_header_above_the_array_limit(tmp_path, command):
    path = _sparse_npy(tmp_path / "wide.npy", (1, 1_000_000_000))  # 4 KB on disk, 4 GB of rows declared
    argv = [command, path] + (["-o", tmp_path / "plots"] if command == "plot" else [])
    message = refused(run_limited(argv))
    assert ("wide.npy: the per-neuron statistics of 1 tensor (1,000,000,000 neurons, as its header says) and a "
            "block of one row would take 233 GiB") in message
    assert "above the limit of 1 GiB for the statistics of a recording" in message
    assert not (tmp_path / "plots").exists()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _zigzag(n: int) -> bytes:
    """An integer as Thrift's compact protocol writes i32 and i64 fields."""
    return _varint((n << 1) ^ (n >> 63))


_I32, _I64, _BINARY, _LIST, _STRUCT, _FALSE = 5, 6, 8, 9, 12, 2  # Thrift compact-protocol types


def _struct(*fields) -> bytes:
    """A Thrift struct of ``(field id, type, encoded value)`` in field-id order."""
    out, last = bytearray(), 0
    for field, kind, value in fields:
        out += bytes([(field - last) << 4 | kind]) + value
        last = field
    return bytes(out) + b"\x00"


def _list(kind: int, items: list[bytes]) -> bytes:
    return bytes([len(items) << 4 | kind]) + b"".join(items)


def _text(text: str) -> bytes:
    return _varint(len(text)) + text.encode()


def _one_row_parquet(values: int, width: int) -> bytes:
    """A recording in Parquet (parquet.thrift's FileMetaData and page headers, written by hand): one
    list<float> column ``logits`` whose metadata says rows of ``width`` values, holding one row of
    ``values`` zeros, dictionary- and run-length encoded in a few hundred bytes."""
    import json

    dictionary = _struct((1, _I32, _zigzag(2)), (2, _I32, _zigzag(4)), (3, _I32, _zigzag(4)),
                         (7, _STRUCT, _struct((1, _I32, _zigzag(1)), (2, _I32, _zigzag(0)), (3, _FALSE, b"")))) + bytes(4)
    repetition = b"\x03\xfe" + _varint((values - 8) << 1) + b"\x01"  # level 0, then values - 1 ones
    definition = _varint(values << 1) + b"\x03"  # every value present
    data = (len(repetition).to_bytes(4, "little") + repetition + len(definition).to_bytes(4, "little") + definition
            + b"\x01" + _varint(values << 1) + b"\x00")  # dictionary index 0, values times
    page = _struct((1, _I32, _zigzag(0)), (2, _I32, _zigzag(len(data))), (3, _I32, _zigzag(len(data))),
                   (5, _STRUCT, _struct((1, _I32, _zigzag(values)), (2, _I32, _zigzag(8)), (3, _I32, _zigzag(3)),
                                        (4, _I32, _zigzag(3))))) + data
    chunk = dictionary + page
    column = _struct((1, _I32, _zigzag(4)), (2, _LIST, _list(_I32, [_zigzag(0), _zigzag(3), _zigzag(8)])),
                     (3, _LIST, _list(_BINARY, [_text("logits"), _text("list"), _text("element")])),
                     (4, _I32, _zigzag(0)), (5, _I64, _zigzag(values)), (6, _I64, _zigzag(len(chunk))),
                     (7, _I64, _zigzag(len(chunk))), (9, _I64, _zigzag(4 + len(dictionary))), (11, _I64, _zigzag(4)))
    schema = [_struct((4, _BINARY, _text("schema")), (5, _I32, _zigzag(1))),
              _struct((3, _I32, _zigzag(1)), (4, _BINARY, _text("logits")), (5, _I32, _zigzag(1)), (6, _I32, _zigzag(3))),
              _struct((3, _I32, _zigzag(2)), (4, _BINARY, _text("list")), (5, _I32, _zigzag(1))),
              _struct((1, _I32, _zigzag(4)), (3, _I32, _zigzag(1)), (4, _BINARY, _text("element")))]
    group = _struct((1, _LIST, _list(_STRUCT, [_struct((2, _I64, _zigzag(4)), (3, _STRUCT, column))])),
                    (2, _I64, _zigzag(len(chunk))), (3, _I64, _zigzag(1)))
    described = json.dumps({"format": "policyport.recording/1", "rows": 1, "tensors": [
        {"name": "logits", "op_type": None, "dtype": "float32", "shape": [width]}]})
    footer = _struct((1, _I32, _zigzag(1)), (2, _LIST, _list(_STRUCT, schema)), (3, _I64, _zigzag(1)),
                     (4, _LIST, _list(_STRUCT, [group])),
                     (5, _LIST, _list(_STRUCT, [_struct((1, _BINARY, _text("policyport.recording")),
                                                        (2, _BINARY, _text(described)))])))
    return b"PAR1" + chunk + footer + len(footer).to_bytes(4, "little") + b"PAR1"


def test_the_hand_written_parquet_recording_is_one_pyarrow_reads():
    import io

    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(io.BytesIO(_one_row_parquet(1000, 1000)))
    assert table.num_rows == 1 and table.column("logits")[0].values.to_numpy().tolist() == [0.0] * 1000


def test_a_parquet_row_of_more_values_than_the_array_limit_is_refused_before_it_is_decoded(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "rec.parquet"
    path.write_bytes(_one_row_parquet(1_250_000_000, 4))  # 359 bytes; decoded, 5 GB (12.8 GB at the peak)
    message = refused(run_limited(["stats", path]))
    assert ("rec.parquet: row group 0 of list column 'logits' (1,250,000,000 float32 values, read as whole rows) "
            f"would take 4.66 GiB (5,000,000,000 bytes), {ARRAY_LIMIT} arrays read from a file") in message


# ------------------------------------------------------------------------------ Keras, SavedModel


def _keras_layer(kind: str, name: str, config: dict, width: int | None = None) -> dict:
    layer = {"module": "keras.layers", "class_name": kind, "registered_name": None,
             "config": {"name": name, "trainable": True, "dtype": "float32", **config}}
    if width is not None:
        layer["build_config"] = {"input_shape": [None, width]}
    return layer


def _keras_archive(path: Path, units: list[int], width: int = 6, padding: int = 0,
                   method: int | None = None) -> Path:
    """A ``.keras`` archive (Keras 3 saving_lib's layout) of a Sequential of ``Dense(units)`` layers
    on ``width`` inputs; its config.json padded with ``padding`` spaces and compressed with
    ``method`` (default deflated). No weights: the config is refused before they would be read."""
    import json
    import zipfile

    layers = [_keras_layer("InputLayer", "obs", {"batch_shape": [None, width]})]
    for i, u in enumerate(units):
        layers.append(_keras_layer("Dense", f"fc_{i}", {"units": u, "activation": "tanh", "use_bias": True}, width))
        width = u
    config = {"module": "keras", "class_name": "Sequential", "config": {"name": "policy", "layers": layers}}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("metadata.json", json.dumps({"keras_version": "3.11.0", "date_saved": "2025-01-01"}))
        zf.writestr(zipfile.ZipInfo("config.json"), json.dumps(config) + " " * padding,
                    compress_type=zipfile.ZIP_DEFLATED if method is None else method)
        zf.writestr("model.weights.h5", b"")
    return path


KERAS = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs the tf extra")


@KERAS
def test_keras_layer_weights_declared_above_the_array_limit_are_refused_before_the_model_is_built(tmp_path):
    path = _keras_archive(tmp_path / "wide.keras", [500_000], width=10_000)  # 1 KB: Dense(500000) on 10,000 inputs
    message = refused(run_limited(["inspect", path]))  # before: TensorFlow's out-of-memory error, exit 70
    assert ("wide.keras: the weights its config declares (5,000,500,000 in the Dense layer 'fc_0' alone) would take "
            "18.6 GiB (20,002,000,000 bytes), above the limit of 1 GiB for the weights of a model, sized from its "
            "config") in message


@KERAS
def test_a_keras_config_larger_than_parsing_it_within_the_array_limit_allows_is_refused_unread(tmp_path):
    path = _keras_archive(tmp_path / "padded.keras", [16], padding=100_000_000)  # 100 KB, 100 MB of JSON
    message = refused(run_limited(["inspect", path]))
    assert "padded.keras: config.json (100,00" in message
    assert "bytes of JSON, parsed) would take 2.33 GiB" in message
    assert "above the limit of 1 GiB for a document parsed from a file" in message


@KERAS
def test_a_keras_member_compressed_without_an_output_bound_is_refused_unread(tmp_path):
    import zipfile

    path = _keras_archive(tmp_path / "bomb.keras", [16], padding=500_000_000, method=zipfile.ZIP_BZIP2)  # 5 KB
    message = refused(run_limited(["inspect", path]))
    assert ("bomb.keras: member 'config.json' is compressed with bzip2, which Python's zipfile decompresses without a "
            "bound on its size") in message


@KERAS
def test_more_keras_layers_than_the_memory_this_process_can_get_holds_are_refused_before_loading(tmp_path):
    path = _keras_archive(tmp_path / "deep.keras", [1] * 3000)  # 17 KB; before: over 22 minutes and 1 GB, unfinished
    message = refused(run_limited(["inspect", path]))
    assert "deep.keras: loading the 3,001 Keras layers its config declares needs about 2.93 GiB, more than" in message
    assert "(the memory this process can get)" in message


_FILL = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf

class Policy(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.ones([4, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="obs")])
    def __call__(self, obs):
        return {"y": tf.matmul(obs, self.w) + tf.reduce_sum(tf.fill([50_000, 50_000], 1.0))}  # 10 GB

policy = Policy()
tf.saved_model.save(policy, sys.argv[1], signatures={"serving_default": policy.__call__})
"""


@KERAS
def test_a_savedmodel_tensor_sized_from_a_constant_above_the_array_limit_is_refused_before_loading(tmp_path):
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", _FILL, str(tmp_path / "fill")], check=True, capture_output=True, timeout=600)
    message = refused(run_limited(["convert", tmp_path / "fill", "-o", tmp_path / "fill.onnx", "--trust"]))  # before: TF aborts
    assert ('fill/saved_model.pb: Fill node "Fill" in function __inference___call___' in message
            and ": its output (float32, shape (50000, 50000)) would take 9.31 GiB (10,000,000,000 bytes), "
                f"{ARRAY_LIMIT} one tensor sized from a value in the model" in message)
    assert not (tmp_path / "fill.onnx").exists()
