"""The MetaDrive expert end to end: numpy and onnxruntime against an independent numpy forward."""

from __future__ import annotations

import numpy as np
import pytest

import policyport as pp

pytestmark = pytest.mark.usefixtures("strict_numpy")


def independent_forward(w: dict[str, np.ndarray], obs: np.ndarray) -> dict[str, np.ndarray]:
    """RLlib's FullyConnectedNetwork forward, written out by hand in float64."""
    p = "default_policy/"
    x = obs.astype(np.float64)
    fc1 = x @ w[p + "fc_1/kernel"].astype(np.float64) + w[p + "fc_1/bias"]
    h1 = np.tanh(fc1)
    fc2 = h1 @ w[p + "fc_2/kernel"].astype(np.float64) + w[p + "fc_2/bias"]
    h2 = np.tanh(fc2)
    logits = h2 @ w[p + "fc_out/kernel"].astype(np.float64) + w[p + "fc_out/bias"]
    return {"fc_1/linear": fc1, "fc_1/tanh": h1, "fc_2/linear": fc2, "fc_2/tanh": h2,
            "logits": logits, "action": logits[:, :2], "log_std": logits[:, 2:]}


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_every_recorded_tensor_matches_an_independent_forward(backend, metadrive_model, metadrive_weights, metadrive_obs):
    expected = independent_forward(metadrive_weights, metadrive_obs)
    recorded = pp.load(metadrive_model, backend=backend).record({"obs": metadrive_obs}, tensors="*")
    assert set(recorded) == set(expected)  # pre- and post-tanh of fc_1 and fc_2, logits, action, log_std
    for name, want in expected.items():
        got = recorded[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        assert np.abs(got - want).max() <= 1e-5, name


@pytest.mark.parametrize("backend", list(pp.BACKENDS))
def test_run_returns_graph_outputs_equal_to_record(backend, metadrive_model, metadrive_obs):
    sess = pp.load(metadrive_model, backend=backend)
    outputs = sess.run({"obs": metadrive_obs[:7]})
    assert list(outputs) == ["logits", "action", "log_std"]
    recorded = sess.record({"obs": metadrive_obs[:7]}, tensors="fc_2/*")
    assert list(recorded) == ["fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
    for name in outputs:
        np.testing.assert_array_equal(outputs[name], recorded[name])


def test_numpy_backend_is_bit_exact_with_the_source_op_order(metadrive_model, metadrive_weights, metadrive_obs):
    p = "default_policy/"
    h = np.tanh(metadrive_obs @ metadrive_weights[p + "fc_1/kernel"] + metadrive_weights[p + "fc_1/bias"])
    h = np.tanh(h @ metadrive_weights[p + "fc_2/kernel"] + metadrive_weights[p + "fc_2/bias"])
    logits = h @ metadrive_weights[p + "fc_out/kernel"] + metadrive_weights[p + "fc_out/bias"]
    np.testing.assert_array_equal(pp.load(metadrive_model).run(metadrive_obs)["logits"], logits)


def test_run_does_not_modify_the_feed(metadrive_model, metadrive_obs):
    obs = metadrive_obs[:3].copy()
    pp.load(metadrive_model).run({"obs": obs})
    np.testing.assert_array_equal(obs, metadrive_obs[:3])


def test_in_place_activations_never_leak_into_recordings(metadrive_model, metadrive_obs):
    sess = pp.load(metadrive_model)
    recorded = sess.record(metadrive_obs[:4])
    sess.run(metadrive_obs[:4])  # the run path overwrites pre-activations in place
    assert not np.array_equal(recorded["fc_1/linear"], recorded["fc_1/tanh"])
    np.testing.assert_array_equal(np.tanh(recorded["fc_1/linear"]), recorded["fc_1/tanh"])


def test_observer_can_steer_a_neuron(metadrive_model, metadrive_obs):
    sess = pp.load(metadrive_model)
    nodes = sess.backend.graph.nodes
    seen = []

    def clamp_first_neuron(node_index, output_index, value):
        seen.append(nodes[node_index].outputs[output_index])
        if nodes[node_index].outputs[output_index] == "fc_2/tanh":
            value = value.copy()
            value[:, 0] = 1.0
        return value

    steered = sess.observe(metadrive_obs[:5], clamp_first_neuron)
    assert seen == ["fc_1/linear", "fc_1/tanh", "fc_2/linear", "fc_2/tanh", "logits", "action", "log_std"]
    rec = sess.record(metadrive_obs[:5])
    h2 = rec["fc_2/tanh"].copy()
    h2[:, 0] = 1.0
    init = {i.name: i for i in metadrive_model.graph.initializer}
    from onnx import numpy_helper

    w = numpy_helper.to_array(init["default_policy/fc_out/kernel"])
    b = numpy_helper.to_array(init["default_policy/fc_out/bias"])
    np.testing.assert_allclose(steered["logits"], h2 @ w + b, atol=1e-6)
    assert np.abs(steered["logits"] - rec["logits"]).max() > 1e-4
