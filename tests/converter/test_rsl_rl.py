"""rsl_rl checkpoints: the fixtures are made by rsl_rl itself (``fixtures/rsl_rl/make_fixtures.py``), and
every expected action is rsl_rl's own inference policy's, computed when the fixtures were made."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import convert_source, detect_kind
from policyport.converter.sources import rsl_rl

ROOT = Path(__file__).resolve().parents[2]
RSL = ROOT / "fixtures" / "rsl_rl"
RUNS = ("gaussian", "gaussian_log_tanh", "heteroscedastic", "beta")


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return np.load(RSL / "observations.npy")


def expected(run: str) -> dict[str, np.ndarray]:
    with np.load(RSL / run / "expected.npz") as f:
        return {k: f[k] for k in f.files}


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_a_checkpoint_is_told_from_its_keys():
    assert detect_kind(RSL / "gaussian" / "model_0.pt") == "rsl-rl"
    assert detect_kind(RSL / "gaussian" / "exported" / "policy.pt") == "torchscript"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("run", RUNS)
def test_the_action_is_rsl_rls_own(run, backend, obs):
    with np.errstate(all="raise"):
        model = pp.convert(RSL / run / "model_0.pt")
        out = pp.load(model, backend).run({"obs": obs})
    want = expected(run)
    assert out["action"].shape == want["action"].shape == (1000, 12)
    assert np.abs(out["action"] - want["action"]).max() <= 1e-5
    if "std" in want:
        assert np.abs(out["std"] - want["std"]).max() <= 1e-5
        assert np.abs(np.exp(out["log_std"]) - want["std"]).max() <= 1e-5


def _normalised_action(layout, obs, eps_on_std=None, eps_on_var=None, clip=None):
    """The gaussian fixture's action under a normaliser of another library's formula."""
    mean, var, std = (layout.normalizer[r][1].astype(np.float64) for r in ("_mean", "_var", "_std"))
    x = (obs - mean) / (std + eps_on_std) if eps_on_std is not None else (obs - mean) / np.sqrt(var + eps_on_var)
    if clip is not None:
        x = np.clip(x, -clip, clip)
    for i, (_, _, w, _, b) in enumerate(layout.layers):
        x = x @ w.T.astype(np.float64) + b
        if i < len(layout.layers) - 1:
            x = np.where(x > 0, x, np.expm1(np.minimum(x, 0)))
    return x


def test_the_normaliser_is_rsl_rls_and_no_other_librarys(obs, monkeypatch):
    """rsl_rl adds 1e-2 to the std and clips nothing; each other library's formula moves the action."""
    layout = rsl_rl.read_layout(rsl_rl.read_checkpoint(RSL / "gaussian" / "model_0.pt"), "gaussian")
    want = expected("gaussian")["action"]
    assert np.abs(_normalised_action(layout, obs, eps_on_std=1e-2) - want).max() <= 1e-5
    others = {"skrl": {"eps_on_std": 1e-8, "clip": 5}, "rl_games": {"eps_on_var": 1e-5, "clip": 5},
              "gymnasium": {"eps_on_var": 1e-8, "clip": 10},
              "rsl_rl epsilon with a clip of 5": {"eps_on_std": 1e-2, "clip": 5}}
    for name, formula in others.items():
        assert np.abs(_normalised_action(layout, obs, **formula) - want).max() > 1e-3, name
    model = pp.convert(RSL / "gaussian" / "model_0.pt")
    assert "Clip" not in {n.op_type for n in model.graph.node if n.name.startswith("obs_normalizer")}
    for eps in (1e-5, 1e-8):  # the converter itself with another epsilon gives another action
        monkeypatch.setattr(rsl_rl, "NORMALIZER_EPS", eps)
        out = pp.load(pp.convert(RSL / "gaussian" / "model_0.pt")).run({"obs": obs})
        assert np.abs(out["action"] - want).max() > 1e-4


