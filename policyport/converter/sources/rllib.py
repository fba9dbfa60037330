"""RLlib checkpoints to ONNX, read without Ray and without running anything from the files.

Three layouts (as Ray writes them; the facts are in the docstrings below):

* **legacy** (Ray 0.x/1.x): one file ``checkpoint-<N>`` (also inside ``checkpoint_<N>/``): a pickled
  dict whose ``"worker"`` value is itself a pickle of ``{"state": {policy_id: weights},
  "filters": {policy_id: filter}}`` (``RolloutWorker.save``); TF weights are a flat dict named
  ``<policy_id>/fc_1/kernel`` ..., plus ``_optimizer_variables``. A ``params.pkl`` beside the
  checkpoint folder, when present, gives the model config.
* **old API stack** (Ray 2.x): a folder with ``rllib_checkpoint.json``,
  ``policies/<policy_id>/policy_state.pkl`` (or ``.msgpack``) holding ``weights`` (torch: a dict
  in ``FullyConnectedNetwork`` names; tf2: an unnamed list in ``policy.variables()`` order),
  ``policy_spec`` (spaces and the model config) and ``connector_configs``; the filter in
  ``algorithm_state.pkl`` -> ``worker.filters.<policy_id>``.
* **new API stack**: ``learner_group/learner/rl_module/<policy_id>/module_state.pkl`` (or
  ``.msgpack``): torch ``state_dict`` names and ``(out, in)`` Linear weights; spaces and the model
  config in that folder's ``class_and_ctor_args.pkl``; the filter in
  ``env_runner/env_to_module_connector/MeanStdFilter/state.pkl``.

Pickles go through :mod:`policyport.converter.readers.unpickle`: numpy arrays and containers are rebuilt;
RLlib, gymnasium and torch classes become inert records; a function or an OS-reaching global is
refused (:class:`~policyport.errors.UntrustedFileError`) unless ``trust``.

What the policy applies before the network is baked into the graph (``compute_single_action``'s
order): the preprocessor (``Discrete`` -> one-hot; ``Box`` as is) and the ``MeanStdFilter``
(:class:`~policyport.converter.build.ObsFilter`). The value branch and optimizer state are dropped
unless ``keep_value``; ``Converted.notes`` says what was dropped.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import BadModelError, LimitExceededError, OptionError, UnreadableFileError, listing
from ...io.arrays import read_npy_zlib
from .. import fields
from ..readers import msgpack_decode, unpickle
from ..activations import Activation, choose_activation, parse_activation
from ..assumptions import HALVES, RLLIB_SPLIT, Assumption, head_assumption, reconstruction
from ..build import NO_HEAD, Dense, MlpSpec, ObsFilter, Prelude
from ..fields import real_number, whole_number
from .rllib_weights import parse_rllib_fcnet
from .state_dict import parse_rllib_torch

#: Modules whose classes and helper functions a checkpoint names; recorded inertly, never imported.
INERT_MODULES = ("ray", "gymnasium", "gym", "torch", "cloudpickle", "numpy.random", "tree", "tensorflow", "tf_keras",
                 "keras")

DEFAULT_POLICY = "default_policy"

#: Ray 0.x/1.x filters divide by ``std + 1e-8``; Ray 2.x by ``std + SMALL_NUMBER`` (1e-6,
#: ``ray/rllib/utils/numpy.py``).
EPSILON_RS = 1e-8
EPSILON_RUNNING_STATS = 1e-6


@dataclass
class Checkpoint:
    """One policy of an RLlib checkpoint, as read from its files.

    Attributes:
        layout: ``"legacy"``, ``"old-stack"`` or ``"new-stack"``.
        policy_id: the policy read.
        policy_ids: every policy the checkpoint holds.
        weights: parameter name -> array (a tf2 list is named on reading).
        framework: ``"tf"`` or ``"torch"`` (the weights' naming and layout).
        model_config: RLlib's model config as far as the checkpoint records it.
        obs_space: ``("box", shape)`` or ``("discrete", n)``, or ``None`` when not recorded.
        action_space: likewise.
        obs_filter: the policy's ``MeanStdFilter``, or ``None``.
        module_class: the RLModule class name (new stack), e.g. ``DefaultDQNTorchRLModule``.
        dropped: what was read but not converted (optimizer state ...), one phrase each.
        files: provenance: the files read and their sha256.
        filter_agents: a new-stack ``MeanStdFilter`` state holding the filters of several agents and
            none of the default agent (``None``): their ids. Which agent's observations a module
            sees is the policy mapping function's choice, which the checkpoint does not record.
        filter_named: the observation filter the checkpoint says the policy used (``"MeanStdFilter"``),
            from its filter state or, when that is absent or was not read, from its config or
            connector classes; ``None`` when it names none (``NoFilter``).
        filter_named_by: what names it (a file, a config entry).
        filter_sought: where the filter's state was looked for.
        order_assumed: why the weights' names come from RLlib's variable order rather than the
            file (an old-stack tf2 list without optimizer slot names), or ``""``.
    """

    layout: str
    policy_id: str
    policy_ids: list[str]
    weights: dict[str, np.ndarray]
    framework: str
    model_config: dict = field(default_factory=dict)
    obs_space: tuple | None = None
    action_space: tuple | None = None
    obs_filter: ObsFilter | None = None
    module_class: str | None = None
    dropped: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    filter_agents: list[str] = field(default_factory=list)
    filter_named: str | None = None
    filter_named_by: str = ""
    filter_sought: str = ""
    order_assumed: str = ""


# ------------------------------------------------------------------------------------------ files


class _Files:
    """Reads a checkpoint's files safely and remembers their digests."""

    def __init__(self, root: Path, trust: bool):
        self.root, self.trust, self.digests = root, trust, {}

    def _bytes(self, path: Path) -> bytes:
        try:
            data = path.read_bytes()
        except OSError as e:
            raise UnreadableFileError(f"cannot read {path}: {e}") from e
        rel = str(path.relative_to(self.root)) if path.is_relative_to(self.root) else path.name
        self.digests[rel] = hashlib.sha256(data).hexdigest()
        return data

    def pickle(self, path: Path, data: bytes | None = None, what: str | None = None) -> Any:
        return unpickle.load(self._bytes(path) if data is None else data, trust=self.trust,
                             what=what or str(path), inert_modules=INERT_MODULES)

    def state(self, stem: Path) -> Any:
        """``<stem>.pkl`` or ``<stem>.msgpack``, whichever exists."""
        for suffix in (".pkl", ".msgpack"):
            path = stem.with_name(stem.name + suffix)
            if path.is_file():
                if suffix == ".msgpack":
                    return msgpack_decode.load(self._bytes(path), what=str(path))
                return self.pickle(path)
        raise UnreadableFileError(f"{stem}.pkl (or .msgpack) is missing from the checkpoint")


def _model_config(value: Any, where: str) -> dict:
    """A policy's model config (``fcnet_hiddens``, ``fcnet_activation`` ...) as a dict; ``{}`` for none.

    Raises:
        BadModelError: something other than a mapping.
    """
    if value is None:
        return {}
    if isinstance(value, unpickle.Record) and isinstance(value.state, dict):
        value = value.state
    if not isinstance(value, dict):
        raise BadModelError(f"{where} is {fields.shown(value)}, not a model config (a mapping)")
    return dict(value)


def _state_file(files: _Files, stem: Path) -> Path:
    """The file :meth:`_Files.state` reads for ``stem``: ``<stem>.pkl``, else ``<stem>.msgpack``."""
    pickled = stem.with_name(stem.name + ".pkl")
    return pickled if pickled.is_file() else stem.with_name(stem.name + ".msgpack")


def _pick(policy_ids: list[str], wanted: str | None, where: str) -> str:
    pid = wanted or DEFAULT_POLICY
    if pid not in policy_ids:
        if wanted is None and len(policy_ids) == 1:
            return policy_ids[0]
        raise BadModelError(
            f"policy {pid!r} is not in {where}; it holds: {listing(sorted(policy_ids), show=str) or 'no policies'} "
            "(choose one with --policy-id)"
        )
    return pid


def _decode_array(value: Any, what: str, before: int = 0) -> Any:
    """RLlib serialises arrays in JSON-able states as base64 of zlib of ``.npy`` bytes
    (``ray/rllib/utils/serialization.py``); anything else, or text that does not decode, comes back
    unchanged. The ``.npy`` header is checked against the array limit before its data is
    decompressed (:func:`policyport.io.arrays.read_npy_zlib`).

    Args:
        value: the state's entry.
        what: how to name it in messages (``f"{where}: the MeanStdFilter's mean_array"``).
        before: the bytes of the arrays decoded before it from the same state, which it may take
            together with no more than the array limit.

    Raises:
        LimitExceededError: the array it holds would take more than the array limit, alone or
            with ``before``.
    """
    if isinstance(value, str) and value.startswith("eJ"):
        try:
            return read_npy_zlib(base64.b64decode(value, validate=True), what, before=before)
        except LimitExceededError:
            raise
        except (ValueError, UnreadableFileError):
            return value
    return value


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, unpickle.Record):
        return obj.get(name, default)
    if isinstance(obj, dict):
        return obj.get(name, default)
    return default


