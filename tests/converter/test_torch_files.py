"""Reading torch files (policyport/converter/readers/torch_files.py): torch.load's weights-only reader and
its refusals, the reader without torch, tensors of every container and bfloat16 as numpy, the
state_dict check, and the layout metadata that lets extract give a state_dict back in its order."""

from __future__ import annotations

import collections
import io
import json
import pickle
import re
import sys
import zipfile

import numpy as np
import onnx
import pytest

import policyport as pp
from policyport.converter.readers.torch_files import as_state_dict, keep_state_dict_layout, load_torch_file
from policyport.converter.readers.unpickle import Record
from policyport.graph.passes import MAX_VALUE_ELEMENTS, ORDER_KEY, PARAMETERS_KEY

torch = pytest.importorskip("torch")

REFUSAL_TAIL = ("while unpickling; torch.load(weights_only=True) rebuilds only tensors and plain containers and "
                "refused it (nothing from the file ran). A whole pickled module runs code when loaded: if you trust "
                "this file, pass --trust (trust=True)")


def saved(value, **kwargs) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer, **kwargs)
    return buffer.getvalue()


def torch_error(data: bytes, weights_only: bool = True) -> str:
    """The first line of what torch.load says of ``data``."""
    with pytest.raises(Exception) as caught:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    text = str(caught.value).strip()
    return text.splitlines()[0] if text else type(caught.value).__name__


def test_a_missing_file_is_named():
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file("/no/such/policy.pt")
    assert str(caught.value) == "/no/such/policy.pt: no such file"


#: How a refusal of a file torch.save did not write says what torch.save writes.
TORCH_SAVE = ("torch.save writes a zip archive holding data.pkl, or, before torch 1.6, a pickle that starts with "
              "torch's magic number")


@pytest.mark.parametrize("trust", [False, True])
def test_junk_is_no_torch_file_whatever_trust_and_the_bytes_are_named_as_given(trust):
    data = b"junk bytes, not a pickle"
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(data, trust=trust)
    assert str(caught.value) == f"the torch file is not a file torch.save wrote: it starts with b'junk byt', and {TORCH_SAVE}"
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(data, what="policy.pth in model.zip")
    assert str(caught.value).startswith("policy.pth in model.zip is not a file torch.save wrote: ")


def test_a_torch_archive_torch_cannot_read_gets_torchs_first_line():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("archive/data.pkl", b"junk, not a pickle")
    data = buffer.getvalue()
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(data)
    assert str(caught.value) == f"the torch file is not a readable torch file: {torch_error(data)}"


def test_an_empty_file_or_member_is_said_to_be_empty(tmp_path):
    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(path)
    assert str(caught.value) == f"{path} is empty"
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(b"", what="policy.pth in model.zip")
    assert str(caught.value) == "policy.pth in model.zip is empty"


def _onnx_model(path):
    x = onnx.helper.make_tensor_value_info("obs", onnx.TensorProto.FLOAT, [1, 2])
    y = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["obs"], ["logits"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), path)


#: Files torch.save did not write, how each is made, and what the refusal says it is.
NOT_TORCH = {
    "an ONNX model": (_onnx_model, "an ONNX model, not a file torch.save wrote"),
    "an .npy": (lambda p: np.save(p.open("wb"), np.zeros(3)), "a NumPy array (.npy), not a file torch.save wrote"),
    "an .npz": (lambda p: np.savez(p.open("wb"), w=np.zeros(3)),
                "an .npz archive of arrays, not a file torch.save wrote (torch.save writes a zip archive holding "
                "data.pkl, or, before torch 1.6, a pickle that starts with torch's magic number); policyport converts "
                "it with --from npz"),
    "a pickle of arrays": (lambda p: p.write_bytes(pickle.dumps({"w": np.zeros(3)}, protocol=4)),
                           "a Python pickle, not a file torch.save wrote"),
    "a TorchScript file": (lambda p: torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(p)),
                           "a TorchScript file (torch.jit.save), not a state_dict or a pickled module; policyport "
                           "converts it with --from torchscript, which loads it only with --trust: loading TorchScript "
                           "runs the code the file holds"),
}


