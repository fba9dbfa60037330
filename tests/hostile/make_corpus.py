"""Write a corpus of hostile and broken files, and the policyport command each one is tried with.

Every file is small (the largest, a deflated .npz bomb, is about 2 MB) and made here, at test time,
from nothing but numpy, onnx and the standard library; nothing large is ever committed. Each case
says the exit code and a piece of the message policyport must end with, without a traceback.

    python tests/hostile/make_corpus.py DIR      # writes the files and lists the cases

The cases are the smallest examples of each kind of attack found: arrays whose headers or zip
members claim far more memory than the file holds; graphs whose node outputs are sized from
values (ConstantOfShape, Expand, Tile, Range) or broadcast to TiB; graphs of too many nodes;
initializers whose data does not match their dims; inputs that are not files at all; and commands
asked for more memory than the machine has.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Case:
    """One hostile input: the command line (after ``policyport``), its exit code, a piece of its message."""

    name: str
    argv: tuple[str, ...]
    exit_code: int
    message: str
    env: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # outputs that must not exist afterwards


# ------------------------------------------------------------------------------------------- models


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    from onnx import helper

    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="corpus")
    model.ir_version = 8
    return model


def _obs(width=4):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", width])


def _out(name="y", elem=None, shape=None):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT if elem is None else elem, shape)


def _int64(name, values):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _save(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())  # onnx.save would check nothing more
    return path


def sized_from_value_models(folder: Path) -> dict[str, Path]:
    """Graphs whose one node is driven to TiB sizes by a constant (onnxruntime refuses each cleanly);
    ``Expand_rows`` gets there only over many rows of input."""
    from onnx import TensorProto, helper

    tib = 10**6  # (10**6, 10**6) float32 = 3.6 TiB
    models = {
        "ConstantOfShape": _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill")],
                                  [_obs()], [_out()], [_int64("shape", [tib, tib])]),
        "Expand": _model([helper.make_node("Expand", ["obs", "shape"], ["y"], name="widen")],
                         [_obs()], [_out()], [_int64("shape", [tib, tib, 1, 4])]),
        "Expand_rows": _model([helper.make_node("Expand", ["obs", "shape"], ["y"], name="widen")],
                              [_obs()], [_out()], [_int64("shape", [tib, 1, 4])]),  # 16 MB a row
        "Tile": _model([helper.make_node("Tile", ["obs", "repeats"], ["y"], name="repeat")],
                       [_obs()], [_out()], [_int64("repeats", [tib, tib])]),
        "Range": _model([helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="count")],
                        [_obs()], [_out(elem=TensorProto.INT64)],
                        [_int64("start", 0), _int64("limit", 10**13), _int64("delta", 1)]),
    }
    return {op: _save(m, folder / f"{op.lower()}_tib.onnx") for op, m in models.items()}


def sized_from_attribute_models(folder: Path) -> dict[str, tuple[Path, str]]:
    """Graphs whose one node is driven to TiB sizes by an attribute or by its equation rather than by
    the size of its inputs: op -> (model, node name)."""
    from onnx import TensorProto, helper, numpy_helper

    tib = 10**6
    as_3d = helper.make_node("Reshape", ["obs", "to_3d"], ["x"], name="to_3d")  # (batch, 1, 4): one channel
    to_3d = _int64("to_3d", [0, 1, 4])
    wide = {"pads": [tib * tib, tib * tib]}
    nodes = {
        "RandomNormal": ([helper.make_node("RandomNormal", [], ["y"], name="noise", shape=[tib, tib])], []),
        "RandomUniform": ([helper.make_node("RandomUniform", [], ["y"], name="noise", shape=[tib, tib])], []),
        "Multinomial": ([helper.make_node("Multinomial", ["obs"], ["y"], name="draw", sample_size=tib * tib)], []),
        "Conv": ([as_3d, helper.make_node("Conv", ["x", "w"], ["y"], name="convolve", **wide)],
                 [to_3d, numpy_helper.from_array(np.ones((1, 1, 1), np.float32), "w")]),
        "MaxPool": ([as_3d, helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[1], **wide)], [to_3d]),
        "AveragePool": ([as_3d, helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[1], **wide)],
                        [to_3d]),
        # an outer product of six 100-element constants: 10**12 elements from 2.4 KB
        "Einsum": ([helper.make_node("Einsum", list("abcdef"), ["y"], name="outer", equation="a,b,c,d,e,f->abcdef")],
                   [numpy_helper.from_array(np.ones(100, np.float32), n) for n in "abcdef"]),
        # (100, 100) indices of the one row of a (1, 100000) constant: 4 GB from 480 KB
        "Gather": ([helper.make_node("Gather", ["table", "rows"], ["y"], name="pick")],
                   [numpy_helper.from_array(np.zeros((1, 100_000), np.float32), "table"),
                    numpy_helper.from_array(np.zeros((100, 100), np.int64), "rows")]),
    }
    models = {}
    for op, (graph_nodes, initializers) in nodes.items():
        elem = TensorProto.INT32 if op == "Multinomial" else None
        model = _model(graph_nodes, [_obs()], [_out(elem=elem)], initializers)
        models[op] = (_save(model, folder / f"{op.lower()}_attribute_tib.onnx"), graph_nodes[-1].name)
    return models


def outer_product_model(folder: Path) -> Path:
    """Two 1-MB constants whose sum broadcasts to (250000, 1000000): 0.9 TiB from shapes, not values."""
    from onnx import helper, numpy_helper

    a = numpy_helper.from_array(np.zeros((250_000, 1), np.float32), "column")
    b = numpy_helper.from_array(np.zeros((1, 1_000_000), np.float32), "row")
    nodes = [helper.make_node("Add", ["column", "row"], ["y"], name="outer")]
    return _save(_model(nodes, [_obs()], [_out()], [a, b]), folder / "outer_product.onnx")


def relu_chain(folder: Path, length: int) -> Path:
    """``length`` Relu nodes in a row: obs (batch, 4) -> ... -> y."""
    from onnx import helper

    names = ["obs", *(f"r{i}" for i in range(1, length)), "y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"relu_{i}") for i in range(length)]
    return _save(_model(nodes, [_obs()], [_out(shape=["batch", 4])]), folder / f"relu_chain_{length}.onnx")


def wide_model(folder: Path, width: int = 512) -> Path:
    """obs (batch, 4) -> Gemm to ``width`` -> Tanh -> y: a record holds 2 * width floats per row."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.full((4, width), 0.01, np.float32), "W")
    nodes = [helper.make_node("Gemm", ["obs", "W"], ["h"], name="dense"), helper.make_node("Tanh", ["h"], ["y"], name="tanh")]
    return _save(_model(nodes, [_obs()], [_out(shape=["batch", width])], [w]), folder / "wide.onnx")


