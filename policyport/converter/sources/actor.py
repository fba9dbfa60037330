"""What the readers of the RL libraries' checkpoints share: the actor MLP as a checkpoint holds it
(:class:`ActorLayout`), its graph and its numpy forward. The environment's action bounds the players map
a policy's output to are read by :mod:`~policyport.converter.action_bounds`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np



@dataclass
class ActorLayout:
    """An actor MLP, as a library's checkpoint holds it (names are the library's keys).

    Attributes:
        layers: ``(weight name, weight (out, in), bias name, bias (out,))`` of the hidden layers, in order.
        head: the same for the last layer: the mean (continuous actions) or the logits (discrete).
        continuous: whether the head is a mean (else logits).
        sigma: ``(name, array)`` of a state-independent log std (or std) parameter, or ``None``.
        sigma_layer: the layer of a state-dependent one, as ``head``, or ``None``.
        normalizer: role -> (name, array) of the observation normaliser's statistics.
        left_out: keys of the checkpoint that the graph does not compute (the value function ...).
    """

    layers: list[tuple[str, np.ndarray, str, np.ndarray]]
    head: tuple[str, np.ndarray, str, np.ndarray]
    continuous: bool
    sigma: tuple[str, np.ndarray] | None = None
    sigma_layer: tuple[str, np.ndarray, str, np.ndarray] | None = None
    normalizer: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        """The observation width the first layer reads."""
        return int((self.layers[0][1] if self.layers else self.head[1]).shape[1])

    @property
    def actions(self) -> int:
        """The head's width: action dimensions, or discrete actions."""
        return int(self.head[1].shape[0])


def add_actor(b, layout: ActorLayout, x: str, activation, activation_scope) -> tuple[str, str, list]:
    """The actor's layers on the graph builder ``b``: each hidden layer's ``Gemm`` then ``activation``,
    then the head's ``Gemm`` as ``logits``, and for discrete actions ``action`` = its argmax (int64).

    Args:
        b: the :class:`~policyport.converter.build.MlpBuilder`.
        layout: the actor.
        x: the tensor the first layer reads (the observation, normalised or not).
        activation: the hidden layers' :class:`~policyport.converter.activations.Activation`, or
            ``None`` for none.
        activation_scope: ``activation_scope(weight name)`` -> the module path of the activation after
            that layer (``a2c_network.actor_mlp.1`` after ``a2c_network.actor_mlp.0.weight``).

    Returns:
        ``(hidden, logits, outputs)``: the last hidden tensor, the head's output (float32, ``(batch,
        actions)``), and the graph outputs' value infos so far (``logits``, and ``action`` for discrete).
    """
    import onnx

    from ..build import Dense, Step

    helper, float32 = onnx.helper, onnx.TensorProto.FLOAT
    for wname, w, bname, bias in layout.layers:
        post = [] if activation is None else [Step("activation", activation_scope(wname), activation)]
        x = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in", None, post), x)
    wname, w, bname, bias = layout.head
    logits = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in"), x, "logits")
    outputs = [helper.make_tensor_value_info("logits", float32, ["batch", layout.actions])]
    if not layout.continuous:
        b.node("ArgMax", [logits], "action", axis=1, keepdims=0)
        outputs.append(helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"]))
    return x, logits, outputs


def actor_reference(layout: ActorLayout, x: np.ndarray, activation, out: dict) -> tuple[np.ndarray, np.ndarray]:
    """The actor's forward in numpy float32, as :func:`add_actor` builds it (the same tensor names,
    written to ``out``: each layer's ``<scope>/linear``, each activation's ``<module>/<label>``,
    ``logits``, and for discrete actions ``action``, the argmax, int64).

    Args:
        layout: the actor.
        x: float32 array, shape ``(batch, obs_dim)``, what the first layer reads.
        activation: the hidden layers' activation, or ``None``.
        out: where the tensors are written.

    Returns:
        ``(hidden, logits)``: the last hidden features and the head's output, float32.
    """
    for wname, w, _, bias in layout.layers:
        x = out[f"{wname.rsplit('.', 1)[0]}/linear"] = x @ w.T + bias
        if activation is not None:
            x = out[f"{next_module(wname)}/{activation.label}"] = activation.reference(x).astype(np.float32)
    _, w, _, bias = layout.head
    logits = out["logits"] = x @ w.T + bias
    if not layout.continuous:
        out["action"] = np.argmax(logits, axis=1).astype(np.int64)
    return x, logits


def next_module(weight_name: str) -> str:
    """The module after a ``Sequential``'s ``Linear``: ``mlp.3`` for ``mlp.2.weight``."""
    scope, index = weight_name.rsplit(".", 2)[:2]
    return f"{scope}.{int(index) + 1}"
