"""Half-precision (bfloat16, float16) state_dicts: converted under --weights-dtype keep and float32,
run on both backends and compared with torch's own forward of the module in that dtype; extract
gives the parameters back bit for bit in their own dtype (keep) or exactly in float32."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source

from torch_fixtures import SB3_DIR, TORCH_DIR, load_module, observations

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.slow

#: (atol, rtol) for a float32 model against torch's module in each half precision: one rounding
#: step of the dtype (bfloat16 2**-7, float16 2**-10) on values near 1, as policyport's own defaults.
HALF_TOLERANCE = {torch.bfloat16: (1e-2, 1e-2), torch.float16: (1e-3, 1e-3)}
NUMPY_DTYPE = {torch.bfloat16: np.dtype(ml_dtypes.bfloat16), torch.float16: np.dtype(np.float16)}


def half_module(dtype, seed: int = 3):
    """A policy MLP with a LayerNorm (6 -> 32 -> LayerNorm -> tanh -> 32 -> relu -> 3), seeded, in ``dtype``."""
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.LayerNorm(32), torch.nn.Tanh(),
                                 torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    with torch.no_grad():  # a trained LayerNorm's affine parameters are not ones and zeros
        module[1].weight.uniform_(0.5, 1.5)
        module[1].bias.uniform_(-0.2, 0.2)
    return module.to(dtype).eval()


def save(module, tmp_path, suffix: str):
    path = tmp_path / f"policy{suffix}"
    state = module.state_dict()
    if suffix == ".safetensors":
        safetensors_torch.save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def torch_logits(module, obs: np.ndarray, dtype) -> np.ndarray:
    """torch's own forward of the half-precision module on ``obs`` cast to its dtype, as float64."""
    with torch.no_grad():
        return module(torch.from_numpy(obs).to(dtype)).float().numpy().astype(np.float64)


