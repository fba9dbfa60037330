"""RLlib checkpoints: read without Ray and without running pickled code; filters baked in; Ray's own outputs matched."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.converter import convert_source
from policyport.cli import app
from policyport.converter.sources.rllib import EPSILON_RS, EPSILON_RUNNING_STATS, _filter, read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
RLLIB = ROOT / "fixtures" / "rllib"
LEGACY = RLLIB / "legacy" / "checkpoint_000120" / "checkpoint-120"
MALICIOUS = RLLIB / "malicious" / "checkpoint-1"
RAY = RLLIB / "ray"

runner = CliRunner()

# A meta-path finder that makes `import ray` fail, as on a machine without Ray.
BLOCK_RAY = (
    "import sys\n"
    "class NoRay:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'ray':\n"
    "            raise ImportError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, NoRay())\n"
)


class _StandInUnpickler(pickle.Unpickler):
    """The test's own reading of the legacy fixture: RLlib's filter classes as plain objects."""

    def find_class(self, module, name):
        if module == "ray.rllib.utils.filter":
            return type(name, (), {})
        return super().find_class(module, name)


@pytest.fixture(scope="module")
def legacy_worker():
    with open(LEGACY, "rb") as f:
        outer = _StandInUnpickler(f).load()
    import io

    return _StandInUnpickler(io.BytesIO(outer["worker"])).load()


def _ray1_filter(obs: np.ndarray, filt) -> np.ndarray:
    """Ray 1.x MeanStdFilter.__call__ (float64, then the observation's dtype)."""
    rs = filt.rs
    var = rs._S / (rs._n - 1) if rs._n > 1 else np.square(rs._M)
    y = (obs.astype(np.float64) - rs._M) / (np.sqrt(var) + 1e-8)
    return np.clip(y, -filt.clip, filt.clip).astype(obs.dtype)


def _fcnet(weights: dict, x: np.ndarray, prefix="default_policy/", value=False) -> np.ndarray:
    h = x
    stem = "fc_value_" if value else "fc_"
    i = 1
    while f"{prefix}{stem}{i}/kernel" in weights:
        h = np.tanh(h @ weights[f"{prefix}{stem}{i}/kernel"] + weights[f"{prefix}{stem}{i}/bias"])
        i += 1
    out = "value_out" if value else "fc_out"
    return h @ weights[f"{prefix}{out}/kernel"] + weights[f"{prefix}{out}/bias"]


def test_legacy_checkpoint_converts_without_ray_and_matches_the_filtered_metadrive_forward(
        tmp_path, legacy_worker, metadrive_weights, metadrive_obs):
    out = tmp_path / "metadrive.onnx"
    code = BLOCK_RAY + (
        "from policyport.cli import main\n"
        "sys.argv = ['policyport', 'convert', sys.argv[1], '-o', sys.argv[2], '--head', 'diag-gaussian', '--json']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    assert not [m for m in sys.modules if m.split('.')[0] == 'ray'], 'ray was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(LEGACY), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verification"]["passed"] and doc["kind"] == "rllib"
    assert any("MeanStdFilter" in n for n in doc["notes"]) and any("value branch" in n for n in doc["notes"])

    filt = legacy_worker["filters"]["default_policy"]
    filtered = _ray1_filter(metadrive_obs, filt)
    assert (np.abs(filtered) == filt.clip).any()  # the clip is exercised
    logits = _fcnet(metadrive_weights, filtered)
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(out, backend=backend).record({"obs": metadrive_obs}, "*")
        np.testing.assert_allclose(got["obs_filter/clip"], filtered, atol=1e-5, rtol=1e-5)
        for name, expected in (("logits", logits), ("action", logits[:, :2]), ("log_std", logits[:, 2:])):
            assert np.abs(got[name] - expected).max() <= 1e-5, (backend, name)
        assert "value" not in got


def test_value_branch_only_with_keep_value(legacy_worker, metadrive_obs):
    plain = pp.convert(LEGACY)
    assert [o.name for o in plain.graph.output] == ["logits"]
    kept = pp.convert(LEGACY, keep_value=True)
    assert [o.name for o in kept.graph.output] == ["logits", "value"]
    state = legacy_worker["state"]["default_policy"]
    expected = _fcnet(state, _ray1_filter(metadrive_obs, legacy_worker["filters"]["default_policy"]), value=True)
    got = pp.load(kept, backend="onnxruntime").run({"obs": metadrive_obs})["value"]
    assert np.abs(got - expected).max() <= 1e-5
    weights = pp.extract_weights(kept)
    for name, value in state.items():
        if name != "_optimizer_variables":
            assert weights[name].tobytes() == value.tobytes(), name
    assert not [k for k in weights if "optimizer" in k]


def test_no_filter_leaves_the_filter_out(metadrive_weights, metadrive_obs):
    model = pp.convert(LEGACY, obs_filter=False)
    assert not [n for n in model.graph.node if n.name.startswith("obs_filter")]
    got = pp.load(model).run({"obs": metadrive_obs})["logits"]
    assert np.abs(got - _fcnet(metadrive_weights, metadrive_obs)).max() <= 1e-5


def test_a_filter_that_has_seen_no_observations_is_baked_in_with_a_warning():
    converted = convert_source(LEGACY, policy_id="opponent")
    assert ("warning: the MeanStdFilter of policy 'opponent' has seen no observations: it divides by std + epsilon = "
            "1e-08 at most, as RLlib does, so almost every observation ends at the clip bound ±10 and the policy's "
            "output barely depends on it; was this policy ever trained?") in converted.notes
    width = converted.model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    obs = np.linspace(-3, 3, 8 * width, dtype=np.float32).reshape(8, width)
    clipped = pp.load(converted.model).record({"obs": obs}, "obs_filter/clip")["obs_filter/clip"]
    assert (np.abs(clipped) == 10).all()  # as the warning says
    assert not any("has seen no observations" in n for n in convert_source(LEGACY).notes)  # 12,000 observations


def test_policy_id_picks_a_policy_and_an_unknown_one_lists_those_present(tmp_path):
    model = pp.convert(LEGACY, policy_id="opponent")
    assert [i.dims for i in model.graph.initializer if i.name == "opponent/fc_out/kernel"] == [[4, 2]]
    result = runner.invoke(app, ["convert", str(LEGACY), "-o", str(tmp_path / "x.onnx"), "--policy-id", "hero"])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert "'hero'" in result.output and "default_policy, opponent" in result.output


def test_a_malicious_pickle_is_refused_naming_the_global_and_never_runs(tmp_path):
    marker = tmp_path / "policyport-pickle-ran"
    proc = subprocess.run([sys.executable, "-m", "policyport", "convert", str(MALICIOUS), "-o", "out.onnx"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "posix.system" in proc.stderr and "--trust" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists() and not (tmp_path / "out.onnx").exists()
    with pytest.raises(pp.UntrustedFileError, match="posix.system"):
        pp.convert(MALICIOUS)
    assert not marker.exists() and not Path("policyport-pickle-ran").exists()


@pytest.mark.parametrize("name", ["ppo_new", "ppo_new_msgpack", "ppo_old_torch"])
def test_ray_written_checkpoints_match_rays_own_filter_and_forward(name):
    expected = dict(np.load(RAY / f"{name}_expected.npz"))
    model = pp.convert(RAY / name, keep_value="value" in expected)
    logits = expected.get("action_dist_inputs", expected.get("logits"))
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).record({"obs": expected["obs"]}, "*")
        filtered = got.get("obs_filter/clip", got.get("obs_filter/destd"))
        assert np.abs(filtered - expected["filtered_obs"]).max() <= 1e-5
        assert np.abs(got["logits"] - logits).max() <= 1e-5
        np.testing.assert_array_equal(got["action"], np.argmax(logits, axis=1))  # CartPole: Discrete(2)
        if "value" in expected:
            assert np.abs(got["value"].ravel() - expected["value"].ravel()).max() <= 1e-5


#: What RLlib's tf2 checkpoints import when unpickled the usual way, none of which the reader may import.
BLOCK_FRAMEWORKS = BLOCK_RAY.replace("== 'ray'", "in ('ray', 'tensorflow', 'tf_keras', 'keras', 'tree')")


@pytest.mark.parametrize("name", ["ppo_old_tf2", "ppo_old_tf2_pendulum"])
def test_old_stack_tf2_checkpoints_match_rays_compute_single_action(name):
    expected = dict(np.load(RAY / f"{name}_expected.npz"))
    model = pp.convert(RAY / name, keep_value=True)
    logits = expected["action_dist_inputs"]
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).record({"obs": expected["obs"]}, "*")
        assert np.abs(got["obs_filter/destd"] - expected["filtered_obs"]).max() <= 1e-5  # old stack: no clip
        assert np.abs(got["logits"] - logits).max() <= 1e-5
        assert np.abs(got["value"].ravel() - expected["vf_preds"]).max() <= 1e-5
        if name.endswith("pendulum"):  # Box(1,): [mean, log_std]; the action is the mean, before Ray rescales it
            assert np.abs(got["action"] - expected["action_normalized"]).max() <= 1e-5
            assert np.abs(got["log_std"] - logits[:, 1:]).max() <= 1e-5
        else:
            np.testing.assert_array_equal(got["action"], expected["action"])


def test_an_old_stack_tf2_checkpoint_converts_without_ray_tensorflow_or_tree(tmp_path):
    out = tmp_path / "tf2.onnx"
    code = BLOCK_FRAMEWORKS + (
        "from policyport.cli import main\n"
        "sys.argv = ['policyport', 'convert', sys.argv[1], '-o', sys.argv[2], '--json']\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    assert not [m for m in sys.modules if m.split('.')[0] in ('ray', 'tensorflow', 'tf_keras', 'tree')]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(RAY / "ppo_old_tf2"), str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verification"]["passed"] and doc["kind"] == "rllib" and out.is_file()
    assert "dropped optimizer state (25 _optimizer_variables)" in doc["notes"]
    expected = dict(np.load(RAY / "ppo_old_tf2_expected.npz"))
    got = pp.load(str(out)).run({"obs": expected["obs"]})
    assert np.abs(got["logits"] - expected["action_dist_inputs"]).max() <= 1e-5


class _CallsAPartial:
    """Pickles as ``functools.partial(func, *args)()``, as tf_keras pickles a TensorFlow variable."""

    def __init__(self, func, *args):
        self.partial = functools.partial(func, *args)

    def __reduce__(self):
        return self.partial, ()


def test_a_tf2_policy_state_whose_partial_wraps_a_command_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    folder = _policy_folder(tmp_path, {"weights": [np.zeros((4, 2), np.float32), np.zeros(2, np.float32)],
                                       "_optimizer_variables": [_CallsAPartial(os.system, f"touch {marker}")]})
    out = tmp_path / "x.onnx"
    result = runner.invoke(app, ["convert", str(folder), "-o", str(out)])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert f"asks to call {os.system.__module__}.system while unpickling" in result.output
    assert not marker.exists() and not out.exists()


def test_an_old_stack_tf2_weight_list_is_named_by_its_optimizers_slot_variables():
    ckpt = read_checkpoint(RAY / "ppo_old_tf2")
    order = ["fc_1", "fc_value_1", "fc_2", "fc_value_2", "fc_out", "value_out"]
    assert list(ckpt.weights) == [f"default_policy/{layer}/{p}" for layer in order for p in ("kernel", "bias")]
    assert [ckpt.weights[f"default_policy/{layer}/kernel"].shape for layer in order] == [
        (4, 8), (4, 8), (8, 8), (8, 8), (8, 2), (8, 1)]
    shared = read_checkpoint(RAY / "ppo_old_tf2_pendulum")
    assert {k: v.shape for k, v in shared.weights.items()} == {
        "default_policy/fc_1/kernel": (3, 8), "default_policy/fc_1/bias": (8,), "default_policy/fc_out/kernel": (8, 2),
        "default_policy/fc_out/bias": (2,), "default_policy/value_out/kernel": (8, 1),
        "default_policy/value_out/bias": (1,)}


def test_the_optimizers_slot_names_win_over_the_model_configs_order_only_when_they_fit_the_list():
    from policyport.converter.readers.unpickle import Record
    from policyport.converter.sources.rllib import _name_tf2_list

    def slot(name, shape):
        return Record(name=name, initial_value=np.zeros(shape, np.float32))

    shapes = [(2, 3), (3,), (3, 1), (1,), (3, 2), (2,)]
    arrays = [np.full(shape, float(i), np.float32) for i, shape in enumerate(shapes)]
    slots = Record()  # as tf_keras pickles an optimizer's variables: a step counter, then m and v slots
    slots.list_items.append(slot("iteration", ()))
    for name, shape in zip(["fc_1/kernel", "fc_1/bias", "value_out/kernel", "value_out/bias", "fc_out/kernel",
                            "fc_out/bias"], shapes):
        slots.list_items += [slot(f"Adam/m/{name}", shape), slot(f"Adam/v/{name}", shape)]
    config = {"fcnet_hiddens": [3], "vf_share_layers": True}  # its order: fc_1, fc_out, value_out
    named = _name_tf2_list(arrays, config, "p", slots)
    assert {k: (v.shape, float(v.flat[0])) for k, v in named.items()} == {
        "p/fc_1/kernel": ((2, 3), 0.0), "p/fc_1/bias": ((3,), 1.0), "p/value_out/kernel": ((3, 1), 2.0),
        "p/value_out/bias": ((1,), 3.0), "p/fc_out/kernel": ((3, 2), 4.0), "p/fc_out/bias": ((2,), 5.0)}
    slots.list_items[1] = slot("Adam/m/fc_1/kernel", (3, 2))  # slots of other shapes name another list
    fallback = _name_tf2_list(arrays, config, "p", slots)
    assert list(fallback) == ["p/fc_1/kernel", "p/fc_1/bias", "p/fc_out/kernel", "p/fc_out/bias", "p/value_out/kernel",
                              "p/value_out/bias"]
    assert fallback["p/fc_out/kernel"].shape == (3, 1)
    with pytest.raises(pp.BadModelError, match="unnamed list of 6 arrays; its model config"):
        _name_tf2_list(arrays, {"fcnet_hiddens": [3], "vf_share_layers": False}, "p", slots)


#: Every graph output policyport gives each checkpoint Ray wrote (converted with --keep-value), and what Ray
#: computed under its own name for it (``<name>_expected.npz``; ``dqn_new``: ``qf_preds``, which its
#: Categorical takes as logits; ``ppo_new`` records the logits alone, whose argmax its deterministic
#: Categorical returns; a DiagGaussian's log_std is the second half of its inputs).
RAY_NAMES = {
    "ppo_new": {"logits": "action_dist_inputs", "value": None,
                "action": lambda e: np.argmax(e["action_dist_inputs"], axis=1)},
    "ppo_old_torch": {"logits": "logits", "value": "value", "action": lambda e: np.argmax(e["logits"], axis=1)},
    "ppo_old_tf2": {"logits": "action_dist_inputs", "value": "vf_preds", "action": "action"},
    "ppo_old_tf2_pendulum": {"logits": "action_dist_inputs", "value": "vf_preds", "action": "action_normalized",
                             "log_std": lambda e: e["action_dist_inputs"][:, 1:]},
    "dqn_new": {"logits": "qf_preds", "action": "actions"},
}


@pytest.mark.parametrize("name", sorted(RAY_NAMES))
def test_every_output_name_is_what_ray_calls_that_value(name):
    expected = dict(np.load(RAY / f"{name}_expected.npz"))
    model = pp.convert(RAY / name, keep_value=name != "dqn_new")
    assert sorted(o.name for o in model.graph.output) == sorted(RAY_NAMES[name])
    got = pp.load(model, backend="onnxruntime").run({"obs": expected["obs"]})
    for output, ray in RAY_NAMES[name].items():
        if ray is None:  # Ray's forward_inference of a new-stack PPO computes no value
            continue
        want = ray(expected) if callable(ray) else expected[ray]
        assert np.abs(got[output].reshape(want.shape) - want).max() <= 1e-5, output


def test_the_msgpack_checkpoint_reads_as_its_pickle_twin():
    a, b = read_checkpoint(RAY / "ppo_new"), read_checkpoint(RAY / "ppo_new_msgpack")
    assert list(a.weights) == list(b.weights)
    for k in a.weights:
        assert a.weights[k].tobytes() == b.weights[k].tobytes()
    assert b.obs_filter is not None and np.array_equal(a.obs_filter.mean, b.obs_filter.mean)


@pytest.mark.skipif(not (RAY / "dqn_new").is_dir(), reason="no Ray DQN checkpoint")
@pytest.mark.parametrize("opset", [17, 18])  # ReduceMean takes its axes as an attribute, from 18 as an input
def test_dqn_logits_are_rays_dueling_q_values_and_the_action_their_argmax(opset):
    expected = dict(np.load(RAY / "dqn_new_expected.npz"))  # qf_preds: what Ray's Categorical takes as logits
    model = pp.convert(RAY / "dqn_new", opset=opset)
    assert [o.name for o in model.graph.output] == ["logits", "action"]
    assert [o.version for o in model.opset_import if o.domain == ""] == [opset]
    mean = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    assert (len(mean.input), [a.name for a in mean.attribute]) == ((2, ["keepdims"]) if opset >= 18 else (1, ["axes", "keepdims"]))
    for backend in ("onnxruntime", "numpy"):
        got = pp.load(model, backend=backend).record({"obs": expected["obs"]}, "*")
        assert np.abs(got["logits"] - expected["qf_preds"]).max() <= 1e-5
        np.testing.assert_array_equal(got["action"], expected["actions"])  # Ray's forward_inference
        q = got["value"] + got["advantages"] - got["advantages"].mean(axis=1, keepdims=True)
        assert np.abs(q - expected["qf_preds"]).max() <= 1e-5  # the two streams, named
        assert np.abs(got["advantages"] - expected["qf_preds"]).max() > 1e-2  # which are not the logits


def test_filter_forms_and_their_epsilons():
    rs = _filter({"demean": True, "destd": True, "clip": 5.0,
                  "rs": {"_n": 1, "_M": np.array([2.0, -1.0]), "_S": np.array([0.0, 0.0])}})
    assert rs.epsilon == EPSILON_RS == 1e-8 and rs.form == "rs"
    np.testing.assert_array_equal(rs.std, [2.0, 1.0])  # n <= 1: variance is _M ** 2
    new = _filter({"de_mean_to_zero": True, "de_std_to_one": False, "clip_by_value": None,
                   "running_stats": [{"num_pushes": 5, "mean_array": np.array([1.0]), "sum_sq_diff_array": np.array([16.0])}]})
    assert new.epsilon == EPSILON_RUNNING_STATS == 1e-6 and new.form == "running_stats"
    assert (new.destd, new.clip) == (False, None) and new.std[0] == 2.0
    assert _filter({"running_stats": [{"num_pushes": 1, "mean_array": np.array([3.0]),
                                       "sum_sq_diff_array": np.array([0.0])}]}).std[0] == 0.0


def _policy_folder(tmp_path: Path, policy_state: dict) -> Path:
    folder = tmp_path / "ckpt"
    (folder / "policies" / "default_policy").mkdir(parents=True)
    (folder / "rllib_checkpoint.json").write_text('{"type": "Algorithm", "checkpoint_version": "1.1"}')
    (folder / "policies" / "default_policy" / "policy_state.pkl").write_bytes(pickle.dumps(policy_state))
    return folder


def test_a_discrete_observation_is_one_hot_encoded_in_the_graph(tmp_path):
    rng = np.random.default_rng(0)
    w = {"_hidden_layers.0._model.0.weight": rng.normal(size=(6, 5)).astype(np.float32),
         "_hidden_layers.0._model.0.bias": rng.normal(size=6).astype(np.float32),
         "_logits._model.0.weight": rng.normal(size=(3, 6)).astype(np.float32),
         "_logits._model.0.bias": rng.normal(size=3).astype(np.float32)}
    folder = _policy_folder(tmp_path, {
        "weights": w,
        "policy_spec": {"observation_space": {"space": {"space": "discrete", "n": 5, "start": 0}},
                        "action_space": {"space": {"space": "discrete", "n": 3, "start": 0}},
                        "config": {"model": {"fcnet_activation": "relu"}}}})
    model = pp.convert(folder)
    obs = np.array([0, 4, 2, 2, 1], dtype=np.int64)
    one_hot = np.eye(5, dtype=np.float32)[obs]
    h = np.maximum(one_hot @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"], 0)
    logits = h @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": obs})
        assert np.abs(got["logits"] - logits).max() <= 1e-5
        np.testing.assert_array_equal(got["action"], np.argmax(logits, axis=1))


def test_an_unnamed_tf2_weight_list_is_named_in_rllibs_variable_order(tmp_path, metadrive_weights, metadrive_obs):
    rng = np.random.default_rng(1)
    w = {k.split("/", 1)[1]: v for k, v in metadrive_weights.items()}
    value = {"fc_value_1/kernel": rng.normal(size=(275, 256)), "fc_value_1/bias": rng.normal(size=256),
             "fc_value_2/kernel": rng.normal(size=(256, 256)), "fc_value_2/bias": rng.normal(size=256),
             "value_out/kernel": rng.normal(size=(256, 1)), "value_out/bias": rng.normal(size=1)}
    w.update({k: v.astype(np.float32) for k, v in value.items()})
    order = ["fc_1", "fc_value_1", "fc_2", "fc_value_2", "fc_out", "value_out"]
    listed = [w[f"{layer}/{p}"] for layer in order for p in ("kernel", "bias")]
    folder = _policy_folder(tmp_path, {"weights": listed, "policy_spec": {"config": {"model": {
        "fcnet_hiddens": [256, 256], "vf_share_layers": False, "fcnet_activation": "tanh"}}}})
    converted = convert_source(folder, head="diag-gaussian")
    model = converted.model
    got = pp.load(model).run({"obs": metadrive_obs})["logits"]
    assert np.abs(got - _fcnet(metadrive_weights, metadrive_obs)).max() <= 1e-5
    assert [str(a) for a in converted.assumptions if a.topic == "layout"] == [
        "layout weight list in RLlib's variable order (fc_1, fc_value_1, fc_2, fc_value_2, fc_out, value_out): "
        f"{folder / 'policies' / 'default_policy' / 'policy_state.pkl'} holds the tf2 policy's weights as an unnamed "
        "list and no optimizer slot variable names each array; named in the order ray/rllib/models/tf/fcnet.py "
        "creates its variables for the model config"]
    assert set(pp.extract_weights(model)) == {f"default_policy/{k}" for k in ("fc_1/kernel", "fc_1/bias", "fc_2/kernel",
                                                                           "fc_2/bias", "fc_out/kernel", "fc_out/bias")}


def test_packed_folder_records_the_filter(tmp_path):
    model = pp.convert(LEGACY, head="diag-gaussian")
    folder = pp.pack(model, tmp_path / "bundle", samples=8)
    policy = json.loads((folder / "policy.json").read_text())
    filt = policy["observation_filter"]
    assert filt["type"] == "MeanStdFilter" and filt["clip"] == 5.0 and filt["epsilon"] == 1e-8
    assert filt["count"] == 12000 and len(filt["mean"]) == len(filt["std"]) == 275
    assert pp.verify_bundle(folder).passed


def test_verify_against_the_checkpoint_rebuilds_the_recorded_options(tmp_path):
    out = tmp_path / "md.onnx"
    assert runner.invoke(app, ["convert", str(LEGACY), "-o", str(out), "--keep-value", "--no-filter"]).exit_code == 0
    result = runner.invoke(app, ["verify", str(out), "--source", str(LEGACY), "--json"])
    assert result.exit_code == 0, result.output
    compared = {c["tensor"] for c in json.loads(result.stdout)["comparisons"] if c["reference"] == "source"}
    assert {"fc_1/tanh", "logits", "value"} <= compared and not [t for t in compared if t.startswith("obs_filter")]


def test_an_activation_contradicting_the_model_config_is_refused():
    with pytest.raises(pp.OptionError, match="--activation relu contradicts the checkpoint's model config "
                                               r"\(fcnet_activation\), which names tanh"):
        pp.convert(RAY / "ppo_new", activation="relu")
    assert convert_source(RAY / "ppo_new", activation="tanh").kind == "rllib"


def test_an_old_tf2_weight_list_is_named_in_policy_variables_order():
    from policyport.converter.sources.rllib import _name_tf2_list

    arrays = [np.full(1, i, np.float32) for i in range(13)]
    named = _name_tf2_list(arrays[:12], {}, "p")  # RLlib's defaults: two hidden layers, separate value branch
    assert list(named) == [f"p/{layer}/{param}" for layer in ("fc_1", "fc_value_1", "fc_2", "fc_value_2", "fc_out",
                                                              "value_out") for param in ("kernel", "bias")]
    assert [int(v[0]) for v in named.values()] == list(range(12))
    shared = _name_tf2_list(arrays[:7], {"fcnet_hiddens": [8], "vf_share_layers": True, "free_log_std": True}, "p")
    assert list(shared) == ["p/fc_1/kernel", "p/fc_1/bias", "p/fc_out/kernel", "p/fc_out/bias", "p/value_out/kernel",
                            "p/value_out/bias", "p/log_std"]
    with pytest.raises(pp.BadModelError) as caught:
        _name_tf2_list(arrays[:5], {"fcnet_hiddens": [8]}, "p")
    assert str(caught.value) == ("the tf2 policy's weights are an unnamed list of 5 arrays; its model config "
                                 "(fcnet_hiddens [8], vf_share_layers False) needs 8: p/fc_1/kernel, p/fc_1/bias, "
                                 "p/fc_value_1/kernel, p/fc_value_1/bias, p/fc_out/kernel, p/fc_out/bias, "
                                 "p/value_out/kernel, p/value_out/bias")


# ----------------------------------------------------------------------- old API stack, built in tmp_path


def _small_torch_weights(seed: int = 3) -> dict:
    """A 3-4-2 FullyConnectedNetwork state_dict in RLlib's old-stack torch names."""
    rng = np.random.default_rng(seed)
    return {"_hidden_layers.0._model.0.weight": rng.normal(size=(4, 3)).astype(np.float32),
            "_hidden_layers.0._model.0.bias": rng.normal(size=4).astype(np.float32),
            "_logits._model.0.weight": rng.normal(size=(2, 4)).astype(np.float32),
            "_logits._model.0.bias": rng.normal(size=2).astype(np.float32)}


def _stats_filter(mean, sum_sq, n: int, clip=None) -> dict:
    """A Ray 2.x MeanStdFilter state as the old stack pickles it (arrays plain)."""
    return {"demean": True, "destd": True, "clip": clip, "running_stats": [
        {"num_pushes": n, "mean_array": np.asarray(mean, np.float64), "sum_sq_diff_array": np.asarray(sum_sq, np.float64)}]}


def _connectors(filt: dict) -> dict:
    """``policy_state['connector_configs']`` as Ray 2.x writes it, the filter's state second."""
    return {"agent": ("AgentConnectorPipeline", [("ObsPreprocessorConnector", None),
                                                  ("MeanStdObservationFilterAgentConnector", filt)])}


FILTER_A = _stats_filter([1.0, -2.0, 0.5], [36.0, 4.0, 0.0], 5, clip=3.0)  # std 3, 1, 0
FILTER_B = _stats_filter([-1.0, 0.0, 2.0], [4.0, 16.0, 64.0], 5)  # std 1, 2, 4


def test_an_old_stack_filter_is_read_from_algorithm_state_before_the_connectors(tmp_path):
    w = _small_torch_weights()
    folder = _policy_folder(tmp_path, {"weights": w, "connector_configs": _connectors(FILTER_B)})
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps(
        {"worker": {"filters": {"default_policy": FILTER_A, "other": FILTER_B}}}))
    ckpt = read_checkpoint(folder)
    f = ckpt.obs_filter
    np.testing.assert_array_equal(f.mean, [1.0, -2.0, 0.5])
    np.testing.assert_array_equal(f.std, [3.0, 1.0, 0.0])
    assert (f.clip, f.count, f.epsilon, f.form) == (3.0, 5, EPSILON_RUNNING_STATS, "running_stats")
    assert set(ckpt.files) == {"algorithm_state.pkl", str(Path("policies/default_policy/policy_state.pkl"))}

    # The converted graph divides by std + 1e-6, clips at 3 and runs tanh (RLlib's default activation).
    obs = np.array([[4.0, -2.5, 0.5], [1.0, 0.0, 0.5 + 1e-6], [-20.0, -2.0, 0.0]], np.float32)
    y = np.clip((obs.astype(np.float64) - [1.0, -2.0, 0.5]) / (np.array([3.0, 1.0, 0.0]) + 1e-6), -3, 3)
    h = np.tanh(y @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"])
    logits = h @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]
    model = pp.convert(folder)
    assert [o.name for o in model.graph.output] == ["logits"]  # no action space recorded: no head
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).record({"obs": obs}, "*")
        np.testing.assert_allclose(got["obs_filter/clip"], y, rtol=1e-5, atol=1e-5)
        assert np.abs(got["logits"] - logits).max() <= 1e-5

    # Without algorithm_state (or without its worker's filter) the connector pipeline's copy is read.
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps({"worker": {"filters": {"other": FILTER_A}}}))
    np.testing.assert_array_equal(read_checkpoint(folder).obs_filter.mean, [-1.0, 0.0, 2.0])
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps({"counters": {}}))
    np.testing.assert_array_equal(read_checkpoint(folder).obs_filter.std, [1.0, 2.0, 4.0])
    (folder / "algorithm_state.pkl").unlink()
    b = read_checkpoint(folder).obs_filter
    np.testing.assert_array_equal(b.std, [1.0, 2.0, 4.0])
    assert b.clip is None