def test_extract_gives_every_array_back_bit_for_bit(tmp_path):
    torch = pytest.importorskip("torch")
    saved = torch.load(RSL / "gaussian" / "model_0.pt", weights_only=False)["actor_state_dict"]
    weights = pp.extract_weights(pp.convert(RSL / "gaussian" / "model_0.pt"))
    assert sorted(weights) == sorted(saved)
    for name, tensor in saved.items():
        assert weights[name].dtype == tensor.numpy().dtype and weights[name].shape == tuple(tensor.shape)
        assert weights[name].tobytes() == tensor.numpy().tobytes(), name


def test_the_activation_comes_from_agent_yaml_or_must_be_given(tmp_path, obs):
    shutil.copy(RSL / "gaussian_log_tanh" / "model_0.pt", tmp_path / "model_0.pt")
    refused = invoke("convert", tmp_path / "model_0.pt", "-o", tmp_path / "a.onnx")
    assert refused.exit_code == 2 and "--activation" in refused.output
    given = convert_source(tmp_path / "model_0.pt", activation="tanh")
    assert [a.topic for a in given.assumptions] == ["activation", "action bounds"]
    assert "given by --activation" in given.assumptions[0].because
    out = pp.load(given.model).run({"obs": obs})
    assert np.abs(out["action"] - expected("gaussian_log_tanh")["action"]).max() <= 1e-5
    read = convert_source(RSL / "gaussian_log_tanh" / "model_0.pt")
    assert "params/agent.yaml" in read.assumptions[0].because and "tanh" in read.assumptions[0].assumes
    contradicted = invoke("convert", RSL / "gaussian_log_tanh" / "model_0.pt", "--activation", "elu", "-o", tmp_path / "b.onnx")
    assert contradicted.exit_code == 2 and "contradicts" in contradicted.output


def test_a_two_row_head_without_agent_yaml_is_refused(tmp_path):
    shutil.copy(RSL / "beta" / "model_0.pt", tmp_path / "model_0.pt")
    result = invoke("convert", tmp_path / "model_0.pt", "--activation", "elu", "-o", tmp_path / "a.onnx")
    assert result.exit_code == 2 and "Beta" in result.output and "agent.yaml" in result.output
    assert not (tmp_path / "a.onnx").exists()


def test_pickled_infos_that_would_run_code_convert_without_running_it(tmp_path, obs):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    saved = torch.load(RSL / "gaussian" / "model_0.pt", weights_only=False)
    saved["infos"] = {"env": Payload(), "obj": __import__("collections").Counter(a=1)}
    (tmp_path / "run").mkdir()
    shutil.copytree(RSL / "gaussian" / "params", tmp_path / "run" / "params")
    torch.save(saved, tmp_path / "run" / "model_7.pt")
    assert detect_kind(tmp_path / "run" / "model_7.pt") == "rsl-rl"
    out = pp.load(pp.convert(tmp_path / "run" / "model_7.pt")).run({"obs": obs})
    assert not marker.exists()
    assert np.abs(out["action"] - expected("gaussian")["action"]).max() <= 1e-5


