"""Weights in RLlib's TF ``FullyConnectedNetwork`` layout, from an ``.npz`` file or a dict.

The layout (``ray/rllib/models/tf/fcnet.py``): a common prefix (the policy's variable scope, e.g.
``default_policy/``), hidden layers ``fc_1 ... fc_N`` each with ``kernel`` ``[in, out]`` and
``bias`` ``[out]``, the output layer ``fc_out``; with ``free_log_std`` a ``log_std`` vector that is
concatenated after ``fc_out``'s mean; optionally a value branch ``fc_value_1 ... fc_value_N`` and
``value_out`` (with ``vf_share_layers`` only ``value_out``, fed by the last policy hidden layer).
TF's ``:0`` variable suffix is accepted. Layer order comes from the layer numbers, never from the
order of the keys.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from ...errors import BadModelError, OptionError, listing
from ...io.arrays import load_arrays
from ...io.kinds import sha256_file
from ..activations import Activation, parse_activation, required_activation
from ..build import Dense, MlpSpec

_KEY = re.compile(
    r"^(?P<prefix>(?:.*/)?)(?:(?P<layer>fc_\d+|fc_out|fc_value_\d+|value_out)/(?P<param>kernel|bias)"
    r"|(?P<log_std>log_std))(?::0)?$"
)


def read_weights(source: str | os.PathLike | Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of a weights file (or dict) and provenance for the model metadata."""
    if isinstance(source, Mapping):
        return {str(k): np.asarray(v) for k, v in source.items()}, {"kind": "npz"}
    path = Path(source)
    arrays = load_arrays(path)
    if list(arrays) == [""]:
        raise BadModelError(f"{path} is a single .npy array; a policy's weights must be an .npz of named arrays")
    return arrays, {"kind": "npz", "file": path.name, "sha256": sha256_file(path)}


def _torch_layout_hint(arrays: Mapping[str, np.ndarray]) -> str:
    """Which ``--from`` converts arrays named in a torch ``state_dict`` layout policyport knows, or ``""``."""
    from .state_dict import detect_layout

    try:
        layout = detect_layout(arrays)
    except BadModelError:
        return ""
    kind, what = ("rllib-torch", "an RLlib torch model's state_dict") if layout == "rllib-torch" else \
        ("state-dict", "a torch state_dict")
    return f"; the names are those of {what}: convert with --from {kind} (kind={kind!r} in Python)"


def parse_rllib_fcnet(arrays: Mapping[str, np.ndarray], activation: Activation | None, keep_value: bool = False,
                      source: dict | None = None) -> MlpSpec:
    """Place every array of an RLlib TF FullyConnectedNetwork into an :class:`MlpSpec`.

    Args:
        arrays: parameter name -> float array.
        activation: the hidden layers' activation (RLlib's ``fcnet_activation``, tanh by default);
            ``None`` for linear hidden layers.
        keep_value: include the value branch (``value`` output) when present.
        source: provenance for the model metadata.

    Raises:
        BadModelError: names that fit no layer (all listed), more than one prefix, missing ``fc_out``
            or a kernel, gaps in ``fc_1..fc_N``, non-float or mixed dtypes, wrong ranks.
    """
    placed: dict[tuple[str, str], tuple[str, np.ndarray]] = {}
    unplaced, prefixes = [], set()
    for name, arr in arrays.items():
        m = _KEY.match(name)
        if not m:
            unplaced.append(name)
            continue
        prefixes.add(m["prefix"])
        key = ("log_std", "") if m["log_std"] else (m["layer"], m["param"])
        if key in placed:
            raise BadModelError(f"{name!r} and {placed[key][0]!r} are the same parameter {'/'.join(key)}")
        placed[key] = (name, np.asarray(arr))
    if unplaced:
        raise BadModelError(
            f"cannot place {len(unplaced)} array(s) in RLlib's FullyConnectedNetwork layout "
            f"(expected [prefix/]fc_<i>/kernel|bias, fc_out/..., fc_value_<i>/..., value_out/..., log_std): "
            f"{listing(sorted(unplaced), show=str)}{_torch_layout_hint(arrays)}"
        )
    if len(prefixes) > 1:
        raise BadModelError(f"the arrays carry more than one prefix ({sorted(prefixes)}); give one policy's weights")
    if ("fc_out", "kernel") not in placed:
        raise BadModelError(
            f"no output layer: expected an array named <prefix>fc_out/kernel; found {listing(sorted(arrays), show=str) or 'no arrays'}"
        )
    from .state_dict import check_dtypes

    check_dtypes({name: a for name, a in placed.values()}, "the weights",
                 "np.savez(path, **{k: v.astype(np.float32) for k, v in weights.items()})")

    bad = sorted(name for name, a in placed.values() if not np.isfinite(a).all())
    if bad:
        raise BadModelError(f"non-finite values (NaN or inf) in {listing(bad, show=str)}; a trained policy's weights are finite")

    def layer(name: str, act: Activation | None) -> Dense:
        if (name, "kernel") not in placed:
            raise BadModelError(f"layer {name!r} has a bias but no kernel")
        wname, w = placed[(name, "kernel")]
        if w.ndim != 2:
            raise BadModelError(f"{wname} must be a 2-D kernel [in, out], got shape {tuple(w.shape)}")
        bname, b = placed.get((name, "bias"), (None, None))
        return Dense(name, w, wname, b, bname, "in_out", act)

    def numbered(stem: str) -> list[str]:
        nums = sorted(int(k[0][len(stem):]) for k in placed if re.fullmatch(stem + r"\d+", k[0]))
        nums = sorted(set(nums))
        if nums != list(range(1, len(nums) + 1)):
            raise BadModelError(f"layers {stem}<i> must be numbered 1..N without gaps; found {[f'{stem}{n}' for n in nums]}")
        return [f"{stem}{n}" for n in nums]

    hidden_names, value_names = numbered("fc_"), numbered("fc_value_")
    layers = [k[0] for k in placed if k[1] == "kernel"]
    with_bias = [n for n in layers if (n, "bias") in placed]
    if with_bias and len(with_bias) != len(layers):
        missing = sorted(set(layers) - set(with_bias))
        raise BadModelError(
            f"layer(s) {', '.join(missing)} have no bias while {', '.join(sorted(with_bias))} do; "
            "RLlib's layers all carry one — is the file truncated?"
        )
    hidden = [layer(n, activation) for n in hidden_names]
    value_hidden = [layer(n, activation) for n in value_names]
    has_value = ("value_out", "kernel") in placed or ("value_out", "bias") in placed
    if keep_value and not has_value:
        raise OptionError("a value branch was asked for (--keep-value), but the weights hold no value_out layer")
    log_std_name, log_std = placed.get(("log_std", ""), (None, None))
    if log_std is not None and log_std.ndim != 1:
        raise BadModelError(f"{log_std_name} must be a vector, got shape {tuple(log_std.shape)}")
    return MlpSpec(
        hidden=hidden,
        output=layer("fc_out", None),
        value_hidden=value_hidden if keep_value else [],
        value_output=layer("value_out", None) if keep_value and has_value else None,
        free_log_std=log_std,
        free_log_std_name=log_std_name,
        source=source or {"kind": "npz"},
    )


