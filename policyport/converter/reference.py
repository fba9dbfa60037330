"""The plain numpy forward pass of an :class:`~policyport.converter.build.MlpSpec`.

This is the source's own computation for a weights file (RLlib's ``FullyConnectedNetwork``:
``h = act(h @ kernel + bias)`` per hidden layer, then ``fc_out``; ``ray/rllib/models/tf/fcnet.py``),
written directly from the arrays and independent of policyport's ONNX interpreter, so that
verification has something to compare both backends against.
"""

from __future__ import annotations

import numpy as np

from .build import Dense, MlpSpec


def _affine(layer: Dense, x: np.ndarray) -> np.ndarray:
    w = layer.weight if layer.weight_layout == "in_out" else layer.weight.T
    y = x @ w
    return y + layer.bias if layer.bias is not None else y


def reference_forward(spec: MlpSpec, obs: np.ndarray, head: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor the exported graph names, computed in numpy from the source arrays.

    Args:
        spec: the network.
        obs: float array, shape ``(batch, obs_dim)``, in the weights' dtype.
        head: as given to :func:`~policyport.converter.build.build_mlp`.

    Returns:
        tensor name -> array: ``<layer>/linear`` and ``<layer>/<activation>`` for each hidden layer,
        ``logits``, and the head's ``action``/``log_std`` and ``value`` where the graph has them.
    """
    out: dict[str, np.ndarray] = {}

    def hidden(layers, h):
        for layer in layers:
            h = out[f"{layer.name}/linear"] = _affine(layer, h)
            if layer.activation is not None:
                h = out[f"{layer.name}/{layer.activation.label}"] = layer.activation.reference(h)
        return h

    h = hidden(spec.hidden, obs)
    if spec.free_log_std is not None:
        mean = out[f"{spec.output.name}/mean"] = _affine(spec.output, h)
        out["logits"] = np.concatenate([mean, np.broadcast_to(spec.free_log_std, mean.shape)], axis=1)
    else:
        out["logits"] = _affine(spec.output, h)
    logits = out["logits"]
    if head == "diag-gaussian":
        half = logits.shape[1] // 2
        out["action"], out["log_std"] = logits[:, :half], logits[:, half:]
    elif head == "categorical":
        out["action"] = np.argmax(logits, axis=1).astype(np.int64)
    if spec.value_output is not None:
        v = hidden(spec.value_hidden, obs) if spec.value_hidden else h
        out["value"] = _affine(spec.value_output, v)
    return out