@pytest.mark.parametrize("trust", [False, True])
@pytest.mark.parametrize("kind", list(NOT_TORCH))
def test_a_file_torch_save_did_not_write_is_named_for_what_it_is_and_trust_is_not_advised(tmp_path, kind, trust):
    make, said = NOT_TORCH[kind]
    path = tmp_path / "policy.pt"
    make(path)
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(path, trust=trust)
    assert str(caught.value).startswith(f"{path} is {said}")
    assert "pass --trust" not in str(caught.value)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_whole_pickled_module_is_refused_naming_its_class_and_loads_with_trust(tmp_path, legacy):
    linear = torch.nn.Linear(2, 3)
    path = tmp_path / "module.pt"
    path.write_bytes(saved(linear, _use_new_zipfile_serialization=not legacy))
    with pytest.raises(pp.UntrustedFileError) as caught:
        load_torch_file(path)
    assert str(caught.value) == f"{path} asks for torch.nn.modules.linear.Linear {REFUSAL_TAIL}"
    loaded = load_torch_file(path, trust=True)  # weights_only=False: the module itself
    assert isinstance(loaded, torch.nn.Linear)
    assert torch.equal(loaded.weight, linear.weight) and loaded.weight.device.type == "cpu"


class CallsSystem:
    def __reduce__(self):
        import os

        return os.system, ("true",)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_refusal_torch_does_not_name_is_named_from_the_pickle_or_said_in_general():
    """torch's weights-only reader stops at the legacy format's first pickle (protocol 4's FRAME),
    naming no GLOBAL: the global is then read from the pickle's opcodes, and a class policyport's own
    reader would rebuild inertly (Counter) is not named at all."""
    calls = saved(CallsSystem(), _use_new_zipfile_serialization=False, pickle_protocol=4)
    assert re.search(r"GLOBAL ([\w.]+)", torch_error(calls)) is None
    with pytest.raises(pp.UntrustedFileError) as caught:
        load_torch_file(calls, what="calls.pt")
    assert str(caught.value) == f"calls.pt asks for {CallsSystem().__reduce__()[0].__module__}.system {REFUSAL_TAIL}"
    counter = saved(collections.Counter(a=1), _use_new_zipfile_serialization=False, pickle_protocol=4)
    with pytest.raises(pp.UntrustedFileError) as caught:
        load_torch_file(counter, what="counter.pt")
    assert str(caught.value) == f"counter.pt asks for objects beyond tensors and containers {REFUSAL_TAIL}"


def test_tensors_of_every_container_become_numpy_and_everything_else_stays(tmp_path):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    bf = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    path = tmp_path / "mixed.pt"
    path.write_bytes(saved({"w": t, "bf": bf, "list": [t[0], 7], "tuple": (t[1],), "nested": {"n": 5, "s": "x"}}))
    got = load_torch_file(path)
    assert list(got) == ["w", "bf", "list", "tuple", "nested"]
    np.testing.assert_array_equal(got["w"], t.numpy())
    assert got["w"].dtype == np.float32 and isinstance(got["w"], np.ndarray)
    assert got["bf"].dtype.name == "bfloat16" and got["bf"].astype(np.float32).tolist() == [1.5, -2.25, 3.0]
    assert type(got["list"]) is list and isinstance(got["list"][0], np.ndarray) and got["list"][1] == 7
    np.testing.assert_array_equal(got["list"][0], [0.0, 1.0, 2.0])
    assert type(got["tuple"]) is tuple and got["tuple"][0].tolist() == [3.0, 4.0, 5.0]
    assert got["nested"] == {"n": 5, "s": "x"}


