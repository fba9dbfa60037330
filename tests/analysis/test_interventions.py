"""Intervention files (JSON and YAML) through the API, `run`, `record` and a packed folder's run.py, checked
against the MetaDrive expert's forward computed here in numpy from its weights."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import policyport as pp
from expert import expert_forward
from policyport.runtime.interventions import read_interventions, reservoir
from test_cli import invoke

BACKENDS = list(pp.BACKENDS)


@pytest.fixture(scope="module")
def files(tmp_path_factory, metadrive_onnx, metadrive_obs):
    """A folder with observations, a direction, a recording of the model on 400 observations and an
    intervention file (YAML and the same as JSON) naming them by relative path."""
    folder = tmp_path_factory.mktemp("interventions")
    np.save(folder / "obs.npy", metadrive_obs[:50])
    np.save(folder / "data.npy", metadrive_obs[600:1000])
    np.save(folder / "clean.npy", metadrive_obs[900:901])
    np.save(folder / "dir.npy", np.linspace(-1, 1, 256).astype(np.float32))
    result = invoke("record", metadrive_onnx, "-i", folder / "data.npy", "-o", folder / "acts.npz", "--tensors", "fc_*",
                    "--quiet")
    assert result.exit_code == 0, result.output
    (folder / "sets.yaml").write_text("""
left:
  fc_2/tanh: {"*": {add: dir.npy, alpha: 0.5}}
knockout:
  fc_1/tanh:
    "0:16": {ablate: zero}
    "16:32": {ablate: mean, recording: acts.npz}
    "32:48": {ablate: mean, dataset: data.npy}
swap:
  fc_2/tanh: {"*": {patch: clean.npy}}
scramble:
  fc_1/tanh: {"100:200": {ablate: resample, recording: acts.npz, seed: 3, rows: 64}}
brake:
  fc_2/tanh: {"17": 1.0}
