"""Converters: one module per source kind, each producing an ONNX model named after the source.

:func:`convert` is the public entry point; :func:`convert_source` also returns the source's own
reference forward pass, which :func:`policyport.verify` compares the backends against.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ..errors import BadModelError, UnreadableFileError
from .activations import parse_activation
from .build import DEFAULT_OPSET, HEADS, MIN_OPSET

#: Source kinds ``--from`` accepts.
KINDS = ("npz",)


@dataclass
class Converted:
    """A converted policy.

    Attributes:
        model: the ``onnx.ModelProto``.
        reference: ``reference(obs) -> {tensor name: array}``, the source's own forward pass on
            ``obs`` (float array, shape ``(batch, obs_dim)``), naming tensors as the graph does.
        kind: the source kind.
    """

    model: object
    reference: Callable[[np.ndarray], dict[str, np.ndarray]]
    kind: str


def detect_kind(source) -> str:
    """The source kind of a path or object (``--from`` overrides this).

    Raises:
        UnreadableFileError: a path that does not exist.
        BadModelError: a source of no known kind.
    """
    if isinstance(source, Mapping):
        return "npz"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise UnreadableFileError(f"{path}: no such file")
        if path.is_dir():
            raise UnreadableFileError(f"{path} is a folder; expected a policy file ({', '.join(KINDS)})")
        if path.suffix == ".npz":
            return "npz"
        raise BadModelError(
            f"cannot tell what kind of policy {path} is from its name; supported: {', '.join(KINDS)} (use --from)"
        )
    raise BadModelError(f"cannot convert a {type(source).__name__}; supported sources: {', '.join(KINDS)}")


def convert_source(source, *, kind: str | None = None, activation: str = "tanh", head: str | None = None,
                   opset: int = DEFAULT_OPSET, keep_value: bool = False) -> Converted:
    """Convert a policy and keep the source's reference forward pass. Arguments as for :func:`convert`."""
    kind = kind or detect_kind(source)
    if kind not in KINDS:
        raise BadModelError(f"unknown source kind {kind!r}; choose one of {', '.join(KINDS)}")
    act = parse_activation(activation)
    from .build import build_mlp
    from .reference import reference_forward
    from .rllib_weights import parse_rllib_fcnet, read_weights

    arrays, provenance = read_weights(source)
    spec = parse_rllib_fcnet(arrays, None if act.name == "linear" else act, keep_value=keep_value, source=provenance)
    model = build_mlp(spec, head=head, opset=opset, metadata={"policyport.activation": activation})
    return Converted(model, lambda obs: reference_forward(spec, obs, head), kind)


def convert(source, *, kind: str | None = None, activation: str = "tanh", head: str | None = None,
            opset: int = DEFAULT_OPSET, keep_value: bool = False):
    """Convert a trained policy to ONNX.

    Args:
        source: a path to an ``.npz`` of weights, or a dict name -> array, in RLlib's TF
            FullyConnectedNetwork layout (``[prefix/]fc_<i>/kernel`` ``[in, out]``, ``.../bias``,
            ``fc_out/...``; see :mod:`policyport.converter.rllib_weights`).
        kind: the source kind (one of ``KINDS``); detected from ``source`` when ``None``.
        activation: hidden-layer activation: tanh (default, RLlib's), relu, elu, selu, swish/silu,
            softplus, leaky_relu[:slope] (default slope 0.01), gelu, linear.
        head: ``None`` (logits only), ``"diag-gaussian"`` (adds ``action`` = mean, ``log_std``) or
            ``"categorical"`` (adds ``action`` = argmax, int64).
        opset: ONNX default-domain opset, 11 up to the installed onnx's newest; default 17.
        keep_value: also export the value branch as output ``value``.

    Returns:
        An ``onnx.ModelProto``: input ``obs`` (float, shape ``(batch, obs_dim)``), output
        ``logits``, tensors named after the source's layers, initializers after its parameters.

    Raises:
        UnreadableFileError: the file is missing or unreadable.
        BadModelError: arrays that cannot be placed (listed), bad shapes, unknown activation/head/opset.
    """
    return convert_source(source, kind=kind, activation=activation, head=head, opset=opset,
                          keep_value=keep_value).model


__all__ = ["KINDS", "HEADS", "MIN_OPSET", "DEFAULT_OPSET", "Converted", "convert", "convert_source", "detect_kind"]