def test_bfloat16_without_ml_dtypes_is_refused_with_the_package_to_install(monkeypatch):
    data = saved({"w": torch.ones(2, dtype=torch.bfloat16)})
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(data)
    assert str(caught.value) == ("the torch file holds bfloat16 tensors, which numpy reads only with the ml_dtypes package "
                                 "(pip install ml_dtypes)")


def test_without_torch_the_zip_is_read_by_policyports_reader_naming_the_path(tmp_path, monkeypatch):
    t = torch.arange(4, dtype=torch.float32)
    good, legacy, junk = tmp_path / "sd.pt", tmp_path / "legacy.pt", tmp_path / "junk.pt"
    good.write_bytes(saved({"w": t}))
    legacy.write_bytes(saved({"w": t}, _use_new_zipfile_serialization=False))
    junk.write_bytes(b"not a zip")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert load_torch_file(good)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(legacy)
    assert str(caught.value).startswith(f"{legacy} is not a torch zip archive (torch >= 1.6 writes one); reading the "
                                        "legacy format needs torch installed")
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(junk)  # told before either reader: what it is, with torch or without
    assert str(caught.value) == f"{junk} is a text file, not a file torch.save wrote ({TORCH_SAVE})"
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(b"not a zip")  # bytes: named as the torch file, as with torch
    assert str(caught.value).startswith("the torch file is not a file torch.save wrote: it starts with b'not a zi'")
    with pytest.raises(pp.MissingDependencyError) as caught:
        load_torch_file(good, trust=True)
    assert str(caught.value) == ("loading a whole pickled torch module (--trust) needs the Python package 'torch', which "
                                 "is not installed; install it with: pip install 'policyport[torch]'")
    assert (caught.value.module, caught.value.extra) == ("torch", "torch")


def test_as_state_dict_says_what_the_file_holds_instead():
    with pytest.raises(pp.UntrustedFileError) as caught:
        as_state_dict(type("Policy", (Record,), {"global_name": "mymodule.Policy"})(), "policy.pt")
    assert str(caught.value) == ("policy.pt holds a whole pickled object (mymodule.Policy), not a state_dict; loading it "
                                 "runs code from the file: if you trust it, pass --trust (trust=True)")
    with pytest.raises(pp.BadModelError) as caught:
        as_state_dict([np.zeros(2)], "policy.pt")
    assert str(caught.value) == "policy.pt holds a list, not a state_dict (a mapping of parameter names to tensors)"
    with pytest.raises(pp.BadModelError) as caught:
        as_state_dict({"w": np.zeros(2), "meta": {"a": 1}}, "policy.pt")
    assert str(caught.value) == "policy.pt is not a flat state_dict: meta is not tensors"
    many = {f"k{i}": i for i in range(12)}
    with pytest.raises(pp.BadModelError) as caught:
        as_state_dict({"w": np.zeros(2), **many}, "policy.pt")
    assert str(caught.value) == f"policy.pt is not a flat state_dict: {', '.join(list(many)[:10])} are not tensors"
    assert list(as_state_dict({1: np.ones(1), "b": np.zeros(1)}, "p")) == ["1", "b"]


def layout_model(mapping: dict | None) -> onnx.ModelProto:
    model = onnx.ModelProto()
    if mapping is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = PARAMETERS_KEY, json.dumps(mapping)
    return model


def props(model) -> dict:
    return {p.key: json.loads(p.value) for p in model.metadata_props}