""")
    import yaml

    (folder / "sets.json").write_text(json.dumps(yaml.safe_load((folder / "sets.yaml").read_text())))
    return folder


def expected(name, weights, obs, data):
    """The logits each set should give, from the weights alone."""
    a1, a2, _ = expert_forward(weights, data)
    if name == "left":
        return expert_forward(weights, obs, h2=lambda a: a + 0.5 * np.linspace(-1, 1, 256, dtype=np.float32))[2]
    if name == "knockout":
        def knocked(a):
            a = a.copy()
            a[:, :16] = 0
            a[:, 16:48] = a1.mean(axis=0)[16:48]
            return a
        return expert_forward(weights, obs, h1=knocked)[2]
    if name == "swap":
        return np.repeat(expert_forward(weights, data[300:301])[2], len(obs), axis=0)
    raise AssertionError(name)


@pytest.mark.parametrize("suffix", ["yaml", "json"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["left", "knockout", "swap"])
def test_a_set_in_the_api_gives_the_logits_of_the_forward_computed_here(files, metadrive_onnx, metadrive_weights,
                                                                       metadrive_obs, backend, suffix, name):
    session = pp.load(metadrive_onnx, backend=backend)
    edits = read_interventions(files / f"sets.{suffix}", name, session)
    got = session.run(metadrive_obs[:50], overrides=edits)["logits"]
    want = expected(name, metadrive_weights, metadrive_obs[:50], metadrive_obs[600:1000])
    np.testing.assert_allclose(got, want, atol=3e-5)


def test_resample_ablation_keeps_rows_of_the_recording_drawn_by_the_seed(files, metadrive_onnx, metadrive_weights,
                                                                        metadrive_obs):
    session = pp.load(metadrive_onnx)
    (edit,) = read_interventions(files / "sets.yaml", "scramble", session)
    samples = edit.array
    recorded = np.load(files / "acts.npz")["fc_1/tanh"]
    assert samples.shape == (64, 256)
    rows = [int(np.flatnonzero((recorded == s).all(axis=1))[0]) for s in samples]
    assert rows == sorted(rows) and len(set(rows)) == 64  # distinct rows of the recording, in its order
    keys = np.random.default_rng(3).random(400)
    assert rows == sorted(np.argsort(keys)[:64].tolist())  # the 64 smallest keys of the seed's draws
    blocks = [recorded[i:i + 37] for i in range(0, 400, 37)]
    np.testing.assert_array_equal(reservoir(blocks, 64, 3, "r"), samples)  # the same rows whatever the blocks


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_takes_an_intervention_file(files, metadrive_onnx, metadrive_weights, metadrive_obs, tmp_path, backend):
    out = tmp_path / "o.npz"
    result = invoke("run", metadrive_onnx, "-i", files / "obs.npy", "-o", out, "--backend", backend,
                    "--steer", "knockout", "--overrides", files / "sets.yaml", "--json")
    assert result.exit_code == 0, result.output
    with np.load(out) as o:
        np.testing.assert_allclose(o["logits"], expected("knockout", metadrive_weights, metadrive_obs[:50],
                                                         metadrive_obs[600:1000]), atol=3e-5)
    # the old form of a set still reads, in the same file
    result = invoke("run", metadrive_onnx, "-i", files / "obs.npy", "-o", tmp_path / "b.npz", "--steer", "brake",
                    "--overrides", files / "sets.yaml", "--record", tmp_path / "a.npz")
    assert result.exit_code == 0, result.output
    with np.load(tmp_path / "a.npz") as a:
        assert (a["fc_2/tanh"][:, 17] == 1).all()


def test_record_takes_an_intervention_file(files, metadrive_onnx, metadrive_weights, metadrive_obs, tmp_path):
    result = invoke("record", metadrive_onnx, "-i", files / "obs.npy", "-o", tmp_path / "r.npz", "--batch-size", "16",
                    "--steer", "left", "--overrides", files / "sets.json", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["overrides"] == ["fc_2/tanh[*]+=0.5*dir.npy"]
    with np.load(tmp_path / "r.npz") as r:
        np.testing.assert_allclose(r["logits"], expected("left", metadrive_weights, metadrive_obs[:50], metadrive_obs[600:1000]), atol=3e-5)


def test_a_patch_needs_one_observation_or_the_runs_rows(files, metadrive_onnx, tmp_path):
    np.save(tmp_path / "three.npy", np.load(files / "obs.npy")[:3])
    (tmp_path / "sets.json").write_text(json.dumps({"swap": {"fc_2/tanh": {"*": {"patch": "three.npy"}}}}))
    result = invoke("run", metadrive_onnx, "-i", files / "obs.npy", "-o", tmp_path / "o.npz",
                    "--steer", "swap", "--overrides", tmp_path / "sets.json")
    assert result.exit_code == 3
    assert ("fc_2/tanh[*]=patch(three.npy): the array has shape (3, 256), which is neither one row of the tensor "
            "'fc_2/tanh' ((256,)) nor its 50 rows (50, 256)") in " ".join(result.stderr.split())
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("doc, message", [
    ({"s": {"fc_1/tanh": {"*": {"ablate": "mean"}}}},
     "set 's': fc_1/tanh[*]: mean-ablation takes its statistics from a recording (recording: FILE) or a dataset"),
    ({"s": {"fc_1/tanh": {"*": {"ablate": "mean", "recording": "acts.npz", "seed": 1}}}},
     "set 's': fc_1/tanh[*]: mean-ablation takes no seed"),
    ({"s": {"fc_1/tanh": {"*": {"add": "dir.npy", "beta": 1}}}},
     "set 's': fc_1/tanh[*]: add takes ['add', 'alpha'], not ['beta']"),
    ({"s": {"fc_1/tanh": {"*": {"ablate": "resample", "recording": "acts.npz", "rows": 0}}}},
     "set 's': fc_1/tanh[*]: rows must be a whole number >= 1, got 0"),
    ({"s": {"obs": {"*": {"ablate": "mean", "recording": "acts.npz"}}}}, "acts.npz holds no tensor 'obs'"),
    ({"s": {"fc_1/tanh": {"*": {"patch": 3}}}}, "patch names a file of observations (.npy or .npz), got 3"),
])
def test_malformed_sets_are_refused_with_the_set_and_the_reason(files, metadrive_onnx, tmp_path, doc, message):
    shutil.copy(files / "acts.npz", tmp_path)
    shutil.copy(files / "dir.npy", tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(pp.PolicyportError) as caught:
        read_interventions(tmp_path / "bad.json", "s", pp.load(metadrive_onnx))
    assert message in str(caught.value)


def test_a_set_that_runs_the_model_needs_it(files):
    with pytest.raises(pp.InputMismatchError, match="running the model on data.npy needs the model"):
        read_interventions(files / "sets.yaml", "knockout")
    assert [e.spec for e in read_interventions(files / "sets.yaml", "left")] == ["fc_2/tanh[*]+=0.5*dir.npy"]


def test_yaml_tags_that_build_objects_are_refused(tmp_path):
    (tmp_path / "evil.yaml").write_text("s: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(pp.UnreadableFileError, match="is not YAML that the safe loader reads"):
        read_interventions(tmp_path / "evil.yaml", "s")


def test_a_packed_folder_runs_an_intervention_file_with_numpy_alone(files, metadrive_model, metadrive_weights,
                                                                   metadrive_obs, tmp_path):
    from numpy_venv import make_venv, run

    python = make_venv(tmp_path / "venv")
    folder = pp.pack(metadrive_model, tmp_path / "bundle", samples=8)
    result = run(python, folder / "run.py", "-i", files / "obs.npy", "-o", tmp_path / "o.npz", "--steer", "knockout",
                 "--overrides", files / "sets.json", "--override", "fc_2/tanh[3]=0.25", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["overrides"] == ["fc_1/tanh[0:16]=0", "fc_1/tanh[16:32]=mean(acts.npz)",
                                                      "fc_1/tanh[32:48]=mean(data.npy)", "fc_2/tanh[3]=0.25"]
    a1 = expert_forward(metadrive_weights, metadrive_obs[600:1000])[0]

    def knocked(a):
        a = a.copy()
        a[:, :16] = 0
        a[:, 16:48] = a1.mean(axis=0)[16:48]
        return a

    def steered(a):
        a = a.copy()
        a[:, 3] = 0.25
        return a

    want = expert_forward(metadrive_weights, metadrive_obs[:50], h1=knocked, h2=steered)[2]
    with np.load(tmp_path / "o.npz") as o:
        np.testing.assert_allclose(o["logits"], want, atol=3e-5)
    alone = run(python, folder / "run.py", "-i", files / "obs.npy", "-o", tmp_path / "p.npz", "--steer", "knockout")
    assert alone.returncode == 2 and "--steer NAME and --overrides FILE go together" in alone.stderr
    (tmp_path / "sets.yaml").write_text("s: {fc_1/tanh: {'0': 1.0}}\n")
    yaml_there = run(python, folder / "run.py", "-i", files / "obs.npy", "-o", tmp_path / "p.npz", "--steer", "s",
                     "--overrides", tmp_path / "sets.yaml")
    assert yaml_there.returncode == 4 and "pip install" in yaml_there.stderr and not (tmp_path / "p.npz").exists()