def bad_initializer_models(folder: Path) -> dict[str, Path]:
    """Initializers whose data does not match their dims: a byte short; 10**12 elements claimed, none held."""
    from onnx import helper

    short, huge = _raw_tensor("W", [4, 4], b"\0" * 63), _raw_tensor("W", [10**6, 10**6], b"")
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["y"], name="dense")]
    return {kind: _save(_model(nodes, [_obs()], [_out(shape=["batch", 4])], [t]), folder / f"initializer_{kind}.onnx")
            for kind, t in (("short", short), ("huge", huge))}


def _raw_tensor(name: str, dims: list[int], raw: bytes):
    """A float32 TensorProto with ``raw`` as its raw_data, whatever its dims say (onnx's
    make_tensor would refuse a mismatch)."""
    from onnx import TensorProto

    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    t.raw_data = raw
    return t


def external_data_model(folder: Path) -> Path:
    """An initializer of 5 * 10**9 float32 (18.6 GiB) in a sparse external file of that size."""
    from onnx import TensorProto, helper

    sub = folder / "external"
    sub.mkdir()
    with open(sub / "weights.bin", "wb") as f:
        f.truncate(20 * 10**9)  # sparse: takes no disk space
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[5 * 10**9])
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(20 * 10**9))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("Identity", ["W"], ["y"], name="weights")]
    return _save(_model(nodes, [_obs()], [_out()], [t]), sub / "model.onnx")