def as_bits(tensor) -> bytes:
    return tensor.contiguous().view(torch.int16).numpy().tobytes()


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("weights_dtype", ["keep", "float32"])
def test_a_half_precision_state_dict_converts_and_matches_torchs_forward_in_that_dtype(tmp_path, suffix, dtype,
                                                                                       weights_dtype):
    module = half_module(dtype)
    path = save(module, tmp_path, suffix)
    converted = convert_source(path, activation="tanh,relu", weights_dtype=weights_dtype)
    model = converted.model
    half = NUMPY_DTYPE[dtype]
    computes = np.dtype(np.float16) if (dtype is torch.float16 and weights_dtype == "keep") else np.dtype(np.float32)
    assert pp.load(model).inputs[0].dtype == computes
    stored = {t.name: t.data_type for t in model.graph.initializer}
    elem = {"bfloat16": 16, "float16": 10, "float32": 1}[half.name if weights_dtype == "keep" else "float32"]
    assert {stored[name] for name in ("0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "5.bias")} == {elem}

    obs = observations((6,), 500, seed=4)
    expected = torch_logits(module, obs, dtype)
    atol, rtol = HALF_TOLERANCE[dtype]
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": obs.astype(computes)})["logits"].astype(np.float64)
        np.testing.assert_allclose(got, expected, atol=atol, rtol=rtol, err_msg=backend)
        assert np.abs(got - expected).max() > 0  # torch rounds in half precision, the model does not always
    weights = pp.extract_weights(model)
    assert sorted(weights) == sorted(module.state_dict())  # safetensors keeps its keys sorted
    for name, tensor in module.state_dict().items():
        if weights_dtype == "keep":
            assert weights[name].dtype == half and weights[name].tobytes() == as_bits(tensor), name
        else:  # exact: float32 holds every half-precision value
            assert weights[name].dtype == np.float32, name
            np.testing.assert_array_equal(weights[name], tensor.float().numpy(), err_msg=name)


@pytest.mark.parametrize("dtype, weights_dtype, note", [
    (torch.bfloat16, "keep", "the state_dict's parameters are bfloat16 and stay so (extract gives them back bit for "
     "bit); each is cast to float32 in the graph, which computes in float32: onnxruntime's CPU provider has no "
     "bfloat16 kernels"),
    (torch.bfloat16, "float32", "the state_dict's parameters are bfloat16, cast to float32 (--weights-dtype "
     "float32): exact, float32 holds every bfloat16 value; the model computes in float32 and extract gives float32 "
     "arrays"),
    (torch.float16, "keep", "the state_dict's parameters are float16: the model computes in float16, as the source "
     "module does"),
])
def test_the_conversion_says_what_it_did_with_half_precision_parameters(tmp_path, dtype, weights_dtype, note):
    path = save(half_module(dtype), tmp_path, ".pt")
    assert convert_source(path, activation="tanh,relu", weights_dtype=weights_dtype).notes == [note]


def test_the_verification_compares_with_the_modules_own_bfloat16_forward_in_bfloat16_tolerances(tmp_path):
    """The source side is the module run in bfloat16: its tensors are bfloat16, so every comparison
    with it takes bfloat16's tolerances, and its values are torch's, rounding included."""
    module = half_module(torch.bfloat16)
    path = save(module, tmp_path, ".safetensors")
    converted = convert_source(path, activation="tanh,relu")
    obs = observations((6,), 64, seed=9)
    source = converted.reference(obs)
    assert source["logits"].dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(source["logits"].astype(np.float64), torch_logits(module, obs, torch.bfloat16))
    report = pp.verify(converted.model, {"obs": obs}, reference=converted.reference)
    against_source = [c for c in report.comparisons if c.reference == "source"]
    assert report.passed and {c.tensor for c in against_source} >= {"0/linear", "1/layer_norm", "2/tanh", "logits"}
    assert {(c.atol, c.rtol) for c in against_source} == {(1e-2, 1e-2)}
    assert max(c.max_abs for c in against_source) > 1e-3  # bfloat16's rounding, which float32 tolerances refuse


def test_a_changed_bfloat16_weight_fails_the_verification(tmp_path):
    """The bfloat16 tolerances still catch a wrong weight: one weight off by 0.25 fails against torch."""
    module = half_module(torch.bfloat16)
    path = save(module, tmp_path, ".pt")
    converted = convert_source(path, activation="tanh,relu")
    state = module.state_dict()
    state["3.weight"][0, 0] += 0.25
    module.load_state_dict(state)
    (tmp_path / "changed").mkdir()
    wrong = convert_source(save(module, tmp_path / "changed", ".pt"), activation="tanh,relu")
    report = pp.verify(converted.model, {"obs": observations((6,), 256, seed=2)}, reference=wrong.reference)
    assert not report.passed
    assert {c.tensor for c in report.comparisons if not c.passed} == {"3/linear", "4/relu", "logits"}


def test_cli_converts_verifies_and_extracts_bfloat16_bit_for_bit(tmp_path):
    module = half_module(torch.bfloat16)
    path = save(module, tmp_path, ".safetensors")
    out, weights = tmp_path / "policy.onnx", tmp_path / "weights.npz"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(path), "-o", str(out), "--activation", "tanh,relu", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    verdict = doc["verification"]
    assert verdict["passed"] and doc["notes"][0].startswith("the state_dict's parameters are bfloat16 and stay so")
    result = runner.invoke(app, ["extract", str(out), "-o", str(weights), "--json"])
    assert result.exit_code == 0, result.output
    assert {p["dtype"] for p in json.loads(result.stdout)["parameters"]} == {"bfloat16"}
    with np.load(weights) as saved:  # numpy writes ml_dtypes' bfloat16 as raw 2-byte elements
        for name, tensor in module.state_dict().items():
            assert saved[name].dtype == np.dtype("V2") and saved[name].tobytes() == as_bits(tensor), name
            back = torch.from_numpy(saved[name].view(np.int16)).view(torch.bfloat16)
            assert torch.equal(back, tensor), name
    obs = observations((6,), 100, seed=6)
    np.save(tmp_path / "obs.npy", obs)
    result = runner.invoke(app, ["run", str(out), "-i", str(tmp_path / "obs.npy"), "-o", str(tmp_path / "out.npz"),
                                 "--backend", "numpy"])
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "out.npz") as ran:
        np.testing.assert_allclose(ran["logits"], torch_logits(module, obs, torch.bfloat16), atol=1e-2, rtol=1e-2)


def test_cli_float32_choice_gives_a_float32_model_that_export_numpy_writes(tmp_path):
    module = half_module(torch.bfloat16)
    path = save(module, tmp_path, ".pt")
    out = tmp_path / "policy.onnx"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(path), "-o", str(out), "--activation", "tanh,relu",
                                 "--weights-dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert "cast to float32 (--weights-dtype float32): exact" in " ".join(result.stderr.split())
    result = runner.invoke(app, ["export-numpy", str(out), "-o", str(tmp_path / "policy.py")])
    assert result.exit_code == 0, result.output
    keep = tmp_path / "keep.onnx"
    result = runner.invoke(app, ["convert", str(path), "-o", str(keep), "--activation", "tanh,relu"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["export-numpy", str(keep), "-o", str(tmp_path / "keep.py")])
    assert result.exit_code == 3
    assert " ".join(result.stderr.split()) == ("error: initializer '0.weight' is bfloat16; export-numpy writes plain "
                                               "numpy types")


@pytest.mark.parametrize("args, message", [
    (["--weights-dtype", "float64"], "error: --weights-dtype 'float64' is not one of keep, float32"),
    (["--weights-dtype", "bfloat16"], "error: --weights-dtype 'bfloat16' is not one of keep, float32"),
])
def test_cli_refuses_a_weights_dtype_it_does_not_know(tmp_path, args, message):
    path = save(half_module(torch.bfloat16), tmp_path, ".pt")
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(tmp_path / "m.onnx"), "--activation",
                                      "tanh,relu", *args])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == message
    assert not (tmp_path / "m.onnx").exists()