def test_convert_verify_pack_and_the_packed_run_on_the_cli(tmp_path):
    source = RSL / "heteroscedastic" / "model_0.pt"
    converted = invoke("convert", source, "-o", tmp_path / "h.onnx", "--json")
    assert converted.exit_code == 0, converted.output
    topics = [a["topic"] for a in json.loads(converted.output)["assumptions"]]
    assert topics == ["activation", "head", "action bounds"]
    verified = invoke("verify", tmp_path / "h.onnx", "--source", source, "--json")
    assert verified.exit_code == 0 and json.loads(verified.output)["passed"] is True
    packed = invoke("pack", tmp_path / "h.onnx", "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout


def test_rsl_rls_exported_onnx_with_a_batch_of_1_runs_at_any_batch(obs, tmp_path):
    """rsl_rl's exporter declares obs (1, 48); both backends run 1,000 rows, each as the original
    graph computes it at a batch of 1, and inspect says the batch was fixed."""
    ort = pytest.importorskip("onnxruntime")

    exported = RSL / "gaussian" / "exported" / "policy.onnx"
    original = ort.InferenceSession(str(exported))
    one_by_one = np.concatenate([original.run(None, {"obs": obs[i:i + 1]})[0] for i in range(len(obs))])
    assert np.abs(one_by_one - expected("gaussian")["action"]).max() <= 1e-5
    for backend in ("numpy", "onnxruntime"):
        out = pp.load(exported, backend).run({"obs": obs})["actions"]
        assert np.abs(out - one_by_one).max() <= 1e-5, backend
        with pytest.raises(pp.PolicyportError, match=r"axis 0 is 4, the model needs 1"):
            pp.load(exported, backend, free=False).run({"obs": obs[:4]})
    inspected = json.loads(invoke("inspect", exported, "--json").output)
    assert inspected["batch_fixed"] == ["obs"] and inspected["batch_freed"] is True
    # one Gemm row at a time and three at once may round differently (the BLAS kernel picks its blocking by size)
    assert float(re.search(r"max abs ([0-9.e+-]+)\)", inspected["batch_note"])[1]) <= 1e-6


def test_verify_record_and_pack_of_the_exported_onnx_use_every_observation(obs, tmp_path):
    """The sample size is not the file's batch of 1: verify draws 1,000 observations and compares the
    freed graph with the file's run one observation at a time; record and a packed folder take any batch."""
    exported = RSL / "gaussian" / "exported" / "policy.onnx"
    verified = json.loads(invoke("verify", exported, "--json").output)
    assert verified["passed"] is True and verified["samples"] == 1000
    [alone] = [c for c in verified["comparisons"] if c["reference"] == "numpy batch 1"]
    assert alone["tensor"] == "actions" and alone["shape"] == [1000, 12] and alone["max_abs"] <= 1e-6
    np.save(tmp_path / "obs.npy", obs)
    recorded = invoke("record", exported, "-i", tmp_path / "obs.npy", "-o", tmp_path / "acts.npz")
    assert recorded.exit_code == 0, recorded.output
    with np.load(tmp_path / "acts.npz") as acts:
        assert acts["actions"].shape == (1000, 12) and acts["linear"].shape == (1000, 32)
        assert np.abs(acts["actions"] - expected("gaussian")["action"]).max() <= 1e-5
    packed = invoke("pack", exported, "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    policy = json.loads((tmp_path / "pack" / "policy.json").read_text())
    assert policy["golden"]["samples"] == 64 and policy["inputs"][0]["shape"] == ["batch", 48]
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0 and "PASS" in run.stdout, run.stdout + run.stderr
    np.save(tmp_path / "four.npy", obs[:4])
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "-i", str(tmp_path / "four.npy"), "-o",
                          str(tmp_path / "four.npz")], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    with np.load(tmp_path / "four.npz") as out:
        assert np.abs(out["actions"] - expected("gaussian")["action"][:4]).max() <= 1e-5


def test_a_batch_the_graph_does_not_allow_freeing_stays_fixed_and_says_why(obs):
    """A node that mixes rows keeps the file's batch of 1, and a larger batch is refused naming the node;
    a freeing that passes the op list but changes what a row computes is caught by the check at batch 1."""
    import onnx

    from policyport.graph.passes import fixed_batch, free_batch
    from policyport.runtime.batch import free_checked

    exported = onnx.load(str(RSL / "gaussian" / "exported" / "policy.onnx"))
    flattened = onnx.load(str(RSL / "gaussian" / "exported" / "policy.onnx"))
    flattened.graph.node.append(onnx.helper.make_node("Flatten", ["actions"], ["flat"], axis=0, name="mix"))
    assert free_batch(flattened) is flattened
    assert 'Flatten node "mix"' in fixed_batch(flattened).reason
    for backend in ("numpy", "onnxruntime"):
        with pytest.raises(pp.PolicyportError, match=r'axis 0 is 4, the model needs 1\); batch fixed at 1 in the file '
                                                     r'\(obs\) and kept: Flatten node "mix"'):
            pp.load(flattened, backend).run({"obs": obs[:4]})
    assert pp.load(flattened).record({"obs": obs[:1]}, "flat")["flat"].shape == (1, 12)
    from policyport.verification.summary import summarize

    inspected = summarize(flattened)
    assert inspected["batch_fixed"] == ["obs"] and inspected["batch_freed"] is False
    assert 'Flatten node "mix"' in inspected["batch_note"]

    # (1, 48) + (1, 1, 48) is (1, 1, 48) per observation but (1, 3, 48) for three: the op list allows it
    broadcast = onnx.load(str(RSL / "gaussian" / "exported" / "policy.onnx"))
    broadcast.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((1, 1, 48), np.float32), "lift"))
    broadcast.graph.node.insert(0, onnx.helper.make_node("Add", ["obs", "lift"], ["lifted"], name="lift"))
    broadcast.graph.output.append(onnx.helper.make_tensor_value_info("lifted", onnx.TensorProto.FLOAT, None))
    assert fixed_batch(broadcast).reason is None and free_batch(broadcast) is not broadcast
    checked = free_checked(broadcast)
    assert checked.freed is False and checked.model is broadcast and "'lifted'" in checked.reason
    freed = free_checked(exported)
    assert freed.freed is True and freed.max_abs <= 1e-6 and freed.model is not exported
    assert [i.type.tensor_type.shape.dim[0].dim_param for i in exported.graph.input] == [""]  # untouched