def tiny_model(folder: Path, width: int = 4) -> Path:
    """obs (batch, width) -> Tanh -> y: a model that is fine, for hostile inputs."""
    from onnx import helper

    nodes = [helper.make_node("Tanh", ["obs"], ["y"], name="tanh")]
    return _save(_model(nodes, [_obs(width)], [_out(shape=["batch", width])]), folder / f"tiny_{width}.onnx")


# ------------------------------------------------------------------------------------------- arrays


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A version-1.0 .npy header (magic, length, dict padded to 64 bytes) describing ``descr`` ``shape``."""
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    pad = 64 - (10 + len(text) + 1) % 64
    text += " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def npz_bomb(path: Path, gib: int = 2) -> Path:
    """An .npz whose one member, ``obs.npy``, is ``gib`` GiB of float32 zeros deflated to about a
    thousandth of that. The zeros are compressed as identical, fully flushed 1 MiB blocks, so making
    the file takes a second, not the time to compress gigabytes; the zip is written by hand."""
    header = npy_header("<f4", (gib * (1 << 28),))
    chunk, chunks = 1 << 20, gib * 1024
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(bytes(chunk)) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.flush()
    size, compressed = len(header) + chunk * chunks, len(head) + len(block) * chunks + len(tail)
    crc, zeros = zlib.crc32(header), bytes(chunk)
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    name = b"obs.npy"
    # local file header, data, central directory, end of central directory (APPNOTE.TXT 4.3)
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, compressed, size, len(name), 0)
    central = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, compressed, size,
                          len(name), 0, 0, 0, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(local + name + head)
        for _ in range(chunks):
            f.write(block)
        f.write(tail)
        central_at = f.tell()
        f.write(central + name)
        f.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central) + len(name), central_at, 0))
    return path


def array_files(folder: Path) -> dict[str, Path]:
    """Hostile .npy/.npz files and inputs that are not array files at all."""
    import io
    import pickle
    import zipfile

    files: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        files[name] = folder / name
        files[name].write_bytes(data)

    # 200 bytes whose header claims 10**12 float32 elements (3.6 TiB)
    put("claims_tib.npy", (npy_header("<f4", (10**12,)) + bytes(72))[:200])
    # 128 bytes of header for one element of 10**9 raw bytes
    put("void_gib.npy", npy_header("|V1000000000", (5,)))
    put("structured.npy", _npy_bytes(np.zeros(3, dtype=[("a", "<f4"), ("b", "<i4")])))
    put("object.npy", npy_header("|O", (2,)) + pickle.dumps([1, 2], protocol=2))
    # an .npz whose member claims 10**12 elements in a few bytes
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("obs.npy", npy_header("<f4", (10**6, 10**6)) + bytes(16))
    put("member_claims_tib.npz", buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("obs.npy", npy_header("|O", (1,)) + pickle.dumps(["x"], protocol=2))
    put("member_object.npz", buf.getvalue())
    files["bomb.npz"] = npz_bomb(folder / "bomb.npz")
    # not array files
    put("empty.npy", b"")
    put("obs.csv", b"0.1,0.2,0.3,0.4\n0.5,0.6,0.7,0.8\n")
    put("obs.pkl", pickle.dumps(np.zeros((2, 4), np.float32), protocol=4))
    put("noise.npy", bytes(range(256)) * 4)
    fifo = folder / "fifo.npy"
    os.mkfifo(fifo)
    files["fifo.npy"] = fifo
    (folder / "folder.npy").mkdir()
    files["folder.npy"] = folder / "folder.npy"
    # fine: observations of width 4, 100,000 of them for memory estimates, two for the rest
    for name, rows in (("rows.npy", 100_000), ("two_rows.npy", 2)):
        files[name] = folder / name
        np.save(files[name], np.zeros((rows, 4), np.float32))
    return files


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


# -------------------------------------------------------------------------------------------- cases


def make_corpus(folder: str | os.PathLike) -> list[Case]:
    """Write every hostile file into ``folder`` (which must exist) and return the cases."""
    folder = Path(folder)
    arrays = array_files(folder)
    tiny = str(tiny_model(folder))
    cases: list[Case] = []

    def case(name, argv, code, message, env=None, absent=()):
        cases.append(Case(name, tuple(map(str, argv)), code, message, env or {}, tuple(map(str, absent))))

    class Out:  # a fresh output path for each case, so that no case sees another's output
        def __str__(self):
            return str(folder / f"out_{len(cases)}.npz")

    out = Out()

    # arrays: sizes are checked before anything is read
    case("npz bomb as -i", ["run", tiny, "-i", arrays["bomb.npz"], "-o", out], 3,
         "bomb.npz would take 2 GiB (2,147,483,776 bytes), above the limit of 1 GiB", absent=[out])
    case("npz bomb as weights", ["convert", arrays["bomb.npz"], "-o", folder / "w.onnx"], 3,
         "above the limit of 1 GiB", absent=[folder / "w.onnx"])
    case("npz bomb inspected", ["inspect", arrays["bomb.npz"]], 3, "above the limit of 1 GiB")
    case("npz bomb with a lower --max-bytes", ["run", tiny, "-i", arrays["bomb.npz"], "-o", out, "--max-bytes", "1M"],
         3, "above the limit of 1 MiB", absent=[out])
    case("npy header claims 3.6 TiB", ["run", tiny, "-i", arrays["claims_tib.npy"], "-o", out], 3,
         "its header describes float32 (1000000000000,) (3.64 TiB), but it holds 72 B of data", absent=[out])
    case("npy of |V1000000000", ["run", tiny, "-i", arrays["void_gib.npy"], "-o", out], 3,
         "elements of 1,000,000,000 raw bytes (dtype |V1000000000)", absent=[out])
    case("structured npy", ["run", tiny, "-i", arrays["structured.npy"], "-o", out], 3, "is a structured array")
    case("object npy", ["run", tiny, "-i", arrays["object.npy"], "-o", out], 3, "only load by unpickling")
    case("npz member claims 3.6 TiB", ["verify", tiny, "-i", arrays["member_claims_tib.npz"]], 3,
         "array 'obs' is truncated or damaged: its header describes float32 (1000000, 1000000) (3.64 TiB)")
    case("npz member of objects", ["verify", tiny, "-i", arrays["member_object.npz"]], 3, "only load by unpickling")
    # inputs that are not array files, each told for what it is
    case("-i /dev/null", ["run", tiny, "-i", "/dev/null", "-o", out], 3, "/dev/null is a character device, not a file")
    case("-i a FIFO", ["run", tiny, "-i", arrays["fifo.npy"], "-o", out], 3, "is a FIFO (named pipe), not a file")
    case("-i a folder", ["run", tiny, "-i", arrays["folder.npy"], "-o", out], 3, "is a folder, not a file")
    case("-i an empty file", ["run", tiny, "-i", arrays["empty.npy"], "-o", out], 3, "is empty (0 bytes)")
    case("-i a CSV file", ["run", tiny, "-i", arrays["obs.csv"], "-o", out], 3, "is a text file of comma-separated values (CSV)")
    case("-i a pickle", ["run", tiny, "-i", arrays["obs.pkl"], "-o", out], 3, "is a Python pickle")
    case("-i random bytes", ["run", tiny, "-i", arrays["noise.npy"], "-o", out], 3, "is not an .npy or .npz file: it starts with")
    # graphs: node outputs sized from values are checked before they are allocated
    sized = sized_from_value_models(folder)
    for op in ("ConstantOfShape", "Expand", "Tile", "Range"):
        node = {"ConstantOfShape": "fill", "Expand": "widen", "Tile": "repeat", "Range": "count"}[op]
        case(f"{op} to TiB", ["run", sized[op], "-i", arrays["two_rows.npy"], "-o", out], 3,
             f'{op} node "{node}" on the numpy backend: its output', absent=[out])
    for op, (model, node) in sized_from_attribute_models(folder).items():
        case(f"{op} from an attribute or an equation", ["run", model, "-i", arrays["two_rows.npy"], "-o", out], 3,
             f'{op} node "{node}" on the numpy backend: its output', absent=[out])
    case("Expand to TiB over 100,000 rows", ["run", sized["Expand_rows"], "-i", arrays["rows.npy"], "-o", out], 3,
         "rows.npy needs about 1.46 TiB", absent=[out])
    case("Add broadcast to 0.9 TiB", ["run", outer_product_model(folder), "-i", arrays["two_rows.npy"], "-o", out], 3,
         'Add node "outer" on the numpy backend ran out of memory', absent=[out])
    case("too many nodes", ["run", relu_chain(folder, 1001), "-i", arrays["rows.npy"], "-o", out], 3,
         "the graph has 1,001 nodes, more than the numpy backend's limit of 1,000", env={"POLICYPORT_MAX_NODES": "1000"})
    # initializers whose data does not match their dims: refused by every command
    for kind, path in bad_initializer_models(folder).items():
        said = ("has dims [4, 4] (16 float32 elements), which take 64 bytes of raw_data, but it holds 63" if kind == "short"
                else "has dims [1000000, 1000000] (1,000,000,000,000 float32 elements), which take 4,000,000,000,000")
        exposed, extracted, packed = folder / f"exposed_{kind}.onnx", folder / f"w_{kind}.npz", folder / f"pack_{kind}"
        case(f"initializer {kind}: inspect", ["inspect", path], 3, said)
        case(f"initializer {kind}: run", ["run", path, "-i", arrays["rows.npy"], "-o", out], 3, said, absent=[out])
        case(f"initializer {kind}: run on onnxruntime", ["run", path, "-i", arrays["rows.npy"], "-o", out,
                                                         "--backend", "onnxruntime"], 3, said, absent=[out])
        case(f"initializer {kind}: verify", ["verify", path], 3, said)
        case(f"initializer {kind}: extract", ["extract", path, "-o", extracted], 3, said, absent=[extracted])
        case(f"initializer {kind}: expose", ["expose", path, "-o", exposed], 3, said, absent=[exposed])
        case(f"initializer {kind}: pack", ["pack", path, "-o", packed], 3, said, absent=[packed])
    case("external data of 18.6 GiB", ["inspect", external_data_model(folder)], 3,
         "its external data would take 18.6 GiB")
    # commands asked for more memory than there is
    case("verify --samples 100000000", ["verify", tiny_model(folder, 275), "--samples", "100000000"], 3,
         "drawing 100,000,000 observations for 1 input(s) needs about 307 GiB")
    case("run --record over a memory limit", ["run", wide_model(folder), "-i", arrays["rows.npy"], "-o", out,
                                              "--record", folder / "acts.npz"], 3,
         "recording 100,000 rows", env={"POLICYPORT_MAX_MEMORY": "100M"}, absent=[out, folder / "acts.npz"])
    return cases


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile_corpus")
    target.mkdir(parents=True, exist_ok=True)
    for c in make_corpus(target):
        env = " ".join(f"{k}={v}" for k, v in c.env.items())
        print(f"{c.name}: {env + ' ' if env else ''}policyport {' '.join(c.argv)}  -> exit {c.exit_code}")