def test_float32_for_float64_parameters_is_refused_since_it_would_round(tmp_path):
    path = save(half_module(torch.float64), tmp_path, ".pt")
    with pytest.raises(pp.OptionError) as caught:
        convert_source(path, activation="tanh,relu", weights_dtype="float32")
    assert str(caught.value) == ("--weights-dtype float32 casts half-precision parameters exactly; the state_dict's "
                                 "parameters are float64, which float32 would round: cast them yourself if that is "
                                 "what you want")


def half_sb3_zip(zip_path, tmp_path, dtype):
    """The SB3 zip ``zip_path`` with every floating tensor of its policy.pth in ``dtype``, the rest as it was."""
    out = tmp_path / f"{zip_path.stem}_{str(dtype).removeprefix('torch.')}.zip"
    with zipfile.ZipFile(zip_path) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "policy.pth":
                state = torch.load(io.BytesIO(data), weights_only=True)
                buffer = io.BytesIO()
                torch.save({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, buffer)
                data = buffer.getvalue()
            zout.writestr(item, data)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("name, algo", [("td3_pendulum", "TD3"), ("ppo_pendulum", "PPO")])
def test_an_sb3_zip_with_a_half_precision_policy_pth_computes_in_float32_as_sb3_does(tmp_path, dtype, name, algo):
    """SB3's set_parameters loads policy.pth into its float32 policy: SB3's own predict on the zip is
    the float32 computation of the half-precision values, and the model's action matches it to
    float32's tolerance, its parameters stored in their own dtype."""
    sb3 = pytest.importorskip("stable_baselines3")
    path = half_sb3_zip(SB3_DIR / f"{name}.zip", tmp_path, dtype)
    converted = convert_source(path)
    assert converted.notes[-1] == (f"policy.pth's parameters are {str(dtype).removeprefix('torch.')} and stay so "
                                   "(extract gives them back bit for bit); each is cast to float32 in the graph, "
                                   "which computes in float32, as SB3 does: it loads them into its float32 policy")
    agent = getattr(sb3, algo).load(path, device="cpu")
    obs = np.random.default_rng(8).uniform(-1, 1, (300, 3)).astype(np.float32)
    expected, _ = agent.predict(obs, deterministic=True)
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5, err_msg=backend)
    # the half-precision values, not the original float32 ones: the original file's model is far farther off
    original = pp.load(convert_source(SB3_DIR / f"{name}.zip").model).run({"obs": obs})["action"]
    assert np.abs(original - expected).max() > 10 * np.abs(got - expected).max()
    state = torch.load(io_bytes(path), weights_only=True)
    weights = pp.extract_weights(converted.model)
    assert weights and set(weights) <= set(state)
    for key, array in weights.items():
        assert array.dtype == NUMPY_DTYPE[dtype] and array.tobytes() == state[key].view(torch.int16).numpy().tobytes()