def _space(value: Any, where: str = "the checkpoint's space") -> tuple | None:
    """A gym(nasium) space record or RLlib's serialised space dict as ``("box", shape)``,
    ``("discrete", n)`` or ``("multidiscrete", nvec)`` (``rllib/utils/serialization.py`` writes
    ``{"space": "discrete", "n"}``, ``{"space": "multi-discrete", "nvec": <base64 npy>}``).

    Args:
        value: the space as the checkpoint holds it.
        where: the file and entry that hold it, for messages.

    Raises:
        BadModelError: a Discrete ``n`` or MultiDiscrete ``nvec`` that is not whole numbers of at
            least 1, a Box shape that is not whole numbers (naming ``where`` and the field).
    """
    while isinstance(value, dict) and isinstance(value.get("space"), dict):  # a serialised space inside another
        value = value["space"]
    if isinstance(value, dict) and "space" in value:
        kind = str(value["space"]).lower().replace("-", "").replace("_", "")
        if kind == "discrete":
            return ("discrete", whole_number(value.get("n"), f"{where}: n", minimum=1))
        if kind == "multidiscrete":
            return ("multidiscrete", _nvec(_decode_array(value.get("nvec"), f"{where}: nvec"), f"{where}: nvec"))
        if kind == "box":
            return ("box", fields.shape(value.get("shape", ()), f"{where}: shape"))
        return (kind, None)
    if isinstance(value, unpickle.Record):
        cls = value.global_name.rsplit(".", 1)[-1]
        if cls == "Discrete":
            return ("discrete", whole_number(value.get("n"), f"{where}: n", minimum=1))
        if cls == "MultiDiscrete":
            return ("multidiscrete", _nvec(value.get("nvec"), f"{where}: nvec"))
        if cls == "Box":
            shape = value.get("_shape", value.get("shape"))
            return ("box", fields.shape(shape, f"{where}: shape")) if shape is not None else ("box", None)
        return (cls.lower(), None)
    return None


def _nvec(value: Any, what: str) -> tuple[int, ...]:
    """A MultiDiscrete's ``nvec`` (any shape, flattened) as whole numbers ≥ 1."""
    return tuple(whole_number(n, what, minimum=1) for n in fields.number_array(value, what).ravel())