def test_the_layout_records_unread_integer_buffers_and_the_state_dicts_order():
    # initializer -> the source's name, or {"name": ..., "also": [names the same initializer stands for]}
    mapping = {"W": "fc.weight", "scale": {"name": "bn.weight", "also": ["bn.bias"]}, "mean": {"name": "bn.running_mean"}}
    state = {
        "bn.num_batches_tracked": np.array(7, np.int64),  # recorded as a value
        "fc.weight": np.zeros((2, 2), np.float32),
        "bn.bias": np.zeros(2, np.float32),  # mapped through "also"
        "bn.weight": np.ones(2, np.float32),
        "other.num_batches_tracked": np.array(1.0, np.float32),  # not an integer: left out
        "steps": np.array(3, np.int64),  # an integer not named num_batches_tracked: left out
        "big.num_batches_tracked": np.zeros(MAX_VALUE_ELEMENTS + 1, np.int32),  # too large for a value
        "edge.num_batches_tracked": np.arange(MAX_VALUE_ELEMENTS, dtype=np.uint8),  # exactly the limit
        "bn.running_mean": np.zeros(2, np.float32),
    }
    model = layout_model(mapping)
    assert keep_state_dict_layout(model, state) == ["bn.num_batches_tracked", "edge.num_batches_tracked"]
    got = props(model)
    assert got[ORDER_KEY] == ["bn.num_batches_tracked", "fc.weight", "bn.bias", "bn.weight", "edge.num_batches_tracked",
                              "bn.running_mean"]
    assert got[PARAMETERS_KEY] == {
        **mapping,
        "bn.num_batches_tracked": {"name": "bn.num_batches_tracked", "value": {"dtype": "int64", "shape": [], "data": [7]}},
        "edge.num_batches_tracked": {"name": "edge.num_batches_tracked",
                                     "value": {"dtype": "uint8", "shape": [MAX_VALUE_ELEMENTS], "data": list(range(MAX_VALUE_ELEMENTS))}},
    }
    keep_state_dict_layout(model, state)  # again: the entries are replaced, not added twice
    assert [p.key for p in model.metadata_props] == [PARAMETERS_KEY, ORDER_KEY] and props(model) == got
    model = layout_model(mapping)  # a live module's own entries: every small integer, whatever its name
    assert keep_state_dict_layout(model, state, every_integer=True) == [
        "bn.num_batches_tracked", "steps", "edge.num_batches_tracked"]
    assert props(model)[PARAMETERS_KEY]["steps"] == {"name": "steps", "value": {"dtype": "int64", "shape": [], "data": [3]}}
    assert "other.num_batches_tracked" not in props(model)[ORDER_KEY] and "big.num_batches_tracked" not in props(model)[ORDER_KEY]


def test_the_layout_of_a_model_without_parameter_metadata_holds_only_the_buffers():
    model = layout_model(None)
    keep_state_dict_layout(model, {"w": np.zeros(2, np.float32), "num_batches_tracked": np.array(2, np.int64)})
    assert props(model) == {PARAMETERS_KEY: {"num_batches_tracked": {"name": "num_batches_tracked",
                                                                     "value": {"dtype": "int64", "shape": [], "data": [2]}}},
                            ORDER_KEY: ["num_batches_tracked"]}


