"""Neuron overrides: the grammar, exactly the chosen neurons change, both backends agree, nothing else is written."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import policyport as pp
from policyport.runtime.overrides import Edit, load_override_sets, parse_overrides, parse_spec

BACKENDS = list(pp.BACKENDS)


@pytest.mark.parametrize("text, expected", [
    ("fc_2/tanh[17]=1.0", Edit("fc_2/tanh", (17,), False, "set", (1.0,))),
    ("fc_1/tanh[*]*=0.5", Edit("fc_1/tanh", None, False, "scale", (0.5,))),
    ("fc_2/tanh[0:8]=clip(-0.5, 0.5)", Edit("fc_2/tanh", (0, 8), True, "clip", (-0.5, 0.5))),
    ("logits[3,1,3]=-2e-1", Edit("logits", (3, 1), False, "set", (-0.2,))),
    (" a[b]/c[ 2 ] *= 3 ", Edit("a[b]/c", (2,), False, "scale", (3.0,))),
])
def test_the_text_grammar(text, expected):
    assert parse_spec(text) == expected
    assert parse_spec(expected.spec) == expected  # spec round-trips


@pytest.mark.parametrize("text, message", [
    ("fc_2/tanh=1", "does not read as TENSOR"),
    ("fc_2/tanh[17]", "does not read as TENSOR"),
    ("fc_2/tanh[x]=1", "index 'x' is not a neuron number"),
    ("fc_2/tanh[5:2]=1", "range 5:2 is empty"),
    ("fc_2/tanh[-1]=1", "neuron numbers start at 0"),
    ("fc_2/tanh[1]=one", "'one' is not a number"),
    ("fc_2/tanh[1]=clip(1,0)", r"clip\(1, 0\) needs low <= high"),
    ("[1]=0", "does not read as TENSOR"),
])
def test_malformed_specs_say_what_is_wrong(text, message):
    with pytest.raises(pp.InputMismatchError, match=message):
        parse_spec(text)


@pytest.mark.parametrize("text, message", [
    ("fc_2/tanh[1]=clip(a,1)", "override 'fc_2/tanh[1]=clip(a,1)': 'a' is not a number"),
    ("fc_2/tanh[1]=clip(0,b)", "override 'fc_2/tanh[1]=clip(0,b)': 'b' is not a number"),
])
def test_a_clip_bound_that_is_not_a_number_is_named_with_its_spec(text, message):
    with pytest.raises(pp.InputMismatchError) as caught:
        parse_spec(text)
    assert str(caught.value) == message


def test_the_mapping_form_and_override_files(tmp_path):
    edits = parse_overrides({"fc_2/tanh": {17: 1.0, "0:8": {"clip": [-0.5, 0.5]}, "*": {"scale": 2}, "3,4": "*=0.5"}})
    assert [e.spec for e in edits] == ["fc_2/tanh[17]=1", "fc_2/tanh[0:8]=clip(-0.5,0.5)", "fc_2/tanh[*]*=2",
                                       "fc_2/tanh[3,4]*=0.5"]
    path = tmp_path / "sets.json"
    path.write_text('{"brake": {"fc_2/tanh": {"17": 1.0}}, "calm": ["fc_1/tanh[*]*=0.5"]}')
    sets = load_override_sets(path)
    assert [e.spec for e in sets["brake"]] == ["fc_2/tanh[17]=1"] and [e.spec for e in sets["calm"]] == ["fc_1/tanh[*]*=0.5"]
    path.write_text('{"brake": {"fc_2/tanh": {"17": {"push": 1}}}}')
    with pytest.raises(pp.InputMismatchError, match="set 'brake'.*not a number"):
        load_override_sets(path)
    with pytest.raises(pp.InputMismatchError, match="index True"):
        parse_overrides({"fc_2/tanh": {True: 1.0}})


CASES = [  # (overrides, tensor, neurons it touches, function of the original values)
    ({"fc_2/tanh": {17: 1.0}}, "fc_2/tanh", [17], lambda v: np.ones_like(v)),
    ("fc_1/tanh[*]*=0.5", "fc_1/tanh", slice(None), lambda v: v * np.float32(0.5)),
    ("fc_2/tanh[10:20]=clip(-0.1,0.1)", "fc_2/tanh", slice(10, 20), lambda v: np.clip(v, -0.1, 0.1)),
    ({"fc_1/linear": {"3,40,7": -2.0}}, "fc_1/linear", [3, 40, 7], lambda v: np.full_like(v, -2.0)),
    ({"logits": {0: 0.25}}, "logits", [0], lambda v: np.full_like(v, 0.25)),
    ({"action": {1: {"scale": -1}}}, "action", [1], lambda v: -v),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("overrides, tensor, neurons, change", CASES)
def test_an_override_changes_exactly_the_chosen_neurons(metadrive_model, metadrive_obs, backend, overrides, tensor,
                                                        neurons, change):
    session = pp.load(metadrive_model, backend=backend)
    obs = metadrive_obs[:50]
    plain, steered = session.record(obs), session.record(obs, overrides=overrides)
    chosen = np.zeros(plain[tensor].shape[-1], bool)
    chosen[neurons] = True
    np.testing.assert_array_equal(steered[tensor][:, ~chosen], plain[tensor][:, ~chosen])
    np.testing.assert_allclose(steered[tensor][:, chosen], change(plain[tensor][:, chosen]), rtol=1e-6)
    order = session.tensor_names
    for name in order[:order.index(tensor)]:  # everything before is untouched
        np.testing.assert_array_equal(steered[name], plain[name])
    outputs = session.run(obs, overrides=overrides)
    for name, value in outputs.items():
        np.testing.assert_array_equal(value, steered[name])
    assert not np.array_equal(outputs["logits"], plain["logits"]) or tensor == "action"


@pytest.mark.parametrize("overrides", [c[0] for c in CASES] + [
    ["fc_1/tanh[0:128]*=0", "fc_2/linear[5]=clip(0,0.3)", "logits[*]*=2", "action[0]=1"],
])
def test_numpy_and_onnxruntime_agree_on_steered_outputs_and_activations(metadrive_model, metadrive_obs, overrides):
    results = [pp.load(metadrive_model, backend=b).record(metadrive_obs, overrides=overrides) for b in BACKENDS]
    assert list(results[0]) == list(results[1])
    for name in results[0]:
        np.testing.assert_allclose(results[1][name], results[0][name], atol=1e-5, rtol=0, err_msg=name)


def test_the_recorded_activation_is_the_steered_one_downstream_too(metadrive_model, metadrive_obs):
    session = pp.load(metadrive_model)
    steered = session.record(metadrive_obs[:8], overrides={"fc_1/tanh": {"*": 0.0}})
    weights = pp.extract_weights(metadrive_model)
    np.testing.assert_allclose(steered["fc_2/linear"], np.broadcast_to(weights["default_policy/fc_2/bias"], (8, 256)), rtol=1e-6)


def aliasing_model():
    """``view`` is the feed itself and ``bias`` the weight itself (Identity returns its input)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["obs"], ["view"]), helper.make_node("Identity", ["B"], ["bias"]),
         helper.make_node("Add", ["view", "bias"], ["y"]), helper.make_node("Tanh", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.array([0.5, -0.5, 0.25], np.float32), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_overrides_never_write_into_feeds_or_weights(backend):
    session = pp.load(aliasing_model(), backend=backend)
    obs = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    kept = obs.copy()
    steered = session.record(obs, overrides=["view[*]=0", "bias[1]=9", "y[0]*=10"])
    np.testing.assert_array_equal(obs, kept)
    np.testing.assert_array_equal(steered["view"], np.zeros((2, 3)))
    np.testing.assert_array_equal(steered["bias"], [0.5, 9, 0.25])
    np.testing.assert_allclose(steered["z"], np.tanh([[5, 9, 0.25], [5, 9, 0.25]]), rtol=1e-6)
    np.testing.assert_allclose(session.run(obs)["z"], np.tanh(kept + [0.5, -0.5, 0.25]), rtol=1e-6)


def test_a_steered_output_does_not_share_memory_with_later_calls(metadrive_model, metadrive_obs):
    session = pp.load(metadrive_model)
    first = session.run(metadrive_obs[:4], overrides={"logits": {0: 1.0}})
    kept = {k: v.copy() for k, v in first.items()}
    session.run(metadrive_obs[4:8], overrides={"logits": {0: 2.0}})
    for k in kept:
        np.testing.assert_array_equal(first[k], kept[k])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_overrides_name_the_problem(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    with pytest.raises(pp.InputMismatchError, match=r"name \['fc_3/tanh'\], which no node .* fc_1/linear, fc_1/tanh"):
        session.run(metadrive_obs[:2], overrides={"fc_3/tanh": {0: 1}})
    with pytest.raises(pp.InputMismatchError, match=r"fc_2/tanh\[250:260\]=0: tensor 'fc_2/tanh' has 256 neurons .*0 to 255"):
        session.run(metadrive_obs[:2], overrides="fc_2/tanh[250:260]=0")
    with pytest.raises(pp.InputMismatchError, match="does not read as"):
        session.record(metadrive_obs[:2], overrides="fc_2/tanh")


def test_the_numpy_plan_compiles_once_per_set_of_tensors_and_keeps_the_plain_path(metadrive_model, metadrive_obs):
    session = pp.load(metadrive_model)
    assert session._run.__wrapped__ is session.backend.plan.run  # the generated function itself, only made quiet
    for value in (0.0, 0.5, 1.0):
        session.run(metadrive_obs[:2], overrides={"fc_2/tanh": {17: value}})
        session.record(metadrive_obs[:2], overrides={"fc_2/tanh": {3: value}})
    session.run(metadrive_obs[:2], overrides={"fc_1/tanh": {17: 1.0}})
    assert sorted(session.backend._steered) == [("record", ("fc_2/tanh",)), ("run", ("fc_1/tanh",)), ("run", ("fc_2/tanh",))]


def test_a_failing_node_is_still_named_with_overrides():
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["h"], name="act"), helper.make_node("Gemm", ["h", "W", "C"], ["y"], name="fc")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "W"), numpy_helper.from_array(np.ones((3, 4), np.float32), "C")])
    session = pp.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(pp.BadModelError, match='Gemm node "fc" on the numpy backend failed'):
        session.run(np.ones((2, 3), np.float32), overrides={"h": {0: 1.0}})