def _filter(value: Any, where: str = "the checkpoint") -> ObsFilter | None:
    """A ``MeanStdFilter`` from a pickled filter record or a serialised state dict; ``None`` for
    ``NoFilter`` or nothing.

    Old filters keep ``rs`` = RunningStat(``_n``, ``_M``, ``_S``): ``var = _S / (_n - 1)``, or
    ``_M ** 2`` when ``_n <= 1``; ``/ (std + 1e-8)``. Newer ones keep ``running_stats``
    (``num_pushes``, ``mean_array``, ``sum_sq_diff_array``): ``var = sum_sq_diff / (n - 1)`` as
    float32, 0 when ``n <= 1``; ``/ (std + 1e-6)``.

    Args:
        value: the filter's state as the checkpoint holds it.
        where: the file (and entry) that holds it, for messages.

    Raises:
        BadModelError: a filter of another kind, statistics of a structured observation, or
            statistics that are not numbers: a count that is not a whole number, means or squared
            differences of text or NaN, means and squared differences of different shapes, a clip
            bound that is not one number ≥ 0, flags that are not booleans (each naming ``where`` and
            the field).
        LimitExceededError: a statistics array it holds serialised would take more than the array limit.
    """
    if value is None:
        return None
    cls = value.global_name.rsplit(".", 1)[-1] if isinstance(value, unpickle.Record) else "MeanStdFilter"
    if cls == "NoFilter":
        return None
    if cls not in ("MeanStdFilter", "ConcurrentMeanStdFilter"):
        raise BadModelError(f"the checkpoint's observation filter is a {cls}; policyport bakes in MeanStdFilter only "
                            "(convert with --no-filter to leave it out)")
    where = f"{where}: the MeanStdFilter's"
    demean_key, destd_key, clip_key = (old if _get(value, old) is not None else new for old, new in (
        ("demean", "de_mean_to_zero"), ("destd", "de_std_to_one"), ("clip", "clip_by_value")))  # Ray 1.x, 2.x
    demean = _flag(_get(value, demean_key, True), f"{where} {demean_key}")
    destd = _flag(_get(value, destd_key, True), f"{where} {destd_key}")
    clip = _get(value, clip_key)
    if isinstance(clip, str):  # a serialised state may hold it as text
        try:
            clip = float(clip)
        except ValueError:
            pass  # refused just below, as text
    clip = None if clip is None or clip is False else real_number(clip, f"{where} {clip_key}", finite=False)
    if clip is not None and not clip >= 0:
        raise BadModelError(f"{where} {clip_key} is {clip:g}; it must be at least 0 (0 for no clipping)")
    clip = clip or None
    rs = _get(value, "rs")
    if rs is not None:
        n = whole_number(_get(rs, "_n"), f"{where} rs._n")
        m, s = _statistics(rs, ("_M", "_S"), f"{where} rs")
        var = s / (n - 1) if n > 1 else np.square(m)
        return ObsFilter(m, np.sqrt(var), EPSILON_RS, demean, destd, clip, n, "rs")
    stats = _get(value, "running_stats")
    if isinstance(stats, (list, tuple)):
        if len(stats) != 1:
            raise BadModelError(f"the MeanStdFilter holds {len(stats)} running statistics (a structured observation); "
                                "policyport bakes in the filter of a flat Box observation only")
        stats = stats[0]
    if stats is None:
        raise BadModelError("the MeanStdFilter holds neither rs nor running_stats; cannot read its statistics")
    if not isinstance(stats, (dict, unpickle.Record)):
        raise BadModelError(f"{where} running_stats is {fields.shown(stats)}, not the statistics of a running mean")
    n = whole_number(_get(stats, "num_pushes"), f"{where} num_pushes")
    m, s = _statistics(stats, ("mean_array", "sum_sq_diff_array"), f"{where} running_stats")
    var = (s / (float(n) - 1)).astype(np.float32) if n > 1 else np.zeros_like(m, dtype=np.float32)
    std = np.sqrt(np.maximum(0, var)).astype(np.float64)
    return ObsFilter(m, std, EPSILON_RUNNING_STATS, demean, destd, clip, n, "running_stats")