def test_an_sb3_zip_named_pt_is_told_apart_and_sent_to_from_sb3(tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app
    from torch_fixtures import SB3_DIR

    renamed = tmp_path / "policy.pt"
    renamed.write_bytes((SB3_DIR / "ppo_pendulum.zip").read_bytes())
    expected = (f"{renamed} is a Stable-Baselines3 save (a zip holding data and policy.pth), not a torch file; "
                "convert it with --from sb3")
    for kind in (None, "state-dict", "torchscript", "rllib-torch"):
        with pytest.raises(pp.UnreadableFileError) as caught:
            pp.convert(renamed, kind=kind)
        assert str(caught.value) == expected
    result = CliRunner().invoke(app, ["convert", str(renamed), "-o", str(tmp_path / "m.onnx")])
    assert (result.exit_code, result.stderr) == (3, f"error: {expected}\n")


@pytest.mark.parametrize("content, reason", [
    (b"", "is empty"),
    (saved({"w": torch.ones(3)})[:300], "is not a readable torch file (a damaged or truncated zip archive: File is not a zip file)"),
])
@pytest.mark.parametrize("kind", ["state-dict", "torchscript"])
def test_an_empty_or_truncated_torch_file_is_refused_saying_so(tmp_path, content, reason, kind):
    path = tmp_path / "policy.pt"
    path.write_bytes(content)
    with pytest.raises(pp.UnreadableFileError) as caught:
        pp.convert(path, kind=kind)
    assert str(caught.value) == f"{path} {reason}"


def test_the_cli_says_what_a_source_is_and_advises_trust_only_for_a_torch_pickle(tmp_path):
    """verify --source of a file that is not the model's source (an ONNX model, an .npy, a pickled
    VecNormalize), read as the state_dict the model records, and a TorchScript file converted as a
    state_dict: each is named for what it is (exit 3), never with advice to pass --trust (the TorchScript
    file is sent to --from torchscript, which needs it: its loading runs code)."""
    from typer.testing import CliRunner

    from policyport.cli import app

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).eval()
    torch.save(module.state_dict(), tmp_path / "seq.pt")
    torch.jit.save(torch.jit.script(module), str(tmp_path / "seq.torchscript.pt"))
    model = tmp_path / "m.onnx"
    onnx.save(pp.convert(tmp_path / "seq.pt", activation="tanh"), model)
    _onnx_model(tmp_path / "other.onnx")
    np.save(tmp_path / "obs.npy", np.zeros((2, 3), np.float32))
    (tmp_path / "vecnormalize.pkl").write_bytes(pickle.dumps({"obs_rms": collections.OrderedDict(mean=[0.0])}))

    def said(*args) -> tuple[int, str]:
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert "Traceback" not in result.output
        return result.exit_code, " ".join(result.output.split())

    for source, what in (("other.onnx", "an ONNX model"), ("obs.npy", "a NumPy array (.npy)"),
                         ("vecnormalize.pkl", "a Python pickle")):
        code, text = said("verify", model, "--source", tmp_path / source, "--samples", "4")
        assert code == 3 and f"{tmp_path / source} is {what}, not a file torch.save wrote" in text, text
        assert "--trust" not in text
    code, text = said("convert", tmp_path / "seq.torchscript.pt", "--from", "state-dict", "-o", tmp_path / "x.onnx")
    assert code == 3 and not (tmp_path / "x.onnx").exists()
    assert text == (f"error: {tmp_path / 'seq.torchscript.pt'} is a TorchScript file (torch.jit.save), not a state_dict "
                    "or a pickled module; policyport converts it with --from torchscript, which loads it only with "
                    "--trust: loading TorchScript runs the code the file holds")
    torch.save(module, tmp_path / "whole.pt")  # a torch pickle that asks for more than tensors: --trust is the remedy
    code, text = said("convert", tmp_path / "whole.pt", "-o", tmp_path / "x.onnx")
    assert code == 3 and text.endswith("if you trust this file, pass --trust (trust=True)")


def test_without_torch_a_damaged_storage_or_byte_order_is_unreadable(tmp_path, monkeypatch):
    import zipfile

    path = tmp_path / "sd.pt"
    path.write_bytes(saved({"w": torch.arange(64, dtype=torch.float32)}))
    with zipfile.ZipFile(path) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    storage = next(n for n in members if n.endswith("/data/0"))
    order = next(n for n in members if n.endswith("/byteorder"))
    offset = path.read_bytes().index(members[storage])
    damaged = bytearray(path.read_bytes())
    damaged[offset + 100] ^= 0xFF  # the storage's bytes no longer match its CRC
    bad_crc = tmp_path / "crc.pt"
    bad_crc.write_bytes(bytes(damaged))
    bad_order = tmp_path / "order.pt"
    with zipfile.ZipFile(bad_order, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, b"\x80middle" if name == order else data)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(bad_crc)
    assert str(caught.value) == f"{bad_crc} is a damaged torch zip archive: Bad CRC-32 for file '{storage}'"
    with pytest.raises(pp.UnreadableFileError) as caught:
        load_torch_file(bad_order)
    assert str(caught.value) == f"{bad_order}: its byteorder member says '\ufffdmiddle', not little or big"