@pytest.mark.parametrize("connectors", [
    {}, {"agent": None}, {"agent": ("AgentConnectorPipeline",)},
    {"agent": ("AgentConnectorPipeline", [("ObsPreprocessorConnector", None), (), ("ClipRewardAgentConnector", FILTER_B)])},
])
def test_connector_configs_without_a_mean_std_filter_give_no_filter(tmp_path, connectors):
    folder = _policy_folder(tmp_path, {"weights": _small_torch_weights(), "connector_configs": connectors})
    assert read_checkpoint(folder).obs_filter is None
    model = pp.convert(folder)
    assert not [n for n in model.graph.node if n.name.startswith("obs_filter")]


def test_a_policy_state_without_spec_config_or_model_takes_rllibs_defaults(tmp_path):
    w = _small_torch_weights(4)
    obs = np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32)
    h = np.tanh(obs @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"])
    expected = h @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]
    for n, state in enumerate([{"weights": w}, {"weights": w, "policy_spec": None},
                               {"weights": w, "policy_spec": {"config": None}},
                               {"weights": w, "policy_spec": {"config": {"model": None}}},
                               {"weights": w, "policy_spec": {"config": {"model": {"fcnet_hiddens": [4]}}}}]):
        ckpt = read_checkpoint(_policy_folder(tmp_path / str(n), state))
        assert (ckpt.layout, ckpt.policy_id, ckpt.policy_ids, ckpt.framework) == (
            "old-stack", "default_policy", ["default_policy"], "torch")
        assert (ckpt.obs_space, ckpt.action_space, ckpt.obs_filter, ckpt.dropped) == (None, None, None, [])
        assert ckpt.model_config == ({"fcnet_hiddens": [4]} if n == 4 else {})
        converted = convert_source(tmp_path / str(n) / "ckpt")
        assert any("old-stack checkpoint: converted policy 'default_policy'" == note for note in converted.notes)
        got = pp.load(converted.model).run({"obs": obs})["logits"]
        assert np.abs(got - expected).max() <= 1e-5  # tanh, RLlib's default fcnet_activation


