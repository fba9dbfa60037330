"""Brax policies saved with ``brax.io.model.save_params`` or ``brax.training.checkpoint.save``, read without
JAX or Brax.

``save_params(path, params)`` writes ``pickle.dumps(params)`` (``brax/io/model.py``), where PPO's
``train`` hands ``(normalizer_params, policy_params, value_params)`` to its callbacks and SAC's returns
``(normalizer_params, policy_params)`` (``brax/training/agents/{ppo,sac}/train.py``):

* ``normalizer_params``: a ``RunningStatisticsState`` (``brax/training/acme/running_statistics.py``):
  ``mean``, ``std``, ``count``, ``summed_variance``. The policy sees ``normalize(obs)`` = ``(obs - mean) /
  std`` (no clip: PPO and SAC call it without ``max_abs_value``). With ``normalize_observations=False``
  the state is never updated (mean 0, std 1), and baking it in changes nothing.
* ``policy_params``: Flax variables ``{"params": {"hidden_0": {"kernel" (in, out), "bias"}, ...}}`` of
  Brax's ``MLP`` (``brax/training/networks.py``): the activation after every layer but the last; the
  last layer outputs ``2 * action_size`` (``NormalTanhDistribution``'s ``loc`` and scale halves).
  Deterministic action (``make_inference_fn(..., deterministic=True)``): ``tanh(loc)``.

The pickle is read by policyport's restricted unpickler: numpy arrays and containers are rebuilt; a
``jax.Array`` (pickled as ``jax._src.array._reconstruct_array(numpy's _reconstruct, ..., state)``) is
rebuilt as the numpy array it holds by policyport's own function; Brax's classes become inert
records; nothing from the file runs.

``brax.training.checkpoint.save(path, step, params, config)`` (``brax/training/checkpoint.py``) writes the
same tuple with orbax into ``path/<step:012d>/`` and the network configuration beside it (``config.json``:
``network_factory_kwargs`` with ``activation``, ``policy_hidden_layer_sizes``, ``distribution_type``, and
``normalize_observations``). Such a folder is read with tensorstore
(:mod:`policyport.converter.readers.orbax`); the activation comes from its configuration, the layer sizes are
checked against it, and ``normalize_observations: false`` leaves the normaliser out, as Brax does.

What a ``save_params`` file does not record, and this converter therefore assumes and reports: the activation
(``make_ppo_networks``'s default swish for a three-part save, ``make_sac_networks``'s relu for a
two-part one; ``--activation`` names another) and that the policy is tanh-normal (Brax's default).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from ...errors import BadModelError, UnreadableFileError
from ..activations import parse_activation
from ..assumptions import Assumption, joined
from ..build import Dense, MlpSpec
from ..readers.orbax import orbax_step_folder

#: Where a ``jax.Array`` is rebuilt from in a pickle (``jax/_src/array.py``, ``ArrayImpl.__reduce__``).
JAX_ARRAY = ("jax._src.array", "_reconstruct_array")


def _jax_array(fun, args, arr_state, aval_state=None):
    """``_reconstruct_array``'s numpy part: ``fun(*args)`` must be numpy's own ``_reconstruct`` (the only
    function the unpickler hands over for it), whose array takes ``arr_state``; JAX's device placement
    and weak type are dropped."""
    array = fun(*args)
    if type(array) is not np.ndarray:
        raise UnreadableFileError(f"a pickled jax.Array that does not hold a numpy array ({type(array).__name__})")
    array.__setstate__(arr_state)
    if array.dtype.kind not in "biuf":
        raise UnreadableFileError(f"a pickled jax.Array of dtype {array.dtype}; only numeric arrays are read")
    return array


#: The network configuration ``brax.training.checkpoint.save`` writes beside the arrays: ``config.json``,
#: or ``<agent>_network_config.json`` from ``brax/training/agents/{ppo,sac,bc}/checkpoint.py``.
CONFIG_NAMES = ("config.json", "ppo_network_config.json", "sac_network_config.json", "bc_network_config.json")
#: The most bytes of a configuration read for the refusal's account of it.
CONFIG_BYTES = 1 << 20


def network_config(folder: Path) -> tuple[str | None, dict]:
    """``(file name, configuration)`` of the network configuration ``brax.training.checkpoint.save`` writes
    beside an orbax checkpoint's arrays (``network_factory_kwargs``, ``normalize_observations``, sizes), or
    ``(None, {})`` when there is none.

    Raises:
        UnreadableFileError: the file is larger than :data:`CONFIG_BYTES` or not a JSON object.
    """
    from ...io.schema import load_json

    for name in CONFIG_NAMES:
        file = folder / name
        if file.is_file():
            if file.stat().st_size > CONFIG_BYTES:
                raise UnreadableFileError(f"{file} is {file.stat().st_size:,} bytes; a Brax network configuration is "
                                          f"read up to {CONFIG_BYTES:,}")
            config = load_json(file.read_bytes(), str(file), error=UnreadableFileError)
            if not isinstance(config, dict) or not isinstance(config.get("network_factory_kwargs", {}), dict):
                raise UnreadableFileError(f"{file} is not the JSON object of a Brax network configuration")
            return name, config
    return None, {}


def read_brax(path) -> tuple[object, dict, dict | None, dict]:
    """``(normalizer state, policy params, value params or None, provenance)`` of a ``save_params`` file or
    of an orbax checkpoint folder ``brax.training.checkpoint.save`` wrote (the folder itself or the
    ``<step:012d>`` folder inside it; the newest step when there are several).

    An orbax folder is read with tensorstore (:func:`~policyport.converter.readers.orbax.read_orbax_tree`):
    its provenance holds the step folder's name, the sha256 of all its files and its network configuration
    (``provenance["config"]``, ``{}`` when there is none).

    Raises:
        UnreadableFileError: not a pickle or an orbax checkpoint, or damaged.
        UntrustedFileError: a pickle that asks to call a function (other than rebuilding arrays).
        BadModelError: a pickle or checkpoint that is not Brax's params tuple.
        MissingDependencyError: an orbax folder, and tensorstore is not installed (exit 4).
    """
    from ..readers.unpickle import load

    path = Path(path)
    if path.is_dir():
        folder = orbax_step_folder(path)
        if folder is None:
            raise UnreadableFileError(
                f"{path} is a folder and no orbax checkpoint (it holds no _CHECKPOINT_METADATA or _METADATA with "
                "manifest.ocdbt or .zarray files); --from brax takes a file brax.io.model.save_params wrote or the "
                "folder brax.training.checkpoint.save wrote")
        from ..readers.orbax import folder_sha256, read_orbax_tree

        value = read_orbax_tree(folder)
        config_name, config = network_config(folder)
        provenance = {"kind": "brax", "file": folder.name, "format": "orbax", "sha256": folder_sha256(folder),
                      "config": config, "config_file": config_name}
        what = f"{folder} (an orbax checkpoint)"
    elif not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    else:
        data = path.read_bytes()
        value = load(data, what=str(path), rebuilders={JAX_ARRAY: _jax_array})
        provenance = {"kind": "brax", "file": path.name, "sha256": hashlib.sha256(data).hexdigest()}
        what = str(path)
    if not (isinstance(value, (tuple, list)) and len(value) in (2, 3) and isinstance(value[1], dict)):
        raise BadModelError(f"{what} holds a {type(value).__name__}, not the params tuple Brax saves for PPO "
                            "(normalizer_params, policy_params, value_params) or SAC (normalizer_params, policy_params)")
    return value[0], value[1], value[2] if len(value) == 3 else None, provenance


def _statistics(state, what: str) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(state, dict):  # an orbax checkpoint keeps the RunningStatisticsState's fields as a dict
        mean, std = state.get("mean"), state.get("std")
    else:
        mean, std = getattr(state, "mean", None), getattr(state, "std", None)
    if not (isinstance(mean, np.ndarray) and isinstance(std, np.ndarray)):
        raise BadModelError(f"{what}'s normalizer_params hold no mean and std arrays (a RunningStatisticsState has "
                            "them); a nested observation's statistics are not read")
    return mean, std


def _policy_layers(params: dict, act) -> list[Dense]:
    layers = params.get("params") if isinstance(params, dict) else None
    if not isinstance(layers, dict):
        raise BadModelError("the policy params hold no Flax variables {'params': ...}")
    numbers = sorted(int(m[1]) for k in layers if (m := re.fullmatch(r"hidden_(\d+)", k)))
    if not numbers or numbers != list(range(len(numbers))) or len(numbers) != len(layers):
        raise BadModelError(f"the policy params hold {', '.join(sorted(layers))}; Brax's MLP names its layers "
                            "hidden_0 ... hidden_N (a 'normal' distribution's PolicyModuleWithStd is not read)")
    out = []
    for i in numbers:
        layer = layers[f"hidden_{i}"]
        w, b = layer.get("kernel"), layer.get("bias")
        if not isinstance(w, np.ndarray) or w.ndim != 2:
            raise BadModelError(f"params/hidden_{i}/kernel is not a 2-D array")
        out.append(Dense(f"hidden_{i}", w, f"params/hidden_{i}/kernel", b, f"params/hidden_{i}/bias" if b is not None else None,
                         "in_out", act if i < numbers[-1] else None))
    return out


def convert_brax(source, options):
    """Convert a ``brax.io.model.save_params`` file (see the module docstring).

    Returns:
        A :class:`~policyport.converter.options.Converted`: graph input ``obs``, the normaliser
        (``normalizer/centered``, ``normalizer/obs``), ``logits`` (the last layer's ``2 * A`` outputs),
        ``loc`` (their first half) and ``action`` = ``tanh(loc)``.

    Raises:
        UnreadableFileError, UntrustedFileError, BadModelError: see :func:`read_brax`.
    """
    from ..assumptions import reconstruction
    from ..build import build_mlp
    from ..options import Converted
    from .state_dict import check_dtypes, has_torch, reference_for

    state, policy, value, provenance = read_brax(source)
    algorithm = "PPO" if value is not None else "SAC"
    default = "swish" if value is not None else "relu"
    config_file, config = provenance.pop("config_file", None), provenance.pop("config", {})
    kwargs = config.get("network_factory_kwargs", {})
    configured = kwargs.get("activation") if isinstance(kwargs.get("activation"), str) else None
    act_name = options.activation or configured or default
    try:
        act = parse_activation(act_name)
    except (ValueError, LookupError) as e:
        raise BadModelError(f"{config_file} names the activation {act_name!r}: {e}") from e
    act = None if act.name == "linear" else act
    _check_config(config, config_file)
    mean, std = _statistics(state, str(source))
    layers = _policy_layers(policy, act)
    check_dtypes({d.weight_name: d.weight for d in layers} | {d.bias_name: d.bias for d in layers if d.bias is not None},
                 "the Brax policy's parameters")
    spec = MlpSpec(hidden=layers[:-1], output=layers[-1])
    width = spec.output.out_features
    if width % 2:
        raise BadModelError(f"the last layer outputs {width} values; a tanh-normal policy's are loc and scale halves")
    if mean.shape != (spec.obs_dim,) or std.shape != (spec.obs_dim,):
        raise BadModelError(f"the normaliser's mean {mean.shape} and std {std.shape} do not fit the first layer's "
                            f"{spec.obs_dim} inputs")
    tail = TanhLoc(width // 2)
    normalised = config.get("normalize_observations") is not False
    prelude = BraxNormalizer(mean.astype(spec.dtype), std.astype(spec.dtype)) if normalised else None
    spec.source = {**provenance, "algorithm": algorithm}
    model = build_mlp(spec, opset=options.opset, postlude=tail.build, metadata={"policyport.activation": act_name},
                      prelude=prelude)
    sizes = kwargs.get("policy_hidden_layer_sizes")
    if isinstance(sizes, list) and sizes != [layer.out_features for layer in spec.hidden]:
        raise BadModelError(f"{config_file} records policy layers {tuple(sizes)}, the checkpoint holds "
                            f"{tuple(layer.out_features for layer in spec.hidden)}")
    hidden = [layer.name for layer in spec.hidden]
    because = ("given by --activation" + ("" if config_file else "; a save_params file does not record it")
               if options.activation else
               f"read from {config_file}'s network_factory_kwargs" if configured else
               f"Brax's make_{algorithm.lower()}_networks builds its MLP with {default} unless told otherwise, and "
               f"{'this checkpoint records no network configuration' if provenance.get('format') else 'a save_params file does not record it'}")
    assumptions = [Assumption("activation", f"{act_name} at {joined(hidden)}", because, "--activation names another")] if hidden else []
    assumptions.append(Assumption("head", "tanh-normal: action = tanh(first half of the last layer)",
                                  f"read from {config_file}'s distribution_type" if kwargs.get("distribution_type")
                                  else "Brax's default distribution_type; the file holds the network's arrays alone", ""))
    if not normalised:
        assumptions.append(Assumption("observation filter", "none: the policy sees raw observations",
                                      f"{config_file} records normalize_observations false (Brax then passes "
                                      "observations through unchanged and the saved statistics are never used)", ""))
    base = reference_for(spec, None)

    def reference(obs):
        obs = np.asarray(obs)
        filtered = prelude.reference(obs) if prelude is not None else {"normalizer/obs": obs}
        out = base(filtered["normalizer/obs"])
        if prelude is not None:
            out.update(filtered)
        out.update(tail.reference(out))
        return out

    runner = "torch modules" if has_torch() else "numpy"
    read_as = "an orbax checkpoint, read with tensorstore" if provenance.get("format") == "orbax" else "save_params"
    return Converted(model, reference, "brax", [f"read as Brax {algorithm} params ({read_as})"], assumptions,
                     reconstruction("the arrays of Brax's checkpoint" if provenance.get("format") else
                                    "the arrays of Brax's save_params file", runner))


def _check_config(config: dict, name: str | None) -> None:
    """Refuse a network configuration that describes a policy other than the one this converter builds:
    tanh-normal (``distribution_type``) with a network that outputs the loc and scale halves."""
    kwargs = config.get("network_factory_kwargs", {})
    distribution = kwargs.get("distribution_type")
    if distribution not in (None, "tanh_normal"):
        raise BadModelError(f"{name} records distribution_type {distribution!r}; policyport reads Brax's tanh_normal "
                            "policies (action = tanh(loc))")
    if kwargs.get("state_dependent_std") not in (None, False):
        raise BadModelError(f"{name} records state_dependent_std {kwargs['state_dependent_std']!r}; policyport reads "
                            "policies whose network outputs loc and scale halves")


class BraxNormalizer:
    """``running_statistics.normalize``: ``(obs - mean) / std``, as graph nodes before the network.

    It stands where :func:`~policyport.converter.build.build_mlp` takes a
    :class:`~policyport.converter.build.Prelude`: no one-hot encoding (``width``) and no RLlib filter
    (``obs_filter``); :func:`convert_brax` checks the statistics' width against the first layer.
    """

    width = None
    obs_filter = None

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean, self.std = mean, std

    def __bool__(self) -> bool:
        return True

    def build(self, b, x: str) -> str:
        mean = b.initializer(self.mean, "normalizer_params/mean", "normalizer_params/mean")
        std = b.initializer(self.std, "normalizer_params/std", "normalizer_params/std")
        return b.node("Div", [b.node("Sub", [x, mean], "normalizer/centered"), std], "normalizer/obs")

    def graph_input(self, helper, name, elem, input_shape):
        return helper.make_tensor_value_info(name, elem, ["batch", *input_shape])

    def metadata(self, input_name: str = "obs") -> dict[str, str]:
        import json

        return {"policyport.observation_filter": json.dumps({"type": "brax running_statistics.normalize",
                                                             "mean": self.mean.tolist(), "std": self.std.tolist()})}

    def reference(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        centered = obs - self.mean
        return {"normalizer/centered": centered, "normalizer/obs": centered / self.std}


class TanhLoc:
    """``NormalTanhDistribution.mode``: ``loc, scale = split(logits, 2)``, ``action = tanh(loc)``."""

    def __init__(self, action_size: int):
        self.n = action_size

    def build(self, b, logits, value, outputs):
        import onnx

        axes = b.constant([1], "loc/axes")
        loc = b.node("Slice", [logits, b.constant([0], "loc/start"), b.constant([self.n], "loc/end"), axes], "loc")
        b.node("Tanh", [loc], "action")
        elem = onnx.helper.np_dtype_to_tensor_dtype(b.dtype)
        outputs += [onnx.helper.make_tensor_value_info("loc", elem, ["batch", self.n]),
                    onnx.helper.make_tensor_value_info("action", elem, ["batch", self.n])]

    def reference(self, out):
        loc = out["logits"][:, :self.n]
        return {"loc": loc, "action": np.tanh(loc)}