def _statistics(stats: Any, names: tuple[str, str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """The running mean and sum of squared differences a filter keeps under ``names``, as float64.

    Raises:
        BadModelError: either is not numbers (or holds NaN), or the two differ in shape.
        LimitExceededError: serialised, the two would take more than the array limit together
            (the second checked by its header, before it is decompressed).
    """
    mean_name, squares_name = names
    mean = fields.number_array(_decode_array(_get(stats, mean_name), f"{where}.{mean_name}"), f"{where}.{mean_name}")
    squares = fields.number_array(_decode_array(_get(stats, squares_name), f"{where}.{squares_name}", mean.nbytes),
                                  f"{where}.{squares_name}")
    if mean.shape != squares.shape:
        raise BadModelError(f"{where}.{mean_name} has shape {mean.shape} and {squares_name} {squares.shape}; "
                            "a running mean and its squared differences have one shape")
    return mean, squares


def _flag(value: Any, what: str) -> bool:
    """A filter's on/off setting: a bool, or 0/1 as older pickles hold it.

    Raises:
        BadModelError: anything else.
    """
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise BadModelError(f"{what} is {fields.shown(value)}, not true or false")


def _filter_name(value: Any) -> str | None:
    """The filter a config's ``observation_filter`` (a class name, or a class the pickle named) or a
    filter state (a record of its class; a plain state dict is a ``MeanStdFilter``'s) stands for;
    ``None`` for ``NoFilter`` or nothing."""
    if value is None:
        return None
    name = getattr(value, "global_name", None) or (value if isinstance(value, str) else "MeanStdFilter")
    name = str(name).rsplit(".", 1)[-1]
    return None if name in ("NoFilter", "") else name


def _config_filter(*configs: tuple[str, Any]) -> tuple[str | None, str]:
    """The filter the first of ``(where, config)`` whose ``observation_filter`` names one names, and where."""
    for where, config in configs:
        name = _filter_name(_get(config, "observation_filter"))
        if name:
            return name, where
    return None, ""


#: Where a new-stack checkpoint names its env-to-module connectors' classes (pickles read for the
#: globals they name, never unpickled: the algorithm's config holds cloudpickled functions).
_CONNECTOR_CLASS_FILES = {
    "env_runner/env_to_module_connector/MeanStdFilter/class_and_ctor_args.pkl": "the filter connector's class",
    "env_runner/env_to_module_connector/class_and_ctor_args.pkl": "the env-to-module connector pipeline",
    "env_runner/class_and_ctor_args.pkl": "the env runner's config",
    "class_and_ctor_args.pkl": "the algorithm's config",
}


def _connector_filter(path: Path, files: _Files) -> tuple[str | None, str]:
    """The observation filter a new-stack checkpoint's connector classes name (a ``...Filter`` class
    of ``ray.rllib.connectors.env_to_module``), and the file that names it."""
    for rel, what in _CONNECTOR_CLASS_FILES.items():
        if (path / rel).is_file():
            for name in unpickle.pickled_globals(files._bytes(path / rel)):
                module, _, cls = name.rpartition(".")
                if module.startswith("ray.rllib.connectors.env_to_module") and cls.endswith("Filter"):
                    return cls, f"{path / rel} ({what})"
    return None, ""


# -------------------------------------------------------------------------------------- layouts


def find_legacy_file(path: Path) -> Path | None:
    """The ``checkpoint-<N>`` file of a legacy checkpoint given as the file or its folder."""
    if path.is_file():
        return path if re.fullmatch(r"checkpoint-\d+", path.name) else None
    files = [p for p in path.glob("checkpoint-*") if re.fullmatch(r"checkpoint-\d+", p.name) and p.is_file()]
    return max(files, key=lambda p: int(p.name.split("-")[1]), default=None)  # the latest: 10 after 9


def read_checkpoint(path: str | Path, policy_id: str | None = None, trust: bool = False,
                    obs_filter: bool = True) -> Checkpoint:
    """Read one policy of an RLlib checkpoint (any of the three layouts), running nothing from it.

    Args:
        path: the ``checkpoint-<N>`` file or a checkpoint folder.
        policy_id: which policy; default ``default_policy`` (or the only one there is).
        trust: unpickle with the standard pickle (runs the files' code).
        obs_filter: read the observation filter's state (default true). False leaves
            ``Checkpoint.obs_filter`` ``None`` and reads no file and no entry only the filter needs
            (``algorithm_state``, the new stack's ``MeanStdFilter/state``), so a damaged or
            unsupported filter does not stop the conversion; ``filter_named`` still says which
            filter the checkpoint names.

    Raises:
        UntrustedFileError: a pickle names a function or an OS-reaching global (named).
        UnreadableFileError: files missing or unreadable (the filter's state only when ``obs_filter``).
        BadModelError: an unknown policy id (the ids present are listed), a layout that is not RLlib's,
            or (only when ``obs_filter``) a filter policyport does not bake in.
    """
    path = Path(path)
    if not path.exists():
        raise UnreadableFileError(f"{path}: no such file or folder")
    root = path if path.is_dir() else path.parent
    files = _Files(root, trust)
    if path.is_dir() and (path / "learner_group" / "learner" / "rl_module").is_dir():
        ckpt = _read_new_stack(path, files, policy_id, obs_filter)
    elif path.is_dir() and (path / "policies").is_dir():
        ckpt = _read_old_stack(path, files, policy_id, obs_filter)
    elif path.is_dir() and any((path / f"policy_state{s}").is_file() for s in (".pkl", ".msgpack")):
        ckpt = _read_policy_folder(path, files, policy_id, obs_filter=obs_filter)
    else:
        legacy = find_legacy_file(path)
        if legacy is None:
            raise UnreadableFileError(
                f"{path} is not an RLlib checkpoint: expected a checkpoint-<N> file, a folder with policies/<id>/ "
                "(Ray 2.x) or learner_group/learner/rl_module/<id>/ (new API stack)"
            )
        ckpt = _read_legacy(legacy, files, policy_id, obs_filter)
    ckpt.files = dict(files.digests)
    return ckpt


def _read_legacy(path: Path, files: _Files, policy_id: str | None, read_filter: bool = True) -> Checkpoint:
    outer = files.pickle(path)
    if not isinstance(outer, dict) or not isinstance(outer.get("worker"), (bytes, bytearray)):
        raise BadModelError(f"{path} is not a legacy RLlib checkpoint: expected a dict with a pickled 'worker' entry")
    worker = files.pickle(path, bytes(outer["worker"]), what=f"{path} (its worker state)")
    state = _get(worker, "state")
    if not isinstance(state, dict):
        raise BadModelError(f"{path}: the worker state holds no per-policy 'state' dict")
    pid = _pick(list(state), policy_id, str(path))
    policy_state = state[pid]
    weights = policy_state.get("weights", policy_state) if isinstance(policy_state, dict) else None
    if not isinstance(weights, dict):
        raise BadModelError(f"{path}: policy {pid!r} holds no weights dict")
    arrays, dropped = _split_weights(weights, policy_state)
    config, loaded, params = {}, None, None
    for params in (path.parent / "params.pkl", path.parent.parent / "params.pkl"):
        if params.is_file():
            loaded = files.pickle(params)
            config = _model_config(_get(loaded, "model"), f"{params}: model")
            break
    filters = _get(worker, "filters", {}) or {}
    raw = filters.get(pid) if isinstance(filters, dict) else None
    if raw is not None:
        named, named_by = _filter_name(raw), f"{path} (its worker state's filters)"
    else:  # Ray 1.x's worker state also keeps the policy config; params.pkl is the trainer's
        named, named_by = _config_filter((f"{params} (observation_filter)", loaded),
                                         (f"{path} (its worker state's policy_config)", _get(worker, "policy_config")))
    framework = "torch" if any(k.startswith("_hidden_layers") or k.startswith("_logits") for k in arrays) else "tf"
    return Checkpoint("legacy", pid, list(state), arrays, framework, config, None, None,
                      _filter(raw, f"{path} (its worker state's filters[{pid!r}])") if read_filter else None, None,
                      dropped, filter_named=named, filter_named_by=named_by,
                      filter_sought=f"the worker state's filters[{pid!r}] in {path}")


def _split_weights(weights: dict, policy_state: Any) -> tuple[dict[str, np.ndarray], list[str]]:
    """The weight arrays, and phrases for what else the policy state held (optimizer state)."""
    arrays, dropped = {}, []
    for k, v in weights.items():
        if k == "_optimizer_variables":
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            arrays[str(k)] = v
        else:
            dropped.append(f"{k} (not a float array)")
    optimizer = _get(policy_state, "_optimizer_variables")
    if optimizer is None and isinstance(weights, dict):
        optimizer = weights.get("_optimizer_variables")
    if optimizer is not None:
        count = len(optimizer) if isinstance(optimizer, (list, tuple, dict)) else \
            len(optimizer.list_items) if isinstance(optimizer, unpickle.Record) and optimizer.list_items else 1
        dropped.insert(0, f"optimizer state ({count} _optimizer_variables)")
    return arrays, dropped


def _read_policy_folder(folder: Path, files: _Files, policy_id: str | None, ids: list[str] | None = None,
                        algorithm_state: Any = None, state_file: str | None = None,
                        obs_filter: bool = True) -> Checkpoint:
    policy_state = files.state(folder / "policy_state")
    pid = _pick([folder.name], policy_id, str(folder))  # a policy's own folder is that policy
    weights = _get(policy_state, "weights")
    spec = _get(policy_state, "policy_spec") or {}
    config = _get(spec, "config") or {}
    model = _model_config(_get(config, "model"), f"{_state_file(files, folder / 'policy_state')}: policy_spec.config.model")
    order_assumed = ""
    if isinstance(weights, (list, tuple)):
        optimizer = _get(policy_state, "_optimizer_variables")
        if _slot_names(list(weights), optimizer) is None:
            order_assumed = (f"{_state_file(files, folder / 'policy_state')} holds the tf2 policy's weights as an "
                             "unnamed list and no optimizer slot variable names each array; named in the order "
                             "ray/rllib/models/tf/fcnet.py creates its variables for the model config")
        weights = _name_tf2_list(list(weights), model, pid, optimizer)
    if not isinstance(weights, dict):
        raise BadModelError(f"{folder}: policy_state holds no weights")
    arrays, dropped = _split_weights(weights, policy_state)
    framework = "tf" if any("/" in k for k in arrays) else "torch"
    filters = _get(_get(algorithm_state, "worker"), "filters")
    filt = filters.get(pid) if isinstance(filters, dict) else None
    if filt is None:  # the connector pipeline keeps the same statistics
        agent = _get(_get(policy_state, "connector_configs"), "agent")
        for entry in (agent[1] if isinstance(agent, (list, tuple)) and len(agent) == 2 else []):
            if isinstance(entry, (list, tuple)) and entry and "MeanStd" in str(entry[0]):
                filt = entry[1]
    if filt is not None:
        named, named_by = _filter_name(filt), f"{folder} (its filter state)"
    else:
        named, named_by = _config_filter((f"{folder / 'policy_state'} (policy_spec.config.observation_filter)", config),
                                         (f"{state_file} (config.observation_filter)", _get(algorithm_state, "config")))
    sought = (f"worker.filters[{pid!r}] in {state_file}, then " if state_file else "") + \
        f"a MeanStd connector in {folder / 'policy_state'}'s connector_configs"
    return Checkpoint("old-stack", pid, ids or [pid], arrays, framework, model,
                      *(_space(_get(spec, key), f"{_state_file(files, folder / 'policy_state')}: policy_spec.{key}")
                        for key in ("observation_space", "action_space")),
                      _filter(filt, named_by) if obs_filter else None, None, dropped, filter_named=named,
                      filter_named_by=named_by, filter_sought=sought, order_assumed=order_assumed)


def _read_old_stack(path: Path, files: _Files, policy_id: str | None, obs_filter: bool = True) -> Checkpoint:
    ids = sorted(p.name for p in (path / "policies").iterdir() if p.is_dir())
    pid = _pick(ids, policy_id, str(path))
    has_state = any((path / f"algorithm_state{s}").is_file() for s in (".pkl", ".msgpack"))
    # the algorithm state is read for the filter alone: with obs_filter false, not at all
    algorithm_state = files.state(path / "algorithm_state") if has_state and obs_filter else None
    return _read_policy_folder(path / "policies" / pid, files, pid, ids, algorithm_state,
                               f"{path / 'algorithm_state'}.pkl (or .msgpack)", obs_filter)


#: A trainable variable's name at the end of an optimizer slot's (``Adam/m/fc_1/kernel``, tf_keras's
#: ``<optimizer>/<slot>/<variable>``; ``default_policy/fc_1/kernel/Adam`` in TF1's ``<variable>/<slot>``).
_SLOT_VARIABLE = re.compile(r"(?:^|/)((?:fc_\d+|fc_out|fc_value_\d+|value_out)/(?:kernel|bias)|log_std)(?:/[^/]+)?(?::0)?$")


def _slot_variables(optimizer: Any) -> list[tuple[str, tuple | None]]:
    """The trainable variables an old-stack tf2 policy's optimizer keeps slots for, in its order:
    ``(layer/param, shape)`` each once (its first slot), from the pickled optimizer variables'
    ``name`` and ``initial_value`` (``tf_keras`` pickles each as ``functools.partial(ResourceVariable,
    initial_value=..., name=...)``, recorded inertly); ``[]`` when the state holds none."""
    items = optimizer.list_items if isinstance(optimizer, unpickle.Record) else \
        optimizer if isinstance(optimizer, (list, tuple)) else []
    found: dict[str, tuple | None] = {}
    for variable in items:
        name = variable.kwargs.get("name") if isinstance(variable, unpickle.Record) else None
        m = _SLOT_VARIABLE.search(name) if isinstance(name, str) else None
        if m and m[1] not in found:
            initial = variable.kwargs.get("initial_value")
            found[m[1]] = tuple(initial.shape) if isinstance(initial, np.ndarray) else None
    return list(found.items())


def _slot_names(values: list, optimizer: Any) -> list[str] | None:
    """The names (``fc_1/kernel`` ...) of an old-stack tf2 weight list by its optimizer's slot
    variables, when they name one variable per array in order, each of that array's shape; else ``None``."""
    slots = _slot_variables(optimizer)
    if len(slots) == len(values) and all(shape is None or shape == np.shape(v) for (_, shape), v in zip(slots, values)):
        return [name for name, _ in slots]
    return None


def _name_tf2_list(values: list, model: dict, pid: str, optimizer: Any = None) -> dict[str, np.ndarray]:
    """Name an old-stack tf2 policy's unnamed weight list (Keras ``(in, out)`` layout, in
    ``policy.variables()`` order).

    The names come from the checkpoint's optimizer state when it names one slot variable per array,
    in the list's order and with its shapes (:func:`_slot_variables`); else from the model config, in
    the order ``ray/rllib/models/tf/fcnet.py`` creates them: ``fc_1``, ``fc_value_1``, ``fc_2``,
    ``fc_value_2`` ..., ``fc_out``, ``value_out``, kernel then bias (with ``vf_share_layers``
    ``fc_1`` ... ``fc_out``, ``value_out``), then ``log_std`` with ``free_log_std``.

    Raises:
        BadModelError: neither gives the count of arrays the list holds.
    """
    values = [np.asarray(v) for v in values]
    slots = _slot_names(values, optimizer)
    if slots is not None:
        return {f"{pid}/{name}": v for name, v in zip(slots, values)}
    hiddens = list(model.get("fcnet_hiddens", [256, 256]))
    shared = bool(model.get("vf_share_layers"))
    layers = []
    for i in range(1, len(hiddens) + 1):
        layers.append(f"fc_{i}")
        if not shared:
            layers.append(f"fc_value_{i}")
    layers += ["fc_out", "value_out"]
    names = [f"{pid}/{layer}/{param}" for layer in layers for param in ("kernel", "bias")]
    if model.get("free_log_std"):
        names.append(f"{pid}/log_std")
    if len(values) != len(names):
        raise BadModelError(
            f"the tf2 policy's weights are an unnamed list of {len(values)} arrays; its model config "
            f"(fcnet_hiddens {hiddens}, vf_share_layers {shared}) needs {len(names)}: {', '.join(names)}"
        )
    return dict(zip(names, values))


def _read_new_stack(path: Path, files: _Files, policy_id: str | None, read_filter: bool = True) -> Checkpoint:
    modules = path / "learner_group" / "learner" / "rl_module"
    ids = sorted(p.name for p in modules.iterdir() if p.is_dir())
    pid = _pick(ids, policy_id, str(path))
    folder = modules / pid
    state = files.state(folder / "module_state")
    if not isinstance(state, dict):
        raise BadModelError(f"{folder}: module_state is not a mapping of parameter names to arrays")
    named = [k for k in state if not isinstance(k, str)]
    if named:
        raise BadModelError(f"{_state_file(files, folder / 'module_state')} names a parameter {named[0]!r:.60}: not a "
                            "parameter name (RLlib names each by its module path, as text)")
    ctor = files.pickle(folder / "class_and_ctor_args.pkl") if (folder / "class_and_ctor_args.pkl").is_file() else None
    module_class, config, obs_space, action_space = None, {}, None, None
    if ctor is not None:
        cls = _get(ctor, "class")
        module_class = getattr(cls, "global_name", str(cls)).rsplit(".", 1)[-1]
        args = _get(ctor, "ctor_args_and_kwargs")
        kwargs = args[1] if isinstance(args, (list, tuple)) and len(args) == 2 and isinstance(args[1], dict) else {}
        config = dict(kwargs.get("model_config") or {}) if isinstance(kwargs.get("model_config"), dict) else {}
        obs_space, action_space = (_space(kwargs.get(key), f"{folder / 'class_and_ctor_args.pkl'}: {key}")
                                   for key in ("observation_space", "action_space"))
    arrays = {}
    dropped = []
    for k, v in state.items():
        if k.startswith("_target_") or k.endswith("log_std_clip_param_const"):
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            arrays[k] = v
    targets = [k for k in state if k.startswith("_target_")]
    if targets:
        dropped.append(f"the target network ({len(targets)} _target_* arrays)")
    filt, agents = None, []
    filter_stem = path / "env_runner" / "env_to_module_connector" / "MeanStdFilter" / "state"
    filter_file = next((f for f in (filter_stem.with_name(f"state{s}") for s in (".pkl", ".msgpack")) if f.is_file()),
                       None)
    if filter_file is not None:
        named, named_by = "MeanStdFilter", str(filter_stem.parent)
        if read_filter:
            raw = files.state(filter_stem)
            filt = raw.get(None, raw.get("null")) if isinstance(raw, dict) else raw
            if isinstance(raw, dict) and filt is None and len(raw) == 1:
                filt = next(iter(raw.values()))
            elif isinstance(raw, dict) and filt is None and raw:
                agents = sorted(str(agent) for agent in raw)
    else:
        named, named_by = _connector_filter(path, files)
    return Checkpoint("new-stack", pid, ids, arrays, "torch", config, obs_space, action_space,
                      _filter(filt, str(filter_file)),
                      module_class, dropped, filter_agents=agents, filter_named=named, filter_named_by=named_by,
                      filter_sought=f"{filter_stem}.pkl (or .msgpack)")


# -------------------------------------------------------------------------------- weights -> MLP


_MODULE_LAYER = re.compile(r"^(?P<module>.+)\.net\.mlp\.(?P<index>\d+)\.(?P<param>weight|bias)$")

#: The modules of RLlib's default RLModules (``ray/rllib/algorithms/ppo/default_ppo_rl_module.py``,
#: ``ray/rllib/algorithms/dqn/default_dqn_rl_module.py``): encoders, then heads.
_PPO_MODULES = frozenset({"encoder.encoder", "encoder.actor_encoder", "encoder.critic_encoder", "pi", "vf"})
_DQN_MODULES = frozenset({"encoder", "af", "vf"})


def parse_rl_module(arrays: dict[str, np.ndarray], config: dict, activation: Activation | None,
                    head_activation: Activation | None, keep_value: bool, dqn: bool) -> tuple[MlpSpec, bool]:
    """A new-stack default RLModule's ``state_dict`` (``ray/rllib/core/models/torch/``) as an MlpSpec.

    PPO: ``encoder.actor_encoder`` (or shared ``encoder.encoder``) then ``pi``; value branch
    ``encoder.critic_encoder`` then ``vf``. DQN: ``encoder`` then ``af`` (advantages) and ``vf``
    (state value) for the dueling combination. Every encoder layer is followed by
    ``fcnet_activation``; head layers but the last by ``head_fcnet_activation``.

    Returns:
        The spec and whether it is a dueling DQN (its value branch is the state value).

    Raises:
        BadModelError: modules that do not form such a network, or modules the default layout does
            not have (another algorithm's RLModule).
    """
    modules: dict[str, dict[int, dict[str, tuple[str, np.ndarray]]]] = {}
    unplaced = []
    for name, arr in arrays.items():
        m = _MODULE_LAYER.match(name)
        if not m:
            unplaced.append(name)
            continue
        modules.setdefault(m["module"], {}).setdefault(int(m["index"]), {})[m["param"]] = (name, arr)
    if unplaced:
        raise BadModelError(f"cannot place {len(unplaced)} array(s) in RLlib's default RLModule layout "
                            f"(<module>.net.mlp.<i>.weight|bias): {listing(sorted(unplaced), show=str)}")
    known = _DQN_MODULES if dqn else _PPO_MODULES
    unknown = sorted(set(modules) - known)
    if unknown:  # another algorithm's modules (SAC's qf, an extra head ...): a network policyport would get wrong
        raise BadModelError(f"the {'DQN' if dqn else 'PPO'} RLModule holds module(s) {listing(unknown, show=str)} "
                            f"that its default layout does not have ({', '.join(sorted(known))}); "
                            "policyport converts RLlib's default PPO and DQN modules only")

    def layers(module: str, act: Activation | None, last_act: Activation | None) -> list[Dense]:
        found = modules.get(module, {})
        out = []
        for n, index in enumerate(sorted(found)):
            params = found[index]
            if "weight" not in params:
                raise BadModelError(f"{module}.net.mlp.{index} has no weight")
            wname, w = params["weight"]
            bname, b = params.get("bias", (None, None))
            out.append(Dense(f"{module}.net.mlp.{index}", w, wname, b, bname, "out_in",
                             act if n < len(found) - 1 else last_act))
        return out

    if dqn:
        encoder = layers("encoder", activation, activation)
        af = layers("af", head_activation, None)
        vf = layers("vf", head_activation, None)
        if not af:
            raise BadModelError(f"a DQN RLModule needs an af (advantage) head; found modules {listing(sorted(modules), show=str)}")
        if len(vf) > 1 or len(af) > 1:
            raise BadModelError("policyport converts DQN RLModules whose af/vf heads are single layers (head_fcnet_hiddens=[])")
        return MlpSpec(encoder, af[0], [], vf[0] if vf else None), bool(vf)
    shared = "encoder.encoder" in modules
    actor = layers("encoder.encoder" if shared else "encoder.actor_encoder", activation, activation)
    pi = layers("pi", head_activation, None)
    if not pi:
        raise BadModelError(f"the RLModule has no pi head; found modules {listing(sorted(modules), show=str)}")
    value_hidden, value_out = [], None
    if keep_value:
        vf = layers("vf", head_activation, None)
        if not vf:
            raise OptionError("a value branch was asked for (--keep-value), but the RLModule has no vf head")
        if shared and len(vf) > 1:
            raise BadModelError("a vf head with hidden layers on a shared encoder is not supported")
        value_hidden = [] if shared else layers("encoder.critic_encoder", activation, activation) + vf[:-1]
        value_out = vf[-1]
    return MlpSpec(actor + pi[:-1], pi[-1], value_hidden, value_out), False


# ------------------------------------------------------------------------------------------ convert


def _dueling(b, advantages: str, value: str | None, outputs: list) -> None:
    """A DQN's logits and action: RLlib's dueling combination ``logits = V + (A - mean(A))`` of the
    ``advantages`` and ``value`` streams (kept as intermediate tensors), or the advantage head's
    output itself without a value stream, then ``action = argmax(logits)``.

    RLlib calls these Q-values the action distribution's inputs: ``DefaultDQNTorchRLModule``
    builds its ``TorchCategorical`` ``from_logits(qf_preds)``
    (``ray/rllib/algorithms/dqn/torch/default_dqn_torch_rl_module.py``), and the old stack's
    ``get_distribution_inputs_and_class`` returns the same ``q_values``
    (``ray/rllib/algorithms/dqn/dqn_tf_policy.py``). Replaces ``outputs`` by ``logits`` and ``action``.
    """
    from onnx import TensorProto, helper

    logits = advantages
    if value is not None:
        mean = b.reduce_mean(advantages, 1, "dueling/mean_advantage", "dueling/axes", keepdims=1)
        centered = b.node("Sub", [advantages, mean], "dueling/centered_advantage")
        logits = b.node("Add", [value, centered], "logits")
    width = next(o for o in outputs if o.name == advantages).type.tensor_type.shape.dim[1].dim_value
    b.node("ArgMax", [logits], "action", axis=1, keepdims=0)
    outputs[:] = [helper.make_tensor_value_info(logits, helper.np_dtype_to_tensor_dtype(b.dtype), ["batch", width]),
                  helper.make_tensor_value_info("action", TensorProto.INT64, ["batch"])]


def convert_rllib(source, options):
    """Convert one policy of an RLlib checkpoint to ONNX, its preprocessor and filter baked in.

    Args:
        source: the ``checkpoint-<N>`` file or a checkpoint folder (legacy, Ray 2.x, new stack).
        options: a :class:`~policyport.converter.ConvertOptions`: ``policy_id``, ``keep_value``,
            ``obs_filter`` (false: leave the filter out without reading its state), ``head``
            (default: the action distribution's deterministic action — diag-gaussian for a Box
            action space, categorical for Discrete; none, with a note saying why, for another
            space or when the checkpoint does not record it), ``activation`` (default: the
            checkpoint's model config, else RLlib's tanh), ``opset``, ``trust``.

    Returns:
        A :class:`~policyport.converter.Converted` whose notes say what was dropped and baked in;
        its reference is the numpy forward pass of the checkpoint's arrays, filter included. A DQN
        outputs ``logits``, its Q-values as RLlib's action distribution takes them (dueling
        ``V + A - mean(A)`` of the intermediate tensors ``value`` and ``advantages``), and
        ``action`` = argmax.

    Raises:
        UntrustedFileError, UnreadableFileError, BadModelError: see :func:`read_checkpoint`.
        BadModelError: (unless ``obs_filter`` is false) the checkpoint names an observation filter
            (its config, its connector classes) whose state it does not hold, naming the filter,
            what names it and where its state was looked for; or a MeanStdFilter state of other
            agents only.
        OptionError: ``obs_norm`` given; a ``head`` other than categorical for a DQN; a ``head``
            contradicting the recorded action space (diag-gaussian for Discrete, categorical for
            Box, either for MultiDiscrete or another space), naming the space and the head it implies.
    """
    from ..options import Converted
    from ..build import build_mlp
    from .reference import reference_forward

    if options.obs_norm is not None:
        raise OptionError("--obs-norm applies to SB3 sources; an RLlib checkpoint carries its own observation filter")
    ckpt = read_checkpoint(source, options.policy_id, options.trust, options.obs_filter)
    config = ckpt.model_config
    recorded = config.get("fcnet_activation")
    activation_name, _ = choose_activation(options.activation, None if recorded is None else str(recorded),
                                           "the checkpoint's model config (fcnet_activation)")
    assumptions = []
    if recorded is None:
        assumptions.append(Assumption(
            "activation", f"{activation_name or 'tanh'} at every hidden layer",
            ("given by --activation" if activation_name else "RLlib's default fcnet_activation") +
            "; the checkpoint's model config names no fcnet_activation", "--activation names another"))
    act = parse_activation(str(activation_name or "tanh"))
    act = None if act.name == "linear" else act
    head_act = parse_activation(str(config.get("head_fcnet_activation") or "relu"))
    head_act = None if head_act.name == "linear" else head_act
    dqn = bool(ckpt.module_class and "DQN" in ckpt.module_class)
    notes = [f"{ckpt.layout} checkpoint: converted policy {ckpt.policy_id!r}"
             + (f" (it also holds {', '.join(p for p in ckpt.policy_ids if p != ckpt.policy_id)})" if len(ckpt.policy_ids) > 1 else "")]
    if ckpt.layout == "new-stack":
        spec, dueling = parse_rl_module(ckpt.weights, config, act, head_act, options.keep_value, dqn)
    elif ckpt.framework == "torch":  # the same state_dict layout a plain rllib-torch file holds
        spec, dueling = parse_rllib_torch(ckpt.weights, act, keep_value=options.keep_value)[0], False
    else:
        spec, dueling = parse_rllib_fcnet(ckpt.weights, act, options.keep_value), False
    if ckpt.order_assumed:
        names = ", ".join(k.rsplit("/", 2)[-2] for k in ckpt.weights if k.endswith("/kernel"))
        assumptions.append(Assumption("layout", f"weight list in RLlib's variable order ({names})", ckpt.order_assumed))
    value_layers = _value_layer_names(ckpt.weights)
    if value_layers and not options.keep_value and not dqn:
        notes.append(f"dropped the value branch ({', '.join(value_layers)}); --keep-value exports it as 'value'")
    notes += [f"dropped {d}" for d in ckpt.dropped]
    spec.source = {"kind": "rllib", "layout": ckpt.layout, "policy_id": ckpt.policy_id, "framework": ckpt.framework,
                   "files": ckpt.files}

    prelude = Prelude()
    if ckpt.obs_space and ckpt.obs_space[0] == "discrete":
        prelude.one_hot = int(ckpt.obs_space[1])
        notes.append(f"observation space Discrete({prelude.one_hot}): the graph takes int64 indices and one-hot encodes them")
    elif ckpt.obs_space and ckpt.obs_space[0] == "multidiscrete":
        prelude.one_hot_nvec = tuple(ckpt.obs_space[1])
        notes.append(f"observation space MultiDiscrete{list(prelude.one_hot_nvec)}: the graph takes int64 indices, "
                     "one per sub-space, and one-hot encodes each")
    if not options.obs_filter:  # the filter's state was not read
        if ckpt.filter_named:
            notes.append(f"left the checkpoint's {ckpt.filter_named} out (--no-filter): feed filtered observations")
            assumptions.append(Assumption("observation normalisation", "none",
                                          f"left out by --no-filter: the checkpoint's {ckpt.filter_named} is not "
                                          "applied, so the model expects observations already filtered",
                                          "convert without --no-filter"))
        else:
            notes.append("--no-filter: the checkpoint names no observation filter; there was none to leave out")
    elif ckpt.obs_filter is not None:
        f = ckpt.obs_filter
        if f.mean.shape not in ((spec.obs_dim,), spec.input_shape):
            raise BadModelError(f"{ckpt.filter_named_by}: the MeanStdFilter's statistics have shape {f.mean.shape}, but "
                                f"the policy takes observations of shape {spec.input_shape}: it is not this policy's "
                                "filter; convert with --no-filter to leave it out")
        prelude.obs_filter = f
        notes.append(f"baked in the MeanStdFilter ({f.count} observations, epsilon {f.epsilon:g}, "
                     f"clip {f.clip if f.clip else 'none'}); --no-filter leaves it out")
        if f.destd and not f.count:
            notes.append(f"warning: the MeanStdFilter of policy {ckpt.policy_id!r} has seen no observations: it divides "
                         f"by std + epsilon = {float(np.max(f.std)) + f.epsilon:g} at most, as RLlib does, so almost "
                         "every observation ends "
                         + (f"at the clip bound ±{f.clip:g} and the policy's output barely depends on it"
                            if f.clip else "scaled by 1/epsilon")
                         + "; was this policy ever trained?")
    elif ckpt.filter_agents:
        raise BadModelError(
            f"the checkpoint's MeanStdFilter holds the statistics of agents {', '.join(ckpt.filter_agents)} and "
            f"none of the default agent; which agent's observations module {ckpt.policy_id!r} sees is the policy "
            "mapping function's choice, which the checkpoint does not record: convert with --no-filter and "
            "feed observations filtered with that agent's statistics")
    elif ckpt.filter_named:
        raise BadModelError(
            f"{ckpt.filter_named_by} names the observation filter {ckpt.filter_named}, but its state is not in the "
            f"checkpoint (looked for {ckpt.filter_sought}); without it the policy would see unfiltered observations. "
            "Convert with --no-filter to leave the filter out (then feed filtered observations)")
    head = options.head
    if dqn and head not in (None, "categorical"):
        raise OptionError(f"--head {head} does not apply to a DQN checkpoint: its action is the argmax of its Q-values "
                          "(the categorical head, which it always has)")
    if dqn:
        head = None
    else:
        head = _action_head(ckpt.action_space, head, notes)
        if ckpt.action_space is None and head not in (None, NO_HEAD):
            assumptions.append(head_assumption(head, output=spec.output.name, width=spec.output.out_features,
                                               log_std=spec.free_log_std_name, what="the checkpoint",
                                               convention=RLLIB_SPLIT))
    model = build_mlp(spec, head=head, opset=options.opset, prelude=prelude or None,
                      postlude=_dueling if dqn else None, logits_name="advantages" if dueling else "logits",
                      metadata={"policyport.activation": "linear" if act is None else act.name
                                + (f":{act.alpha}" if act.alpha is not None else ""),
                                **({"policyport.head": "categorical"} if dqn else {})})  # its argmax action

    def reference(obs: np.ndarray) -> dict[str, np.ndarray]:
        x, out = prelude.reference(obs, spec.dtype) if prelude else (obs, {})
        out.update(reference_forward(spec, x, head))
        if dqn:
            if dueling:
                adv = out["advantages"] = out.pop("logits")
                mean = out["dueling/mean_advantage"] = adv.mean(axis=1, keepdims=True)
                centered = out["dueling/centered_advantage"] = adv - mean
                out["logits"] = out["value"] + centered
            out["action"] = np.argmax(out["logits"], axis=1).astype(np.int64)
        return out

    return Converted(model, reference, "rllib", notes, assumptions,
                     reconstruction("the checkpoint's arrays and model config", "numpy"))


def _space_text(space: tuple) -> str:
    """``("box", (2,))`` -> ``Box(2,)``, ``("discrete", 2)`` -> ``Discrete(2)``, ``MultiDiscrete[2, 3]``."""
    kind, detail = space
    if kind == "box":
        return f"Box{tuple(detail)}" if detail is not None else "Box"
    if kind == "discrete":
        return f"Discrete({detail})"
    if kind == "multidiscrete":
        return f"MultiDiscrete{list(detail)}"
    return str(kind)


def _action_head(space: tuple | None, head: str | None, notes: list[str]) -> str | None:
    """The head of a policy (not a DQN) whose checkpoint records ``space`` (or ``None``): the one the
    action distribution implies (Box -> diag-gaussian, Discrete -> categorical); ``head`` when given
    and not contradicting it; ``"none"`` (logits only) as asked. Says in ``notes`` why no head was added.

    Raises:
        OptionError: ``head`` contradicts the recorded action space (diag-gaussian for a Discrete
            one, categorical for a Box one, either for a space policyport builds no head for).
    """
    if head == NO_HEAD:  # asked for the logits alone: no head, whatever the space implies
        return head
    if space is None:
        if head is None:
            notes.append("the checkpoint does not record its action space, so no head was added (output logits only); "
                         "--head diag-gaussian or --head categorical adds one")
        return head
    implied = {"box": "diag-gaussian", "discrete": "categorical"}.get(space[0])
    if head == HALVES and implied == "diag-gaussian":  # the split RLlib's DiagGaussian makes anyway
        head = implied
    if head is not None and head != implied:
        if implied is None:
            raise OptionError(f"--head {head} does not fit the checkpoint's action space {_space_text(space)}: "
                              "policyport builds the deterministic action of Box (diag-gaussian) and Discrete "
                              "(categorical) action spaces only; convert without --head to get the logits")
        raise OptionError(f"--head {head} contradicts the checkpoint's action space {_space_text(space)}, which "
                          f"implies the {implied} head (convert without --head to get it)")
    if implied is None:
        notes.append(f"the action space {_space_text(space)} has no head policyport builds: output logits only")
    return implied


def _value_layer_names(weights: dict[str, np.ndarray]) -> list[str]:
    names = []
    for k in weights:
        m = re.search(r"(fc_value_\d+|value_out|_value_branch_separate\.\d+|_value_branch|encoder\.critic_encoder\.net\.mlp\.\d+|^vf\.net\.mlp\.\d+)", k)
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names


__all__ = ["Checkpoint", "read_checkpoint", "convert_rllib", "parse_rl_module", "INERT_MODULES"]
