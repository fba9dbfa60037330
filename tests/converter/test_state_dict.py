"""state_dict files: read safely with or without torch, laid out from their keys (nn.Sequential, SB3,
RLlib torch), converted by build.py, verified against torch, and given back bit for bit by extract."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source
from policyport.converter.sources.reference import reference_forward, torch_forward
from policyport.converter.readers.torch_files import _read_safetensors_layout, read_safetensors, read_torch_zip

from torch_fixtures import CARTPOLE, ROOT, SB3_DIR, TORCH_DIR, load_module, observations

torch = pytest.importorskip("torch")

STATE_DICTS = sorted(TORCH_DIR.glob("*.state_dict.pt"))


def sb3_policy_pth(zip_path, tmp_path):
    out = tmp_path / f"{zip_path.stem}.pth"
    with zipfile.ZipFile(zip_path) as zf:
        out.write_bytes(zf.read("policy.pth"))
    return out


@pytest.mark.parametrize("path", [*STATE_DICTS, CARTPOLE, *sorted(SB3_DIR.glob("*.zip"))], ids=lambda p: p.name)
def test_the_reader_without_torch_matches_torch_load_bit_for_bit(path, tmp_path):
    if path.suffix == ".zip":
        path = sb3_policy_pth(path, tmp_path)
    ours = read_torch_zip(path)
    theirs = torch.load(path, weights_only=True)
    assert list(ours) == list(theirs)
    for key, tensor in theirs.items():
        expected = tensor.numpy()
        assert ours[key].dtype == expected.dtype and ours[key].shape == expected.shape, key
        assert ours[key].tobytes() == expected.tobytes(), key


def test_the_reader_without_torch_reads_views_and_refuses_what_it_cannot_rebuild(tmp_path):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    path = tmp_path / "views.pt"
    torch.save({"t": base.t(), "slice": base[1:3, 2:], "half": torch.ones(3, dtype=torch.float16)}, path)
    got = read_torch_zip(path)
    np.testing.assert_array_equal(got["t"], base.t().numpy())
    np.testing.assert_array_equal(got["slice"], base[1:3, 2:].numpy())
    assert got["half"].dtype == np.float16
    module_path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), module_path)
    from policyport.converter.readers.torch_files import as_state_dict

    with pytest.raises(pp.UntrustedFileError, match=r"torch\.nn\.modules\.linear\.Linear.*--trust"):
        as_state_dict(read_torch_zip(module_path), module_path)


def _crafted_pt(path, size=(4,), stride=(1,), offset=0, data=None, pid=None, prefix="bad/", byteorder=None):
    """A torch zip whose one tensor "w" is rebuilt from a float32 storage "0" of 4 elements with the given
    size, stride and offset (what torch writes, but with values torch would never write)."""
    import collections
    import io

    class Storage:
        pass

    class Tensor:
        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, (storage, offset, size, stride, False, collections.OrderedDict())

    storage = Storage()

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if obj is not storage:
                return None
            return ("storage", torch.FloatStorage, "0", "cpu", 4) if pid is None else pid

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({"w": Tensor()})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{prefix}data.pkl", buf.getvalue())
        if byteorder is not None:
            zf.writestr(f"{prefix}byteorder", byteorder)
        if data is not False:
            zf.writestr(f"{prefix}data/0", np.arange(4, dtype="<f4").tobytes() if data is None else data)
    return path


def test_a_crafted_torch_zip_reads_views_at_an_offset_and_in_either_byte_order(tmp_path):
    got = read_torch_zip(_crafted_pt(tmp_path / "a.pt", size=(2, 2), stride=(1, 2), prefix=""))["w"]
    assert got.dtype == np.float32 and got.flags.writeable and got.tolist() == [[0.0, 2.0], [1.0, 3.0]]
    assert read_torch_zip(_crafted_pt(tmp_path / "b.pt", size=(3,), offset=1))["w"].tolist() == [1.0, 2.0, 3.0]
    assert read_torch_zip(_crafted_pt(tmp_path / "c.pt", size=(0, 3), stride=(3, 1)))["w"].shape == (0, 3)
    big = read_torch_zip(_crafted_pt(tmp_path / "d.pt", data=np.arange(4, dtype=">f4").tobytes(), byteorder="big\n"))
    assert big["w"].dtype == np.float32 and big["w"].dtype.byteorder in "=<" and big["w"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("crafted, error, message", [
    (dict(size=(400,)), pp.UnreadableFileError, "{path} holds a tensor reaching outside its storage (size (400,), "
                                                "stride (1,))"),
    (dict(size=(4,), offset=1), pp.UnreadableFileError, "{path} holds a tensor reaching outside its storage (size (4,), "
                                                        "stride (1,))"),
    (dict(size=(2, 2), stride=(2,)), pp.UnreadableFileError, "{path} holds a malformed tensor (size (2, 2), stride (2,), "
                                                             "offset 0)"),
    (dict(offset=-1), pp.UnreadableFileError, "{path} holds a malformed tensor (size (4,), stride (1,), offset -1)"),
    (dict(size=(2,), stride=(-1,)), pp.UnreadableFileError, "{path} holds a malformed tensor (size (2,), stride (-1,), "
                                                            "offset 0)"),
    (dict(data=b"\x00" * 12), pp.UnreadableFileError, "{path}: storage 0 holds 12 bytes, expected 4 x 4"),
    (dict(data=False), pp.UnreadableFileError, "{path} lacks the storage bad/data/0"),
    (dict(pid=("storage", "float", "0", "cpu", 4)), pp.UntrustedFileError,
     "{path} holds a persistent id this reader does not rebuild: ('storage', 'float', '0', 'cpu', 4)"),
    (dict(pid=("module", torch.FloatStorage, "0", "cpu", 4)), pp.UntrustedFileError,
     "{path} holds a persistent id this reader does not rebuild: ('module', "),
])
def test_a_crafted_torch_zip_is_refused_saying_why(tmp_path, crafted, error, message):
    path = _crafted_pt(tmp_path / "bad.pt", **crafted)
    with pytest.raises(error) as caught:
        read_torch_zip(path)
    assert str(caught.value).startswith(message.replace("{path}", str(path)))
    with pytest.raises(error, match=r"^policy\.pth[ :]"):
        read_torch_zip(path, what="policy.pth")


def test_a_file_that_is_no_torch_zip_is_refused_saying_what_to_do(tmp_path):
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(b"\x80\x02not a zip")
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_torch_zip(legacy)
    assert str(caught.value) == (f"{legacy} is not a torch zip archive (torch >= 1.6 writes one); reading the legacy "
                                 "format needs torch installed: pip install 'policyport[torch]'")
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as zf:
        zf.writestr("a/data.pkl", b"")
        zf.writestr("data.pkl", b"")
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_torch_zip(two)
    assert str(caught.value) == f"{two} is a zip archive but not a torch file (no single data.pkl)"


def test_safetensors_library_and_layout_reader_agree(tmp_path):
    from safetensors.numpy import save_file

    state = {k: v.numpy() for k, v in load_module("norms")[0].state_dict().items()}
    path = tmp_path / "norms.safetensors"
    save_file(state, str(path))
    for reader in (read_safetensors, _read_safetensors_layout):
        got = reader(path)
        assert sorted(got) == sorted(state)
        assert all(got[k].dtype == state[k].dtype and got[k].tobytes() == state[k].tobytes() for k in state)
    from_pt = pp.convert(TORCH_DIR / "norms.state_dict.pt", activation="tanh,relu")
    from_st = pp.convert(path, activation="tanh,relu")
    assert {t.name: t.raw_data for t in from_pt.graph.initializer} == {t.name: t.raw_data for t in from_st.graph.initializer}
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(pp.UnreadableFileError, match="offsets|do not fit"):
        _read_safetensors_layout(truncated)


@pytest.mark.parametrize("name, activation", [("norms", "tanh,relu"), ("float64", "tanh,relu")])
@pytest.mark.parametrize("batch", [1, 7])
def test_a_sequential_state_dict_matches_the_module_layer_by_layer(name, activation, batch):
    module, shape = load_module(name)
    dtype = np.float64 if name == "float64" else np.float32
    c = convert_source(TORCH_DIR / f"{name}.state_dict.pt", activation=activation)
    obs = observations(shape, batch, dtype)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    report = pp.verify(c.model, obs, reference=c.reference, atol=tol, rtol=tol)
    assert report.passed
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(pp.load(c.model, backend="onnxruntime").run({"obs": obs})["logits"], expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, rtol=tol, atol=tol)
    weights = pp.extract_weights(c.model)
    state = {k: v.numpy() for k, v in module.state_dict().items()}
    assert list(weights) == list(state)  # num_batches_tracked included, in the state_dict's order
    assert all(weights[k].dtype == state[k].dtype and weights[k].tobytes() == state[k].tobytes() for k in state)


def test_numpy_and_torch_references_agree_on_every_tensor():
    from policyport.converter.sources.state_dict import parse_layout, read_arrays

    arrays, _ = read_arrays(TORCH_DIR / "norms.state_dict.pt")
    spec, _, _ = parse_layout(arrays, "sequential", "tanh,relu", False)
    obs = observations((5,), 7)
    a, b = reference_forward(spec, obs), torch_forward(spec, obs)
    assert list(a) == list(b) == ["0/linear", "1/layer_norm", "2/tanh", "4/linear", "5/batch_norm", "6/relu", "logits"]
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_a_state_dict_names_what_it_cannot_tell_and_what_does_not_fit(tmp_path):
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(TORCH_DIR / "norms.state_dict.pt")
    assert str(caught.value) == (
        "nn.Sequential: the state_dict does not say which activation modules sit at 2, 3, 6 (they hold no parameters); "
        "name them with --activation (activation= in Python), one per module (3 names, linear for a Dropout, which "
        "does nothing in eval mode), or one per run of modules in a row (2 names; the others in a run are then taken "
        "for Dropout) (e.g. --activation tanh,relu)")
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(TORCH_DIR / "norms.state_dict.pt", activation="tanh,relu,elu,selu,gelu")
    assert str(caught.value) == (
        "nn.Sequential: --activation (activation=) gives 5 activations; the state_dict holds 3 parameter-free modules "
        "(2, 3, 6) in 2 runs of modules in a row (2 to 3, 6): give one per module, in order (3 names, linear for a "
        "Dropout), or one per run (2 names; the others in a run are then taken for Dropout)")
    path = tmp_path / "odd.pt"
    torch.save({"0.weight": torch.zeros(3, 2), "encoder.gamma": torch.zeros(3), "head.kernel": torch.zeros(3, 3)}, path)
    with pytest.raises(pp.BadModelError, match=r"2 key\(s\) do not fit: encoder\.gamma, head\.kernel"):
        pp.convert(path)


@pytest.mark.parametrize("kind", ["state-dict", "rllib-torch"])
def test_rllib_torch_weights_match_the_network(kind):
    net, shape = load_module("rllib_fcnet")
    path = TORCH_DIR / "rllib_fcnet.state_dict.pt"
    c = convert_source(path, kind=kind, keep_value=True, head="diag-gaussian", activation="tanh")
    names = {n.output[0] for n in c.model.graph.node}
    assert {"_hidden_layers.0._model.0/linear", "_hidden_layers.0._model.1/tanh", "_value_branch_separate.0._model.1/tanh"} <= names
    obs = observations(shape, 7)
    assert pp.verify(c.model, obs, reference=c.reference).passed
    with torch.no_grad():
        logits, value = net(torch.as_tensor(obs))
    got = pp.load(c.model, backend="onnxruntime").run({"obs": obs})
    np.testing.assert_allclose(got["logits"], logits.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["value"], value.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["action"], got["logits"][:, :2])
    weights = pp.extract_weights(c.model)
    assert all(weights[k].tobytes() == v.numpy().tobytes() for k, v in net.state_dict().items())


def test_conversion_without_torch_gives_the_same_model(tmp_path):
    """A state_dict and an SB3 zip convert with torch unimportable (the zip reader and the numpy
    reference), to the very model the torch path gives."""
    script = f"""
