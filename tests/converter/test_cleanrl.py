"""CleanRL's ``.cleanrl_model`` files, made by ``fixtures/cleanrl/make_cleanrl.py`` (CleanRL's own
networks rebuilt, saved as its scripts save them): numpy's and onnxruntime's ``action`` equal CleanRL's
deterministic action computed by those networks on 1,000 observations; ``extract`` gives the actor's
arrays back bit for bit; what the file does not record is reported; nothing pickled in a file runs."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import policyport as pp
from policyport.converter import convert_source, detect_kind
from policyport.errors import OptionError, UntrustedFileError

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "cleanrl"


def _make_module():
    spec = importlib.util.spec_from_file_location("make_cleanrl", FIXTURES / "make_cleanrl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_cleanrl"] = module
    spec.loader.exec_module(module)
    return module


mk = _make_module()
NAMES = [*mk.TORCH, *mk.JAX]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """name -> (path, the network make() returned); JAX files only where jax and flax are installed."""
    out = tmp_path_factory.mktemp("cleanrl")
    models = {}
    for name in NAMES:
        if name in mk.JAX and importlib.util.find_spec("flax") is None:
            continue
        models[name] = (out / f"{name}.cleanrl_model", mk.make(name, out))
    return models


def observations(name: str, n: int = 1000) -> np.ndarray:
    dim = (mk.BOX_OBS if "continuous" in name else mk.DISCRETE_OBS).shape[0]
    return np.random.default_rng(7).normal(0, 2, (n, dim)).astype(np.float32)


def _get(made, name):
    if name not in made:
        pytest.skip("jax and flax are not installed")
    return made[name]


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("name", NAMES)
def test_action_equals_cleanrl_deterministic_action(made, name, backend):
    path, network = _get(made, name)
    obs = observations(name)
    want = mk.deterministic_action(name, network, obs)
    kwargs = {"action_bounds": (mk.BOX_ACT.low, mk.BOX_ACT.high)} if name.startswith(("td3_continuous_action_jax", "ddpg_continuous_action_jax")) else {}
    converted = convert_source(path, **kwargs)
    assert converted.kind == "cleanrl"
    got = pp.load(converted.model, backend=backend).run({"obs": obs})["action"]
    assert got.shape == want.shape
    if want.dtype.kind in "iu":
        assert np.array_equal(got, want)
        assert len(np.unique(want)) > 1  # the observations reach more than one action
    else:
        assert np.abs(got - want).max() <= 1e-5
        assert np.abs(want).max() > 0.01


def test_the_kind_is_told_from_the_name_and_the_layout_from_the_content(made):
    path, _ = _get(made, "ppo_continuous_action")
    assert detect_kind(path) == "cleanrl"
    notes = {name: convert_source(made[name][0], **({"action_bounds": (-1, 1)} if "jax" in name and "continuous" in name else {})).notes[0]
             for name in made}
    assert notes["ppo_continuous_action"] == "read as CleanRL's ppo_continuous_action.py"
    assert notes["ddpg_continuous_action"] == "read as CleanRL's td3_continuous_action.py"  # the same Actor
    assert notes.get("c51_jax", "read as CleanRL's c51_jax.py") == "read as CleanRL's c51_jax.py"


def test_ppo_continuous_exports_the_mean_log_std_and_value_and_reports_what_it_assumes(made):
    path, agent = _get(made, "ppo_continuous_action")
    obs = observations("ppo_continuous_action", 50)
    converted = convert_source(path, keep_value=True)
    out = pp.load(converted.model).run({"obs": obs})
    with torch.no_grad():
        assert np.abs(out["value"] - agent.critic(torch.as_tensor(obs)).numpy()).max() <= 1e-5
        assert np.array_equal(out["log_std"], agent.actor_logstd.expand(50, 3).numpy())
    assumed = {a.topic: a.assumes for a in converted.assumptions}
    assert assumed == {"activation": "tanh at actor_mean.1, actor_mean.3, critic.1 and critic.3",
                       "action bounds": "none: the action is actor_mean's output, unclipped",
                       "observation normalisation": "none"}
    clipped = convert_source(path, action_bounds=(-0.001, 0.002))
    action = pp.load(clipped.model).run({"obs": obs})["action"]
    assert action.min() == np.float32(-0.001) and action.max() == np.float32(0.002)


def test_extract_gives_the_actor_arrays_back_bit_for_bit(made):
    for name in ("ppo_continuous_action", "c51", "td3_continuous_action", "sac_continuous_action", "dqn_jax"):
        path, _ = _get(made, name)
        weights = pp.extract_weights(convert_source(path).model)
        if name.endswith("_jax"):
            from policyport.converter.readers.flax_msgpack import load

            params = load(path)["params"]
            source = {f"params/{layer}/{p}": a for layer, ps in params.items() for p, a in ps.items()}
        else:
            state = torch.load(path, weights_only=True)
            state = state[0] if isinstance(state, tuple) else state.get("model_weights", state)
            source = {k: v.numpy() for k, v in state.items() if not k.startswith("critic.")}
        assert set(weights) == set(source), name
        for key, array in source.items():
            assert weights[key].dtype == array.dtype and np.array_equal(weights[key], array), (name, key)


def test_sac_log_std_is_the_actor_forward(made):
    path, actor = _get(made, "sac_continuous_action")
    obs = observations("sac_continuous_action", 100)
    with torch.no_grad():
        _, want = actor(torch.as_tensor(obs))
    got = pp.load(convert_source(path).model, backend="onnxruntime").run({"obs": obs})["log_std"]
    assert np.abs(got - want.numpy()).max() <= 1e-5


def test_jax_td3_bounds_come_from_options_and_are_reported(made):
    path, _ = _get(made, "td3_continuous_action_jax")
    default = convert_source(path)
    assert {a.topic: a.assumes for a in default.assumptions}["action bounds"] == "[-1, 1]: action_scale 1, action_bias 0"
    given = convert_source(path, action_bounds=((-1, -2, -0.5), (1, 2, 1.5)))
    assert {a.topic: a.assumes for a in given.assumptions}["action bounds"] == "[(-1, -2, -0.5), (1, 2, 1.5)]"
    with pytest.raises(OptionError, match="3 action dimensions"):
        convert_source(path, action_bounds=((-1, 1), (1, 2)))
    with pytest.raises(OptionError, match="holds action_scale and action_bias"):
        convert_source(made["td3_continuous_action"][0], action_bounds=(-1, 1))
    with pytest.raises(OptionError, match="no value function"):
        convert_source(made["dqn"][0], keep_value=True)


def _with_payload(path: Path, out: Path, payload) -> Path:
    """``path``'s torch zip with ``payload`` pickled into its data.pkl beside the weights."""
    state = torch.load(path, weights_only=True)
    torch.save({"model_weights": state["model_weights"], "args": payload}, out)
    return out