@pytest.mark.parametrize("backend", BACKENDS)
def test_record_iter_yields_what_record_gives_batch_by_batch(metadrive_model, metadrive_obs, backend):
    session = pp.load(metadrive_model, backend=backend)
    batches = (metadrive_obs[i:i + 300] for i in range(0, 1000, 300))
    results = list(session.record_iter(batches, tensors="fc_2/*", overrides={"fc_1/tanh": {0: 1.0}}))
    assert [len(r["fc_2/tanh"]) for r in results] == [300, 300, 300, 100]
    whole = session.record(metadrive_obs, tensors="fc_2/*", overrides={"fc_1/tanh": {0: 1.0}})
    for name in whole:  # BLAS may sum in another order for another batch size: ~1e-6
        np.testing.assert_allclose(np.concatenate([r[name] for r in results]), whole[name], atol=1e-5, rtol=0)
    with pytest.raises(pp.InputMismatchError, match="match no tensor"):
        session.record_iter(iter(()), tensors="nothing*")  # checked before any batch is read


def test_the_documented_override_sets_move_the_metadrive_action(metadrive_model):
    """docs/metadrive_steer.json, as the README shows it: the throttle moves, the steering stays."""
    from pathlib import Path

    sets = load_override_sets(Path(__file__).resolve().parents[2] / "docs" / "metadrive_steer.json")
    obs = np.random.default_rng(0).uniform(0, 1, (1000, 275)).astype(np.float32)
    for backend in BACKENDS:
        session = pp.load(metadrive_model, backend=backend)
        plain = session.run(obs)["action"].mean(0)
        brake = session.run(obs, overrides=sets["brake"])["action"].mean(0)
        accelerate = session.run(obs, overrides=sets["accelerate"])["action"].mean(0)
        np.testing.assert_allclose([plain, brake, accelerate], [[0.714, -0.583], [0.699, -1.300], [0.748, 0.005]], atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("empty", [{}, [], {"fc_2/tanh": {}}])
def test_no_overrides_at_all_is_a_plain_run(metadrive_model, metadrive_obs, backend, empty):
    session = pp.load(metadrive_model, backend=backend)
    np.testing.assert_array_equal(session.run(metadrive_obs[:4], overrides=empty)["action"],
                                  session.run(metadrive_obs[:4])["action"])
    assert list(session.record(metadrive_obs[:4], overrides=empty)) == session.tensor_names


def exactly(message: str) -> str:
    """A pattern that matches ``message`` and nothing longer or shorter."""
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize("overrides, message", [
    ("t[1]=nan", None),  # a NaN to set is a value like any other
    ("t[1]*=inf", "override 't[1]*=inf': the factor must be finite"),
    ("t[1]*=nan", "override 't[1]*=nan': the factor must be finite"),
    ("t[1]=clip(2,2)", None),  # low == high is a constant
    ("t[0:1]=0", None),
    ("t[1:1]=0", "override 't[1:1]=0': range 1:1 is empty or negative; write a:b with 0 <= a < b"),
    ("t[-1:3]=0", "override 't[-1:3]=0': range -1:3 is empty or negative; write a:b with 0 <= a < b"),
    ("t[1:2:3]=0", "override 't[1:2:3]=0': range 1:2:3 is empty or negative; write a:b with 0 <= a < b"),
    ("t[0,-2]=0", "override 't[0,-2]=0': neuron numbers start at 0, got -2"),
    ("t[1,,2]=0", "override 't[1,,2]=0': index '1,,2' is not a neuron number, a comma list, a range a:b or *"),
    (" [1]=0", "override ' [1]=0' names no tensor"),
    ("t[1]", "override 't[1]' does not read as TENSOR[INDEX]=VALUE, TENSOR[INDEX]*=FACTOR or TENSOR[INDEX]=clip(LO,HI) "
             "(INDEX: a neuron number, a comma list, a range a:b, or *)"),
    ({"t": {(): 1.0}}, "override 't[()]': index () is not a neuron number, a comma list, a range a:b or *"),
    ({"t": {(1, True): 1.0}}, "override 't[(1, True)]': index (1, True) is not a neuron number, a comma list, a range "
                              "a:b or *"),
    ({"t": {(1, 2.0): 1.0}}, "override 't[(1, 2.0)]': index (1, 2.0) is not a neuron number, a comma list, a range "
                             "a:b or *"),
    ({"t": {1.5: 1.0}}, "override 't[1.5]': index 1.5 is not a neuron number, a comma list, a range a:b or *"),
    ({"t": {1: True}}, "override 't[1]': True is not a number"),
    ({"t": {1: {"set": True}}}, "override 't[1]': set needs a number, got True"),
    ({"t": {1: {"scale": "2"}}}, "override 't[1]': scale needs a number, got '2'"),
    ({"t": {1: {"scale": np.float32(2)}}}, None),
    ({"t": {1: {"clip": [0, 1, 2]}}}, "override 't[1]': clip needs [low, high], got [0, 1, 2]"),
    ({"t": {1: {"clip": (0, False)}}}, "override 't[1]': clip needs [low, high], got (0, False)"),
    ({"t": {1: {"clip": "0,1"}}}, "override 't[1]': clip needs [low, high], got '0,1'"),
    ({"t": {1: {"clip": [1, 0]}}}, "override 't[1]': clip(1, 0) needs low <= high"),
    ({"t": {1: {"set": 1, "scale": 2}}}, "override 't[1]': {'set': 1, 'scale': 2} is not a number, {'set': v}, "
                                         "{'scale': f} or {'clip': [lo, hi]}"),
    ({"t": {1: {"push": 1}}}, "override 't[1]': {'push': 1} is not a number, {'set': v}, {'scale': f} or "
                              "{'clip': [lo, hi]}"),
    ({"t": {1: None}}, "override 't[1]': None is not a number, {'set': v}, {'scale': f} or {'clip': [lo, hi]}"),
    ({"t": {1: " *= 2"}}, None),
    ({"t": [1]}, "overrides map a tensor name to {neuron index: value}; got 't': [1]"),
    ({3: {1: 1.0}}, "overrides map a tensor name to {neuron index: value}; got 3: {1: 1.0}"),
    (["t[1]=0", 5], "an override is a text spec or an Edit, got 5"),
    (5, "overrides must be a mapping, a text spec or a list of specs; got int"),
    (None, "overrides must be a mapping, a text spec or a list of specs; got NoneType"),
])
def test_every_refusal_of_an_override_says_exactly_what_is_wrong(overrides, message):
    if message is None:
        assert len(parse_overrides(overrides)) == 1
        return
    with pytest.raises(pp.InputMismatchError, match=exactly(message)):
        parse_overrides(overrides)


@pytest.mark.parametrize("index, parsed", [
    (slice(2, 5), ((2, 5), True)),
    (slice(2, 5, 1), ((2, 5), True)),
    (slice(2, 5, 2), None),
    (slice(None, 5), None),
    (slice(2, None), None),
    (slice(5, 2), "override 's': range 5:2 is empty or negative; write a:b with 0 <= a < b"),
    ([3, np.int32(1)], ((3, 1), False)),
    ("*", (None, False)),
    (" * ", (None, False)),
    ("4", ((4,), False)),
])
def test_an_index_may_be_a_slice_a_list_or_text(index, parsed):
    from policyport.runtime.overrides import _parse_index

    if isinstance(parsed, tuple):
        assert _parse_index(index, "s") == parsed
        return
    message = parsed or f"override 's': index {index!r} is not a neuron number, a comma list, a range a:b or *"
    with pytest.raises(pp.InputMismatchError, match=exactly(message)):
        _parse_index(index, "s")


@pytest.mark.parametrize("overrides, spec", [
    ({"t": {np.int64(4): -0.5}}, "t[4]=-0.5"),
    ({"t": {(3, 1, 3): 2}}, "t[3,1]=2"),
    ({"t": {"*": "clip(0, 1e3)"}}, "t[*]=clip(0,1000)"),
    ({"t": {" 2 ": {"scale": 1.5}}}, "t[2]*=1.5"),
    ({"t": {7: " *= 2"}}, "t[7]*=2"),
    ({"t": {7: "=3"}}, "t[7]=3"),
    ([Edit("t", (0,), False, "set", (1.0,)), "u[1]=2"], "t[0]=1"),
])
def test_the_mapping_form_reads_every_kind_of_index_and_value(overrides, spec):
    assert parse_overrides(overrides)[0].spec == spec


@pytest.mark.parametrize("edit, selector, largest", [
    (Edit("t", None, False, "set", (1.0,)), slice(None), -1),
    (Edit("t", (2, 6), True, "set", (1.0,)), slice(2, 6), 5),
    (Edit("t", (4,), False, "set", (1.0,)), 4, 4),
    (Edit("t", (4, 9, 1), False, "set", (1.0,)), [4, 9, 1], 9),
])
def test_an_edit_selects_its_neurons_on_the_last_axis(edit, selector, largest):
    got = edit.selector()
    if isinstance(selector, list):
        assert got.dtype == np.intp and got.tolist() == selector
    else:
        assert got == selector
    assert edit.largest() == largest


@pytest.mark.parametrize("edit, expected", [
    ("t[1]=5", [[0, 5, 2, 3], [4, 5, 6, 7]]),
    ("t[1:3]*=-2", [[0, -2, -4, 3], [4, -10, -12, 7]]),
    ("t[*]=clip(1,5)", [[1, 1, 2, 3], [4, 5, 5, 5]]),
    ("t[3,0]*=10", [[0, 1, 2, 30], [40, 5, 6, 70]]),
])
def test_an_edit_writes_set_scale_and_clip(edit, expected):
    value = np.arange(8, dtype=np.float32).reshape(2, 4)
    parse_spec(edit).apply(value)
    assert value.tolist() == expected


def test_steering_orders_tensors_as_the_graph_and_edits_as_given():
    steering = pp.runtime.Steering(parse_overrides(["b[0]=1", "a[1]*=2", "b[2]=clip(-1,1)"]), ["a", "b", "c"])
    assert steering.tensors == ("a", "b") and steering.specs == ["a[1]*=2", "b[0]=1", "b[2]=clip(-1,1)"]
    assert repr(steering) == "Steering(a[1]*=2, b[0]=1, b[2]=clip(-1,1))"
    with pytest.raises(pp.InputMismatchError, match=exactly("override(s) name ['d', 'e'], which no node of the model "
                                                             "produces; it has: a, b, c")):
        pp.runtime.Steering(parse_overrides(["d[0]=1", "a[0]=1", "e[0]=1"]), ["a", "b", "c"])
    session = pp.load(aliasing_model())
    assert session.steering(steering) is steering  # a Steering is taken as it is


def test_an_applier_copies_what_the_run_does_not_own_and_refuses_scalars():
    a_fn, = pp.runtime.Steering(parse_overrides("a[1]=9"), ["a"]).appliers(lambda t: True)
    owned = np.zeros((2, 3), np.float32)
    assert a_fn(owned) is owned and owned[:, 1].tolist() == [9, 9]  # written in place
    read_only = np.zeros((2, 3), np.float32)
    read_only.flags.writeable = False
    steered = a_fn(read_only)
    assert steered is not read_only and steered[:, 1].tolist() == [9, 9] and not read_only.any()
    b_fn, = pp.runtime.Steering(parse_overrides("a[1]=9"), ["a"]).appliers(lambda t: False)
    feed = np.zeros((2, 3), np.float32)
    assert b_fn(feed) is not feed and not feed.any()
    for scalar in (np.float32(1.0), np.array(1.0, np.float32), 1.0):
        with pytest.raises(pp.InputMismatchError, match=exactly("tensor 'a' is a scalar here; overrides address "
                                                                 "neurons on a tensor's last axis")):
            a_fn(scalar)
    with pytest.raises(pp.InputMismatchError, match=exactly("override a[1]=9: tensor 'a' has 1 neurons on its last "
                                                             "axis (0 to 0)")):
        a_fn(np.zeros((2, 1), np.float32))
    assert a_fn(np.zeros((2, 2), np.float32))[:, 1].tolist() == [9, 9]  # neuron 1 of 2: the edge fits


@pytest.mark.parametrize("text", ["[]", "{}", '"brake"', "null"])
def test_an_override_file_must_hold_named_sets(tmp_path, text):
    path = tmp_path / "sets.json"
    path.write_text(text)
    with pytest.raises(pp.InputMismatchError, match=exactly(
            f"{path} must hold a JSON object of named override sets, e.g. " '{"brake": {"fc_2/tanh": {"17": 1.0}}}')):
        load_override_sets(path)
