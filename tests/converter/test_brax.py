"""Brax policies saved by Brax itself (``fixtures/brax/make_brax.py``: ``brax.io.model.save_params``): numpy's
and onnxruntime's ``action`` equal Brax's own deterministic action (``make_inference_fn(...,
deterministic=True)``) on 1,000 observations, the observation normaliser applied as Brax applies it;
``extract`` gives the arrays back bit for bit; nothing pickled in a file runs."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.errors import UntrustedFileError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "brax"
NAMES = ("ppo_params", "sac_params")


@pytest.fixture(scope="module")
def make_brax():
    pytest.importorskip("brax")
    sys.path.insert(0, str(FIXTURES))
    try:
        import make_brax
    finally:
        sys.path.remove(str(FIXTURES))
    return make_brax


def observations(n: int = 1000) -> np.ndarray:
    """Observations around the normaliser's mean (about 3) and beyond its std (about 2)."""
    return np.random.default_rng(5).normal(3, 4, (n, 8)).astype(np.float32)


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name", NAMES)
def test_action_equals_brax_deterministic_action(make_brax, name, backend):
    obs = observations()
    want = make_brax.deterministic_action(name, obs)
    converted = convert_source(FIXTURES / f"{name}.pkl")
    assert converted.kind == "brax"
    got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
    assert got.shape == want.shape == (1000, 2)
    assert np.abs(got - want).max() <= 1e-5 and np.abs(want).max() > 0.3


def test_the_normaliser_is_brax_formula_without_epsilon_or_clip(make_brax):
    """(obs - mean) / std: an epsilon (1e-8 on the variance, as gymnasium's) or a clip at 5 or 10 (as
    rl_games', skrl's) would move the action on these far observations."""
    obs = np.concatenate([observations(100), np.full((1, 8), 60, np.float32)])
    converted = convert_source(FIXTURES / "ppo_params.pkl")
    out = pp.load(converted.model).record({"obs": obs}, tensors="*")
    params = pickle.loads((FIXTURES / "ppo_params.pkl").read_bytes())  # the test trusts its own fixture
    mean, std = np.asarray(params[0].mean), np.asarray(params[0].std)
    assert np.array_equal(out["normalizer/obs"], (obs - mean) / std)
    assert out["normalizer/obs"].max() > 10
    assert np.abs(out["action"] - make_brax.deterministic_action("ppo_params", obs)).max() <= 1e-5


def test_detected_by_content_and_extract_gives_the_arrays_back(make_brax):
    assert detect_kind(FIXTURES / "ppo_params.pkl") == "brax"
    weights = pp.extract_weights(convert_source(FIXTURES / "sac_params.pkl").model)
    params = pickle.loads((FIXTURES / "sac_params.pkl").read_bytes())
    want = {"normalizer_params/mean": params[0].mean, "normalizer_params/std": params[0].std}
    want |= {f"params/{layer}/{p}": a for layer, ps in params[1]["params"].items() for p, a in ps.items()}
    assert set(weights) == set(want)
    for key, array in want.items():
        array = np.asarray(array)
        assert weights[key].dtype == array.dtype and np.array_equal(weights[key], array), key


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Inert:
    def __init__(self):
        self.note = "a class the reader does not rebuild"