class Namespace:  # an argparse.Namespace-like object, pickled by class
    def __init__(self, **kw):
        self.__dict__.update(kw)


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickled_payload_never_runs(made, tmp_path):
    path, network = _get(made, "c51")
    obs = observations("c51", 100)
    with_object = _with_payload(path, tmp_path / "obj.cleanrl_model", Namespace(n_atoms=101))
    converted = convert_source(with_object)  # a class is an inert record: the weights convert
    assert np.array_equal(pp.load(converted.model).run({"obs": obs})["action"], mk.deterministic_action("c51", network, obs))
    marker = tmp_path / "ran"
    hostile = _with_payload(path, tmp_path / "hostile.cleanrl_model", RunsCode(marker))
    with pytest.raises(UntrustedFileError, match=r"\.system"):
        convert_source(hostile)
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_continuous_action", "c51", "dqn_jax"])
def test_convert_verify_pack_and_the_packed_run_py(made, name, tmp_path):
    import subprocess

    from typer.testing import CliRunner

    from policyport.cli import app

    path, _ = _get(made, name)
    runner = CliRunner()
    out, folder = tmp_path / "policy.onnx", tmp_path / "packed"
    result = runner.invoke(app, ["convert", str(path), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "cleanrl" and doc["verification"]["passed"]
    result = runner.invoke(app, ["verify", str(out), "--source", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"]
    result = runner.invoke(app, ["pack", str(out), "-o", str(folder), "--source", str(path), "--json"])
    assert result.exit_code == 0, result.output
    done = subprocess.run([sys.executable, str(folder / "run.py"), "--verify", "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["passed"]


def test_action_bounds_on_the_command_line_are_recorded_and_verify_reads_them_back(made, tmp_path):
    from typer.testing import CliRunner

    from policyport.cli import app

    path, agent = _get(made, "ppo_continuous_action")
    runner, out = CliRunner(), tmp_path / "policy.onnx"
    result = runner.invoke(app, ["convert", str(path), "-o", str(out), "--action-bounds", "-0.001,-0.002,-0.003:0.002,0.001,0.003",
                                 "--samples", "50", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {a["topic"]: a["assumes"] for a in doc["assumptions"]}["action bounds"] == (
        "[(-0.001, -0.002, -0.003), (0.002, 0.001, 0.003)]: actor_mean's output clipped as gymnasium's ClipAction does")
    obs = observations("ppo_continuous_action", 200)
    action = pp.load(out).run({"obs": obs})["action"]
    with torch.no_grad():
        low, high = np.float32([-0.001, -0.002, -0.003]), np.float32([0.002, 0.001, 0.003])
        want = np.clip(agent.actor_mean(torch.as_tensor(obs)).numpy(), low, high)
    assert np.abs(action - want).max() <= 1e-6
    assert (action.min(0) == low).all() and (action.max(0) == high).all()  # each bound clips some rows
    result = runner.invoke(app, ["verify", str(out), "--source", str(path), "--samples", "50", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"]


@pytest.mark.parametrize("name, bounds, message", [
    ("ppo_continuous_action", "-1", "give LOW:HIGH, each one number or one per action dimension"),
    ("ppo_continuous_action", "-1:x", "give LOW:HIGH"),
    ("ppo_continuous_action", "-1,-1:1,1", "--action-bounds gives 2 low bounds; the policy has 3 action dimensions"),
    ("ppo_continuous_action", "nan:1", "every bound must be finite and every low at most its high"),
    ("ppo_continuous_action", "1:-1", "every bound must be finite and every low at most its high"),
    ("dqn", "-1,-2:1,2", "--action-bounds does not apply to dqn.py's network: it acts in a Discrete space"),
    ("td3_continuous_action", "-1:1",
     "--action-bounds does not apply to td3_continuous_action.py's network: its file holds action_scale and action_bias"),
])
def test_action_bounds_that_do_not_fit_are_a_usage_error(made, tmp_path, name, bounds, message):
    from typer.testing import CliRunner

    from policyport.cli import app

    path, _ = _get(made, name)
    out = tmp_path / "policy.onnx"
    result = CliRunner().invoke(app, ["convert", str(path), "-o", str(out), f"--action-bounds={bounds}"])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert not out.exists()


def test_a_cleanrl_state_dict_given_as_another_kind_is_refused_naming_cleanrl(made):
    from policyport.errors import BadModelError

    for name, script in (("ppo_continuous_action", "ppo_continuous_action.py"), ("ppo", "ppo.py"),
                         ("td3_continuous_action", "td3_continuous_action.py or ddpg_continuous_action.py")):
        path, _ = _get(made, name)
        with pytest.raises(BadModelError, match=f"CleanRL's {script} (network|actor).*--from cleanrl"):
            convert_source(path, kind="state-dict", activation="tanh")


def test_the_flax_reader_rebuilds_what_flax_writes_and_refuses_what_it_does_not():
    flax = pytest.importorskip("flax")
    import ml_dtypes

    from policyport.converter.readers import flax_msgpack
    from policyport.errors import UnreadableFileError

    tree = {"params": {"Dense_0": {"kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
                                   "bias": np.array([1, 2], ml_dtypes.bfloat16)}},
            "step": np.int64(7), "z": 1 + 2j, "name": "x", "none": None, "list": [np.float64(0.5), 3]}
    back = flax_msgpack.load(flax.serialization.to_bytes(tree))
    assert np.array_equal(back["params"]["Dense_0"]["kernel"], tree["params"]["Dense_0"]["kernel"])
    assert back["params"]["Dense_0"]["bias"].dtype == ml_dtypes.bfloat16
    assert back["step"] == 7 and back["step"].dtype == np.int64 and back["z"] == 1 + 2j and back["none"] is None
    assert back["list"]["0"] == 0.5 and back["list"]["1"] == 3 and back["name"] == "x"

    big = np.random.default_rng(0).normal(size=(5, 7)).astype(np.float32)
    old = flax.serialization.MAX_CHUNK_SIZE
    flax.serialization.MAX_CHUNK_SIZE = 16  # 4 float32 per chunk
    try:
        data = flax.serialization.to_bytes({"w": big})
    finally:
        flax.serialization.MAX_CHUNK_SIZE = old
    assert b"__msgpack_chunked_array__" in data
    assert np.array_equal(flax_msgpack.load(data)["w"], big)

    with pytest.raises(UnreadableFileError, match="extension of type 9"):
        flax_msgpack.load(b"\x81\xa1a\xd4\x09\x00")  # {"a": fixext1(type 9)}
    import msgpack

    payload = msgpack.packb(((2,), "object", b"\0" * 16), use_bin_type=True)
    with pytest.raises(UnreadableFileError, match="only numeric arrays"):
        flax_msgpack.load(msgpack.packb({"a": msgpack.ExtType(1, payload)}, use_bin_type=True))
    payload = msgpack.packb(((3,), "float32", b"\0" * 8), use_bin_type=True)
    with pytest.raises(UnreadableFileError, match="do not fit its shape"):
        flax_msgpack.load(msgpack.packb({"a": msgpack.ExtType(1, payload)}, use_bin_type=True))


def test_a_cleanrl_file_converts_without_torch_or_jax():
    import subprocess

    code = ("import sys; sys.modules['torch'] = sys.modules['jax'] = sys.modules['flax'] = None\n"
            "import numpy as np, policyport as pp\n"
            "from policyport.converter import convert_source\n"
            "for name in ('ppo_continuous_action', 'c51_jax'):\n"
            "    c = convert_source(f'fixtures/cleanrl/{name}.cleanrl_model')\n"
            "    obs = np.random.default_rng(0).normal(size=(20, c.model.graph.input[0].type.tensor_type.shape.dim[1].dim_value)).astype(np.float32)\n"
            "    assert np.array_equal(pp.load(c.model).run({'obs': obs})['action'], c.reference(obs)['action'])\n"
            "    print(c.oracle.name)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "policyport's reconstruction from the arrays of CleanRL's ppo_continuous_action.py network, run in numpy",
        "policyport's reconstruction from the arrays of CleanRL's c51_jax.py network, run in numpy"]