def test_the_model_config_of_the_policy_spec_chooses_the_activation_and_the_spaces_the_head(tmp_path):
    w = _small_torch_weights(6)
    folder = _policy_folder(tmp_path, {"weights": w, "policy_spec": {
        "observation_space": {"space": {"space": "box", "shape": [3]}},
        "action_space": {"space": {"space": "discrete", "n": 2}},
        "config": {"model": {"fcnet_activation": "relu", "vf_share_layers": True}}}})
    ckpt = read_checkpoint(folder)
    assert (ckpt.obs_space, ckpt.action_space) == (("box", (3,)), ("discrete", 2))
    assert ckpt.model_config == {"fcnet_activation": "relu", "vf_share_layers": True}
    obs = np.random.default_rng(7).normal(size=(5, 3)).astype(np.float32)
    h = np.maximum(obs @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"], 0)
    logits = h @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]
    got = pp.load(pp.convert(folder)).run({"obs": obs})
    assert np.abs(got["logits"] - logits).max() <= 1e-5
    np.testing.assert_array_equal(got["action"], np.argmax(logits, axis=1))  # Discrete actions: categorical


def test_an_old_stack_with_several_policies_reads_the_one_named_and_its_filter(tmp_path):
    folder = tmp_path / "ckpt"
    for pid, seed, filt in (("hero", 8, FILTER_A), ("villain", 9, FILTER_B), ("zealot", 10, FILTER_B)):
        (folder / "policies" / pid).mkdir(parents=True)
        (folder / "policies" / pid / "policy_state.pkl").write_bytes(pickle.dumps(
            {"weights": _small_torch_weights(seed), "connector_configs": _connectors(filt)}))
    (folder / "policies" / "README").write_text("not a policy")
    (folder / "rllib_checkpoint.json").write_text('{"type": "Algorithm", "checkpoint_version": "1.1"}')
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps(
        {"worker": {"filters": {"hero": FILTER_B, "villain": FILTER_A}}}))
    with pytest.raises(pp.BadModelError) as caught:
        read_checkpoint(folder)
    assert str(caught.value) == (f"policy 'default_policy' is not in {folder}; it holds: hero, villain, zealot "
                                 "(choose one with --policy-id)")
    ckpt = read_checkpoint(folder, policy_id="villain")
    assert (ckpt.policy_id, ckpt.policy_ids) == ("villain", ["hero", "villain", "zealot"])
    w = _small_torch_weights(9)
    assert all(ckpt.weights[k].tobytes() == w[k].tobytes() for k in w) and list(ckpt.weights) == list(w)
    np.testing.assert_array_equal(ckpt.obs_filter.mean, FILTER_A["running_stats"][0]["mean_array"])
    converted = convert_source(folder, policy_id="hero")
    assert "old-stack checkpoint: converted policy 'hero' (it also holds villain, zealot)" in converted.notes
    # a policy's own folder, given directly, is read as that policy (its connectors hold its filter)
    direct = read_checkpoint(folder / "policies" / "hero")
    assert (direct.layout, direct.policy_id, direct.policy_ids) == ("old-stack", "hero", ["hero"])
    np.testing.assert_array_equal(direct.obs_filter.mean, FILTER_A["running_stats"][0]["mean_array"])
    assert list(direct.files) == ["policy_state.pkl"]


# ------------------------------------------------------------------- spaces, serialised arrays, filters


def _record(global_name: str, state):
    """An inert record of ``module.Class`` with ``state``, as the restricted unpickler makes one."""
    from policyport.converter.readers import unpickle

    module, name = global_name.rsplit(".", 1)
    record = unpickle._stand_in(module, name)()
    record.__setstate__(state)
    return record


def _ray_array(a: np.ndarray) -> str:
    """RLlib's JSON-able array: base64 of zlib of ``.npy`` bytes (``ray/rllib/utils/serialization.py``)."""
    import base64
    import io
    import zlib

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode()


def test_spaces_in_rllibs_serialised_form_and_as_gymnasium_records():
    from policyport.converter.sources.rllib import _space

    assert _space({"space": "discrete", "n": np.int64(4)}) == ("discrete", 4)
    assert _space({"space": {"space": "Multi-Discrete", "nvec": _ray_array(np.array([3, 2]))}}) == ("multidiscrete", (3, 2))
    assert _space({"space": "multi_discrete", "nvec": [[2], [5]]}) == ("multidiscrete", (2, 5))
    assert _space({"space": "BOX", "shape": [2, 3], "low": "eJx"}) == ("box", (2, 3))
    assert _space({"space": "box"}) == ("box", ())
    assert _space({"space": "tuple", "spaces": []}) == ("tuple", None)
    assert [_space(v) for v in (None, "discrete", {"n": 3}, 5)] == [None] * 4
    prefix = "gymnasium.spaces."
    assert _space(_record(prefix + "discrete.Discrete", {"n": np.int64(6), "start": 0})) == ("discrete", 6)
    assert _space(_record(prefix + "multi_discrete.MultiDiscrete", {"nvec": np.array([[4, 3]])})) == ("multidiscrete", (4, 3))
    assert _space(_record(prefix + "box.Box", {"_shape": (5,), "shape": (9,)})) == ("box", (5,))
    assert _space(_record(prefix + "box.Box", {"shape": [2, 2]})) == ("box", (2, 2))
    assert _space(_record(prefix + "box.Box", {"low": 0.0})) == ("box", None)
    assert _space(_record(prefix + "dict.Dict", {"spaces": {}})) == ("dict", None)


def test_serialised_arrays_are_decoded_and_anything_else_comes_back_as_it_was():
    from policyport.converter.sources.rllib import _decode_array

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = _decode_array(_ray_array(a), "mean_array")
    assert got.dtype == np.float32 and got.tobytes() == a.tobytes() and got.shape == (2, 3)
    import base64
    import zlib

    not_npy = base64.b64encode(zlib.compress(b"not an npy file at all")).decode()
    not_zlib = "eJ" + base64.b64encode(b"xy").decode()
    truncated = base64.b64encode(zlib.compress(zlib.decompress(base64.b64decode(_ray_array(a)))[:-1])).decode()
    for value in ("eJ not base64 !", not_zlib, not_npy, truncated, "mean", "", 7, None, [1.0]):
        assert _decode_array(value, "mean_array") is value


def test_a_serialised_array_is_refused_by_its_header_before_its_data_is_decompressed():
    import base64
    import io
    import zlib

    from policyport import LimitExceededError
    from policyport.converter.sources.rllib import _decode_array

    header = io.BytesIO()  # 64 bytes of data behind a header that describes 8 GB of them
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    claims = header.getvalue()
    text = base64.b64encode(zlib.compress(claims + bytes(64))).decode()
    with pytest.raises(LimitExceededError, match=r"^filter\.pkl: mean_array \(float64, shape \(1000000000,\)\) would "
                                                 r"take 7\.45 GiB \(8,000,000,000 bytes\), above the limit of 1 GiB"):
        _decode_array(text, "filter.pkl: mean_array")


def test_filter_statistics_defaults_and_refusals():
    s = np.array([1.0, 2.0 / 3.0, -0.5])
    new = _filter({"running_stats": [{"num_pushes": 4, "mean_array": _ray_array(np.array([0.5, 1.0, 2.0])),
                                      "sum_sq_diff_array": _ray_array(s)}]})
    assert (new.demean, new.destd, new.clip, new.count) == (True, True, None, 4)  # RLlib's defaults
    np.testing.assert_array_equal(new.mean, [0.5, 1.0, 2.0])
    # var = sum_sq_diff / (n - 1) rounded to float32 as Ray does, a negative one read as 0
    expected = np.sqrt(np.maximum(0, (s / 3).astype(np.float32))).astype(np.float64)
    assert new.std.dtype == np.float64 and new.std.tobytes() == expected.tobytes()
    assert new.std[1] != np.sqrt(2.0 / 9.0)

    rs = _filter(_record("ray.rllib.utils.filter.ConcurrentMeanStdFilter", {
        "demean": False, "destd": True, "clip": 0, "rs": {"_n": 3, "_M": np.array([1.0, 2.0]), "_S": np.array([8.0, 2.0])}}))
    assert (rs.demean, rs.destd, rs.clip, rs.count, rs.form) == (False, True, None, 3, "rs")  # clip 0: none
    np.testing.assert_array_equal(rs.std, [2.0, 1.0])
    two = _filter({"de_mean_to_zero": False, "de_std_to_one": False, "clip_by_value": "10", "running_stats":
                   {"num_pushes": 0, "mean_array": np.array([3.0]), "sum_sq_diff_array": np.array([5.0])}})
    assert (two.demean, two.destd, two.clip, two.count) == (False, False, 10.0, 0) and two.std[0] == 0.0
    assert _filter(_record("ray.rllib.utils.filter.NoFilter", {})) is None and _filter(None) is None

    with pytest.raises(pp.BadModelError) as caught:
        _filter(_record("ray.rllib.utils.filter.RunningStat", {}))
    assert str(caught.value) == ("the checkpoint's observation filter is a RunningStat; policyport bakes in "
                                 "MeanStdFilter only (convert with --no-filter to leave it out)")
    with pytest.raises(pp.BadModelError) as caught:
        _filter({"running_stats": [{}, {}]})
    assert str(caught.value) == ("the MeanStdFilter holds 2 running statistics (a structured observation); "
                                 "policyport bakes in the filter of a flat Box observation only")
    for empty in ({"demean": True}, {"running_stats": None}, {"running_stats": [None]}):
        with pytest.raises(pp.BadModelError) as caught:
            _filter(empty)
        assert str(caught.value) == "the MeanStdFilter holds neither rs nor running_stats; cannot read its statistics"


# ------------------------------------------------------------------ new API stack and legacy, built in tmp_path


def _new_stack(tmp_path: Path, state, ctor=None, filter_state=None, pid="default_policy") -> Path:
    folder = tmp_path / "new"
    module = folder / "learner_group" / "learner" / "rl_module" / pid
    module.mkdir(parents=True)
    (folder / "rllib_checkpoint.json").write_text('{"type": "Algorithm", "checkpoint_version": "2.1"}')
    (module / "module_state.pkl").write_bytes(pickle.dumps(state))
    if ctor is not None:
        (module / "class_and_ctor_args.pkl").write_bytes(pickle.dumps(ctor))
    if filter_state is not None:
        stem = folder / "env_runner" / "env_to_module_connector" / "MeanStdFilter"
        stem.mkdir(parents=True)
        (stem / "state.pkl").write_bytes(pickle.dumps(filter_state))
    return folder


def _ppo_module_state(seed: int = 10) -> dict:
    rng = np.random.default_rng(seed)

    def f(*shape):
        return rng.normal(size=shape).astype(np.float32)

    return {"encoder.actor_encoder.net.mlp.0.weight": f(4, 3), "encoder.actor_encoder.net.mlp.0.bias": f(4),
            "encoder.critic_encoder.net.mlp.0.weight": f(4, 3), "encoder.critic_encoder.net.mlp.0.bias": f(4),
            "pi.net.mlp.0.weight": f(2, 4), "pi.net.mlp.0.bias": f(2),
            "vf.net.mlp.0.weight": f(1, 4), "vf.net.mlp.0.bias": f(1)}