def io_bytes(zip_path):
    """The policy.pth of an SB3 zip, as a file object."""
    with zipfile.ZipFile(zip_path) as zf:
        return io.BytesIO(zf.read("policy.pth"))


@pytest.mark.parametrize("file, dtype", [("norms.bfloat16.safetensors", torch.bfloat16),
                                         ("norms.float16.state_dict.pt", torch.float16)])
def test_the_half_precision_fixtures_convert_to_the_fixture_modules_own_forward_in_that_dtype(file, dtype):
    """fixtures/torch/make_half.py's copies of norms.state_dict.pt (LayerNorm, Dropout, BatchNorm1d in
    eval mode): the files hold the float32 file's tensors cast, and the model matches modules.py's
    ``norms`` module run by torch in that dtype with those weights."""
    module, shape = load_module("norms")
    original = module.state_dict()
    path = TORCH_DIR / file
    held = (safetensors_torch.load_file(str(path)) if path.suffix == ".safetensors"
            else torch.load(path, weights_only=True))
    assert held.keys() == original.keys()
    for key, tensor in original.items():
        assert torch.equal(held[key], tensor.to(dtype) if tensor.is_floating_point() else tensor), key
    module = module.to(dtype)
    module.load_state_dict(held)
    converted = convert_source(path, activation="tanh,relu")
    computes = np.float16 if dtype is torch.float16 else np.float32
    obs = observations(shape, 400, seed=12)
    expected = torch_logits(module.eval(), obs, dtype)
    atol, rtol = HALF_TOLERANCE[dtype]
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(converted.model, backend=backend).run({"obs": obs.astype(computes)})["logits"]
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=atol, rtol=rtol, err_msg=backend)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("form", ["module", "pickled", "torchscript"])
def test_a_half_precision_module_exports_and_matches_its_own_forward(tmp_path, dtype, form):
    """A live module, a whole pickled module and a TorchScript file in half precision. torch.onnx
    writes a bfloat16 module's graph in bfloat16, which onnxruntime cannot run: its float32 copy is
    exported and its parameters stored back in bfloat16 (a float16 module exports as it is)."""
    module = half_module(dtype)
    source = module
    if form == "pickled":
        source = tmp_path / "whole.pt"
        torch.save(module, source)
    elif form == "torchscript":
        source = tmp_path / "scripted.pt"
        torch.jit.save(torch.jit.script(module), source)
    model = convert_source(source, trust=form != "module").model
    computes = np.float16 if dtype is torch.float16 else np.float32
    obs = observations((6,), 300, seed=5)
    expected = torch_logits(module, obs, dtype)
    atol, rtol = HALF_TOLERANCE[dtype]
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": obs.astype(computes)})["logits"]
        np.testing.assert_allclose(got.astype(np.float64), expected, atol=atol, rtol=rtol, err_msg=backend)
    weights = pp.extract_weights(model)
    assert sorted(weights) == sorted(module.state_dict())
    for name, tensor in module.state_dict().items():
        assert weights[name].dtype == NUMPY_DTYPE[dtype] and weights[name].tobytes() == as_bits(tensor), name


def test_cli_converts_a_pickled_bfloat16_module_against_torch(tmp_path):
    module = half_module(torch.bfloat16)
    torch.save(module, tmp_path / "whole.pt")
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "whole.pt"), "-o", str(tmp_path / "m.onnx"), "--trust",
                                      "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)["verification"]
    assert verdict["passed"]
    against = [c for c in verdict["comparisons"] if c["reference"] == "source"]
    assert {c["tensor"] for c in against} == {"0/linear", "1/layer_norm", "2/tanh", "3/linear", "4/relu", "logits"}
    assert {(c["atol"], c["rtol"]) for c in against} == {(1e-2, 1e-2)}