def test_extract_on_the_exported_onnx_names_the_folded_std_and_gives_it_back_where_it_can(tmp_path):
    """rsl_rl's exporter stores _std + 0.01 as one constant 'add': extract writes _std back, bit for bit,
    when every value has one float32 _std; else it writes 'add' as it is and says what it is."""
    import onnx
    torch = pytest.importorskip("torch")
    from policyport.graph.passes import folded_stds, unfold_epsilon

    std = torch.load(RSL / "gaussian" / "model_0.pt", weights_only=False)["actor_state_dict"]["obs_normalizer._std"]
    std = std.numpy()
    exported = RSL / "gaussian" / "exported" / "policy.onnx"
    weights = pp.extract_weights(exported)
    assert weights["add"].tobytes() == (std + np.float32(0.01)).astype(np.float32).tobytes()
    assert "obs_normalizer._std" not in weights
    [fold] = folded_stds(onnx.load(str(exported)))
    assert (fold.initializer, fold.source_name, fold.std) == ("add", "obs_normalizer._std", None)
    x, ambiguous = unfold_epsilon(weights["add"], 0.01)
    assert fold.ambiguous == int(ambiguous.sum()) == 2 and fold.size == 48
    assert np.array_equal(x[~ambiguous], std[~ambiguous])  # the other 46 are told bit for bit
    eps, amb = np.float32(0.01), std[ambiguous]  # a neighbouring float32 gives the same sum
    assert ((np.nextafter(amb, np.float32(0)) + eps == amb + eps) | (np.nextafter(amb, np.float32(9)) + eps == amb + eps)).all()
    result = invoke("extract", exported, "-o", tmp_path / "w.npz", "--json")
    [said] = json.loads(result.output)["folded"]
    assert said["is"] == "obs_normalizer._std + 0.01" and said["written_as"] == "add" and said["ambiguous"] == 2

    # the same file with stds each of whose sums has one float32 _std: _std comes back bit for bit
    model = onnx.load(str(exported))
    unique_std = np.random.default_rng(3).uniform(1.0, 1.98, (1, 48)).astype(np.float32)
    [add] = [t for t in model.graph.initializer if t.name == "add"]
    add.CopyFrom(onnx.numpy_helper.from_array((unique_std + np.float32(0.01)).astype(np.float32), "add"))
    weights = pp.extract_weights(model)
    assert "add" not in weights and weights["obs_normalizer._std"].tobytes() == unique_std.tobytes()
    assert list(weights)[-2:] == ["obs_normalizer._mean", "obs_normalizer._std"]
    onnx.save(model, str(tmp_path / "unique.onnx"))
    result = invoke("extract", tmp_path / "unique.onnx", "-o", tmp_path / "u.npz")
    assert result.exit_code == 0 and "recovered bit for bit" in result.output
    with np.load(tmp_path / "u.npz") as f:
        assert f["obs_normalizer._std"].tobytes() == unique_std.tobytes()
    # a model policyport wrote keeps _std and the epsilon apart: nothing is folded
    assert folded_stds(pp.convert(RSL / "gaussian" / "model_0.pt")) == []


