"""Options a source kind does not read are refused (exit 2), never silently ignored; the options a model
records come back as they were given, except the trust, which is never read from a file."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app
from policyport.converter import READS, convert_source

from torch_fixtures import CARTPOLE, ROOT

EXPERT = ROOT / "fixtures/real/metadrive_ppo_expert.npz"
KERAS = ROOT / "fixtures/keras/mlp_norm.keras"


@pytest.mark.parametrize("source,options,message", [
    (EXPERT, {"exporter": "dynamo"}, r"--exporter does not apply to npz sources \(--exporter applies to state-dict "
                                     r"files holding a whole pickled module read with --trust, torch, torchscript\)"),
    (EXPERT, {"policy_id": "p1", "input_shape": (5, 55)}, r"--policy-id, --input-shape do not apply to npz sources"),
    (EXPERT, {"obs_filter": False}, r"--no-filter does not apply to npz sources \(--no-filter applies to rllib, sb3, skrl, torchrl\)"),
    (CARTPOLE, {"head": "categorical"}, r"--head does not apply to sb3 sources"),
    (KERAS, {"activation": "relu"}, r"--activation does not apply to keras sources"),
])
def test_an_option_the_source_does_not_read_is_refused(source, options, message):
    with pytest.raises(pp.OptionError, match=message):
        convert_source(source, **options)


def test_the_refusal_is_a_usage_error_on_the_command_line(tmp_path):
    result = CliRunner().invoke(app, ["convert", str(EXPERT), "-o", str(tmp_path / "m.onnx"), "--exporter", "dynamo"])
    assert result.exit_code == 2 and "--exporter does not apply to npz sources" in result.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_trust_is_a_permission_every_kind_accepts():
    assert convert_source(EXPERT, trust=True, activation="tanh").kind == "npz"


def test_every_kind_has_its_reads():
    from policyport.converter import KINDS

    assert set(READS) == set(KINDS)
    assert all("opset" in reads for reads in READS.values())


def test_recorded_options_come_back_as_given_but_never_the_trust_nor_a_path():
    from policyport.converter import ConvertOptions

    given = ConvertOptions(activation="relu", head="categorical", opset=13, keep_value=True, exporter="dynamo",
                           policy_id="p1", obs_filter=False, obs_norm="vecnormalize.pkl", trust=True,
                           input_shape=(2, 3), output_names=("logits", "value"), action_bounds=((-1, -2), (1, 2.5)))
    text = given.to_metadata()
    assert "trust" not in json.loads(text) and json.loads(text)["obs_norm"] == "vecnormalize.pkl"
    back = ConvertOptions.from_metadata(text)
    assert back == dataclasses.replace(given, trust=False, obs_norm=None)  # a recorded path is never opened
    assert type(back.input_shape) is tuple and type(back.output_names) is tuple
    assert back.action_bounds == ((-1.0, -2.0), (1.0, 2.5)) and all(type(v) is float for v in back.action_bounds[0])
    recorded = json.loads(text) | {"trust": True, "added_later": 1}  # a newer policyport's key, a forged trust
    assert ConvertOptions.from_metadata(json.dumps(recorded)) == back
    assert ConvertOptions.from_metadata(json.dumps({"opset": 12, "input_shape": None})) == ConvertOptions(opset=12)
    assert ConvertOptions.from_metadata(None) == ConvertOptions.from_metadata("") == ConvertOptions()


@pytest.mark.parametrize("text, reason", [
    ("[1, 2]", "expected an object, got list"),
    ('"opset"', "expected an object, got str"),
    ("{opset: 13}", None),
])
def test_malformed_recorded_options_are_refused(text, reason):
    from policyport.converter import ConvertOptions

    with pytest.raises(pp.BadModelError) as caught:
        ConvertOptions.from_metadata(text)
    if reason is None:  # not JSON at all
        assert str(caught.value) == ("model metadata 'policyport.convert_options' is not valid JSON: Expecting property "
                                     "name enclosed in double quotes: line 1 column 2 (char 1)")
    else:
        assert str(caught.value) == f"model metadata 'policyport.convert_options' is malformed: {reason}"


@pytest.mark.parametrize("recorded, reason", [
    ({"opset": "13"}, "opset must be a whole number, not str '13'"),
    ({"opset": 0}, "opset must be a finite number >= 1, got 0"),
    ({"keep_value": "yes"}, "keep_value must be bool, not str 'yes'"),
    ({"activation": ["tanh"]}, "activation must be str, not list ['tanh']"),
    ({"input_shape": [2, "3"]}, "input_shape must be a list of int or null, not [2, '3']"),
    ({"output_names": "logits"}, "output_names must be a list of str or null, not 'logits'"),
    ({"action_bounds": [-1, 0, 1]},
     "action_bounds must be (low, high), each a number or a sequence of numbers, not [-1, 0, 1]"),
    ({"action_bounds": [["low"], [1]]}, "action_bounds must be (low, high)"),
])
def test_recorded_options_of_the_wrong_type_are_a_damaged_model_not_the_users_options(recorded, reason):
    from policyport.converter import ConvertOptions

    with pytest.raises(pp.BadModelError) as caught:  # exit 3, where the user's own options are exit 2
        ConvertOptions.from_metadata(json.dumps(recorded))
    assert not isinstance(caught.value, (pp.ArgumentTypeError, pp.OptionError))
    assert str(caught.value).startswith(f"model metadata 'policyport.convert_options' is malformed: {reason}")


def test_action_bounds_become_two_tuples_of_floats_or_are_refused_as_a_type_error():
    import numpy as np

    from policyport.converter import ConvertOptions

    given = ConvertOptions(action_bounds=(np.array([-1, -2], np.int64), 3))
    assert given.action_bounds == ((-1.0, -2.0), (3.0,))
    assert all(type(v) is float for side in given.action_bounds for v in side)
    with pytest.raises(pp.ArgumentTypeError, match=r"action_bounds must be \(low, high\)"):
        convert_source(EXPERT, action_bounds=(-1, 0, 1))


def test_verify_with_a_source_calls_ill_typed_recorded_options_a_bad_model(tmp_path):
    import onnx

    from policyport.converter import OPTIONS_KEY

    model = pp.convert(EXPERT, activation="tanh")
    entry = next(p for p in model.metadata_props if p.key == OPTIONS_KEY)
    entry.value = json.dumps({**json.loads(entry.value), "opset": "seventeen"})
    onnx.save(model, tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "m.onnx"), "--source", str(EXPERT), "--samples", "4"])
    assert result.exit_code == 3
    assert ("model metadata 'policyport.convert_options' is malformed: opset must be a whole number, not str "
            "'seventeen'; the model file is damaged") in " ".join(result.stderr.split())


TELLS = ("npz (.npz), sb3 (.zip), torchscript, rsl-rl, rl-games, skrl, ml-agents, tianshou, sample-factory, torchrl or state-dict (.pt, .pth), state-dict "
         "(.safetensors), keras (.keras, .h5, .hdf5), cleanrl (.cleanrl_model), brax (a pickle naming Brax's classes), "
         "savedmodel (a folder with saved_model.pb), rllib (checkpoint-N, or a "
         "folder with rllib_checkpoint.json or checkpoint-N), torchrl (a folder with a torchrl.checkpoint manifest.json) "
         "and brax (an orbax checkpoint folder brax.training.checkpoint.save wrote) by their names; name the kind of a source named otherwise "
         "with --from KIND (kind=KIND in Python), one of npz, torchscript, state-dict, sb3, rllib-torch, keras, "
         "savedmodel, rllib, rl-games, skrl, ml-agents, tianshou, sample-factory, torchrl, cleanrl, brax, rsl-rl")


def _zip(path, *names):
    import zipfile

    with zipfile.ZipFile(path, "w") as zf:
        for name in names:
            zf.writestr(name, b"")
    return path


def _file(path, content=b""):
    path.write_bytes(content)
    return path


def test_a_source_kind_is_told_from_its_name_and_layout(tmp_path):
    from policyport.converter import detect_kind

    for name in ("a.NPZ", "c.safetensors", "d.keras", "e.H5", "f.hdf5", "checkpoint-12", "g.pth"):
        (tmp_path / name).write_bytes(b"")
    for folder, inner in (("sm", "saved_model.pb"), ("rl", "rllib_checkpoint.json"), ("rl2", "checkpoint-3")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / inner).write_bytes(b"")
    kinds = {name: detect_kind(tmp_path / name) for name in
             ("a.NPZ", "c.safetensors", "d.keras", "e.H5", "f.hdf5", "checkpoint-12", "g.pth", "sm", "rl", "rl2")}
    assert kinds == {"a.NPZ": "npz", "c.safetensors": "state-dict", "d.keras": "keras", "e.H5": "keras",
                     "f.hdf5": "keras", "checkpoint-12": "rllib", "g.pth": "state-dict", "sm": "savedmodel",
                     "rl": "rllib", "rl2": "rllib"}
    assert detect_kind(_zip(tmp_path / "nested.zip", "model/policy.pth", "model/data")) == "sb3"
    assert detect_kind(_zip(tmp_path / "script.PT", "archive/data.pkl", "archive/constants.pkl")) == "torchscript"
    assert detect_kind(_zip(tmp_path / "weights.pt", "archive/data.pkl")) == "state-dict"
    assert detect_kind(str(CARTPOLE)) == "sb3" and detect_kind({"fc_1/kernel": None}) == "npz"


@pytest.mark.parametrize("make, what", [
    (lambda tmp: _file(tmp / "checkpoint-x"), "file"),
    (lambda tmp: _file(tmp / "policy.bin"), "file"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "folder"),
])
def test_a_source_of_no_kind_is_refused_saying_what_policyport_tells(tmp_path, make, what):
    from policyport.converter import UnknownKindError, detect_kind

    path = make(tmp_path)
    with pytest.raises(UnknownKindError) as caught:
        detect_kind(path)
    assert str(caught.value) == f"cannot tell what kind of policy the {what} {path} is: policyport tells {TELLS}"


def test_a_live_object_is_told_by_the_framework_of_its_classes():
    from policyport.converter import detect_kind

    def subclass_of(module: str):
        base = type("Model", (), {"__module__": module})
        return type("MyPolicy", (base,), {"__module__": "my_project.policies"})()

    assert [detect_kind(subclass_of(m)) for m in ("keras.src.models.model", "tensorflow.python.eager.polymorphic_function",
                                                   "tf_keras.src.engine.training", "torch.nn.modules.module")] == [
        "keras", "keras", "keras", "torch"]
    assert detect_kind(type("Tensor", (), {"__module__": "torch"})()) == "torch"
    with pytest.raises(pp.BadModelError) as caught:
        detect_kind(subclass_of("kerasish.models"))
    assert str(caught.value).startswith("cannot convert a MyPolicy; supported sources: ")


def test_a_missing_path_or_an_object_of_no_kind_is_refused(tmp_path):
    from policyport.converter import detect_kind

    with pytest.raises(pp.UnreadableFileError) as caught:
        detect_kind(tmp_path / "nothere.npz")
    assert str(caught.value) == f"{tmp_path / 'nothere.npz'}: no such file"
    with pytest.raises(pp.BadModelError) as caught:
        detect_kind(3)
    assert str(caught.value) == ("cannot convert a int; supported sources: npz, torch, torchscript, state-dict, sb3, "
                                 "rllib-torch, keras, savedmodel, rllib, rl-games, skrl, ml-agents, tianshou, sample-factory, torchrl, cleanrl, brax, rsl-rl")


ACTIVATIONS = "tanh, relu, elu, selu, swish, silu, softplus, leaky_relu, gelu, mish, hardswish, sigmoid, linear"


@pytest.mark.parametrize("source, options, error, message", [
    (EXPERT, {"opset": "17"}, pp.ArgumentTypeError, "opset must be a whole number, not str '17'"),
    (EXPERT, {"keep_value": 1}, pp.ArgumentTypeError, "convert(): keep_value must be bool, not int 1"),
    (EXPERT, {"obs_norm": 3}, pp.ArgumentTypeError, "convert(): obs_norm must be str or PathLike, not int 3"),
    (EXPERT, {"activation": 3}, pp.ArgumentTypeError, "convert(): activation must be str, not int 3"),
    (EXPERT, {"trust": None}, pp.ArgumentTypeError, "convert(): trust must be bool, not NoneType None"),
    (EXPERT, {"bogus": 1, "also": 2}, pp.ArgumentTypeError, "convert() got unexpected keyword argument(s) also, bogus"),
    (EXPERT, {"head": "beta"}, pp.OptionError, "unknown head 'beta'; choose one of diag-gaussian, diag-gaussian:halves, categorical (or none)"),
    (EXPERT, {"kind": "onnx"}, pp.OptionError,
     "unknown source kind 'onnx'; choose one of npz, torch, torchscript, state-dict, sb3, rllib-torch, keras, savedmodel, rllib, rl-games, skrl, ml-agents, tianshou, sample-factory, torchrl, cleanrl, brax, rsl-rl"),
    (EXPERT, {"activation": "softsign"}, pp.OptionError, f"unknown activation 'softsign'; choose one of {ACTIVATIONS}"),
    (EXPERT, {"activation": "relu,softsign", "kind": "state-dict"}, pp.OptionError,
     f"unknown activation 'softsign'; choose one of {ACTIVATIONS}"),
    (EXPERT, {"policy_id": "p", "input_shape": (5,)}, pp.OptionError,
     "--policy-id, --input-shape do not apply to npz sources (--policy-id applies to rllib, torchrl; --input-shape applies to "
     "rllib-torch, state-dict, torch, torchscript)"),
    (EXPERT, {"activation": "relu,tanh"}, pp.OptionError,
     "--activation (activation=) 'relu,tanh' is a list, one activation per parameter-free module, which applies to "
     "state-dict sources of a plain nn.Sequential; npz sources take one activation name"),
    (CARTPOLE, {"activation": "relu,tanh"}, pp.OptionError,
     "--activation (activation=) 'relu,tanh' is a list, one activation per parameter-free module, which applies to "
     "state-dict sources of a plain nn.Sequential; sb3 sources take one activation name; an SB3 zip records its "
     "activation in policy_kwargs (leave --activation out to use it)"),
    (ROOT / "fixtures/rllib/ray/ppo_old_torch", {"activation": "relu,tanh"}, pp.OptionError,
     "--activation (activation=) 'relu,tanh' is a list, one activation per parameter-free module, which applies to "
     "state-dict sources of a plain nn.Sequential; rllib sources take one activation name; an RLlib checkpoint "
     "records its activation in its model config (fcnet_activation)"),
])
def test_option_values_are_checked_before_the_source_is_read(source, options, error, message):
    with pytest.raises(error) as caught:
        convert_source(source, **options)
    assert type(caught.value) is error and str(caught.value) == message


def test_the_options_the_conversion_ran_with_are_recorded_once_in_the_model():
    from policyport.converter import OPTIONS_KEY, ConvertOptions

    c = convert_source(EXPERT, options=ConvertOptions(activation="relu"), opset=13)
    keys = [p.key for p in c.model.metadata_props]
    assert keys.count(OPTIONS_KEY) == keys.count("policyport.source_kind") == 1
    props = {p.key: p.value for p in c.model.metadata_props}
    assert props["policyport.source_kind"] == "npz"
    assert ConvertOptions.from_metadata(props[OPTIONS_KEY]) == ConvertOptions(activation="relu", opset=13)
    assert c.model.opset_import[0].version == 13 and "Relu" in {n.op_type for n in c.model.graph.node}


GAUSSIAN_STATE_DICT = ROOT / "fixtures/torch/gaussian.state_dict.pt"
PPO_RLLIB = ROOT / "fixtures/rllib/ray/ppo_new"


def _outputs(model) -> list[str]:
    return [o.name for o in model.graph.output]


def _head(model) -> str:
    return {p.key: p.value for p in model.metadata_props}["policyport.head"]


@pytest.mark.parametrize("source, kind, options, own_outputs, own_head", [
    (GAUSSIAN_STATE_DICT, None, {"activation": "tanh"}, ["logits", "action", "log_std"], "diag-gaussian"),  # an SB3 state_dict's own Gaussian
    (PPO_RLLIB, None, {}, ["logits", "action"], "categorical"),  # the head of the checkpoint's action space
    (EXPERT, None, {"activation": "tanh"}, ["logits"], "none"),
    (KERAS, None, {}, ["fc_out"], "none"),  # a Keras model's outputs are named by its layers
])
def test_head_none_leaves_logits_alone_where_the_source_would_add_its_own_action(source, kind, options, own_outputs,
                                                                                 own_head):
    own = convert_source(source, kind=kind, **options).model
    assert _outputs(own) == own_outputs and _head(own) == own_head
    model = convert_source(source, kind=kind, head="none", **options).model
    assert _outputs(model) == own_outputs[:1] and _head(model) == "none"
    assert not {n.output[0] for n in model.graph.node} & {"action", "log_std"}


@pytest.mark.parametrize("source, kind", [
    (CARTPOLE, "sb3"),
    (ROOT / "fixtures/torch/gaussian.torchscript.pt", "torchscript"),
])
@pytest.mark.parametrize("head", ["none", "categorical"])
def test_every_head_value_is_refused_where_the_source_fixes_its_outputs(tmp_path, source, kind, head):
    result = CliRunner().invoke(app, ["convert", str(source), "-o", str(tmp_path / "m.onnx"), "--head", head])
    assert result.exit_code == 2, result.output
    assert (f"--head does not apply to {kind} sources (--head applies to keras, npz, rllib, rllib-torch, sample-factory, savedmodel, "
            "state-dict)") in result.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_head_none_from_the_command_line_reaches_the_converter(tmp_path):
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(app, ["convert", str(GAUSSIAN_STATE_DICT), "-o", str(out), "--activation", "tanh",
                                      "--head", "none"])
    assert result.exit_code == 0, result.output
    import onnx

    model = onnx.load(out)
    assert _outputs(model) == ["logits"] and _head(model) == "none"
    recorded = {p.key: p.value for p in model.metadata_props}["policyport.convert_options"]
    assert json.loads(recorded)["head"] == "none"