def test_verify_source_rebuilds_the_source_side_with_the_recorded_weights_dtype(tmp_path):
    """verify --source reads the options convert recorded (--weights-dtype float32 among them) and
    checks the float32 model against torch's bfloat16 forward again."""
    module = half_module(torch.bfloat16)
    path = save(module, tmp_path, ".safetensors")
    out = tmp_path / "policy.onnx"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(path), "-o", str(out), "--activation", "tanh,relu",
                                 "--weights-dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert {t.data_type for t in onnx.load(str(out)).graph.initializer} == {onnx.TensorProto.FLOAT}
    result = runner.invoke(app, ["verify", str(out), "--source", str(path), "--samples", "200", "--json"])
    assert result.exit_code == 0, result.output
    against = [c for c in json.loads(result.stdout)["comparisons"] if c["reference"] == "source"]
    assert {c["tensor"] for c in against} == {"0/linear", "1/layer_norm", "2/tanh", "3/linear", "4/relu", "logits"}
    assert {(c["atol"], c["rtol"]) for c in against} == {(1e-2, 1e-2)} and all(c["passed"] for c in against)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_rllib_torch_weights_in_half_precision_match_the_fcnet_layers_run_by_torch(tmp_path, dtype):
    """RLlib's torch FullyConnectedNetwork keys (SlimFC: Linear then the activation) in half precision."""
    torch.manual_seed(7)
    hidden = [torch.nn.Linear(5, 16), torch.nn.Linear(16, 16)]
    logits = torch.nn.Linear(16, 4)
    state = {f"_hidden_layers.{i}._model.0.{p}": getattr(layer, p).detach().to(dtype)
             for i, layer in enumerate(hidden) for p in ("weight", "bias")}
    state.update({f"_logits._model.0.{p}": getattr(logits, p).detach().to(dtype) for p in ("weight", "bias")})
    torch.save(state, tmp_path / "fcnet.pt")
    model = convert_source(tmp_path / "fcnet.pt", kind="rllib-torch", activation="tanh").model
    obs = observations((5,), 200, seed=3)
    with torch.no_grad():
        x = torch.from_numpy(obs).to(dtype)
        for layer in hidden:
            x = torch.tanh(torch.nn.functional.linear(x, layer.weight.to(dtype), layer.bias.to(dtype)))
        expected = torch.nn.functional.linear(x, logits.weight.to(dtype), logits.bias.to(dtype)).double().numpy()
    computes = np.float16 if dtype is torch.float16 else np.float32
    atol, rtol = HALF_TOLERANCE[dtype]
    got = pp.load(model, backend="onnxruntime").run({"obs": obs.astype(computes)})["logits"]
    np.testing.assert_allclose(got.astype(np.float64), expected, atol=atol, rtol=rtol)


def test_a_bfloat16_safetensors_file_reads_in_a_fresh_interpreter(tmp_path):
    """safetensors.numpy asks numpy for "bfloat16" by name, which numpy knows only once ml_dtypes is
    imported: the reader imports it first, so the file reads before anything else has."""
    import subprocess
    import sys

    from torch_fixtures import ROOT

    code = ("import sys; from policyport.converter.readers.torch_files import read_safetensors; "
            f"arrays = read_safetensors({str(TORCH_DIR / 'norms.bfloat16.safetensors')!r}); "
            "print(sorted({a.dtype.name for a in arrays.values()}), len(arrays))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "['bfloat16', 'int64'] 13"


@pytest.mark.parametrize("file", ["norms.bfloat16.safetensors", "norms.float16.state_dict.pt"])
def test_without_torch_the_numpy_source_side_computes_and_is_judged_in_the_half_dtype(file, monkeypatch, tmp_path):
    """Where torch is not installed the source side is policyport's numpy forward in the parameters' dtype; its
    tensors carry that dtype (bfloat16 as ml_dtypes.bfloat16), so the verdict applies that dtype's tolerances as
    it does to torch's own bfloat16 forward."""
    from policyport.converter.sources import state_dict

    monkeypatch.setattr(state_dict, "has_torch", lambda: False)
    result = CliRunner().invoke(app, ["convert", str(TORCH_DIR / file), "-o", str(tmp_path / "half.onnx"),
                                      "--activation", "tanh,relu", "--json"])
    assert result.exit_code == 0, result.output
    verdict = json.loads(result.stdout)["verification"]
    assert verdict["passed"] and "run in numpy" in json.dumps(verdict)
    half = "bfloat16" if "bfloat16" in file else "float16"
    assert half in verdict["tolerances"]
