"""RNN, GRU and LSTM on the numpy backend against onnxruntime, attribute by attribute.

The ONNX node tests cover the defaults, bias, peepholes, batchwise layout, reverse and bidirectional
with equal lengths; here every direction meets ragged ``sequence_lens`` (0 included), initial states,
clip, parameterised activations, ``input_forget``, ``linear_before_reset``, both opset versions and
nodes that omit outputs. onnxruntime rejects ``layout=1``, so that is checked against the ONNX
reference evaluator and against the transposed ``layout=0`` result.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import policyport as pp  # noqa: E402
from onnx_node import assert_same, both, f32, feed_dict, node_model, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("strict_numpy")

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_inputs(op_type, directions=1, lengths=None, initial=True, bias=True, peepholes=False, seq=SEQ,
                     batch=BATCH, scale=0.5):
    """The op's inputs in ONNX order as (name, array or None) pairs."""
    g = GATES[op_type]
    pairs = [("x", f32(seq, batch, INPUT)), ("w", f32(directions, g * HIDDEN, INPUT, scale=scale)),
             ("r", f32(directions, g * HIDDEN, HIDDEN, scale=scale)),
             ("b", f32(directions, 2 * g * HIDDEN, scale=scale) if bias else None),
             ("sequence_lens", None if lengths is None else np.array(lengths, np.int32)),
             ("initial_h", f32(directions, batch, HIDDEN) if initial else None)]
    if op_type == "LSTM":
        pairs += [("initial_c", f32(directions, batch, HIDDEN) if initial else None),
                  ("p", f32(directions, 3 * HIDDEN, scale=scale) if peepholes else None)]
    return pairs


def outputs_of(op_type):
    return ["y", "y_h", "y_c"] if op_type == "LSTM" else ["y", "y_h"]


def check(op_type, inputs, opset=14, outputs=None, atol=1e-6, **attrs):
    model = node_model(op_type, inputs, opset, outputs or outputs_of(op_type), hidden_size=HIDDEN, **attrs)
    assert_same(*both(model, inputs), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lengths", [None, [5, 2, 0], [1, 5, 3]], ids=["full", "ragged-with-0", "ragged"])
@pytest.mark.parametrize("opset", [7, 14])
def test_directions_and_sequence_lengths_match_onnxruntime(op_type, direction, lengths, opset):
    inputs = recurrent_inputs(op_type, 2 if direction == "bidirectional" else 1, lengths, peepholes=True)
    check(op_type, inputs, opset, direction=direction)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_defaults_without_bias_or_initial_state(op_type):
    check(op_type, recurrent_inputs(op_type, initial=False, bias=False), opset=9)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_without_hidden_size_the_hidden_width_is_the_recurrence_weights_last_axis(op_type):
    inputs = recurrent_inputs(op_type)
    ours = run(node_model(op_type, inputs, 14, outputs_of(op_type)), inputs)  # the operator page: hidden_size optional
    assert ours[0].shape == (SEQ, 1, BATCH, HIDDEN)
    theirs = run(node_model(op_type, inputs, 14, outputs_of(op_type), hidden_size=HIDDEN), inputs, backend="onnxruntime")
    assert_same(ours, theirs, rtol=1e-5, atol=1e-6)  # onnxruntime needs the attribute


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("clip", [0.1, 0.75])
def test_clip_bounds_every_gate_input(op_type, clip):
    inputs = recurrent_inputs(op_type, 2, [5, 3, 4], scale=3.0, peepholes=True)
    # weights of scale 3 carry onnxruntime's float32 tanh/sigmoid approximations (~1e-7) through time
    check(op_type, inputs, direction="bidirectional", clip=clip, atol=1e-5)


@pytest.mark.parametrize("op_type, activations, alpha, beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["LeakyRelu", "Elu"], [0.3, 0.7], None),
    ("RNN", ["ThresholdedRelu"], [0.2], None),
    ("RNN", ["Softsign"], None, None),
    ("GRU", ["HardSigmoid", "Softplus"], [0.3], [0.4]),
    ("GRU", ["Sigmoid", "Affine"], [0.8], [0.1]),
    ("LSTM", ["HardSigmoid", "LeakyRelu", "ScaledTanh"], [0.3, 0.2, 1.5], [0.6, 0.5]),
    ("LSTM", ["sigmoid", "tanh", "softsign"], None, None),  # names are case-insensitive
    ("LSTM", ["Sigmoid", "Elu", "Tanh", "HardSigmoid", "Tanh", "Relu"], [1.3, 0.25], [0.45]),
])
def test_activations_consume_alpha_and_beta_in_order(op_type, activations, alpha, beta):
    directions = 2 if len(activations) == 2 * {"RNN": 1, "GRU": 2, "LSTM": 3}[op_type] else 1
    attrs = {"activations": activations}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    direction = "bidirectional" if directions == 2 else "forward"
    check(op_type, recurrent_inputs(op_type, directions), direction=direction, **attrs)


def test_thresholded_relu_keeps_only_values_above_alpha_whose_default_is_one():
    """x = 0.5 exactly at the threshold is dropped (x > alpha, as the ThresholdedRelu operator); without
    activation_alpha the ThresholdedRelu operator's default 1.0 applies (onnxruntime would use 0)."""
    pairs = [("x", np.array([[[0.5]], [[1.5]]], np.float32)), ("w", np.ones((1, 1, 1), np.float32)),
             ("r", np.zeros((1, 1, 1), np.float32))]
    at_half = run(node_model("RNN", pairs, 14, ["y"], hidden_size=1, activations=["ThresholdedRelu"],
                             activation_alpha=[0.5]), pairs)[0]
    default = run(node_model("RNN", pairs, 14, ["y"], hidden_size=1, activations=["ThresholdedRelu"]), pairs)[0]
    np.testing.assert_array_equal(at_half.ravel(), [0.0, 1.5])
    np.testing.assert_array_equal(default.ravel(), [0.0, 1.5])