def test_a_new_stack_module_state_drops_targets_buffers_and_counters_and_reads_its_ctor_args(tmp_path):
    w = _ppo_module_state()
    state = {**w, "_target_pi.net.mlp.0.weight": w["pi.net.mlp.0.weight"] + 1, "_target_pi.net.mlp.0.bias": w["pi.net.mlp.0.bias"],
             "pi.log_std_clip_param_const": np.array(20.0, np.float32), "num_updates": np.array(7, np.int64)}
    ctor = {"class": "ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module.DefaultPPOTorchRLModule",
            "ctor_args_and_kwargs": ((), {"observation_space": {"space": "box", "shape": [3]},
                                          "action_space": {"space": "discrete", "n": 2},
                                          "model_config": {"fcnet_activation": "relu", "vf_share_layers": False}})}
    folder = _new_stack(tmp_path, state, ctor, {None: FILTER_B})
    ckpt = read_checkpoint(folder)
    assert (ckpt.layout, ckpt.policy_id, ckpt.policy_ids, ckpt.framework) == ("new-stack", "default_policy",
                                                                            ["default_policy"], "torch")
    assert list(ckpt.weights) == list(w) and all(ckpt.weights[k].tobytes() == w[k].tobytes() for k in w)
    assert ckpt.dropped == ["the target network (2 _target_* arrays)"]
    assert (ckpt.module_class, ckpt.model_config) == ("DefaultPPOTorchRLModule", {"fcnet_activation": "relu",
                                                                                  "vf_share_layers": False})
    assert (ckpt.obs_space, ckpt.action_space) == (("box", (3,)), ("discrete", 2))
    np.testing.assert_array_equal(ckpt.obs_filter.std, [1.0, 2.0, 4.0])
    assert sorted(ckpt.files) == sorted(str(Path(p)) for p in (
        "learner_group/learner/rl_module/default_policy/module_state.pkl",
        "learner_group/learner/rl_module/default_policy/class_and_ctor_args.pkl",
        "env_runner/env_to_module_connector/MeanStdFilter/state.pkl"))

    converted = convert_source(folder, keep_value=True)
    assert "dropped the target network (2 _target_* arrays)" in converted.notes
    obs = np.random.default_rng(11).normal(size=(5, 3)).astype(np.float32)
    x = (obs - np.array([-1.0, 0.0, 2.0], np.float32)) / np.array([1.0, 2.0, 4.0], np.float32)
    h = np.maximum(x @ w["encoder.actor_encoder.net.mlp.0.weight"].T + w["encoder.actor_encoder.net.mlp.0.bias"], 0)
    v = np.maximum(x @ w["encoder.critic_encoder.net.mlp.0.weight"].T + w["encoder.critic_encoder.net.mlp.0.bias"], 0)
    logits = h @ w["pi.net.mlp.0.weight"].T + w["pi.net.mlp.0.bias"]
    value = v @ w["vf.net.mlp.0.weight"].T + w["vf.net.mlp.0.bias"]
    got = pp.load(converted.model).run({"obs": obs})
    assert np.abs(got["logits"] - logits).max() <= 1e-5 and np.abs(got["value"] - value).max() <= 1e-5
    np.testing.assert_array_equal(got["action"], np.argmax(logits, axis=1))


@pytest.mark.parametrize("wrapped", [None, "null", "default"])
def test_the_new_stack_filter_state_is_found_under_its_key(tmp_path, wrapped):
    folder = _new_stack(tmp_path, _ppo_module_state(), None, {wrapped: FILTER_A})
    ckpt = read_checkpoint(folder)
    assert ckpt.obs_filter is not None and ckpt.obs_filter.clip == 3.0
    np.testing.assert_array_equal(ckpt.obs_filter.mean, [1.0, -2.0, 0.5])
    assert (ckpt.module_class, ckpt.model_config, ckpt.obs_space, ckpt.action_space) == (None, {}, None, None)


@pytest.mark.parametrize("ctor", [
    {"class": "X", "ctor_args_and_kwargs": ((), {"model_config": ["not", "a", "dict"]})},
    {"class": "X", "ctor_args_and_kwargs": ({"model_config": {"fcnet_activation": "relu"}},)},
    {"class": "X", "ctor_args_and_kwargs": ((), ["model_config"])},
    {"class": "X", "ctor_args_and_kwargs": None},
    {"class": "X", "ctor_args_and_kwargs": ((), {"model_config": None})},
])
def test_ctor_args_of_another_form_give_an_empty_model_config(tmp_path, ctor):
    ckpt = read_checkpoint(_new_stack(tmp_path, _ppo_module_state(), ctor))
    assert (ckpt.module_class, ckpt.model_config, ckpt.obs_space, ckpt.action_space) == ("X", {}, None, None)


def test_a_new_stack_module_state_that_is_no_mapping_is_refused(tmp_path):
    folder = _new_stack(tmp_path, [np.zeros(3, np.float32)])
    with pytest.raises(pp.BadModelError) as caught:
        read_checkpoint(folder)
    module = folder / "learner_group" / "learner" / "rl_module" / "default_policy"
    assert str(caught.value) == f"{module}: module_state is not a mapping of parameter names to arrays"


def _legacy(tmp_path: Path, worker, name="checkpoint-3") -> Path:
    folder = tmp_path / "checkpoint_000003"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(pickle.dumps({"worker": pickle.dumps(worker), "optimizer": b""}))
    return folder / name