def test_rsl_rls_exported_torchscript_is_refused_without_trust(tmp_path):
    """exported/policy.pt is TorchScript, which runs the file's code as it loads: without --trust it is
    refused (exit 2) before torch reads it, and nothing is written."""
    source = RSL / "gaussian" / "exported" / "policy.pt"
    refused = invoke("convert", source, "-o", tmp_path / "ts.onnx", "--json")
    assert refused.exit_code == 2
    assert json.loads(refused.stdout)["error"].startswith(
        f"{source} is a TorchScript file (torch.jit.save), and loading it runs code the file holds")
    assert not (tmp_path / "ts.onnx").exists()
    with pytest.raises(pp.TrustRequiredError):
        pp.convert(source)


def test_rsl_rls_exported_torchscript_converts_with_its_normaliser(obs, tmp_path):
    """exported/policy.pt (rsl_rl's export_policy_to_jit) is read by the TorchScript converter with --trust:
    its forward holds the normaliser, and the action is rsl_rl's own; verify against it passes."""
    pytest.importorskip("torch")
    source = RSL / "gaussian" / "exported" / "policy.pt"
    converted = invoke("convert", source, "-o", tmp_path / "ts.onnx", "--trust", "--json")
    assert converted.exit_code == 0, converted.output
    assert json.loads(converted.stdout)["kind"] == "torchscript"
    want = expected("gaussian")["action"]
    for backend in ("numpy", "onnxruntime"):
        out = pp.load(tmp_path / "ts.onnx", backend).run({"obs": obs})
        assert np.abs(out["logits"] - want).max() <= 1e-5, backend
    verified = invoke("verify", tmp_path / "ts.onnx", "--source", source, "-i", RSL / "observations.npy", "--trust",
                      "--json")
    report = json.loads(verified.stdout)
    assert verified.exit_code == 0 and report["passed"] is True and report["samples"] == 1000
    assert report["source_oracle"]["framework"] is True and "TorchScript module" in report["source_oracle"]["name"]
    # policyport exports without constant folding: _std and the epsilon stay apart (rsl_rl's own exporter folds
    # them into one constant), so extract gives every state_dict entry back under its name, bit for bit
    extracted = json.loads(invoke("extract", tmp_path / "ts.onnx", "-o", tmp_path / "w.npz", "--json").stdout)
    assert not extracted.get("folded")
    import torch

    state = torch.jit.load(str(source)).state_dict()  # the test trusts its own fixture
    weights = np.load(tmp_path / "w.npz")
    assert [k for k in state if k in weights] == list(weights)
    assert set(state) - set(weights) == {"obs_normalizer._var"}  # the exported forward reads _std, not _var
    for name in weights:
        want = state[name].numpy()
        assert weights[name].dtype == want.dtype and np.array_equal(weights[name], want), name


@pytest.mark.parametrize("checkpoint", ["rsl_rl/gaussian/model_0.pt", "rl_games/ant_elu/nn/ant_elu.pth"])
def test_a_zip_that_zipfile_refuses_is_a_damaged_file_not_a_bug(tmp_path, checkpoint):
    """A central directory declaring a zip version zipfile does not implement: the library checks that tell
    an rsl_rl checkpoint by its pickle's strings read it as no checkpoint, and the reader refuses it."""
    data = bytearray((ROOT / "fixtures" / checkpoint).read_bytes())
    entry = data.index(b"PK\x01\x02")
    data[entry + 6:entry + 8] = (163).to_bytes(2, "little")  # "version needed to extract" 16.3
    damaged = tmp_path / Path(checkpoint).name
    damaged.write_bytes(bytes(data))
    result = invoke("convert", damaged, "-o", tmp_path / "a.onnx")
    assert result.exit_code == 3, result.output
    assert "zip file version 16.3" in result.output and "bug" not in result.output