def test_lstm_input_forget_couples_the_forget_gate_to_the_input_gate():
    check("LSTM", recurrent_inputs("LSTM", 2, [4, 5, 1], peepholes=True), direction="bidirectional", input_forget=1)


@pytest.mark.parametrize("opset", [7, 14])
def test_gru_linear_before_reset(opset):
    check("GRU", recurrent_inputs("GRU", 2, [2, 5, 0]), opset, direction="bidirectional", linear_before_reset=1)


@pytest.mark.parametrize("op_type, outputs", [
    (op_type, outputs) for op_type in ("RNN", "GRU", "LSTM")
    for outputs in (["y"], ["", "y_h"], ["", "", "y_c"], ["y", "", "y_c"]) if len(outputs) <= len(outputs_of(op_type))
])
def test_nodes_that_omit_outputs(op_type, outputs):
    check(op_type, recurrent_inputs(op_type, lengths=[3, 5, 2]), outputs=outputs)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1_puts_the_batch_axis_first(op_type, direction):
    """onnxruntime refuses layout=1: the ONNX reference evaluator and our own layout=0 are the oracles."""
    from onnx.reference import ReferenceEvaluator

    directions = 2 if direction == "bidirectional" else 1
    pairs = recurrent_inputs(op_type, directions, peepholes=True)
    batch_first = [(n, None if a is None else np.ascontiguousarray(np.swapaxes(a, 0, 1)) if n.startswith(("x", "initial"))
                    else a) for n, a in pairs]
    names = outputs_of(op_type)
    model = node_model(op_type, batch_first, 14, names, hidden_size=HIDDEN, layout=1, direction=direction)
    ours = run(model, batch_first)
    reference = ReferenceEvaluator(model).run(None, feed_dict(batch_first))
    assert_same(ours, [np.asarray(r, np.float32) for r in reference], rtol=1e-5, atol=1e-6)
    seq_first = run(node_model(op_type, pairs, 14, names, hidden_size=HIDDEN, direction=direction), pairs)
    np.testing.assert_array_equal(ours[0], seq_first[0].transpose(2, 0, 1, 3))
    for a, b in zip(ours[1:], seq_first[1:]):
        np.testing.assert_array_equal(a, np.swapaxes(b, 0, 1))


def test_zero_length_sequences_and_empty_batches():
    """A sequence of length 0 outputs zeros (Y and the final states), as onnxruntime does; a batch of 0
    and a sequence axis of 0 give empty outputs and the initial state, never the feed itself."""
    inputs = recurrent_inputs("LSTM", lengths=[0, 0, 0])
    y, y_h, y_c = run(node_model("LSTM", inputs, 14, outputs_of("LSTM"), hidden_size=HIDDEN), inputs)
    assert not y.any() and not y_h.any() and not y_c.any()
    empty_batch = recurrent_inputs("LSTM", batch=0)
    shapes = [o.shape for o in run(node_model("LSTM", empty_batch, 14, outputs_of("LSTM"), hidden_size=HIDDEN),
                                   empty_batch)]
    assert shapes == [(SEQ, 1, 0, HIDDEN), (1, 0, HIDDEN), (1, 0, HIDDEN)]
    no_steps = recurrent_inputs("GRU", seq=0)
    model = node_model("GRU", no_steps, 14, outputs_of("GRU"), hidden_size=HIDDEN)
    feeds = feed_dict(no_steps)
    y, y_h = pp.load(model, backend="numpy").run(feeds).values()
    assert y.shape == (0, 1, BATCH, HIDDEN)
    np.testing.assert_array_equal(y_h, feeds["initial_h"])
    feeds["initial_h"][:] = 7.0  # the caller refills its state buffer
    assert not (y_h == 7.0).any()


@pytest.mark.parametrize("attrs, message", [
    ({"direction": "sideways"}, "direction must be forward, reverse or bidirectional"),
    ({"activations": ["Sigmoid", "Tanh"]}, "activations lists 2 functions; 3 expected"),
    ({"activations": ["Sigmoid", "Swish", "Tanh"]}, "unknown activation 'Swish'"),
])
def test_bad_attributes_are_bad_model_errors_naming_the_node(attrs, message):
    inputs = recurrent_inputs("LSTM")
    session = pp.load(node_model("LSTM", inputs, 14, outputs_of("LSTM"), hidden_size=HIDDEN, **attrs))
    with pytest.raises(pp.BadModelError, match=rf'LSTM node "n0" on the numpy backend failed: ValueError: {message}'):
        session.run(feed_dict(inputs))


def test_sequence_lengths_beyond_the_sequence_are_refused():
    inputs = recurrent_inputs("GRU", lengths=[5, 6, 1])
    session = pp.load(node_model("GRU", inputs, 14, outputs_of("GRU"), hidden_size=HIDDEN))
    with pytest.raises(pp.BadModelError, match=r"sequence_lens \[5, 6, 1\] must hold 3 lengths in \[0, 5\]"):
        session.run(feed_dict(inputs))