import sys
sys.modules["torch"] = None  # import torch fails
import policyport as pp
from typer.testing import CliRunner

from policyport.cli import app
from policyport.converter import convert_source
for src, opts in [({str(TORCH_DIR / 'norms.state_dict.pt')!r}, dict(activation="tanh,relu")), ({str(CARTPOLE)!r}, {{}})]:
    c = convert_source(src, **opts)
    assert pp.verify(c.model, reference=c.reference, samples=50).passed
    report = pp.verify(c.model, source=src, samples=50)  # what verify --source does: the numpy forward
    assert report.passed and report.reference == "source"
    open({str(tmp_path)!r} + "/" + src.rsplit("/", 1)[1] + ".onnx", "wb").write(c.model.SerializeToString())
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m.split(".")[0] == "torch"]
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    for src, opts in [(TORCH_DIR / "norms.state_dict.pt", dict(activation="tanh,relu")), (CARTPOLE, {})]:
        with_torch = pp.convert(src, **opts)
        without = (tmp_path / f"{src.name}.onnx").read_bytes()
        assert with_torch.SerializeToString() == without


def test_the_cli_converts_a_state_dict_and_verifies_it_against_the_source(tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    out = tmp_path / "norms.onnx"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(TORCH_DIR / "norms.state_dict.pt"), "-o", str(out),
                                 "--activation", "tanh,relu", "--samples", "64", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "state-dict" and doc["verification"]["passed"]
    result = runner.invoke(app, ["verify", str(out), "--source", str(TORCH_DIR / "norms.state_dict.pt"), "--json"])
    assert result.exit_code == 0, result.output
    assert {c["tensor"] for c in json.loads(result.stdout)["comparisons"] if c["reference"] == "source"} >= {"5/batch_norm", "logits"}
    result = runner.invoke(app, ["convert", str(TORCH_DIR / "norms.state_dict.pt"), "-o", str(tmp_path / "x.onnx")])
    assert result.exit_code == 2 and "--activation" in result.stderr and not (tmp_path / "x.onnx").exists()


def test_rllib_weights_as_a_dict_of_arrays_convert_like_the_file():
    """RLlib's ``policy.get_weights()`` hands the torch layout over as a dict of numpy arrays."""
    net, shape = load_module("rllib_fcnet")
    weights = {k: v.numpy() for k, v in net.state_dict().items()}
    from_dict = convert_source(weights, kind="rllib-torch", head="diag-gaussian", activation="tanh")
    from_file = convert_source(TORCH_DIR / "rllib_fcnet.state_dict.pt", kind="rllib-torch", head="diag-gaussian",
                               activation="tanh")
    assert from_dict.model.graph == from_file.model.graph
    assert pp.verify(from_dict.model, observations(shape, 7), reference=from_dict.reference).passed


def test_sb3_policy_state_dicts_without_their_zip(tmp_path):
    """policy.pth alone: the layout is SB3's, the action space unknown, which the assumptions say."""
    from policyport.converter.assumptions import Assumption

    settle = "convert the SB3 zip, whose data records the action space"
    cartpole = convert_source(sb3_policy_pth(CARTPOLE, tmp_path), activation="tanh")
    assert [o.name for o in cartpole.model.graph.output] == ["logits", "action"]
    assert Assumption("action space", "Discrete: action = argmax of the logits", "a policy without log_std acts in a "
                      "Discrete or MultiDiscrete space, and a state_dict does not say which", settle) in cartpole.assumptions
    obs = observations((4,), 7)
    got = pp.load(cartpole.model).run({"obs": obs})
    np.testing.assert_array_equal(got["action"], np.argmax(got["logits"], axis=1))
    pendulum = convert_source(sb3_policy_pth(SB3_DIR / "ppo_pendulum.zip", tmp_path), activation="relu")
    assert Assumption("action bounds", "none: the action is the Gaussian mean, unclipped", "a state_dict does not hold "
                      "the action space, whose bounds SB3's predict clips the mean to", settle) in pendulum.assumptions
    obs = observations((3,), 7) * 100  # far outside the bounds: nothing clips
    got = pp.load(pendulum.model).run({"obs": obs})
    np.testing.assert_array_equal(got["action"], got["logits"][:, :1])
    sac = convert_source(sb3_policy_pth(SB3_DIR / "sac_pendulum.zip", tmp_path), activation="relu")
    got = pp.load(sac.model).run({"obs": obs})
    assert np.all(np.abs(got["action"]) <= 1)
    assert Assumption("action bounds", "[-1, 1]: the action is tanh's output, not rescaled",
                      "a state_dict does not hold the action space", settle) in sac.assumptions
    np.testing.assert_allclose(got["action"], np.tanh(got["logits"]), rtol=1e-6, atol=1e-6)


def test_sb3_shared_layers_feed_both_branches(tmp_path):
    """SB3 < 1.8 wrote net_arch=[64, dict(pi=[...], vf=[...])] as mlp_extractor.shared_net before both branches."""
    torch.manual_seed(1)
    shared = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh())
    pi = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    vf = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    action_net, value_net = torch.nn.Linear(8, 3), torch.nn.Linear(8, 1)
    state = {**{f"mlp_extractor.shared_net.{k}": v for k, v in shared.state_dict().items()},
             **{f"mlp_extractor.policy_net.{k}": v for k, v in pi.state_dict().items()},
             **{f"mlp_extractor.value_net.{k}": v for k, v in vf.state_dict().items()},
             **{f"action_net.{k}": v for k, v in action_net.state_dict().items()},
             **{f"value_net.{k}": v for k, v in value_net.state_dict().items()}}
    path = tmp_path / "shared.pt"
    torch.save(state, path)
    c = convert_source(path, keep_value=True, activation="tanh")
    obs = observations((5,), 7)
    with torch.no_grad():
        latent = shared(torch.as_tensor(obs))
        logits, value = action_net(pi(latent)).numpy(), value_net(vf(latent)).numpy()
    got = pp.load(c.model, backend="onnxruntime").run({"obs": obs})
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["value"], value, rtol=1e-5, atol=1e-5)
    assert "mlp_extractor.shared_net.1/tanh" in {n.output[0] for n in c.model.graph.node}
    assert pp.verify(c.model, obs, reference=c.reference).passed