def test_legacy_checkpoints_read_their_params_from_the_folder_or_the_one_above(tmp_path):
    w = _small_torch_weights(12)
    path = _legacy(tmp_path, {"state": {"default_policy": {**w, "_optimizer_variables": [np.zeros(1)] * 3}},
                              "filters": {"default_policy": FILTER_B}})
    obs = np.random.default_rng(13).normal(size=(4, 3)).astype(np.float32)
    x = (obs - np.array([-1.0, 0.0, 2.0], np.float32)) / np.array([1.0, 2.0, 4.0], np.float32)

    def forward(act):
        return act(x @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"]) \
            @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]

    ckpt = read_checkpoint(path)
    assert (ckpt.layout, ckpt.framework, ckpt.model_config) == ("legacy", "torch", {})
    assert ckpt.dropped == ["optimizer state (3 _optimizer_variables)"]
    assert np.abs(pp.load(pp.convert(path)).run({"obs": obs})["logits"] - forward(np.tanh)).max() <= 1e-5
    (tmp_path / "params.pkl").write_bytes(pickle.dumps({"model": {"fcnet_activation": "relu"}}))
    assert read_checkpoint(path).model_config == {"fcnet_activation": "relu"}
    relu = pp.load(pp.convert(path)).run({"obs": obs})["logits"]
    assert np.abs(relu - forward(lambda z: np.maximum(z, 0))).max() <= 1e-5
    (path.parent / "params.pkl").write_bytes(pickle.dumps({"model": {"fcnet_activation": "elu"}, "env": "x"}))
    assert read_checkpoint(path).model_config == {"fcnet_activation": "elu"}  # the folder's own first
    (path.parent / "params.pkl").write_bytes(pickle.dumps({"model": None}))
    assert read_checkpoint(path).model_config == {}


def test_legacy_checkpoints_of_another_shape_are_refused_with_what_is_missing(tmp_path):
    cases = [
        ({"state": [1, 2]}, "{path}: the worker state holds no per-policy 'state' dict"),
        ({"filters": {}}, "{path}: the worker state holds no per-policy 'state' dict"),
        ({"state": {"default_policy": [np.zeros(2)]}}, "{path}: policy 'default_policy' holds no weights dict"),
        ({"state": {"default_policy": {"weights": None}}}, "{path}: policy 'default_policy' holds no weights dict"),
    ]
    for n, (worker, message) in enumerate(cases):
        path = _legacy(tmp_path / str(n), worker)
        with pytest.raises(pp.BadModelError) as caught:
            read_checkpoint(path)
        assert str(caught.value) == message.format(path=path)
    for n, outer in enumerate([[1], {"worker": "text"}, {"state": {}}]):
        path = tmp_path / f"o{n}" / "checkpoint-1"
        path.parent.mkdir()
        path.write_bytes(pickle.dumps(outer))
        with pytest.raises(pp.BadModelError) as caught:
            read_checkpoint(path)
        assert str(caught.value) == (f"{path} is not a legacy RLlib checkpoint: expected a dict with a pickled "
                                     "'worker' entry")
    # the policy is found in the weights dict itself or under "weights"; the only policy when none is named
    w = _small_torch_weights(14)
    ckpt = read_checkpoint(_legacy(tmp_path / "w", {"state": {"p1": {"weights": w, "global_timestep": 5}}}))
    assert (ckpt.policy_id, ckpt.policy_ids, list(ckpt.weights), ckpt.obs_filter) == ("p1", ["p1"], list(w), None)


def test_where_a_path_is_no_checkpoint_and_which_legacy_file_is_read(tmp_path):
    from policyport.converter.sources.rllib import find_legacy_file

    with pytest.raises(pp.UnreadableFileError) as caught:
        read_checkpoint(tmp_path / "missing")
    assert str(caught.value) == f"{tmp_path / 'missing'}: no such file or folder"
    (tmp_path / "empty").mkdir()
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_checkpoint(tmp_path / "empty")
    assert str(caught.value) == (f"{tmp_path / 'empty'} is not an RLlib checkpoint: expected a checkpoint-<N> file, a "
                                 "folder with policies/<id>/ (Ray 2.x) or learner_group/learner/rl_module/<id>/ "
                                 "(new API stack)")
    for name in ("checkpoint-9", "checkpoint-10", "checkpoint-2", "checkpoint-11.tune_metadata", "checkpoint-x"):
        (tmp_path / "empty" / name).write_bytes(b"")
    (tmp_path / "empty" / "checkpoint-12").mkdir()
    assert find_legacy_file(tmp_path / "empty") == tmp_path / "empty" / "checkpoint-10"  # the latest file: 10 after 9
    assert find_legacy_file(tmp_path / "empty" / "checkpoint-2") == tmp_path / "empty" / "checkpoint-2"
    assert find_legacy_file(tmp_path / "empty" / "checkpoint-11.tune_metadata") is None
    assert find_legacy_file(tmp_path) is None


def _dqn_module_state(seed: int, dueling: bool) -> dict:
    rng = np.random.default_rng(seed)
    state = {"encoder.net.mlp.0.weight": rng.normal(size=(5, 3)), "encoder.net.mlp.0.bias": rng.normal(size=5),
             "af.net.mlp.0.weight": rng.normal(size=(4, 5)), "af.net.mlp.0.bias": rng.normal(size=4)}
    if dueling:
        state.update({"vf.net.mlp.0.weight": rng.normal(size=(1, 5)), "vf.net.mlp.0.bias": rng.normal(size=1)})
    return {k: v.astype(np.float32) for k, v in state.items()}


@pytest.mark.parametrize("opset", [17, 18])
def test_a_dqn_module_without_a_value_head_acts_on_its_advantages_and_a_dueling_one_names_its_steps(tmp_path, opset):
    ctor = {"class": "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module.DefaultDQNTorchRLModule",
            "ctor_args_and_kwargs": ((), {"model_config": {"fcnet_activation": "relu"}})}
    obs = np.random.default_rng(15).normal(size=(7, 3)).astype(np.float32)
    for dueling in (False, True):
        w = _dqn_module_state(16, dueling)
        folder = _new_stack(tmp_path / str(dueling), w, ctor)
        model = pp.convert(folder, opset=opset)
        h = np.maximum(obs @ w["encoder.net.mlp.0.weight"].T + w["encoder.net.mlp.0.bias"], 0)
        adv = h @ w["af.net.mlp.0.weight"].T + w["af.net.mlp.0.bias"]
        outputs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
        if not dueling:
            assert outputs == {"logits": ["batch", 4], "action": ["batch"]}
            source = convert_source(folder, opset=opset).reference(obs)  # what verify --source compares against
            np.testing.assert_array_equal(source["action"], np.argmax(adv, axis=1))
            got = pp.load(model).run({"obs": obs})
            assert np.abs(got["logits"] - adv).max() <= 1e-5
            np.testing.assert_array_equal(got["action"], np.argmax(adv, axis=1))
            continue
        assert outputs == {"logits": ["batch", 4], "action": ["batch"]}
        q = (h @ w["vf.net.mlp.0.weight"].T + w["vf.net.mlp.0.bias"]) + adv - adv.mean(axis=1, keepdims=True)
        for backend in ("numpy", "onnxruntime"):
            got = pp.load(model, backend=backend).record({"obs": obs}, "*")
            np.testing.assert_allclose(got["advantages"], adv, atol=1e-5)
            np.testing.assert_allclose(got["dueling/mean_advantage"], adv.mean(axis=1, keepdims=True), atol=1e-5)
            np.testing.assert_allclose(got["dueling/centered_advantage"], adv - adv.mean(axis=1, keepdims=True), atol=1e-5)
            assert np.abs(got["logits"] - q).max() <= 1e-5
            np.testing.assert_array_equal(got["action"], np.argmax(q, axis=1))
        if opset >= 18:
            axes = next(t for t in model.graph.initializer if t.name == "dueling/axes")
            assert list(axes.int64_data) or axes.raw_data == np.array([1], np.int64).tobytes()


def test_a_dqn_refuses_a_diag_gaussian_head_and_takes_categorical_as_the_argmax_it_has(tmp_path):
    ctor = {"class": "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module.DefaultDQNTorchRLModule",
            "ctor_args_and_kwargs": ((), {"model_config": {"fcnet_activation": "relu"}})}
    folder = _new_stack(tmp_path, _dqn_module_state(16, False), ctor)
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(folder, head="diag-gaussian")
    assert str(caught.value) == ("--head diag-gaussian does not apply to a DQN checkpoint: its action is the argmax of its "
                                 "Q-values (the categorical head, which it always has)")
    assert pp.convert(folder, head="categorical").graph == pp.convert(folder).graph  # the options recorded differ
    assert {p.key: p.value for p in pp.convert(folder).metadata_props}["policyport.head"] == "categorical"


def test_an_unnamed_tf2_list_against_rllibs_default_model_config_names_what_it_needs():
    from policyport.converter.sources.rllib import _name_tf2_list

    with pytest.raises(pp.BadModelError) as caught:
        _name_tf2_list([np.zeros(1)] * 3, {}, "p")
    assert str(caught.value).startswith("the tf2 policy's weights are an unnamed list of 3 arrays; its model config "
                                        "(fcnet_hiddens [256, 256], vf_share_layers False) needs 12: p/fc_1/kernel, ")


def _linear(rng, out: int, inp: int, prefix: str, bias: bool = True) -> dict:
    layer = {f"{prefix}.weight": rng.normal(size=(out, inp)).astype(np.float32)}
    if bias:
        layer[f"{prefix}.bias"] = rng.normal(size=out).astype(np.float32)
    return layer


def _apply(w: dict, prefix: str, x: np.ndarray, act=None) -> np.ndarray:
    y = x @ w[f"{prefix}.weight"].T + w.get(f"{prefix}.bias", 0)
    return act(y) if act else y


def test_rl_module_heads_with_hidden_layers_take_rllibs_head_activation_default(tmp_path):
    rng = np.random.default_rng(17)
    w = {}
    for prefix, out, inp in (("encoder.actor_encoder.net.mlp.0", 5, 3), ("encoder.actor_encoder.net.mlp.2", 4, 5),
                             ("encoder.critic_encoder.net.mlp.0", 6, 3), ("encoder.critic_encoder.net.mlp.2", 6, 6),
                             ("pi.net.mlp.0", 3, 4), ("pi.net.mlp.2", 2, 3), ("vf.net.mlp.0", 2, 6)):
        w.update(_linear(rng, out, inp, prefix))
    w.update(_linear(rng, 1, 2, "vf.net.mlp.2", bias=False))
    ctor = {"class": "DefaultPPOTorchRLModule",
            "ctor_args_and_kwargs": ((), {"model_config": {"fcnet_activation": "tanh"}})}  # head activation omitted
    model = pp.convert(_new_stack(tmp_path, w, ctor), keep_value=True)
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    relu = lambda z: np.maximum(z, 0)  # noqa: E731 - RLlib's default head_fcnet_activation
    h = _apply(w, "encoder.actor_encoder.net.mlp.2", _apply(w, "encoder.actor_encoder.net.mlp.0", obs, np.tanh), np.tanh)
    logits = _apply(w, "pi.net.mlp.2", _apply(w, "pi.net.mlp.0", h, relu))
    critic = _apply(w, "encoder.critic_encoder.net.mlp.2", _apply(w, "encoder.critic_encoder.net.mlp.0", obs, np.tanh), np.tanh)
    v = _apply(w, "vf.net.mlp.2", _apply(w, "vf.net.mlp.0", critic, relu))
    for backend in ("numpy", "onnxruntime"):
        got = pp.load(model, backend=backend).run({"obs": obs})
        assert np.abs(got["logits"] - logits).max() <= 1e-5 and np.abs(got["value"] - v).max() <= 1e-5
    assert {"vf.net.mlp.2.weight"} <= set(pp.extract_weights(model)) and "vf.net.mlp.2.bias" not in pp.extract_weights(model)


def test_a_shared_rl_module_encoder_feeds_both_heads(tmp_path):
    rng = np.random.default_rng(18)
    w = {**_linear(rng, 5, 3, "encoder.encoder.net.mlp.0"), **_linear(rng, 2, 5, "pi.net.mlp.0"),
         **_linear(rng, 1, 5, "vf.net.mlp.0")}
    ctor = {"class": "DefaultPPOTorchRLModule", "ctor_args_and_kwargs": ((), {"model_config": {
        "fcnet_activation": "relu", "head_fcnet_activation": "tanh", "vf_share_layers": True}})}
    model = pp.convert(_new_stack(tmp_path, w, ctor), keep_value=True)
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    h = _apply(w, "encoder.encoder.net.mlp.0", obs, lambda z: np.maximum(z, 0))
    got = pp.load(model).run({"obs": obs})
    assert np.abs(got["logits"] - _apply(w, "pi.net.mlp.0", h)).max() <= 1e-5
    assert np.abs(got["value"] - _apply(w, "vf.net.mlp.0", h)).max() <= 1e-5


def test_rl_module_layouts_policyport_cannot_convert_are_refused_naming_what_is_wrong():
    from policyport.converter.sources.rllib import parse_rl_module

    rng = np.random.default_rng(19)
    enc = _linear(rng, 4, 3, "encoder.encoder.net.mlp.0")

    def refused(arrays, message, error=pp.BadModelError, keep_value=False, dqn=False):
        with pytest.raises(error) as caught:
            parse_rl_module(arrays, {}, None, None, keep_value, dqn)
        assert str(caught.value) == message

    refused({**enc, "pi.weight": np.zeros((2, 4)), "a.net.mlp.x.bias": np.zeros(2)},
            "cannot place 2 array(s) in RLlib's default RLModule layout (<module>.net.mlp.<i>.weight|bias): "
            "a.net.mlp.x.bias, pi.weight")
    refused({**enc, "pi.net.mlp.0.bias": np.zeros(2)}, "pi.net.mlp.0 has no weight")
    # another algorithm's modules (SAC's twin Q heads, a DQN's advantage head in a PPO module) would be left out
    refused({**enc, **_linear(rng, 2, 4, "pi.net.mlp.0"), **_linear(rng, 1, 6, "qf.net.mlp.0"), **_linear(rng, 1, 6, "qf_twin.net.mlp.0")},
            "the PPO RLModule holds module(s) qf, qf_twin that its default layout does not have (encoder.actor_encoder, "
            "encoder.critic_encoder, encoder.encoder, pi, vf); policyport converts RLlib's default PPO and DQN modules only")
    refused({**_linear(rng, 4, 3, "encoder.net.mlp.0"), **_linear(rng, 2, 4, "af.net.mlp.0"), **_linear(rng, 2, 4, "pi.net.mlp.0")},
            "the DQN RLModule holds module(s) pi that its default layout does not have (af, encoder, vf); "
            "policyport converts RLlib's default PPO and DQN modules only", dqn=True)
    refused({**_linear(rng, 4, 3, "encoder.net.mlp.0"), **_linear(rng, 2, 4, "pi.net.mlp.0")},
            "the PPO RLModule holds module(s) encoder that its default layout does not have (encoder.actor_encoder, "
            "encoder.critic_encoder, encoder.encoder, pi, vf); policyport converts RLlib's default PPO and DQN modules only")
    refused(enc, "the RLModule has no pi head; found modules encoder.encoder")
    pi = _linear(rng, 2, 4, "pi.net.mlp.0")
    refused({**enc, **pi}, "a value branch was asked for (--keep-value), but the RLModule has no vf head",
            error=pp.OptionError, keep_value=True)
    refused({**enc, **pi, **_linear(rng, 3, 4, "vf.net.mlp.0"), **_linear(rng, 1, 3, "vf.net.mlp.1")},
            "a vf head with hidden layers on a shared encoder is not supported", keep_value=True)
    dqn_enc = _linear(rng, 4, 3, "encoder.net.mlp.0")
    refused({**dqn_enc, **_linear(rng, 1, 4, "vf.net.mlp.0")},
            "a DQN RLModule needs an af (advantage) head; found modules encoder, vf", dqn=True)
    for two in ("af", "vf"):
        arrays = {**dqn_enc, **_linear(rng, 2, 4, "af.net.mlp.0"), **_linear(rng, 1, 4, "vf.net.mlp.0"),
                  **_linear(rng, 2, 2 if two == "af" else 1, f"{two}.net.mlp.1")}
        refused(arrays, "policyport converts DQN RLModules whose af/vf heads are single layers (head_fcnet_hiddens=[])",
                dqn=True)
    spec, dueling = parse_rl_module({**dqn_enc, **_linear(rng, 2, 4, "af.net.mlp.0")}, {}, None, None, False, True)
    assert (dueling, spec.value_output, [d.name for d in spec.hidden], spec.output.name) == (
        False, None, ["encoder.net.mlp.0"], "af.net.mlp.0")
    spec, dueling = parse_rl_module({**enc, **pi, **_linear(rng, 1, 4, "vf.net.mlp.0")}, {}, None, None, False, False)
    assert (dueling, spec.value_output, spec.value_hidden) == (False, None, [])  # the value head only with keep_value


def test_a_policy_folder_read_directly_is_its_own_policy_and_its_state_must_hold_weights(tmp_path):
    folder = _policy_folder(tmp_path, {"weights": _small_torch_weights(20), "_optimizer_variables": [np.zeros(2)] * 4,
                                       "global_timestep": 100})
    policy = folder / "policies" / "default_policy"
    ckpt = read_checkpoint(policy, policy_id="default_policy")
    assert (ckpt.policy_id, ckpt.policy_ids, ckpt.framework) == ("default_policy", ["default_policy"], "torch")
    assert ckpt.dropped == ["optimizer state (4 _optimizer_variables)"]
    assert "dropped optimizer state (4 _optimizer_variables)" in convert_source(folder).notes
    with pytest.raises(pp.BadModelError) as caught:
        read_checkpoint(policy, policy_id="hero")
    assert str(caught.value) == f"policy 'hero' is not in {policy}; it holds: default_policy (choose one with --policy-id)"
    for state in ({"policy_spec": {}}, {"weights": np.zeros(3, np.float32)}):
        bad = _policy_folder(tmp_path / str(len(state)) / type(state.get("weights")).__name__, state)
        with pytest.raises(pp.BadModelError) as caught:
            read_checkpoint(bad)
        assert str(caught.value) == f"{bad / 'policies' / 'default_policy'}: policy_state holds no weights"


def test_an_unnamed_tf2_weight_list_reads_as_a_tf_policy(tmp_path):
    rng = np.random.default_rng(21)
    listed = [rng.normal(size=s).astype(np.float32) for s in ((3, 4), (4,), (3, 4), (4,), (4, 2), (2,), (4, 1), (1,))]
    ckpt = read_checkpoint(_policy_folder(tmp_path, {"weights": listed, "policy_spec": {"config": {"model": {
        "fcnet_hiddens": [4]}}}}))
    assert ckpt.framework == "tf" and list(ckpt.weights)[:2] == ["default_policy/fc_1/kernel", "default_policy/fc_1/bias"]


def test_an_old_stack_algorithm_state_in_msgpack_gives_the_filter(tmp_path):
    msgpack = pytest.importorskip("msgpack")  # Ray's own dependency
    folder = _policy_folder(tmp_path, {"weights": _small_torch_weights(22), "connector_configs": _connectors(FILTER_B)})
    stats = FILTER_A["running_stats"][0]
    serialised = {"demean": True, "destd": True, "clip": 3.0, "running_stats": [{
        "num_pushes": 5, "mean_array": _ray_array(stats["mean_array"]), "sum_sq_diff_array": _ray_array(stats["sum_sq_diff_array"])}]}
    (folder / "algorithm_state.msgpack").write_bytes(msgpack.packb({"worker": {"filters": {"default_policy": serialised}}}))
    ckpt = read_checkpoint(folder)
    np.testing.assert_array_equal(ckpt.obs_filter.mean, [1.0, -2.0, 0.5])
    assert ckpt.obs_filter.clip == 3.0 and "algorithm_state.msgpack" in ckpt.files


def test_a_new_stack_with_several_modules_reads_the_one_named_and_the_filter_of_the_default_agent(tmp_path, monkeypatch):
    import types

    module = types.ModuleType("ray.rllib.core.rl_module")  # RLlib's class, for pickling only
    module.DefaultPPOTorchRLModule = type("DefaultPPOTorchRLModule", (), {"__module__": module.__name__})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    folder = _new_stack(tmp_path, _ppo_module_state(27), pid="hero")
    (folder / "learner_group" / "learner" / "rl_module" / "villain").mkdir()
    villain = _ppo_module_state(28)
    (folder / "learner_group" / "learner" / "rl_module" / "villain" / "module_state.pkl").write_bytes(pickle.dumps(villain))
    ctor = {"class": module.DefaultPPOTorchRLModule, "ctor_args_and_kwargs": ((), {})}
    (folder / "learner_group" / "learner" / "rl_module" / "villain" / "class_and_ctor_args.pkl").write_bytes(
        pickle.dumps(ctor))
    with pytest.raises(pp.BadModelError) as caught:
        read_checkpoint(folder)
    assert str(caught.value) == f"policy 'default_policy' is not in {folder}; it holds: hero, villain (choose one with --policy-id)"
    ckpt = read_checkpoint(folder, policy_id="villain")
    assert (ckpt.policy_id, ckpt.policy_ids, ckpt.module_class) == ("villain", ["hero", "villain"], "DefaultPPOTorchRLModule")
    assert all(ckpt.weights[k].tobytes() == villain[k].tobytes() for k in villain)
    stem = folder / "env_runner" / "env_to_module_connector" / "MeanStdFilter"
    stem.mkdir(parents=True)
    for state, mean in (({None: FILTER_A, "agent_1": FILTER_B}, [1.0, -2.0, 0.5]),
                        ({"null": FILTER_B, "agent_1": FILTER_A}, [-1.0, 0.0, 2.0])):
        (stem / "state.pkl").write_bytes(pickle.dumps(state))
        assert read_checkpoint(folder, policy_id="hero").obs_filter.mean.tolist() == mean


def test_a_dueling_dqn_with_two_encoder_layers_activates_both_and_its_source_reference_combines_the_heads(tmp_path):
    rng = np.random.default_rng(29)
    w = {**_linear(rng, 6, 3, "encoder.net.mlp.0"), **_linear(rng, 5, 6, "encoder.net.mlp.2"),
         **_linear(rng, 4, 5, "af.net.mlp.0"), **_linear(rng, 1, 5, "vf.net.mlp.0")}
    ctor = {"class": "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module.DefaultDQNTorchRLModule",
            "ctor_args_and_kwargs": ((), {"model_config": {"fcnet_activation": "relu"}})}
    converted = convert_source(_new_stack(tmp_path, w, ctor))
    assert converted.notes == ["new-stack checkpoint: converted policy 'default_policy'"]  # vf is no value branch here
    obs = rng.normal(size=(8, 3)).astype(np.float32)
    relu = lambda z: np.maximum(z, 0)  # noqa: E731
    h = _apply(w, "encoder.net.mlp.2", _apply(w, "encoder.net.mlp.0", obs, relu), relu)
    adv, value = _apply(w, "af.net.mlp.0", h), _apply(w, "vf.net.mlp.0", h)
    q = value + adv - adv.mean(axis=1, keepdims=True)
    source = converted.reference(obs)  # what verify --source compares every backend against
    np.testing.assert_allclose(source["logits"], q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(source["advantages"], adv, rtol=1e-5, atol=1e-5)
    assert source["action"].dtype == np.int64 and source["action"].tolist() == np.argmax(q, axis=1).tolist()
    got = pp.load(converted.model).run({"obs": obs})
    assert np.abs(got["logits"] - q).max() <= 1e-5
    np.testing.assert_array_equal(got["action"], np.argmax(q, axis=1))


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


class _CallsSystem:
    """Pickles as a call of ``os.system`` (never run: the reader refuses the global)."""

    def __reduce__(self):
        import os

        return (os.system, ("exit 0",))


def _refusal(what: str, global_name: str) -> str:
    return (f"{what} asks to call {global_name} while unpickling, which could run arbitrary code; policyport rebuilds "
            "only numpy arrays and plain containers from a pickle and refused it (nothing from the file ran). If you "
            "trust this file, pass --trust (trust=True)")


def test_a_legacy_checkpoint_names_the_file_in_its_refusals_and_reads_its_state_with_trust(tmp_path):
    w = _small_torch_weights(30)
    path = _legacy(tmp_path / "worker", {"state": {"default_policy": w}, "hook": _CallsSystem()})
    with pytest.raises(pp.UntrustedFileError) as caught:
        read_checkpoint(path)
    assert str(caught.value) == _refusal(f"{path} (its worker state)", "posix.system")

    outer = tmp_path / "outer" / "checkpoint-4"
    outer.parent.mkdir()
    outer.write_bytes(pickle.dumps({"worker": pickle.dumps({"state": {"default_policy": w}}), "hook": len}))
    with pytest.raises(pp.UntrustedFileError) as caught:
        read_checkpoint(outer)
    assert str(caught.value) == _refusal(str(outer), "builtins.len")
    trusted = read_checkpoint(outer, trust=True)  # the standard unpickler: builtins.len is rebuilt as itself
    assert list(trusted.weights) == list(w) and trusted.files == {"checkpoint-4": _sha256(outer)}
    assert convert_source(outer, trust=True).notes == ["legacy checkpoint: converted policy 'default_policy'", NO_HEAD]

    with pytest.raises(pp.BadModelError) as caught:
        read_checkpoint(outer, policy_id="hero", trust=True)
    assert str(caught.value) == f"policy 'hero' is not in {outer}; it holds: default_policy (choose one with --policy-id)"


@pytest.mark.parametrize("names, framework", [
    (["_hidden_layers.0._model.0.weight", "_hidden_layers.0._model.0.bias"], "torch"),  # no_final_linear: no _logits
    (["_logits._model.0.weight", "_logits._model.0.bias"], "torch"),  # fcnet_hiddens []: no hidden layer
    (["default_policy/fc_1/kernel", "default_policy/fc_1/bias", "default_policy/fc_out/kernel"], "tf"),
])
def test_a_legacy_checkpoints_framework_is_told_by_its_weight_names(tmp_path, names, framework):
    w = {name: np.full((2, 2) if name.endswith(("weight", "kernel")) else 2, n, np.float32) for n, name in enumerate(names)}
    ckpt = read_checkpoint(_legacy(tmp_path, {"state": {"default_policy": w}}))
    assert (ckpt.framework, list(ckpt.weights)) == (framework, names)


def test_a_legacy_policy_state_beside_its_weights_dict_reports_its_optimizer_state(tmp_path):
    w = _small_torch_weights(31)
    state = {"weights": {**w, "step": np.int64(3)}, "_optimizer_variables": [np.zeros(2)] * 2, "global_timestep": 9}
    ckpt = read_checkpoint(_legacy(tmp_path, {"state": {"default_policy": state}}))
    assert ckpt.dropped == ["optimizer state (2 _optimizer_variables)", "step (not a float array)"]
    assert list(ckpt.weights) == list(w)
    assert "dropped optimizer state (2 _optimizer_variables)" in convert_source(tmp_path / "checkpoint_000003").notes


def test_a_new_stack_filter_state_of_another_agent_first_or_pickled_as_its_filter_object(tmp_path, monkeypatch):
    import types

    folder = _new_stack(tmp_path, _ppo_module_state(32), None, {"agent_1": FILTER_B, None: FILTER_A})
    np.testing.assert_array_equal(read_checkpoint(folder).obs_filter.mean, [1.0, -2.0, 0.5])  # the default agent's

    module = types.ModuleType("ray.rllib.utils.filter")  # RLlib's class, for pickling only
    module.MeanStdFilter = type("MeanStdFilter", (), {"__module__": module.__name__})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    filt = module.MeanStdFilter()
    filt.__dict__.update(FILTER_B)
    stem = folder / "env_runner" / "env_to_module_connector" / "MeanStdFilter" / "state.pkl"
    stem.write_bytes(pickle.dumps(filt))
    got = read_checkpoint(folder).obs_filter  # the filter itself, read as an inert record
    assert (got.clip, got.count, got.form) == (None, 5, "running_stats")
    np.testing.assert_array_equal(got.std, [1.0, 2.0, 4.0])


def test_a_new_stack_filter_state_of_other_agents_only_is_refused_unless_left_out(tmp_path):
    # {agent id: filter} without the default agent (None): the policy mapping function, which the
    # checkpoint does not record, decides which agent's statistics the module's observations carry
    folder = _new_stack(tmp_path, _ppo_module_state(33), None, {"runner": FILTER_A, "chaser": FILTER_B})
    ckpt = read_checkpoint(folder)
    assert (ckpt.obs_filter, ckpt.filter_agents) == (None, ["chaser", "runner"])
    with pytest.raises(pp.BadModelError) as caught:
        convert_source(folder, activation="tanh")
    assert str(caught.value) == (
        "the checkpoint's MeanStdFilter holds the statistics of agents chaser, runner and none of the default agent; "
        "which agent's observations module 'default_policy' sees is the policy mapping function's choice, which the "
        "checkpoint does not record: convert with --no-filter and feed observations filtered with that agent's "
        "statistics")
    converted = convert_source(folder, activation="tanh", obs_filter=False)  # the filter's state is not even read
    assert "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations" in converted.notes
    assert [n.op_type for n in converted.model.graph.node][:1] == ["Gemm"]  # no filter in front of the network
    result = CliRunner().invoke(app, ["convert", str(folder), "--activation", "tanh", "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3 and not (tmp_path / "m.onnx").exists()
    assert "convert with --no-filter" in " ".join(result.output.split())


# --------------------------------------------------------------------- what convert says and records

NO_HEAD = ("the checkpoint does not record its action space, so no head was added (output logits only); "
           "--head diag-gaussian or --head categorical adds one")


@pytest.mark.parametrize("options, notes", [
    ({}, ["legacy checkpoint: converted policy 'default_policy' (it also holds opponent)",
          "dropped the value branch (fc_value_1, fc_value_2, value_out); --keep-value exports it as 'value'",
          "dropped optimizer state (3 _optimizer_variables)",
          "baked in the MeanStdFilter (12000 observations, epsilon 1e-08, clip 5.0); --no-filter leaves it out",
          NO_HEAD]),
    ({"obs_filter": False, "keep_value": True},
     ["legacy checkpoint: converted policy 'default_policy' (it also holds opponent)",
      "dropped optimizer state (3 _optimizer_variables)",
      "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations", NO_HEAD]),
    ({"policy_id": "opponent"}, ["legacy checkpoint: converted policy 'opponent' (it also holds default_policy)",
                                 "baked in the MeanStdFilter (0 observations, epsilon 1e-08, clip 10.0); --no-filter "
                                 "leaves it out",
                                 "warning: the MeanStdFilter of policy 'opponent' has seen no observations: it divides by "
                                 "std + epsilon = 1e-08 at most, as RLlib does, so almost every observation ends at the "
                                 "clip bound ±10 and the policy's output barely depends on it; was this policy ever "
                                 "trained?", NO_HEAD]),
    ({"head": "diag-gaussian"},  # a head asked for: no note about the one not added
     ["legacy checkpoint: converted policy 'default_policy' (it also holds opponent)",
      "dropped the value branch (fc_value_1, fc_value_2, value_out); --keep-value exports it as 'value'",
      "dropped optimizer state (3 _optimizer_variables)",
      "baked in the MeanStdFilter (12000 observations, epsilon 1e-08, clip 5.0); --no-filter leaves it out"]),
])
def test_the_notes_and_the_recorded_source_of_a_legacy_conversion(options, notes):
    converted = convert_source(LEGACY, **options)
    assert (converted.kind, converted.notes) == ("rllib", notes)
    metadata = {p.key: p.value for p in converted.model.metadata_props}
    pid = options.get("policy_id", "default_policy")
    assert json.loads(metadata["policyport.source"]) == {
        "kind": "rllib", "layout": "legacy", "policy_id": pid, "framework": "tf", "files": {"checkpoint-120": _sha256(LEGACY)}}
    assert metadata["policyport.activation"] == "tanh"


def test_obs_norm_is_refused_by_the_rllib_converter_itself():
    from policyport.converter import ConvertOptions
    from policyport.converter.sources.rllib import convert_rllib

    with pytest.raises(pp.OptionError) as caught:
        convert_rllib(LEGACY, ConvertOptions(obs_norm="vecnormalize.pkl"))
    assert str(caught.value) == "--obs-norm applies to SB3 sources; an RLlib checkpoint carries its own observation filter"


def _ppo_with_hidden_heads(rng) -> dict:
    w = {}
    for prefix, out, inp in (("encoder.actor_encoder.net.mlp.0", 5, 3), ("pi.net.mlp.0", 4, 5), ("pi.net.mlp.2", 2, 4)):
        w.update(_linear(rng, out, inp, prefix))
    return w


@pytest.mark.parametrize("config, activation, act, head_act, recorded, steps", [
    ({"fcnet_activation": "linear", "head_fcnet_activation": "tanh"}, None, None, np.tanh, "linear", ["pi.net.mlp.0/tanh"]),
    ({"fcnet_activation": "relu", "head_fcnet_activation": "linear"}, None, lambda z: np.maximum(z, 0), None, "relu",
     ["encoder.actor_encoder.net.mlp.0/relu"]),
    ({"head_fcnet_activation": "relu"}, "leaky_relu:0.25", lambda z: np.where(z > 0, z, 0.25 * z),
     lambda z: np.maximum(z, 0), "leaky_relu:0.25", ["encoder.actor_encoder.net.mlp.0/leaky_relu", "pi.net.mlp.0/relu"]),
])
def test_rl_module_encoder_and_head_activations_from_the_model_config(tmp_path, config, activation, act, head_act,
                                                                       recorded, steps):
    rng = np.random.default_rng(33)
    w = _ppo_with_hidden_heads(rng)
    ctor = {"class": "DefaultPPOTorchRLModule", "ctor_args_and_kwargs": ((), {
        "model_config": config, "action_space": {"space": "discrete", "n": 2}})}
    converted = convert_source(_new_stack(tmp_path, w, ctor), activation=activation)
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    logits = _apply(w, "pi.net.mlp.2", _apply(w, "pi.net.mlp.0", _apply(w, "encoder.actor_encoder.net.mlp.0", obs, act),
                                                head_act))
    metadata = {p.key: p.value for p in converted.model.metadata_props}
    assert metadata["policyport.activation"] == recorded
    assert converted.notes == ["new-stack checkpoint: converted policy 'default_policy'"]
    from policyport.converter.assumptions import Assumption

    chosen = [Assumption("activation", f"{activation} at every hidden layer", "given by --activation; the checkpoint's "
                         "model config names no fcnet_activation", "--activation names another")] if activation else []
    assert converted.assumptions == chosen  # a config that names its activation assumes none
    source = converted.reference(obs)
    got = pp.load(converted.model).run({"obs": obs})
    for values in (source, got):
        assert np.abs(values["logits"] - logits).max() <= 1e-5
        np.testing.assert_array_equal(values["action"], np.argmax(logits, axis=1))  # Discrete: categorical
    assert [n.output[0] for n in converted.model.graph.node if n.op_type not in ("Gemm", "ArgMax")] == steps


_FILTER_540 = "baked in the MeanStdFilter (540 observations, epsilon 1e-06, clip none); --no-filter leaves it out"
_OLD_TORCH = ["old-stack checkpoint: converted policy 'default_policy'",
              "dropped the value branch (_value_branch_separate.0, _value_branch_separate.1, _value_branch); "
              "--keep-value exports it as 'value'", "dropped optimizer state (1 _optimizer_variables)"]


@pytest.mark.parametrize("name, notes", [
    ("ppo_old_torch", _OLD_TORCH + [_FILTER_540]),
    ("ppo_old_torch_discrete", _OLD_TORCH + [
        "observation space Discrete(4): the graph takes int64 indices and one-hot encodes them", _FILTER_540]),
    ("ppo_old_torch_multidiscrete", _OLD_TORCH + [
        "observation space MultiDiscrete[2, 2]: the graph takes int64 indices, one per sub-space, and one-hot encodes "
        "each", _FILTER_540]),
    ("ppo_new", ["new-stack checkpoint: converted policy 'default_policy'",
                 "dropped the value branch (encoder.critic_encoder.net.mlp.0, encoder.critic_encoder.net.mlp.2, "
                 "vf.net.mlp.0); --keep-value exports it as 'value'",
                 "baked in the MeanStdFilter (534 observations, epsilon 1e-06, clip 10.0); --no-filter leaves it out"]),
])
def test_the_notes_of_ray_written_checkpoints_and_their_source_reference_tensor_by_tensor(name, notes):
    converted = convert_source(RAY / name)
    assert converted.notes == notes
    nvec = {"ppo_old_torch_discrete": (4,), "ppo_old_torch_multidiscrete": (2, 2)}.get(name)
    rng = np.random.default_rng(34)
    if nvec is None:
        obs = rng.normal(size=(9, 4)).astype(np.float32)
    else:
        obs = rng.integers(0, nvec, size=(9, len(nvec))).astype(np.int64)
        obs = obs[:, 0] if len(nvec) == 1 else obs
    source = converted.reference(obs)
    got = pp.load(converted.model).record({"obs": obs}, "*")
    assert {"logits", "action"} <= set(source) <= set(got)
    for tensor, value in source.items():
        assert value.dtype == got[tensor].dtype and np.abs(value - got[tensor]).max() <= 1e-5, tensor
    if nvec is not None:
        rows = obs.reshape(len(obs), -1)
        one_hot = np.concatenate([np.eye(n, dtype=np.float32)[rows[:, i]] for i, n in enumerate(nvec)], axis=1)
        np.testing.assert_array_equal(source["obs_preprocessor/one_hot"], one_hot)
    np.testing.assert_array_equal(source["action"], np.argmax(source["logits"], axis=1))


@pytest.mark.parametrize("space, head, outputs", [
    ({"space": "box", "shape": [1]}, None, ["logits", "action", "log_std"]),  # a Box action: diag-gaussian
    ({"space": "discrete", "n": 2}, None, ["logits", "action"]),  # Discrete: categorical
    ({"space": "box", "shape": [1]}, "diag-gaussian", ["logits", "action", "log_std"]),  # --head agreeing with it
    ({"space": "discrete", "n": 2}, "categorical", ["logits", "action"]),
    ({"space": "tuple", "spaces": []}, None, ["logits"]),  # no deterministic action for another space
])
def test_the_head_follows_the_recorded_action_space_unless_one_is_given(tmp_path, space, head, outputs):
    w = _ppo_module_state(35)
    ctor = {"class": "DefaultPPOTorchRLModule", "ctor_args_and_kwargs": ((), {"action_space": space})}
    converted = convert_source(_new_stack(tmp_path, w, ctor), head=head)
    assert [o.name for o in converted.model.graph.output] == outputs
    obs = np.random.default_rng(36).normal(size=(5, 3)).astype(np.float32)
    source, got = converted.reference(obs), pp.load(converted.model).run({"obs": obs})
    logits = _apply(w, "pi.net.mlp.0", _apply(w, "encoder.actor_encoder.net.mlp.0", obs, np.tanh))
    for values in (source, got):
        assert np.abs(values["logits"] - logits).max() <= 1e-5
        if "log_std" in outputs:
            np.testing.assert_array_equal(values["action"], values["logits"][:, :1])
            np.testing.assert_array_equal(values["log_std"], values["logits"][:, 1:])
        elif "action" in outputs:
            np.testing.assert_array_equal(values["action"], np.argmax(logits, axis=1))


# ------------------------------------------------------------------------------- files and weights read


def _msgpack_array(a: np.ndarray) -> dict:
    """An array as msgpack-numpy writes it in Ray's ``.msgpack`` states."""
    return {b"nd": True, b"type": a.dtype.str, b"shape": list(a.shape), b"data": a.tobytes()}


def test_a_policy_folder_in_msgpack_is_read_and_its_damage_named(tmp_path):
    msgpack = pytest.importorskip("msgpack")  # Ray's own dependency
    w = _small_torch_weights(37)
    folder = tmp_path / "default_policy"
    folder.mkdir()
    data = msgpack.packb({"weights": {k: _msgpack_array(v) for k, v in w.items()},
                          "policy_spec": {"config": {"model": {"fcnet_activation": "relu"}}}})
    (folder / "policy_state.msgpack").write_bytes(data)
    ckpt = read_checkpoint(folder)
    assert (ckpt.layout, ckpt.policy_id, ckpt.framework, ckpt.model_config) == (
        "old-stack", "default_policy", "torch", {"fcnet_activation": "relu"})
    assert all(ckpt.weights[k].tobytes() == w[k].tobytes() for k in w) and list(ckpt.weights) == list(w)
    assert ckpt.files == {"policy_state.msgpack": _sha256(folder / "policy_state.msgpack")}
    (folder / "policy_state.msgpack").write_bytes(data[:-3])
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_checkpoint(folder)
    assert str(caught.value) == (f"{folder / 'policy_state.msgpack'} is truncated: a MessagePack value runs past the end "
                                 "of the file")


def test_a_missing_module_state_and_an_unreadable_file_are_named(tmp_path, monkeypatch):
    folder = _new_stack(tmp_path, _ppo_module_state(38))
    module = folder / "learner_group" / "learner" / "rl_module" / "default_policy"
    (module / "module_state.pkl").unlink()
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_checkpoint(folder)
    assert str(caught.value) == f"{module / 'module_state'}.pkl (or .msgpack) is missing from the checkpoint"

    path = _legacy(tmp_path, {"state": {"default_policy": _small_torch_weights(39)}})

    def refuse(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(pp.UnreadableFileError) as caught:
        read_checkpoint(path)
    assert str(caught.value) == f"cannot read {path}: [Errno 13] Permission denied"


def test_framework_functions_a_checkpoint_names_are_recorded_inertly(tmp_path, monkeypatch):
    import types

    hooks = []
    for name in ("ray.rllib.policyport_hooks", "cloudpickle.policyport_hooks", "numpy.random.policyport_hooks"):
        module = types.ModuleType(name)  # a framework module's function, for pickling only
        module.hook = lambda x: x
        module.hook.__module__, module.hook.__qualname__ = name, "hook"
        monkeypatch.setitem(sys.modules, name, module)
        hooks.append(module.hook)
    ctor = {"class": "DefaultPPOTorchRLModule", "ctor_args_and_kwargs": ((), {
        "model_config": {"fcnet_activation": "relu"}, "hooks": hooks})}
    ckpt = read_checkpoint(_new_stack(tmp_path, _ppo_module_state(40), ctor))
    assert (ckpt.module_class, ckpt.model_config) == ("DefaultPPOTorchRLModule", {"fcnet_activation": "relu"})


@pytest.mark.parametrize("state, weights, dropped", [
    ({"_optimizer_variables": [np.zeros(2)] * 2, "a": np.ones(2, np.float32), "b": np.zeros(1, np.float64)}, ["a", "b"],
     ["optimizer state (2 _optimizer_variables)"]),  # the optimizer state first in the dict: the rest is still read
    ({"a": np.ones(2, np.float32), "n": 7, "x": np.float64(2.0), "_optimizer_variables": np.zeros(3)}, ["a"],
     ["optimizer state (1 _optimizer_variables)", "n (not a float array)", "x (not a float array)"]),
    ({"a": np.ones(2, np.float16), "i": np.arange(3), "_optimizer_variables": {"m": 1, "v": 2, "t": 3}}, ["a"],
     ["optimizer state (3 _optimizer_variables)", "i (not a float array)"]),
    ({"weights": {"a": np.ones(2, np.float32), "_optimizer_variables": [np.zeros(1)] * 4}, "global_timestep": 1}, ["a"],
     ["optimizer state (4 _optimizer_variables)"]),  # the optimizer state inside the weights dict
])
def test_the_weights_of_a_policy_state_and_what_else_it_held(tmp_path, state, weights, dropped):
    ckpt = read_checkpoint(_legacy(tmp_path, {"state": {"default_policy": state}}))
    assert (list(ckpt.weights), ckpt.dropped) == (weights, dropped)


def test_a_checkpoint_without_policies_says_it_holds_none(tmp_path):
    folder = _new_stack(tmp_path, _ppo_module_state(41))
    modules = folder / "learner_group" / "learner" / "rl_module"
    (modules / "default_policy" / "module_state.pkl").unlink()
    (modules / "default_policy").rmdir()
    (tmp_path / "old" / "policies").mkdir(parents=True)
    for path in (folder, tmp_path / "old"):
        with pytest.raises(pp.BadModelError) as caught:
            read_checkpoint(path)
        assert str(caught.value) == f"policy 'default_policy' is not in {path}; it holds: no policies (choose one with --policy-id)"


def test_serialised_arrays_are_read_strictly_and_never_unpickled():
    import base64
    import io
    import zlib

    from policyport.converter.sources.rllib import _decode_array

    text = _ray_array(np.arange(4, dtype=np.float64))
    damaged = text[:12] + "!" + text[12:]  # a lenient base64 decoder would skip the "!"
    assert _decode_array(damaged, "mean_array") is damaged
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    pickled = base64.b64encode(zlib.compress(buf.getvalue())).decode()
    assert _decode_array(pickled, "mean_array") is pickled


def test_a_pickled_filter_object_takes_rllibs_defaults_for_what_it_does_not_record():
    rs = _filter(_record("ray.rllib.utils.filter.MeanStdFilter", {
        "rs": {"_n": 3, "_M": np.array([1.0]), "_S": np.array([8.0])}}))
    assert (rs.demean, rs.destd, rs.clip, rs.count, rs.form) == (True, True, None, 3, "rs")
    np.testing.assert_array_equal(rs.std, [2.0])


def test_filter_statistics_of_two_observations_are_float64_whatever_the_stored_dtype():
    mean, sum_sq = np.array([0.5, -1.5], np.float32), np.array([2.25, 0.09], np.float32)
    rs = _filter({"destd": False, "rs": {"_n": 2, "_M": mean, "_S": sum_sq}})  # n = 2: var = _S / 1, not _M ** 2
    new = _filter({"running_stats": [{"num_pushes": 2, "mean_array": mean, "sum_sq_diff_array": sum_sq}]})
    assert (rs.demean, rs.destd, new.demean, new.destd) == (True, False, True, True)
    for f in (rs, new):
        assert f.mean.dtype == f.std.dtype == np.float64 and f.count == 2
        assert f.mean.tobytes() == mean.astype(np.float64).tobytes()
    assert rs.std.tobytes() == np.sqrt(sum_sq.astype(np.float64)).tobytes()
    assert new.std.tobytes() == np.sqrt(sum_sq.astype(np.float64).astype(np.float32)).astype(np.float64).tobytes()
    # a count past float32's integers: the division still in float64, as Ray divides its float64 sums
    n = 2 ** 24 + 2
    big = _filter({"running_stats": [{"num_pushes": n, "mean_array": np.zeros(1, np.float32),
                                      "sum_sq_diff_array": np.array([2.0 ** 24], np.float32)}]})
    var = np.float32(2.0 ** 24 / (n - 1))
    assert var == np.float32(1 - 2.0 ** -24) and big.std[0] == np.float64(np.sqrt(var)) < 1.0


# ------------------------------------------------------- a filter the checkpoint names, and --no-filter


def _missing_filter(named_by: str, sought: str, name: str = "MeanStdFilter") -> str:
    return (f"{named_by} names the observation filter {name}, but its state is not in the checkpoint (looked for "
            f"{sought}); without it the policy would see unfiltered observations. Convert with --no-filter to leave "
            "the filter out (then feed filtered observations)")


def _copy(name: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(RAY / name, tmp_path / name))


@pytest.mark.parametrize("removed, named_by", [
    ("env_runner", "class_and_ctor_args.pkl (the algorithm's config)"),
    ("env_runner/env_to_module_connector", "env_runner/class_and_ctor_args.pkl (the env runner's config)"),
    ("env_runner/env_to_module_connector/MeanStdFilter",
     "env_runner/env_to_module_connector/class_and_ctor_args.pkl (the env-to-module connector pipeline)"),
    ("env_runner/env_to_module_connector/MeanStdFilter/state.pkl",
     "env_runner/env_to_module_connector/MeanStdFilter/class_and_ctor_args.pkl (the filter connector's class)"),
])
def test_a_new_stack_filter_named_by_its_config_but_missing_is_refused_unless_left_out(tmp_path, removed, named_by):
    import shutil

    folder = _copy("ppo_new", tmp_path)
    gone = folder / removed
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    stem = folder / "env_runner" / "env_to_module_connector" / "MeanStdFilter" / "state"
    message = _missing_filter(f"{folder / named_by}", f"{stem}.pkl (or .msgpack)")
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(folder)
    assert str(caught.value) == message
    out = tmp_path / "n5.onnx"
    result = runner.invoke(app, ["convert", str(folder), "-o", str(out)])
    assert result.exit_code == 3 and not out.exists() and "Traceback" not in result.output
    assert " ".join(message.split()) in " ".join(result.output.split())

    result = runner.invoke(app, ["convert", str(folder), "-o", str(out), "--no-filter", "--samples", "20"])
    assert result.exit_code == 0, result.output
    assert "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations" in result.output
    expected = dict(np.load(RAY / "ppo_new_expected.npz"))  # fed what Ray's filter made, it is Ray's policy
    got = pp.load(str(out)).run({"obs": expected["filtered_obs"].astype(np.float32)})
    assert np.abs(got["logits"] - expected["action_dist_inputs"]).max() <= 1e-5


def test_a_new_stack_that_names_no_filter_converts_without_one(tmp_path):
    import shutil

    folder = _copy("dqn_new", tmp_path)
    shutil.rmtree(folder / "env_runner")
    ckpt = read_checkpoint(folder)
    assert (ckpt.obs_filter, ckpt.filter_named) == (None, None)
    converted = convert_source(folder)
    assert not [n for n in converted.model.graph.node if n.name.startswith("obs_filter")]
    assert not [note for note in converted.notes if "Filter" in note]


def test_an_old_stack_filter_named_by_its_config_but_missing_is_refused_unless_left_out(tmp_path):
    w = _small_torch_weights(40)
    spec = {"config": {"observation_filter": "MeanStdFilter", "model": {}}}
    folder = _policy_folder(tmp_path, {"weights": w, "policy_spec": spec,
                                       "connector_configs": {"agent": ("AgentConnectorPipeline", [])}})
    state = folder / "policies" / "default_policy" / "policy_state"
    sought = (f"worker.filters['default_policy'] in {folder / 'algorithm_state'}.pkl (or .msgpack), then a MeanStd "
              f"connector in {state}'s connector_configs")
    message = _missing_filter(f"{state} (policy_spec.config.observation_filter)", sought)
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(folder)
    assert str(caught.value) == message
    # an algorithm state whose worker holds another policy's filter only: still missing
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps({"worker": {"filters": {"other": FILTER_A}}}))
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(folder)
    assert str(caught.value) == message
    converted = convert_source(folder, obs_filter=False)
    assert "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations" in converted.notes
    obs = np.random.default_rng(41).normal(size=(4, 3)).astype(np.float32)
    expected = np.tanh(obs @ w["_hidden_layers.0._model.0.weight"].T + w["_hidden_layers.0._model.0.bias"]) \
        @ w["_logits._model.0.weight"].T + w["_logits._model.0.bias"]
    assert np.abs(pp.load(converted.model).run({"obs": obs})["logits"] - expected).max() <= 1e-5

    # the algorithm state's own config names it too when the policy's does not
    (folder / "policies" / "default_policy" / "policy_state.pkl").write_bytes(pickle.dumps({"weights": w}))
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps(
        {"config": {"observation_filter": "MeanStdFilter"}, "worker": {"filters": {}}}))
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(folder)
    assert str(caught.value) == _missing_filter(
        f"{folder / 'algorithm_state'}.pkl (or .msgpack) (config.observation_filter)", sought)
    # NoFilter, RLlib's default, names none
    (folder / "algorithm_state.pkl").write_bytes(pickle.dumps({"config": {"observation_filter": "NoFilter"}}))
    converted = convert_source(folder)
    assert not [n for n in converted.model.graph.node if n.name.startswith("obs_filter")]
    assert not [note for note in converted.notes if "Filter" in note]


def test_a_legacy_filter_named_by_params_or_the_policy_config_but_missing_is_refused_unless_left_out(tmp_path):
    w = _small_torch_weights(42)
    sought_in = "the worker state's filters['default_policy'] in {path}"
    path = _legacy(tmp_path / "a", {"state": {"default_policy": w}, "filters": {"opponent": FILTER_A}})
    (tmp_path / "a" / "params.pkl").write_bytes(pickle.dumps({"observation_filter": "MeanStdFilter", "model": {}}))
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(path)
    assert str(caught.value) == _missing_filter(f"{tmp_path / 'a' / 'params.pkl'} (observation_filter)",
                                                sought_in.format(path=path))
    converted = convert_source(path, obs_filter=False)
    assert "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations" in converted.notes

    path = _legacy(tmp_path / "b", {"state": {"default_policy": w},
                                    "policy_config": {"observation_filter": "ConcurrentMeanStdFilter"}})
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(path)
    assert str(caught.value) == _missing_filter(f"{path} (its worker state's policy_config)",
                                                sought_in.format(path=path), "ConcurrentMeanStdFilter")
    path = _legacy(tmp_path / "c", {"state": {"default_policy": w}, "policy_config": {"observation_filter": "NoFilter"}})
    assert not [note for note in convert_source(path).notes if "Filter" in note]


@pytest.mark.parametrize("name, damaged", [
    ("ppo_new", "env_runner/env_to_module_connector/MeanStdFilter/state.pkl"),
    ("ppo_new_msgpack", "env_runner/env_to_module_connector/MeanStdFilter/state.msgpack"),
    ("ppo_old_torch", "algorithm_state.pkl"),
])
def test_with_no_filter_a_damaged_filter_state_is_not_read(tmp_path, name, damaged):
    folder = _copy(name, tmp_path)
    (folder / damaged).write_bytes(b"")
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["convert", str(folder), "-o", str(out)])
    assert result.exit_code == 3 and not out.exists() and "Traceback" not in result.output
    reason = "is empty: it holds no MessagePack value" if damaged.endswith(".msgpack") else "is not a readable pickle: EOFError"
    assert f"{folder / damaged} {reason}" in " ".join(result.output.split())

    result = runner.invoke(app, ["convert", str(folder), "-o", str(out), "--no-filter", "--samples", "20"])
    assert result.exit_code == 0, result.output
    assert "left the checkpoint's MeanStdFilter out (--no-filter): feed filtered observations" in result.output
    import onnx

    metadata = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    read = json.loads(metadata["policyport.source"])["files"]
    assert str(Path(damaged)) not in read and str(Path(damaged).parent / "class_and_ctor_args.pkl") not in read
    expected = dict(np.load(RAY / f"{name}_expected.npz"))
    logits = expected.get("action_dist_inputs", expected.get("logits"))
    got = pp.load(str(out)).run({"obs": expected["filtered_obs"].astype(np.float32)})
    assert np.abs(got["logits"] - logits).max() <= 1e-5


def test_with_no_filter_a_filter_of_another_kind_is_left_out_and_named(tmp_path, monkeypatch):
    import types

    module = types.ModuleType("ray.rllib.utils.filter")  # RLlib's module, for pickling only
    module.RunningMinMaxFilter = type("RunningMinMaxFilter", (), {"__module__": module.__name__})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    path = _legacy(tmp_path, {"state": {"default_policy": _small_torch_weights(43)},
                              "filters": {"default_policy": module.RunningMinMaxFilter()}})
    with pytest.raises(pp.BadModelError) as caught:
        pp.convert(path)
    assert str(caught.value) == ("the checkpoint's observation filter is a RunningMinMaxFilter; policyport bakes in "
                                 "MeanStdFilter only (convert with --no-filter to leave it out)")
    converted = convert_source(path, obs_filter=False)
    assert "left the checkpoint's RunningMinMaxFilter out (--no-filter): feed filtered observations" in converted.notes
    assert not [n for n in converted.model.graph.node if n.name.startswith("obs_filter")]


# ------------------------------------------------------------------------ --head against the action space


def test_a_head_contradicting_the_recorded_action_space_is_refused(tmp_path):
    message = ("--head diag-gaussian contradicts the checkpoint's action space Discrete(2), which implies the "
               "categorical head (convert without --head to get it)")
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(RAY / "ppo_old_torch", head="diag-gaussian")
    assert str(caught.value) == message
    out = tmp_path / "x.onnx"
    result = runner.invoke(app, ["convert", str(RAY / "ppo_old_torch"), "-o", str(out), "--head", "diag-gaussian"])
    assert result.exit_code == 2 and not out.exists() and "Traceback" not in result.output
    assert message in " ".join(result.output.split())
    # the head the space implies, asked for, is the default one
    assert pp.convert(RAY / "ppo_old_torch", head="categorical").graph == pp.convert(RAY / "ppo_old_torch").graph


@pytest.mark.parametrize("space, head, message", [
    ({"space": "box", "shape": [1]}, "categorical",
     "--head categorical contradicts the checkpoint's action space Box(1,), which implies the diag-gaussian head "
     "(convert without --head to get it)"),
    ({"space": "multi-discrete", "nvec": [2, 3]}, "categorical",
     "--head categorical does not fit the checkpoint's action space MultiDiscrete[2, 3]: policyport builds the "
     "deterministic action of Box (diag-gaussian) and Discrete (categorical) action spaces only; convert without "
     "--head to get the logits"),
    ({"space": "multi-discrete", "nvec": [2, 3]}, "diag-gaussian",
     "--head diag-gaussian does not fit the checkpoint's action space MultiDiscrete[2, 3]: policyport builds the "
     "deterministic action of Box (diag-gaussian) and Discrete (categorical) action spaces only; convert without "
     "--head to get the logits"),
    ({"space": "tuple", "spaces": []}, "categorical",
     "--head categorical does not fit the checkpoint's action space tuple: policyport builds the deterministic action "
     "of Box (diag-gaussian) and Discrete (categorical) action spaces only; convert without --head to get the logits"),
])
def test_new_stack_heads_contradicting_the_action_space_are_refused(tmp_path, space, head, message):
    ctor = {"class": "DefaultPPOTorchRLModule", "ctor_args_and_kwargs": ((), {"action_space": space})}
    folder = _new_stack(tmp_path, _ppo_module_state(44), ctor)
    with pytest.raises(pp.OptionError) as caught:
        pp.convert(folder, head=head)
    assert str(caught.value) == message
    if space["space"] != "box":  # without --head: the logits, and a note saying why
        converted = convert_source(folder)
        assert [o.name for o in converted.model.graph.output] == ["logits"]
        shown = "MultiDiscrete[2, 3]" if space["space"] == "multi-discrete" else "tuple"
        assert f"the action space {shown} has no head policyport builds: output logits only" in converted.notes


def test_without_a_recorded_action_space_the_note_says_why_no_head_was_added(tmp_path):
    folder = _policy_folder(tmp_path, {"weights": _small_torch_weights(45)})
    converted = convert_source(folder)
    assert [o.name for o in converted.model.graph.output] == ["logits"] and NO_HEAD in converted.notes
    chosen = convert_source(folder, head="categorical")  # any head may be asked for
    assert [o.name for o in chosen.model.graph.output] == ["logits", "action"] and NO_HEAD not in chosen.notes


def test_no_filter_on_a_checkpoint_without_a_filter_says_there_was_none_to_leave_out():
    notes = convert_source(RAY / "dqn_new", obs_filter=False).notes
    assert "--no-filter: the checkpoint names no observation filter; there was none to leave out" in notes
    assert not any("no observation filter" in n for n in convert_source(RAY / "dqn_new").notes)


# ------------------------------------------------------------------- damaged values in a checkpoint

FILTER_FILE = "env_runner/env_to_module_connector/MeanStdFilter/state.pkl"


def _ppo_new_with_filter(tmp_path: Path, change) -> Path:
    """A copy of the new-stack PPO fixture whose MeanStdFilter state (plain arrays) ``change`` edited."""
    from policyport.converter.readers import unpickle
    from policyport.converter.sources.rllib import _decode_array

    folder = _copy("ppo_new", tmp_path)
    state = unpickle.load(folder / FILTER_FILE)
    filt = dict(state[None])
    filt["running_stats"] = [{k: _decode_array(v, k) for k, v in filt["running_stats"][0].items()}]
    change(filt)
    (folder / FILTER_FILE).write_bytes(pickle.dumps({None: filt}))
    return folder


def _stat(**values):
    return lambda filt: filt["running_stats"][0].update(values)


@pytest.mark.parametrize("change, message", [
    (_stat(num_pushes=None), "{file}: the MeanStdFilter's num_pushes is None, not a whole number"),
    (_stat(num_pushes="x"), "{file}: the MeanStdFilter's num_pushes is 'x', not a whole number"),
    (_stat(mean_array="abc"), "{file}: the MeanStdFilter's running_stats.mean_array is 'abc', not numbers"),
    (_stat(mean_array=np.array(["a"] * 4)),
     "{file}: the MeanStdFilter's running_stats.mean_array is an array of text (<U1), not of real numbers"),
    (_stat(sum_sq_diff_array=np.full(4, np.nan)), "{file}: the MeanStdFilter's running_stats.sum_sq_diff_array holds NaN"),
    (_stat(mean_array=np.zeros(7)),
     "{file}: the MeanStdFilter's running_stats.mean_array has shape (7,) and sum_sq_diff_array (4,); a running mean "
     "and its squared differences have one shape"),
    (_stat(mean_array=np.zeros(7), sum_sq_diff_array=np.ones(7)),
     "{folder}: the MeanStdFilter's statistics have shape (7,), but the policy takes observations of shape (4,): it is "
     "not this policy's filter; convert with --no-filter to leave it out"),
    (lambda f: f.update(clip_by_value="x"), "{file}: the MeanStdFilter's clip_by_value is 'x', not a number"),
    (lambda f: f.update(clip_by_value=np.array([1.0, 2.0])),
     "{file}: the MeanStdFilter's clip_by_value is array([1., 2.]), not a number"),
    (lambda f: f.update(clip_by_value=-3.0),
     "{file}: the MeanStdFilter's clip_by_value is -3; it must be at least 0 (0 for no clipping)"),
    (lambda f: f.update(de_mean_to_zero=np.array([1, 0])),
     "{file}: the MeanStdFilter's de_mean_to_zero is array([1, 0]), not true or false"),
    (lambda f: f.update(running_stats="x"),
     "{file}: the MeanStdFilter's running_stats is 'x', not the statistics of a running mean"),
])
def test_filter_statistics_that_are_not_numbers_are_refused_naming_the_file_and_field(tmp_path, change, message):
    folder = _ppo_new_with_filter(tmp_path, change)
    result = CliRunner().invoke(app, ["convert", str(folder), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3, result.output
    expected = message.format(file=folder / FILTER_FILE, folder=(folder / FILTER_FILE).parent)
    assert " ".join(result.stderr.split()) == f"error: {expected}"
    assert not (tmp_path / "m.onnx").exists()


def test_a_module_state_naming_a_parameter_by_a_number_is_refused(tmp_path):
    msgpack = pytest.importorskip("msgpack")  # Ray's own dependency
    folder = _copy("ppo_new_msgpack", tmp_path)
    module = folder / "learner_group" / "learner" / "rl_module" / "default_policy" / "module_state.msgpack"
    state = msgpack.unpackb(module.read_bytes(), strict_map_key=False)
    state[7] = state.pop(next(iter(state)))
    module.write_bytes(msgpack.packb(state))
    result = CliRunner().invoke(app, ["convert", str(folder), "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 3, result.output
    assert " ".join(result.stderr.split()) == (f"error: {module} names a parameter 7: not a parameter name (RLlib names "
                                               "each by its module path, as text)")


@pytest.mark.parametrize("space, message", [
    ({"space": "discrete", "n": "x"}, "f: n is 'x', not a whole number"),
    ({"space": "discrete"}, "f: n is None, not a whole number"),
    ({"space": "discrete", "n": 0}, "f: n is 0; it must be at least 1"),
    ({"space": "multi-discrete", "nvec": "abc"}, "f: nvec is 'abc', not numbers"),
    ({"space": "multi-discrete", "nvec": [2.5]}, "f: nvec is 2.5, not a whole number"),
    ({"space": "box", "shape": [4, "a"]}, "f: shape[1] is 'a', not a whole number"),
    ({"space": {"space": {"space": "box", "shape": 4}}}, "f: shape is 4, not a list of dimensions"),
])
def test_a_space_whose_sizes_are_not_whole_numbers_is_refused(space, message):
    from policyport.converter.sources.rllib import _space

    with pytest.raises(pp.BadModelError) as caught:
        _space(space, "f")
    assert str(caught.value) == message


def test_a_space_nested_in_spaces_deeper_than_python_recurses_is_read():
    from policyport.converter.sources.rllib import _space

    space = {"space": "discrete", "n": 3}
    for _ in range(5000):
        space = {"space": space}
    assert _space(space, "f") == ("discrete", 3)


def test_a_ray1_filter_is_refused_by_its_own_field_names():
    state = {"demean": True, "destd": np.array([1, 0]), "clip": 5.0,
             "rs": {"_n": 3, "_M": np.array([1.0, 2.0]), "_S": np.array([8.0, 2.0])}}
    with pytest.raises(pp.BadModelError) as caught:
        _filter(_record("ray.rllib.utils.filter.MeanStdFilter", state), "checkpoint-3")
    assert str(caught.value) == "checkpoint-3: the MeanStdFilter's destd is array([1, 0]), not true or false"
    state.update(destd=True, clip="wide")
    with pytest.raises(pp.BadModelError) as caught:
        _filter(_record("ray.rllib.utils.filter.MeanStdFilter", state), "checkpoint-3")
    assert str(caught.value) == "checkpoint-3: the MeanStdFilter's clip is 'wide', not a number"
    state.update(clip=5.0, rs={"_n": 2.5, "_M": np.array([1.0]), "_S": np.array([8.0])})
    with pytest.raises(pp.BadModelError) as caught:
        _filter(_record("ray.rllib.utils.filter.MeanStdFilter", state), "checkpoint-3")
    assert str(caught.value) == "checkpoint-3: the MeanStdFilter's rs._n is 2.5, not a whole number"


def _serialised(array: np.ndarray) -> str:
    """An array as RLlib serialises it in a JSON-able state: base64 of zlib of ``.npy`` bytes."""
    import base64
    import io
    import zlib

    npy = io.BytesIO()
    np.save(npy, array)
    return base64.b64encode(zlib.compress(npy.getvalue())).decode()


def test_filter_statistics_are_refused_by_their_sum_before_the_second_is_decompressed():
    """Each array under the limit, the two together above it: the limit is named, not memory run out of."""
    from policyport.io.limits import using_limits

    stats = {"num_pushes": 5, "mean_array": _serialised(np.zeros(100)), "sum_sq_diff_array": _serialised(np.ones(100))}
    state = {"de_mean_to_zero": True, "de_std_to_one": True, "clip_by_value": 10.0, "running_stats": [stats]}
    with using_limits(array_bytes=1000), pytest.raises(pp.LimitExceededError) as refused:
        _filter(state, "state.pkl")
    assert str(refused.value).startswith(
        "state.pkl: the MeanStdFilter's running_stats.sum_sq_diff_array (float64, shape (100,)) with the arrays read "
        "before it would take 1.56 KiB (1,600 bytes), above the limit of 1000 B")
    with using_limits(array_bytes=1600):
        assert _filter(state, "state.pkl").mean.tolist() == [0.0] * 100
    rs = {"rs": {"_n": 5, "_M": _serialised(np.zeros(100)), "_S": _serialised(np.ones(100))}}
    with using_limits(array_bytes=1000), pytest.raises(pp.LimitExceededError, match=r"rs\._S .* with the arrays read"):
        _filter(rs, "state.pkl")