def test_a_pickled_payload_never_runs(make_brax, tmp_path):
    from brax.io import model

    params = model.load_params(str(FIXTURES / "sac_params.pkl"))
    model.save_params(str(tmp_path / "extra.pkl"), (params[0], {"params": {**params[1]["params"], "extra": Inert()}}))
    with pytest.raises(pp.PolicyportError, match="extra"):  # an inert record where a layer should be: named
        convert_source(tmp_path / "extra.pkl", kind="brax")
    model.save_params(str(tmp_path / "with_record.pkl"), (params[0], params[1], {"note": Inert()}))
    assert convert_source(tmp_path / "with_record.pkl", kind="brax", activation="relu").kind == "brax"
    marker = tmp_path / "ran"
    model.save_params(str(tmp_path / "hostile.pkl"), (params[0], params[1], RunsCode(marker)))
    with pytest.raises(UntrustedFileError, match=r"\.system"):
        convert_source(tmp_path / "hostile.pkl", kind="brax")
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_params.pkl", "ppo_checkpoint"])
def test_convert_verify_pack_and_the_packed_run_py(make_brax, name, tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    source, out, folder = FIXTURES / name, tmp_path / "policy.onnx", tmp_path / "packed"
    runner = CliRunner()
    result = runner.invoke(app, ["convert", str(source), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verification"]["passed"]
    result = runner.invoke(app, ["verify", str(out), "--source", str(source), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"], result.output
    result = runner.invoke(app, ["pack", str(out), "-o", str(folder), "--source", str(source), "--json"])
    assert result.exit_code == 0, result.output
    done = subprocess.run([sys.executable, str(folder / "run.py"), "--verify", "--json"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and json.loads(done.stdout)["passed"], done.stderr


CHECKPOINT = FIXTURES / "ppo_checkpoint"
STEP = CHECKPOINT / "000000000005"


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("given", [CHECKPOINT, STEP], ids=["checkpoint folder", "step folder"])
def test_an_orbax_checkpoint_gives_brax_own_action(make_brax, given, backend):
    """The folder brax.training.checkpoint.save wrote, read with tensorstore: Brax's own deterministic action of
    what checkpoint.load restores, with the activation read from config.json (silu, not the default)."""
    assert detect_kind(given) == "brax"
    converted = convert_source(given)
    assert converted.notes == ["read as Brax PPO params (an orbax checkpoint, read with tensorstore)"]
    activation = next(a for a in converted.assumptions if a.topic == "activation")
    assert activation.assumes.startswith("silu at hidden_0") and "config.json" in activation.because
    obs = observations()
    want = _brax_checkpoint_action(STEP, obs)
    got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
    assert got.shape == want.shape == (1000, 2)
    assert np.abs(got - want).max() <= 1e-5 and np.abs(want).max() > 0.3


def test_an_orbax_checkpoint_holds_the_save_params_arrays_bit_for_bit(make_brax):
    """fixtures/brax/make_brax.py saves ppo_params.pkl's arrays into the checkpoint: extract gives each back."""
    from_folder = pp.extract_weights(convert_source(STEP).model)
    from_file = pp.extract_weights(convert_source(FIXTURES / "ppo_params.pkl", activation="silu").model)
    assert set(from_folder) == set(from_file) and len(from_folder) == 12
    for key, array in from_file.items():
        assert from_folder[key].dtype == array.dtype and np.array_equal(from_folder[key], array), key


def test_normalize_observations_false_leaves_the_normaliser_out(make_brax, tmp_path):
    """A second variant: a run trained without normalisation. Brax then applies the identity, whatever the
    saved statistics hold; so must the conversion."""
    import shutil

    folder = tmp_path / "000000000005"
    shutil.copytree(STEP, folder)
    config = json.loads((folder / "config.json").read_text())
    config["normalize_observations"] = False
    (folder / "config.json").write_text(json.dumps(config))
    converted = convert_source(folder)
    assert not any(k.startswith("normalizer") for k in pp.extract_weights(converted.model))
    assert any(a.topic == "observation filter" and "normalize_observations false" in a.because
               for a in converted.assumptions)
    obs = observations()
    want = _brax_checkpoint_action(folder, obs)
    assert np.abs(want - _brax_checkpoint_action(STEP, obs)).max() > 0.05  # the normaliser matters here
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
        assert np.abs(got - want).max() <= 1e-5, backend


def _copy_step(tmp_path) -> Path:
    import shutil

    folder = tmp_path / "000000000005"
    shutil.copytree(STEP, folder)
    return folder


def test_a_configuration_that_contradicts_the_arrays_is_refused(tmp_path):
    folder = _copy_step(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["network_factory_kwargs"]["policy_hidden_layer_sizes"] = [64, 64]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(pp.BadModelError, match=r"records policy layers \(64, 64\), the checkpoint holds \(32, 32, 32, 32\)"):
        convert_source(folder)
    config["network_factory_kwargs"] |= {"policy_hidden_layer_sizes": [32] * 4, "distribution_type": "normal"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(pp.BadModelError, match="distribution_type 'normal'"):
        convert_source(folder)


def test_damaged_orbax_folders_are_bad_files_and_write_nothing(tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    folder = _copy_step(tmp_path)
    (folder / "_METADATA").write_text("[" * 100_000)
    with pytest.raises(pp.UnreadableFileError, match="_METADATA"):
        convert_source(folder)
    folder = _copy_step(tmp_path / "second")
    for data in (folder / "d").iterdir():  # the database's out-of-line values: truncated
        data.write_bytes(data.read_bytes()[:20])
    result = CliRunner().invoke(app, ["convert", str(folder), "--from", "brax", "-o", str(tmp_path / "policy.onnx")])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert not (tmp_path / "policy.onnx").exists()


def test_a_leaf_declaring_more_than_the_array_limit_is_refused_before_it_is_read(tmp_path):
    """orbax without OCDBT writes plain zarr folders; one whose .zarray declares 16 GiB (its chunks absent, so
    tensorstore would fill them) is refused from the declaration, nothing allocated."""
    import shutil

    ts = pytest.importorskip("tensorstore")
    folder = tmp_path / "000000000001"
    folder.mkdir()
    shutil.copy(STEP / "_CHECKPOINT_METADATA", folder)
    tree = {"('0',)": {"key_metadata": [{"key": "0", "key_type": 1}],
                       "value_metadata": {"value_type": "np.ndarray", "write_shape": [1 << 20, 1 << 12]}}}
    (folder / "_METADATA").write_text(json.dumps({"tree_metadata": tree}))
    ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder / "0")}, "create": True,
             "metadata": {"shape": [1 << 20, 1 << 12], "chunks": [1 << 10, 1 << 12], "dtype": "<f4",
                          "compressor": None}}).result()
    assert detect_kind(folder) == "brax"
    with pytest.raises(pp.LimitExceededError, match=r"leaf 0 \(float32, shape \(1048576, 4096\)\) would take 16"):
        convert_source(folder)


def test_without_tensorstore_the_folder_names_the_extra(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(pp.MissingDependencyError, match=r"pip install 'policyport\[brax\]'"):
        convert_source(STEP)
    result = CliRunner().invoke(app, ["convert", str(STEP), "-o", str(tmp_path / "policy.onnx")])
    assert result.exit_code == 4 and not (tmp_path / "policy.onnx").exists(), result.output


def test_a_folder_without_orbax_metadata_is_no_brax_checkpoint(tmp_path):
    (tmp_path / "manifest.ocdbt").write_bytes(b"not orbax's")
    with pytest.raises(pp.UnreadableFileError, match="is a folder; --from brax takes a file Brax.s save_params wrote or a folder"):
        convert_source(tmp_path, kind="brax")
    with pytest.raises(pp.PolicyportError, match="cannot tell"):
        detect_kind(tmp_path)


def _brax_checkpoint_action(folder: Path, obs: np.ndarray) -> np.ndarray:
    """Brax's deterministic action of an orbax checkpoint: the arrays ``checkpoint.load`` restores, in the network
    ``make_ppo_networks`` builds from ``config.json``'s sizes and activation, run by ``make_inference_fn``.
    (brax 0.14.2's ``load_config`` fails on the ``null`` kernel initialisers its own ``save`` writes, so the
    config is read here.)"""
    import jax
    import jax.numpy as jnp
    from brax.training import checkpoint, networks
    from brax.training.acme import running_statistics
    from brax.training.agents.ppo import networks as ppo_networks

    config = json.loads((folder / "config.json").read_text())
    kwargs = config["network_factory_kwargs"]
    from brax.training import types

    normalize = running_statistics.normalize if config["normalize_observations"] else types.identity_observation_preprocessor
    nets = ppo_networks.make_ppo_networks(config["observation_size"], config["action_size"],
                                          preprocess_observations_fn=normalize,
                                          policy_hidden_layer_sizes=tuple(kwargs["policy_hidden_layer_sizes"]),
                                          value_hidden_layer_sizes=tuple(kwargs["value_hidden_layer_sizes"]),
                                          activation=networks.ACTIVATION[kwargs["activation"]])
    policy = ppo_networks.make_inference_fn(nets)(checkpoint.load(folder), deterministic=True)
    return np.asarray(policy(jnp.asarray(obs), jax.random.PRNGKey(0))[0])