def _safetensors(path, header, body=b"", length=None):
    """A .safetensors file: 8-byte little-endian header length, JSON header, data."""
    text = json.dumps(header).encode()
    path.write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + body)
    return path


def test_the_layout_reader_skips_metadata_and_keeps_shapes_dtypes_and_empty_tensors(tmp_path):
    body = np.arange(6, dtype="<f4").tobytes() + np.array([-2, 3], "<i2").tobytes()
    path = _safetensors(tmp_path / "m.safetensors", {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "empty": {"dtype": "I64", "shape": [0], "data_offsets": [24, 24]},
        "steps": {"dtype": "I16", "shape": [2], "data_offsets": [24, 28]}}, body)
    for reader in (read_safetensors, _read_safetensors_layout):
        got = reader(path)
        assert list(got) == ["w", "empty", "steps"]
        assert got["w"].dtype == np.float32 and got["w"].shape == (2, 3) and got["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert got["empty"].dtype == np.int64 and got["empty"].shape == (0,)
        assert got["steps"].dtype == np.int16 and got["steps"].tolist() == [-2, 3]


def test_the_layout_reader_names_what_is_wrong(tmp_path):
    def refused(path, message):
        with pytest.raises(pp.UnreadableFileError) as caught:
            _read_safetensors_layout(path)
        assert str(caught.value) == message.replace("{path}", str(path))

    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x00" * 7)
    refused(short, "{path} is not a .safetensors file: 7 bytes")
    empty_header = tmp_path / "eight.safetensors"
    empty_header.write_bytes(b"\x00" * 8)
    with pytest.raises(pp.UnreadableFileError, match=r"is not a .safetensors file: its header is not valid JSON: Expecting value"):
        _read_safetensors_layout(empty_header)
    text_length = len(json.dumps({}).encode())
    assert _read_safetensors_layout(_safetensors(tmp_path / "exact.safetensors", {}, length=text_length)) == {}
    long = _safetensors(tmp_path / "long.safetensors", {}, length=text_length + 1)
    refused(long, "{path} is not a .safetensors file: header length 3 exceeds the file")
    huge = _safetensors(tmp_path / "huge.safetensors", {}, length=2**64 - 1)
    refused(huge, "{path} is not a .safetensors file: header length 18446744073709551615 exceeds the file")
    entry = {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}
    refused(_safetensors(tmp_path / "c64.safetensors", {"z": entry}, b"\x00" * 8),
            f"{{path}}: tensor 'z' has a malformed header entry {entry!r}")
    refused(_safetensors(tmp_path / "off.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
                         b"\x00" * 8),
            "{path}: tensor 'w' offsets 0..4 do not fit shape (2,) float32 within 8 data bytes")
    refused(tmp_path / "missing.safetensors", "cannot read {path}: [Errno 2] No such file or directory: '{path}'")
    with pytest.raises(pp.UnreadableFileError, match=rf"^{short} is not a readable .safetensors file: "):
        read_safetensors(short)


def test_without_the_safetensors_library_the_layout_reader_reads_the_file_and_names_it(tmp_path, monkeypatch):
    body = np.arange(4, dtype="<f4").tobytes()
    path = _safetensors(tmp_path / "m.safetensors", {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, body)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)  # as on a machine without safetensors
    got = read_safetensors(path)
    assert list(got) == ["w"] and got["w"].dtype == np.float32 and got["w"].tolist() == [[0, 1], [2, 3]]
    bf16 = _safetensors(tmp_path / "bf16.safetensors", {"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}},
                        b"\x80\x3f\x00\x40")
    assert read_safetensors(bf16)["w"].astype(np.float32).tolist() == [1.0, 2.0]
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_safetensors(bf16)
    assert str(caught.value) == (f"{bf16} holds bfloat16 tensors, which numpy reads only with the ml_dtypes package "
                                 "(pip install ml_dtypes)")


def test_rllib_torch_state_dicts_parse_with_their_notes_log_std_and_refusals():
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_rllib_torch

    rng = np.random.default_rng(25)

    def linear(prefix, out, inp):
        return {f"{prefix}.weight": rng.normal(size=(out, inp)).astype(np.float32),
                f"{prefix}.bias": rng.normal(size=out).astype(np.float32)}

    arrays = {**linear("_hidden_layers.0._model.0", 4, 3), **linear("_hidden_layers.1._model.0", 4, 4),
              **linear("_logits._model.0", 2, 4), **linear("_value_branch_separate.0._model.0", 5, 3),
              **linear("_value_branch._model.0", 1, 5), "_append_free_log_std.log_std": np.array([0.5], np.float32)}
    tanh = parse_activation("tanh")
    spec, notes = parse_rllib_torch(arrays, tanh)
    assert notes == ["the value function (_value_branch) is not exported; --keep-value exports it as 'value'"]
    assert [d.name for d in spec.hidden] == ["_hidden_layers.0._model.0", "_hidden_layers.1._model.0"]
    assert [[(s.kind, s.scope, s.activation) for s in d.post] for d in spec.hidden] == [
        [("activation", "_hidden_layers.0._model.1", tanh)], [("activation", "_hidden_layers.1._model.1", tanh)]]
    assert (spec.value_hidden, spec.value_output, spec.free_log_std_name) == ([], None, "_append_free_log_std.log_std")
    assert spec.free_log_std.tobytes() == arrays["_append_free_log_std.log_std"].tobytes()
    kept, notes = parse_rllib_torch(arrays, None, keep_value=True)
    assert notes == [] and kept.value_output.name == "_value_branch._model.0"
    assert [d.name for d in kept.value_hidden] == ["_value_branch_separate.0._model.0"]
    assert all(d.post == [] for d in kept.hidden + kept.value_hidden)  # a linear network: no activation steps
    del arrays["_append_free_log_std.log_std"], arrays["_value_branch._model.0.weight"], arrays["_value_branch._model.0.bias"]
    spec, notes = parse_rllib_torch(arrays, tanh)
    assert notes == [] and (spec.free_log_std, spec.free_log_std_name) == (None, None)

    def refused(bad, message, error=pp.BadModelError, keep_value=False):
        with pytest.raises(error) as caught:
            parse_rllib_torch(bad, tanh, keep_value=keep_value)
        assert str(caught.value) == message

    refused(arrays, "a value branch was asked for (--keep-value), but the weights hold no _value_branch",
            error=pp.OptionError, keep_value=True)
    refused({**arrays, "encoder.weight": np.zeros((1, 1)), "_logits.bias": np.zeros(1)},
            "keys that do not fit RLlib's torch FullyConnectedNetwork: _logits.bias, encoder.weight")
    refused({k: v for k, v in arrays.items() if not k.startswith("_logits")},
            "no _logits._model.0.weight: RLlib's FullyConnectedNetwork has a _logits layer")
    gap = {k.replace("_hidden_layers.1.", "_hidden_layers.2."): v for k, v in arrays.items()}
    refused(gap, "_hidden_layers.<i> must be numbered 0..N-1 without gaps; found [0, 2]")


def test_sb3_actor_state_dicts_note_what_is_left_out_and_refuse_other_layouts_exactly():
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor

    rng = np.random.default_rng(26)
    relu = parse_activation("relu")

    def w(*shape):
        return rng.normal(size=shape).astype(np.float32)

    sac = {"actor.latent_pi.0.weight": w(4, 3), "actor.latent_pi.0.bias": w(4), "actor.mu.weight": w(2, 4),
           "actor.mu.bias": w(2), "actor.log_std.weight": w(2, 4), "actor.log_std.bias": w(2),
           "critic.qf0.0.weight": w(1, 5), "critic_target.qf0.0.weight": w(1, 5), "log_ent_coef": w(1)}
    spec, family, notes = parse_sb3_actor(sac, relu)
    assert family == "sac" and spec.output.name == "actor.mu" and [d.name for d in spec.hidden] == ["actor.latent_pi.0"]
    assert notes[:2] == ["not exported: critic, critic_target, log_ent_coef (the deterministic action needs the actor only)",
                         "actor.log_std (the state-dependent std) is not exported: the deterministic action does not use it"]
    td3 = {"actor.mu.0.weight": w(4, 3), "actor.mu.0.bias": w(4), "actor.mu.2.weight": w(2, 4), "actor.mu.2.bias": w(2)}
    spec, family, notes = parse_sb3_actor(td3, relu)
    assert (family, notes, [d.name for d in spec.hidden], spec.output.name) == ("td3", [], ["actor.mu.0"], "actor.mu.2")

    def refused(arrays, message):
        with pytest.raises(pp.BadModelError) as caught:
            parse_sb3_actor(arrays, relu)
        assert str(caught.value) == message

    extractor = {f"actor.features_extractor.cnn.{i}.weight": w(1) for i in range(5)}
    refused({**td3, **extractor}, "the actor has a features extractor with parameters (actor.features_extractor.cnn.0.weight, "
            "actor.features_extractor.cnn.1.weight, actor.features_extractor.cnn.2.weight, "
            "actor.features_extractor.cnn.3.weight): a CNN or custom extractor; policyport converts MLP policies only")
    refused({**sac, "actor.extra.weight": w(1)}, "keys that do not fit SB3's SAC actor: actor.extra.weight")
    refused({k: v for k, v in sac.items() if not k.startswith("actor.log_std")},
            "a SAC actor without actor.log_std: a gSDE actor, which policyport does not convert")
    refused({**td3, "actor.mu.x": w(1)}, "keys that do not fit SB3's TD3/DDPG actor (actor.mu.<i>): actor.mu.x")


def test_the_reader_without_torch_rebuilds_parameters_and_parameters_with_attributes(tmp_path):
    plain = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    tagged = torch.nn.Parameter(torch.tensor([1.5, -2.0], dtype=torch.float64), requires_grad=False)
    tagged.note = "kept by _rebuild_parameter_with_state"
    path = tmp_path / "params.pt"
    torch.save({"plain": plain, "tagged": tagged}, path)
    got = read_torch_zip(path)
    assert got["plain"].dtype == np.float32 and got["plain"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert got["tagged"].dtype == np.float64 and got["tagged"].tolist() == [1.5, -2.0]


def test_rllib_torch_is_the_layout_it_is_told_and_names_itself(tmp_path):
    path = TORCH_DIR / "rllib_fcnet.state_dict.pt"
    c = convert_source(path, kind="rllib-torch", activation="tanh")
    metadata = {p.key: p.value for p in c.model.metadata_props}
    assert c.kind == "rllib-torch" and metadata["policyport.layout"] == "rllib-torch"
    assert json.loads(metadata["policyport.source"])["kind"] == "rllib-torch"
    sequential = tmp_path / "sequential.pt"
    torch.save({"0.weight": torch.zeros(3, 2), "0.bias": torch.zeros(3)}, sequential)
    with pytest.raises(pp.BadModelError) as caught:  # read as RLlib's, not as the nn.Sequential its keys look like
        convert_source(sequential, kind="rllib-torch")
    assert str(caught.value) == "keys that do not fit RLlib's torch FullyConnectedNetwork: 0.bias, 0.weight"


def _actor(layout, dtype=np.float32, seed=27):
    """SB3 actor state_dicts: a SAC and a TD3 actor with a Dropout after their first Linear."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.normal(size=shape).astype(dtype)

    if layout == "sac":
        return {"actor.latent_pi.0.weight": w(4, 3), "actor.latent_pi.0.bias": w(4), "actor.latent_pi.3.weight": w(4, 4),
                "actor.latent_pi.3.bias": w(4), "actor.mu.weight": w(2, 4), "actor.mu.bias": w(2),
                "actor.log_std.weight": w(2, 4), "actor.log_std.bias": w(2)}
    return {"actor.mu.0.weight": w(4, 3), "actor.mu.0.bias": w(4), "actor.mu.3.weight": w(2, 4), "actor.mu.3.bias": w(2)}


@pytest.mark.parametrize("family, hidden, output, gap", [
    ("sac", ["actor.latent_pi.0", "actor.latent_pi.3"], "actor.mu", "actor.latent_pi.1 to actor.latent_pi.2"),
    ("td3", ["actor.mu.0"], "actor.mu.3", "actor.mu.1 to actor.mu.2"),
])
def test_an_sb3_actor_names_its_sequential_in_assumptions_and_refusals(family, hidden, output, gap):
    from policyport.converter.activations import parse_activation
    from policyport.converter.assumptions import Assumption
    from policyport.converter.sources.state_dict import MODULE_ITSELF, parse_sb3_actor

    relu = parse_activation("relu")
    spec, got_family, notes = parse_sb3_actor(_actor(family), relu)
    assert (got_family, [d.name for d in spec.hidden], spec.output.name) == (family, hidden, output)
    assert spec.assumptions == [Assumption(
        "layout", f"modules {gap} = one activation, then modules without effect in eval mode (Dropout)",
        "2 modules in a row hold no parameters, so the state_dict cannot say what they are", MODULE_ITSELF)]
    assert not any("Dropout" in n for n in notes)  # an assumption, no longer a note
    if family == "sac":  # the latent features end in an activation too (SB3's create_mlp)
        assert [(s.kind, s.scope) for s in spec.hidden[-1].post] == [("activation", "actor.latent_pi.4")]
    prefix = "actor.mu" if family == "td3" else "actor.latent_pi"
    norm_only = {k: v for k, v in _actor(family).items() if not k.startswith(f"{prefix}.")}
    norm_only[f"{prefix}.0.weight"] = np.ones(4, np.float32)  # a LayerNorm's, no Linear's
    with pytest.raises(pp.BadModelError) as caught:
        parse_sb3_actor(norm_only, relu)
    assert str(caught.value) == f"{prefix} has no Linear layer (no 2-D weight under {prefix}.)"


def test_an_sb3_state_dict_without_an_actor_has_no_actor_mu():
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor

    with pytest.raises(pp.BadModelError, match=r"^actor\.mu has no Linear layer$"):
        parse_sb3_actor({"critic.qf0.0.weight": np.zeros((1, 5), np.float32)}, parse_activation("relu"))


@pytest.mark.parametrize("family, arrays, kind, scope, assumed", [
    ("sac", _actor("sac"), "squash", "action",
     ("action bounds", "[-1, 1]: the action is tanh's output, not rescaled", "a state_dict does not hold the action space")),
    ("td3", _actor("td3"), "squash", "actor.mu.4",
     ("action bounds", "[-1, 1]: the action is tanh's output, not rescaled", "a state_dict does not hold the action space")),
    ("ac", {"action_net.weight": np.ones((2, 3), np.float32), "log_std": np.zeros(2, np.float32)}, "clip", "action",
     ("action bounds", "none: the action is the Gaussian mean, unclipped",
      "a state_dict does not hold the action space, whose bounds SB3's predict clips the mean to")),
    ("ac", {"action_net.weight": np.ones((2, 3), np.float32)}, "argmax", "action",
     ("action space", "Discrete: action = argmax of the logits",
      "a policy without log_std acts in a Discrete or MultiDiscrete space, and a state_dict does not say which")),
])
def test_a_bare_sb3_state_dict_gets_the_action_head_its_family_implies(family, arrays, kind, scope, assumed):
    from policyport.converter.activations import parse_activation
    from policyport.converter.assumptions import Assumption
    from policyport.converter.sources.state_dict import bare_actor_head, parse_sb3_actor, parse_sb3_actor_critic

    relu = parse_activation("relu")
    spec = parse_sb3_actor(arrays, relu)[0] if family != "ac" else parse_sb3_actor_critic(arrays, relu)[0]
    earlier = list(spec.assumptions)  # the parser's own (a Dropout gap in the actors)
    bare_actor_head(spec, family)
    assert spec.assumptions == [*earlier, Assumption(*assumed, "convert the SB3 zip, whose data records the action space")]
    action = spec.action
    assert (action.kind, action.tanh_scope) == (kind, scope)
    bounds = {"squash": (-1.0, 1.0), "clip": (-np.inf, np.inf), "argmax": None}[kind]
    if bounds is None:
        assert action.low is None and action.high is None
    else:
        for got, want in zip((action.low, action.high), bounds):
            assert got.dtype == np.float32 and got.shape == (2,) and np.all(got == want)
    untouched = parse_sb3_actor(_actor("td3"), relu)[0]
    before = list(untouched.assumptions)
    bare_actor_head(untouched, None)  # no family (a plain Sequential, RLlib): no head, nothing assumed
    assert untouched.action is None and untouched.assumptions == before


def test_a_state_dict_loaded_without_torch_is_never_taken_for_a_module(tmp_path, monkeypatch):
    from policyport.converter.sources.state_dict import read_arrays

    path = tmp_path / "w.npz"
    np.savez(path, **{"0.weight": np.ones((2, 3), np.float32)})
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    arrays, provenance = read_arrays(path, trust=True)
    assert list(arrays) == ["0.weight"] and provenance["file"] == "w.npz" and "sha256" in provenance


@pytest.mark.parametrize("crafted, message", [
    # the file's storage holds more bytes than the tensor's numel says: only numel elements are the storage
    (dict(size=(5,), data=np.arange(6, dtype="<f4").tobytes()),
     "{path} holds a tensor reaching outside its storage (size (5,), stride (1,))"),
    (dict(size=(2,), stride=(4,)), "{path} holds a tensor reaching outside its storage (size (2,), stride (4,))"),
    (dict(size=(2, 2), stride=(3, 1)), "{path} holds a tensor reaching outside its storage (size (2, 2), stride (3, 1))"),
])
def test_a_tensor_may_reach_only_the_elements_its_storage_declares(tmp_path, crafted, message):
    path = _crafted_pt(tmp_path / "bad.pt", **crafted)
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_torch_zip(path)
    assert str(caught.value) == message.replace("{path}", str(path))


def test_a_torch_zip_names_itself_in_the_restricted_unpicklers_refusal(tmp_path):
    import os

    class RunsCommand:
        def __reduce__(self):
            return os.system, ("true",)

    path = tmp_path / "hostile.pt"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("hostile/data.pkl", pickle.dumps({"w": RunsCommand()}, protocol=2))
    with pytest.raises(pp.UntrustedFileError, match=rf"^{path} asks to call {os.system.__module__}\.system while"):
        read_torch_zip(path)
    with pytest.raises(pp.UntrustedFileError, match=rf"^policy\.pth asks to call {os.system.__module__}\.system while"):
        read_torch_zip(path, what="policy.pth")


def test_bfloat16_storages_need_ml_dtypes_and_say_so(tmp_path, monkeypatch):
    path = tmp_path / "bf16.pt"
    torch.save({"w": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, path)
    got = read_torch_zip(path)["w"]
    assert got.dtype.name == "bfloat16" and got.astype(np.float32).tolist() == [1.5, -2.0]
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_torch_zip(path, what="policy.pth")
    assert str(caught.value) == ("policy.pth holds bfloat16 tensors, which numpy reads only with the ml_dtypes package "
                                 "(pip install ml_dtypes)")


@pytest.mark.parametrize("members, expected", [
    ({"data.pkl": "hostile"}, "posix.system"),  # a pickle at the archive's root, as torch also reads
    ({"model/data.pkl": "hostile"}, "posix.system"),
    ({"model/data.pkl": "plain"}, None),
    ({"a/data.pkl": "hostile", "b/data.pkl": "hostile"}, None),  # no single pickle: nothing to name
    ({"model/other.pkl": "hostile"}, None),
])
def test_the_refused_global_of_a_torch_zip_is_read_from_its_one_data_pkl(members, expected):
    import io

    from policyport.converter.readers.torch_files import _refused_global

    pickles = {"hostile": b"\x80\x02cposix\nsystem\nq\x00.", "plain": pickle.dumps({"w": np.zeros(2)}, protocol=2)}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, which in members.items():
            zf.writestr(name, pickles[which])
    assert _refused_global(io.BytesIO(buffer.getvalue())) == expected
    assert _refused_global(io.BytesIO(pickles["hostile"])) == "posix.system"  # not a zip: the pickle itself


def test_a_bare_sequential_without_a_linear_layer_is_refused_by_its_name():
    from policyport.converter.sources.state_dict import parse_sequential

    norm = {"0.weight": np.ones(3, np.float32), "0.bias": np.zeros(3, np.float32)}
    with pytest.raises(pp.BadModelError, match=r"^nn\.Sequential has no Linear layer \(no 2-D weight\)$"):
        parse_sequential(norm, "", None)
    with pytest.raises(pp.BadModelError, match=r"^policy has no Linear layer \(no 2-D weight under net\.\)$"):
        parse_sequential({f"net.{k}": v for k, v in norm.items()}, "net.", None, what="policy")


def _actor_critic(*, shared=(), pi=(8,), vf=(8,), value=True, log_std=True, gap=None, obs=5, actions=2, seed=3):
    """An SB3 ActorCriticPolicy state_dict (stable_baselines3/common/policies.py, torch_layers.py's MlpExtractor):
    Linear layers at even indices of each Sequential, their activations at the odd ones; ``gap`` names a
    Sequential whose second Linear sits two indices further (a Dropout after the activation)."""
    rng = np.random.default_rng(seed)
    arrays, width = {}, obs

    def sequential(name, sizes):
        nonlocal width
        index, start = 0, width
        for size in sizes:
            arrays[f"mlp_extractor.{name}.{index}.weight"] = rng.normal(size=(size, start)).astype(np.float32)
            arrays[f"mlp_extractor.{name}.{index}.bias"] = rng.normal(size=size).astype(np.float32)
            index += 4 if gap == name else 2
            start = size
        return start

    width = sequential("shared_net", shared)
    latent_pi, latent_vf = sequential("policy_net", pi), sequential("value_net", vf)
    arrays["action_net.weight"] = rng.normal(size=(actions, latent_pi)).astype(np.float32)
    arrays["action_net.bias"] = rng.normal(size=actions).astype(np.float32)
    if value:
        arrays["value_net.weight"] = rng.normal(size=(1, latent_vf)).astype(np.float32)
        arrays["value_net.bias"] = rng.normal(size=1).astype(np.float32)
    if log_std:
        arrays["log_std"] = np.full(actions, -0.5, np.float32)
    return arrays


VALUE_NOT_EXPORTED = "the value function (mlp_extractor.value_net, value_net) is not exported; --keep-value exports it as 'value'"
SHARES = "the value branch shares the policy's latent features"


@pytest.mark.parametrize("prefix", ["features_extractor.", "pi_features_extractor.", "vf_features_extractor."])
@pytest.mark.parametrize("count, listed", [(4, "{p}0.weight, {p}1.weight, {p}2.weight, {p}3.weight"),
                                           (5, "{p}0.weight, {p}1.weight, {p}2.weight, {p}3.weight ...")])
def test_an_sb3_extractor_with_parameters_is_refused_listing_four_of_them(prefix, count, listed):
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor_critic

    arrays = {**_actor_critic(), **{f"{prefix}{i}.weight": np.ones((2, 2), np.float32) for i in range(count)}}
    with pytest.raises(pp.BadModelError) as caught:
        parse_sb3_actor_critic(arrays, parse_activation("tanh"))
    assert str(caught.value) == (f"the policy has a features extractor with parameters ({listed.format(p=prefix)}): a CNN or "
                                 "custom extractor; policyport converts MLP policies (FlattenExtractor) only")


def test_an_sb3_actor_critic_state_dict_is_refused_exactly_where_it_does_not_fit():
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor_critic

    tanh = parse_activation("tanh")
    cases = [
        ({**_actor_critic(), "zeta": np.ones(1, np.float32), "critic.0.weight": np.ones((1, 1), np.float32)}, pp.BadModelError,
         "keys that do not fit SB3's ActorCriticPolicy: critic.0.weight, zeta"),
        ({k: v for k, v in _actor_critic().items() if not k.startswith("action_net.")}, pp.BadModelError,
         "no action_net.weight: an SB3 ActorCriticPolicy state_dict has one"),
        ({**_actor_critic(), "log_std": np.zeros((2, 8), np.float32)}, pp.BadModelError,
         "log_std has shape (2, 8): a gSDE policy (use_sde=True), whose exploration noise depends on the latent features; "
         "policyport converts the plain Gaussian policies (a log_std vector)"),
    ]
    for arrays, error, message in cases:
        with pytest.raises(error) as caught:
            parse_sb3_actor_critic(arrays, tanh)
        assert type(caught.value) is error and str(caught.value) == message
    with pytest.raises(pp.OptionError) as caught:
        parse_sb3_actor_critic(_actor_critic(value=False), tanh, keep_value=True)
    assert str(caught.value) == "a value branch was asked for (--keep-value), but the state_dict has no value_net"


@pytest.mark.parametrize("net", ["shared_net", "policy_net", "value_net"])
def test_an_sb3_actor_critic_names_each_sequential_in_its_assumptions(net):
    from policyport.converter.activations import parse_activation
    from policyport.converter.assumptions import Assumption
    from policyport.converter.sources.state_dict import MODULE_ITSELF, parse_sb3_actor_critic

    arrays = _actor_critic(shared=(6, 6), pi=(8, 8), vf=(8, 8), gap=net)
    spec, notes = parse_sb3_actor_critic(arrays, parse_activation("tanh"), keep_value=True)
    p = f"mlp_extractor.{net}"
    assert notes == []
    assert spec.assumptions == [Assumption("layout", f"modules {p}.1 to {p}.3 = one activation, then modules without effect in "
                                           "eval mode (Dropout)", "3 modules in a row hold no parameters, so the "
                                           "state_dict cannot say what they are", MODULE_ITSELF)]
    assert [d.name for d in spec.trunk + spec.hidden + spec.value_hidden] == [
        "mlp_extractor.shared_net.0", f"mlp_extractor.shared_net.{4 if net == 'shared_net' else 2}",
        "mlp_extractor.policy_net.0", f"mlp_extractor.policy_net.{4 if net == 'policy_net' else 2}",
        "mlp_extractor.value_net.0", f"mlp_extractor.value_net.{4 if net == 'value_net' else 2}"]


@pytest.mark.parametrize("arrays, keep_value, notes, value_layers", [
    (_actor_critic(), False, [VALUE_NOT_EXPORTED], []),
    (_actor_critic(), True, [], ["mlp_extractor.value_net.0"]),
    (_actor_critic(vf=()), True, [SHARES], []),  # the value head on the policy's latent features
    (_actor_critic(pi=(), vf=(), shared=(6,)), True, [SHARES], []),  # a trunk alone: shared too
    (_actor_critic(pi=(), vf=()), True, [], []),  # linear heads on the observation: nothing shared
    (_actor_critic(value=False), False, [], []),
])
def test_an_sb3_actor_critic_keeps_its_value_branch_only_when_asked_and_says_what_it_shares(arrays, keep_value, notes,
                                                                                          value_layers):
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor_critic

    spec, got = parse_sb3_actor_critic(arrays, parse_activation("tanh"), keep_value=keep_value)
    assert got == notes
    assert [d.name for d in spec.value_hidden] == value_layers
    assert (spec.value_output is not None) == (keep_value and "value_net.weight" in arrays)
    assert spec.free_log_std_name == "log_std" and spec.free_log_std.tolist() == [-0.5, -0.5]
    spec, _ = parse_sb3_actor_critic(_actor_critic(log_std=False), parse_activation("tanh"))
    assert spec.free_log_std is None and spec.free_log_std_name is None


def _saved(tmp_path, arrays, name="sd.pt"):
    path = tmp_path / name
    torch.save({k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}, path)
    return path


def _metadata(model) -> dict:
    return {p.key: p.value for p in model.metadata_props}


@pytest.mark.parametrize("arrays, kind, options, layout, activation, op", [
    (_actor_critic(), None, {"activation": "relu"}, "sb3", "relu", "Relu"),
    (_actor("sac"), None, {"activation": "tanh"}, "sb3-actor", "tanh", "Tanh"),
    (None, "rllib-torch", {"activation": "tanh"}, "rllib-torch", "tanh", "Tanh"),
    ({"0.weight": np.ones((3, 2), np.float32), "2.weight": np.ones((1, 3), np.float32)}, None, {"activation": "elu"},
     "sequential", "elu", "Elu"),
    ({"0.weight": np.ones((3, 2), np.float32), "0.bias": np.zeros(3, np.float32)}, None, {}, "sequential", "none", None),
])
def test_a_state_dict_records_its_layout_and_the_activation_it_was_read_with(tmp_path, arrays, kind, options, layout,
                                                                              activation, op):
    path = TORCH_DIR / "rllib_fcnet.state_dict.pt" if arrays is None else _saved(tmp_path, arrays)
    if op is not None:  # a state_dict records no activation: none is taken by default, whatever the layout
        with pytest.raises(pp.OptionError, match=r"with --activation"):
            convert_source(path, kind=kind)
    c = convert_source(path, kind=kind, **options)
    metadata = _metadata(c.model)
    assert (metadata["policyport.layout"], metadata["policyport.activation"]) == (layout, activation)
    assert json.loads(metadata["policyport.source"])["layout"] == layout
    ops = {n.op_type for n in c.model.graph.node}
    if op is None:  # a single Linear: no activation node at all
        assert not ops & {"Tanh", "Relu", "Elu"}
    else:
        assert op in ops


def test_a_state_dict_converts_at_the_opset_and_input_shape_asked_for(tmp_path):
    from policyport.converter.assumptions import Assumption
    from policyport.converter.sources.state_dict import MODULE_ITSELF

    arrays = {"2.weight": np.ones((3, 6), np.float32), "2.bias": np.zeros(3, np.float32)}  # 0..1: a Flatten
    c = convert_source(_saved(tmp_path, arrays), opset=13, input_shape=(2, 3))
    assert c.model.opset_import[0].version == 13
    assert [d.dim_value for d in c.model.graph.input[0].type.tensor_type.shape.dim[1:]] == [2, 3]
    assert Assumption("layout", "modules 0 to 1 = nn.Flatten", "they hold no parameters before the first layer, so the "
                      "state_dict cannot say what they are", MODULE_ITSELF) in c.assumptions
    assert not any("nn.Flatten" in n for n in c.notes)  # an assumption, no longer a note
    one = convert_source(_saved(tmp_path, {"1.weight": np.ones((3, 6), np.float32)}, "one.pt"), input_shape=(2, 3))
    assert Assumption("layout", "module 0 = nn.Flatten", "it holds no parameters before the first layer, so the "
                      "state_dict cannot say what they are", MODULE_ITSELF) in one.assumptions
    obs = observations((2, 3), 4)
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], obs.reshape(4, 6) @ np.ones((6, 3)), rtol=1e-6)
    assert pp.verify(c.model, obs, reference=c.reference).passed  # torch's nn.Flatten in the reference


@pytest.mark.parametrize("family", ["sac", "td3"])
def test_a_head_is_refused_for_an_sb3_actor_naming_its_family(tmp_path, family):
    with pytest.raises(pp.OptionError) as caught:
        convert_source(_saved(tmp_path, _actor(family)), head="diag-gaussian", activation="relu")
    assert str(caught.value) == f"--head does not apply to an SB3 {family.upper()} actor: its action is the squashed mean"


def test_a_state_dicts_reference_computes_the_head_asked_for(tmp_path):
    c = convert_source(_saved(tmp_path, _actor_critic()), head="diag-gaussian", activation="tanh")
    obs = observations((5,), 6)
    reference = c.reference(obs)
    assert {"logits", "action", "log_std"} <= set(reference)
    np.testing.assert_array_equal(reference["log_std"], np.full((6, 2), -0.5, np.float32))
    assert pp.verify(c.model, obs, reference=c.reference).passed


def test_a_whole_module_in_a_state_dict_file_converts_with_trust_as_a_state_dict_kind(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    path = tmp_path / "module.pt"
    torch.save(module, path)
    with pytest.raises(pp.UntrustedFileError):
        convert_source(path)
    c = convert_source(path, trust=True)
    assert c.kind == "state-dict"
    obs = observations((3,), 5)
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], expected, rtol=1e-5, atol=1e-6)


MODULE_ONLY = ("(--exporter, --output-names apply to state-dict files holding a whole pickled module read with --trust, "
               "torch, torchscript)")


@pytest.mark.parametrize("options, message", [
    ({"exporter": "dynamo"}, "--exporter does not apply to a state_dict, which holds weights and no module code: "
                             "policyport builds its graph itself (--exporter applies to state-dict files holding a whole "
                             "pickled module read with --trust, torch, torchscript)"),
    ({"output_names": ("a", "b"), "exporter": "dynamo"},
     "--exporter, --output-names do not apply to a state_dict, which holds weights and no module code: policyport "
     f"builds its graph itself {MODULE_ONLY}"),
])
def test_a_state_dict_of_weights_refuses_the_options_of_a_module(tmp_path, options, message):
    with pytest.raises(pp.OptionError) as caught:
        convert_source(TORCH_DIR / "gaussian.state_dict.pt", **options)
    assert str(caught.value) == message
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(app, ["convert", str(TORCH_DIR / "gaussian.state_dict.pt"), "-o", str(out),
                                      "--output-names", "a,b", "--exporter", "dynamo"])
    assert result.exit_code == 2 and "--exporter, --output-names do not apply to a state_dict" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("options, message", [
    ({"keep_value": True}, "--keep-value does not apply to a whole pickled module: torch.onnx exports its forward as it "
                           "is, with its own layers, activations and outputs"),
    ({"activation": "relu", "head": "none"}, "--activation, --head do not apply to a whole pickled module: torch.onnx "
                                             "exports its forward as it is, with its own layers, activations and outputs"),
])
def test_a_whole_pickled_module_refuses_the_options_of_weights(tmp_path, options, message):
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)), path)
    with pytest.raises(pp.OptionError) as caught:
        convert_source(path, trust=True, **options)
    assert str(caught.value) == message
    assert [o.name for o in convert_source(path, trust=True, output_names=("mean",)).model.graph.output] == ["mean"]


def test_a_state_dicts_layout_refuses_options_it_cannot_take_by_their_whole_message(tmp_path):
    cases = [
        (_actor_critic(), {"activation": "relu,tanh"}, pp.OptionError,
         "--activation (activation=) 'relu,tanh' is a list, one activation per module, which applies to a plain "
         "nn.Sequential; this state_dict has the sb3 layout"),
        (_actor("sac"), {"keep_value": True}, pp.OptionError,
         "--keep-value: an SB3 actor has no value function (its critics estimate Q(s, a))"),
        ({"0.weight": np.ones((3, 2), np.float32)}, {"keep_value": True}, pp.OptionError,
         "--keep-value: a plain nn.Sequential has no value branch"),
        ({"a.0.weight": np.ones((3, 2), np.float32), "b.0.weight": np.ones((3, 2), np.float32)}, {}, pp.BadModelError,
         "the keys carry more than one prefix (['a.', 'b.']); give one nn.Sequential's state_dict"),
        ({"0.weight": np.ones((3, 2), np.float32), "0.bias": np.zeros(3, np.float64)}, {}, pp.BadModelError,
         "the state_dict's parameters are float32 (0.weight) and float64 (0.bias): a policy's parameters share one "
         "float dtype, which the model computes in; cast them to one (state_dict = {k: v.float() for k, v in "
         "state_dict.items()}) and save that"),
    ]
    for arrays, options, error, message in cases:
        with pytest.raises(error) as caught:
            convert_source(_saved(tmp_path, arrays), **options)
        assert type(caught.value) is error and str(caught.value) == message


@pytest.mark.parametrize("source", [TORCH_DIR / "norms.torchscript.pt", "module"])
def test_a_list_of_activations_for_a_module_is_refused_as_an_option_it_does_not_read(source):
    """A TorchScript file or a live module records its activations: --activation does not apply to it,
    a list or one name alike (not: "takes one activation name")."""
    source = load_module("norms")[0] if source == "module" else source
    for activation in ("tanh,relu", "tanh"):
        with pytest.raises(pp.OptionError) as caught:
            convert_source(source, activation=activation)
        kind = "torch" if isinstance(source, torch.nn.Module) else "torchscript"
        assert str(caught.value) == (f"--activation does not apply to {kind} sources (--activation applies to brax, cleanrl, npz, "
                                     "rl-games, rllib, rllib-torch, rsl-rl, sample-factory, sb3, skrl, state-dict, tianshou, torchrl)")


@pytest.mark.parametrize("dtype, message", [
    (torch.int64, "the state_dict's parameters are int64 (0.weight, 0.bias, 2.weight … and 1 more): a policy's weights "
     "are floating point; integer ones are a quantized model's (whose scales these arrays do not hold) or no "
     "policy's; save the float weights the policy computes with"),
    (torch.complex64, "the state_dict's parameters are complex64 (0.weight, 0.bias, 2.weight … and 1 more): "
     "policyport builds a model from float16, bfloat16, float32 or float64 parameters; cast the parameters to "
     "float32 (state_dict = {k: v.float() for k, v in state_dict.items()}) and save that"),
    (torch.float8_e4m3fn, "the state_dict's parameters are float8_e4m3fn (0.weight, 0.bias, 2.weight … and 1 more): "
     "policyport builds a model from float16, bfloat16, float32 or float64 parameters; cast the parameters to "
     "float32 (state_dict = {k: v.float() for k, v in state_dict.items()}) and save that"),
])
def test_parameters_of_a_dtype_no_model_is_built_in_are_named_with_what_to_do(tmp_path, dtype, message):
    pytest.importorskip("ml_dtypes")
    module = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    obs = observations((6,), 16)
    path = tmp_path / "policy.pt"
    torch.save({k: (v * 100).to(dtype) for k, v in module.state_dict().items()}, path)
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(path, activation="tanh")
    assert str(caught.value) == message
    if dtype is torch.float8_e4m3fn:  # what the message says to do converts, to torch's output in float32
        torch.save({k: v.float() for k, v in torch.load(path, weights_only=True).items()}, path)
        module.load_state_dict(torch.load(path, weights_only=True))
        with torch.no_grad():
            expected = module(torch.from_numpy(obs)).numpy()
        got = pp.load(convert_source(path, activation="tanh").model).run({"obs": obs})["logits"]
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tensor, message", [
    (lambda w: torch.quantize_per_tensor(w, 0.1, 0, torch.qint8),
     "{path}: tensor '0.weight' is quantized (torch.qint8); policyport converts floating-point policies: save the "
     "state_dict of the model before quantization (or tensor.dequantize())"),
    (lambda w: w.to_sparse(),
     "{path}: tensor '0.weight' is stored as torch.sparse_coo; policyport reads dense tensors: save the state_dict "
     "with each tensor made dense (tensor.to_dense())"),
])
def test_tensors_numpy_cannot_hold_as_they_are_are_refused_by_name(tmp_path, tensor, message):
    module = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    state = module.state_dict()
    state["0.weight"] = tensor(state["0.weight"])
    path = tmp_path / "policy.pt"
    torch.save(state, path)
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(tmp_path / "m.onnx"), "--activation", "tanh"])
    assert result.exit_code == 3, result.output
    assert " ".join(result.stderr.split()) == "error: " + message.format(path=path)


def test_initializers_beyond_one_protobuf_are_refused_before_they_are_written():
    """A stride-0 weight (as torch.expand saves one) takes a few bytes in the file and its whole size
    in the model: past 2 GiB protobuf cannot hold it, and the builder says so before copying it."""
    from policyport.converter.build import MlpBuilder

    builder = MlpBuilder(17, np.float32)
    builder.initializer(np.zeros(4, np.float32), "small")
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (2**15, 2**14), (0, 0))
    with pytest.raises(pp.LimitExceededError) as caught:
        builder.initializer(huge, "0.weight")
    assert str(caught.value) == ("the model's initializers would take 2 GiB once '0.weight' (float32, shape (32768, "
                                 "16384)) is added, more than the 2 GiB one ONNX protobuf holds; policyport writes a "
                                 "model's weights inside it, not as external data")
    assert len(builder.initializers) == 1


def test_read_arrays_names_where_the_arrays_came_from(tmp_path):
    from policyport.converter.sources.state_dict import read_arrays

    module = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), module)
    with pytest.raises(pp.UntrustedFileError):
        read_arrays(module)  # trust is off unless given
    value, provenance = read_arrays(module, trust=True)
    assert isinstance(value, torch.nn.Linear) and provenance == {"kind": "torch", "file": "module.pt"}
    from safetensors.numpy import save_file

    st = tmp_path / "Weights.SafeTensors"
    save_file({"0.weight": np.ones((2, 3), np.float32)}, str(st))
    arrays, provenance = read_arrays(st)
    assert list(arrays) == ["0.weight"] and arrays["0.weight"].shape == (2, 3)
    import hashlib

    assert provenance == {"file": "Weights.SafeTensors", "sha256": hashlib.sha256(st.read_bytes()).hexdigest()}
    listed = tmp_path / "list.pt"
    torch.save([torch.ones(2)], listed)
    with pytest.raises(pp.BadModelError) as caught:
        read_arrays(listed)
    assert str(caught.value) == f"{listed} holds a list, not a state_dict (a mapping of parameter names to tensors)"


def test_a_sequential_index_that_fits_no_module_is_refused_naming_its_parameters_and_shapes():
    from policyport.converter.sources.state_dict import parse_sequential

    arrays = {"0.weight": np.ones((3, 2), np.float32), "1.bias": np.ones(3, np.float32)}
    with pytest.raises(pp.BadModelError) as caught:
        parse_sequential(arrays, "", None)
    assert str(caught.value) == "1 holds bias with shapes [(3,)], which fit no Linear, LayerNorm or BatchNorm1d"


def test_a_list_of_activations_must_name_one_per_parameter_free_module_and_linear_adds_nothing(tmp_path):
    arrays = {f"{i}.weight": np.eye(2, dtype=np.float32) for i in (0, 2, 4, 6)}  # gaps at 1, 3, 5; no biases
    with pytest.raises(pp.OptionError) as caught:
        convert_source(_saved(tmp_path, arrays), activation="relu,tanh")
    assert str(caught.value) == ("nn.Sequential: --activation (activation=) gives 2 activations for 3 parameter-free "
                                 "module(s) at 1, 3, 5; give one per module, in order")
    with pytest.raises(pp.OptionError) as caught:  # one name would apply to modules a Sequential may mix
        convert_source(_saved(tmp_path, arrays), activation="relu")
    assert str(caught.value) == ("nn.Sequential: --activation relu names one activation, and 3 parameter-free modules at "
                                 "1, 3, 5 each hold one that the state_dict cannot tell (an nn.Sequential may mix them); "
                                 "give one per module, in order: --activation relu,relu,relu if they are all relu")
    c = convert_source(_saved(tmp_path, arrays), activation="relu,linear,tanh")
    assert [n.op_type for n in c.model.graph.node if n.op_type in ("Relu", "Tanh", "Identity")] == ["Relu", "Tanh"]
    obs = np.array([[-2.0, 3.0]], np.float32)
    np.testing.assert_allclose(pp.load(c.model).run({"obs": obs})["logits"], [[0.0, np.tanh(3.0)]], rtol=1e-6)


def test_an_action_net_must_be_a_linear_weight_and_may_have_no_bias():
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor_critic

    tanh = parse_activation("tanh")
    with pytest.raises(pp.BadModelError) as caught:
        parse_sb3_actor_critic({"action_net.weight": np.ones(3, np.float32)}, tanh)
    assert str(caught.value) == "action_net.weight must be a 2-D Linear weight [out, in], got shape (3,)"
    spec, _ = parse_sb3_actor_critic({"action_net.weight": np.ones((2, 3), np.float32)}, tanh)
    assert (spec.output.name, spec.output.weight_name, spec.output.bias, spec.output.bias_name) == (
        "action_net", "action_net.weight", None, None)


@pytest.mark.parametrize("keys, layout", [
    (["action_net.weight"], "sb3"),
    (["mlp_extractor.policy_net.0.weight"], "sb3"),
    (["actor.mu.0.weight"], "sb3-actor"),
    (["q_net_target.q_net.0.weight", "q_net.q_net.4.bias"], "sb3-q"),
    (["quantile_net.quantile_net.0.weight"], "sb3-q"),
    (["q_net.0.weight", "q_net.2.bias"], "sequential"),  # a module's own q_net, not SB3's q_net.q_net
    (["0.weight", "net.2.bias"], "sequential"),
])
def test_the_layout_is_read_from_any_one_key_of_it(keys, layout):
    from policyport.converter.sources.state_dict import detect_layout

    assert detect_layout({k: np.ones((1, 1), np.float32) for k in keys}) == layout


def test_keys_that_fit_no_layout_are_counted_and_the_first_twenty_listed():
    from policyport.converter.sources.state_dict import detect_layout

    keys = [f"odd_{i:02d}" for i in range(21)] + ["0.weight"]
    with pytest.raises(pp.BadModelError) as caught:
        detect_layout({k: np.ones(1, np.float32) for k in keys})
    assert str(caught.value) == (
        "the state_dict's keys fit no layout policyport knows (nn.Sequential <i>.weight, SB3 mlp_extractor/action_net, "
        "SB3 actor.*, SB3 q_net.*/quantile_net.*, RLlib _hidden_layers.<i>._model.0/_logits): 21 key(s) do not fit: "
        + ", ".join(keys[:20]) + " … and 1 more")


def test_non_finite_weights_are_refused_by_name_and_integer_buffers_are_not_checked(tmp_path):
    arrays = {"0.weight": np.array([[np.nan, 1.0]], np.float32), "0.bias": np.array([np.inf], np.float32),
              "2.weight": np.ones((1, 1), np.float32)}
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(_saved(tmp_path, arrays), activation="relu")
    assert str(caught.value) == "non-finite values (NaN or inf) in 0.bias, 0.weight; a trained policy's weights are finite"
    from policyport.converter.sources.state_dict import _check_finite

    _check_finite({"steps": np.array([2**62], np.int64), "w": np.ones(2, np.float32)})  # nothing to refuse


def test_without_torch_the_reference_is_numpys_with_the_head_asked_for(monkeypatch):
    from policyport.converter.activations import parse_activation
    from policyport.converter.sources.state_dict import parse_sb3_actor_critic, reference_for

    spec, _ = parse_sb3_actor_critic(_actor_critic(), parse_activation("tanh"))
    obs = observations((5,), 3)
    with_torch = reference_for(spec, "diag-gaussian")(obs)
    monkeypatch.setitem(sys.modules, "torch", None)
    without = reference_for(spec, "diag-gaussian")(obs)
    assert set(without) == set(with_torch) and {"action", "log_std"} <= set(without)
    for name in without:
        np.testing.assert_allclose(without[name], with_torch[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("activation", ["mish", "softplus", "gelu", "hardswish"])
def test_the_torch_reference_runs_each_named_activation_as_its_module(tmp_path, activation):
    arrays = {"0.weight": np.full((3, 2), 0.5, np.float32), "2.weight": np.full((1, 3), -0.25, np.float32)}
    c = convert_source(_saved(tmp_path, arrays), activation=activation)
    obs = observations((2,), 5)
    module = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False), {"mish": torch.nn.Mish, "softplus": torch.nn.Softplus,
                                 "gelu": torch.nn.GELU, "hardswish": torch.nn.Hardswish}[activation](),
                                 torch.nn.Linear(3, 1, bias=False))
    module.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
    with torch.no_grad():
        expected = module(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(c.reference(obs)["logits"], expected, rtol=1e-6, atol=1e-7)
    assert pp.verify(c.model, obs, reference=c.reference).passed


def test_a_head_contradicting_the_state_dict_is_a_usage_error_saying_why(tmp_path):
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(app, ["convert", str(TORCH_DIR / "gaussian.state_dict.pt"), "-o", str(out),
                                      "--activation", "tanh", "--head", "categorical"])
    assert result.exit_code == 2 and not out.exists()
    assert ("--head categorical takes the argmax of the logits, but this is a Gaussian policy: its logits are the 2 "
            "means of 'action_net' followed by the 2 entries of its free log_std 'log_std'") in " ".join(result.stderr.split())
    for head in ("diag-gaussian", "diag-gaussian:halves"):  # named as given
        with pytest.raises(pp.OptionError) as caught:
            convert_source(_saved(tmp_path, _actor_critic(log_std=False)), head=head, activation="tanh")
        assert str(caught.value) == (
            f"--head {head} needs a log_std, and this SB3 ActorCriticPolicy has none: SB3 keeps a Gaussian policy's "
            "log_std as a parameter, so this one acts in a Discrete or MultiDiscrete space (use --head categorical, "
            "or none)")
    discrete = convert_source(_saved(tmp_path, _actor_critic(log_std=False)), head="categorical", activation="tanh").model
    assert [o.name for o in discrete.graph.output] == ["logits", "action"]


@pytest.mark.parametrize("arrays, name, means, kind", [
    (_actor_critic() | {"log_std": np.zeros(3, np.float32)}, "log_std", ("action_net", 2), None),
    (None, "_append_free_log_std.log_std", ("_logits._model.0", 4), "rllib-torch"),
])
def test_a_free_log_std_as_wide_as_no_output_layer_is_refused_before_anything_is_built(tmp_path, arrays, name, means, kind):
    if arrays is None:  # RLlib's torch fcnet (4 logits) given a free_log_std one entry short
        arrays = {k: v.numpy() for k, v in torch.load(TORCH_DIR / "rllib_fcnet.state_dict.pt").items()}
        arrays[name] = np.zeros(3, np.float32)
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(_saved(tmp_path, arrays), kind=kind, activation="tanh")
    layer, n = means
    assert str(caught.value) == (
        f"{name} has {arrays[name].shape[0]} entries, but {layer!r} outputs {n}: a free log_std holds one entry per action "
        f"dimension, as many as the means it follows in logits (a diag-gaussian policy with {n} means needs a log_std "
        f"of {n}); are the weights of two different policies?")