def convert_npz(source: str | os.PathLike | Mapping[str, np.ndarray], options):
    """Convert RLlib TF FullyConnectedNetwork weights (an ``.npz`` or a dict) to ONNX.

    Args:
        source: the weights (see the module docstring for the layout).
        options: a :class:`~policyport.converter.ConvertOptions`; ``activation`` is required when
            there are hidden layers (the file does not record it); ``exporter``, ``policy_id``,
            ``obs_norm`` do not apply to a weights file.

    Returns:
        A :class:`~policyport.converter.Converted` whose reference is the plain numpy forward pass,
        with the assumptions the file cannot settle: the activation, the head, no observation filter.

    Raises:
        BadModelError: an option that does not apply, or arrays that cannot be placed.
        OptionError: no ``activation`` for a network with hidden layers; a head the weights cannot
            take (see :func:`~policyport.converter.assumptions.head_assumption`).
    """
    from ..options import Converted
    from ..assumptions import RLLIB_SPLIT, activation_assumption, head_assumption, no_normaliser, reconstruction
    from ..build import build_mlp
    from .reference import reference_forward

    if options.obs_norm is not None:
        raise BadModelError("an observation-normalisation file applies to SB3 sources, not to an .npz of weights")
    arrays, provenance = read_weights(source)
    spec = parse_rllib_fcnet(arrays, None, keep_value=options.keep_value, source=provenance)
    hidden = [*spec.hidden, *spec.value_hidden]
    what = "an .npz of weights" if provenance.get("file") else "a dict of weights"
    activation = required_activation(options.activation, what, [layer.name for layer in hidden],
                                     "RLlib's fcnet_activation defaults to tanh")
    act = parse_activation(activation)
    for layer in hidden:
        layer.activation = None if act.name == "linear" else act
    assumptions = [a for a in (
        activation_assumption([(layer.name, activation) for layer in hidden], what,
                              "RLlib's FullyConnectedNetwork uses one fcnet_activation for every hidden layer"),
        head_assumption(options.head, output=spec.output.name, width=spec.output.out_features,
                        log_std=spec.free_log_std_name, what=what, convention=RLLIB_SPLIT),
        no_normaliser(what, "RLlib keeps a MeanStdFilter's in the checkpoint",
                      "convert the RLlib checkpoint to bake its filter in"),
    ) if a is not None]
    model = build_mlp(spec, head=options.head, opset=options.opset, metadata={"policyport.activation": activation})
    return Converted(model, lambda obs: reference_forward(spec, obs, options.head), "npz",
                     assumptions=assumptions, oracle=reconstruction(f"the arrays of {what}", "numpy"))
