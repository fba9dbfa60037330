"""TorchRL actors: ``torch.save(actor.state_dict())`` of a ``ProbabilisticActor`` and the checkpoint
folders ``torchrl.checkpoint.Checkpoint`` writes.

A ``ProbabilisticActor`` (``torchrl/modules/tensordict_module/actors.py``) is a
``TensorDictSequential`` of the user's ``TensorDictModule`` and a ``SafeProbabilisticModule`` that
builds the action distribution, so its ``state_dict`` keys read ``module.0.module.<...>``:

* the usual continuous actor, ``TensorDictModule(nn.Sequential(MLP(...), NormalParamExtractor()),
  out_keys=["loc", "scale"])``: ``module.0.module.0.{0,2,4}.{weight,bias}`` (torchrl's ``MLP``,
  ``torchrl/modules/models/models.py``, a ``Linear`` then the activation module, so the odd
  indices are the activations); the ``NormalParamExtractor`` (``tensordict/nn/distributions/
  continuous.py``) holds no parameter, only its ``scale_mapping`` submodule, which the
  state_dict's ``_metadata`` names (``module.0.module.1.scale_mapping``): that is how its presence
  is told. It splits the last layer's output in halves, ``loc, scale = out.chunk(2, -1)``, and
  maps ``scale = biased_softplus_1.0(scale).clamp_min(1e-4)`` =
  ``softplus(scale + log(expm1(0.99))) + 0.01`` floored at ``1e-4`` (its defaults);
* a discrete actor, ``TensorDictModule(MLP(...), out_keys=["logits"])``:
  ``module.0.module.{0,2,...}.*``, the logits of a ``OneHotCategorical`` or ``Categorical``.

The deterministic action (``set_exploration_type(ExplorationType.DETERMINISTIC)``, the
``SafeProbabilisticModule``'s default interaction type) is the distribution's
``deterministic_sample`` (``torchrl/modules/distributions/continuous.py``, ``discrete.py``):

* ``TanhNormal``: ``safe_tanh(loc)`` = ``clamp(tanh(loc), -1 + 1e-6, 1 - 1e-6)`` (``SafeTanhTransform``,
  the float32 resolution), then, when ``low``/``high`` are not -1/1, ``(high + low) / 2 + (high - low)
  / 2 * t`` (its ``_PatchedAffineTransform``); the bounds are ``distribution_kwargs`` of the actor,
  which no file records (``--action-bounds``);
* ``Normal`` / ``IndependentNormal``: ``loc``;
* ``OneHotCategorical`` / ``Categorical``: the argmax of the logits (policyport gives its index;
  ``OneHotCategorical`` returns it one-hot).

The distribution class, its ``tanh_loc`` (off by default) and the MLP's activation (``nn.Tanh``
by default) are arguments of the code that built the actor, in no file: ``--distribution`` and
``--activation`` name them. Observation transforms (``ObservationNorm``, ``VecNorm``) live in the
environment (``TransformedEnv``), not in the actor: a state_dict file holds none. A checkpoint folder may
hold one as a component of its own (the transform's or the ``TransformedEnv``'s state_dict): an
``ObservationNorm`` (``torchrl/envs/transforms/_normalization.py``) records ``loc``, ``scale`` and
``standard_normal``, and is baked in as it computes: ``(x - loc) / scale`` with ``standard_normal``,
``x * scale + loc`` without (its ``eps`` only floors ``scale`` when the statistics are made, and it
clips nothing); ``loc`` and ``scale`` stay initializers under ``<component>.<key>``. ``VecNorm``'s
running sums, whose ``eps`` no file records, are refused (``--no-filter`` converts the actor alone).

The checkpoint folder (``torchrl/checkpoint/_checkpoint.py``, ``Checkpoint.save``, format
``torchrl.checkpoint`` version 1): ``manifest.json`` names each component, its adapter and its
folder ``components/NNNN-<name>``; a ``torchrl.state_dict`` component holds ``state.json`` (the
state_dict's structure, each tensor a ``{"kind": "tensor", "key": "tensor_XXXXXXXX"}``, its
``_metadata`` kept) and ``state/`` as ``tensordict.save`` writes it: ``meta.json`` (per key: shape,
dtype, device) and one ``<key>.memmap`` per tensor, the raw little-endian bytes of the array
(``tensordict/_td.py``, ``_save_metadata``, ``MemoryMappedTensor``). policyport reads them with
numpy: every declared size is checked against the array limit before anything is allocated, and a
file of another size than its shape and dtype say is refused. Nothing from the folder is
unpickled; a component written with ``payload_format="torch"`` (``state.pt``) is read with the
restricted reader (:mod:`..readers.checkpoints`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, OptionNeeded, UnreadableFileError
from ..assumptions import Assumption

#: ``Checkpoint``'s manifest name and format (``torchrl/checkpoint/_checkpoint.py``).
MANIFEST = "manifest.json"
FORMAT = "torchrl.checkpoint"
#: The most bytes a ``manifest.json``, ``state.json`` or ``meta.json`` may take (they hold names).
MAX_JSON_BYTES = 16 << 20
#: ``tensordict``'s dtype names (``str(torch.dtype)``) -> numpy's little-endian dtypes.
DTYPES = {"torch.float32": "<f4", "torch.float64": "<f8", "torch.float16": "<f2", "torch.int64": "<i8",
          "torch.int32": "<i4", "torch.int16": "<i2", "torch.int8": "i1", "torch.uint8": "u1", "torch.bool": "?"}
#: ``SafeTanhTransform``'s clamp: ``1 - torch.finfo(float32).resolution``.
TANH_LIMIT = 1.0 - 1e-6
#: ``NormalParamExtractor``'s defaults: ``biased_softplus_1.0`` (``softplus(x + bias) + min_val`` with
#: ``bias = log(expm1(1.0 - min_val))``, ``min_val = 0.01``) then ``clamp_min(scale_lb = 1e-4)``.
SCALE_MIN_VAL = 0.01
SCALE_LB = 1e-4
#: ``--distribution`` names -> the torchrl class each stands for, and whether it is continuous.
DISTRIBUTIONS = {"tanh-normal": ("TanhNormal", True), "normal": ("Normal / IndependentNormal", True),
                 "categorical": ("OneHotCategorical / Categorical", False)}
#: The prefix of the trained actor's parameters in a loss module's state_dict (``torchrl/objectives/
#: common.py``, ``convert_to_functional``: ``<module_name>_params``, and ``target_<module_name>_params``
#: for the Polyak-averaged copy that DDPG and TD3 keep).
LOSS_ACTOR = "actor_network_params."
_KEY = re.compile(r"(?P<prefix>.*?)module\.0\.module\.(?P<seq>0\.)?(?P<index>\d+)\.(?P<role>weight|bias)")


@dataclass
class Layout:
    """A ProbabilisticActor's MLP, as the state_dict holds it (names are the state_dict's keys).

    Attributes:
        layers: ``(weight name, weight (out, in), bias name, bias (out,))`` of every ``Linear``, in
            order, the last one the output layer.
        extractor: whether a ``NormalParamExtractor`` follows the MLP (continuous actions).
        told: whether the file tells ``extractor``: an MLP inside an ``nn.Sequential`` whose ``_metadata``
            the file does not keep (a loss module's ``TensorDictParams``) may be followed by one or not.
        left_out: keys the graph does not compute.
    """

    layers: list[tuple[str, np.ndarray, str, np.ndarray]]
    extractor: bool
    told: bool = True
    left_out: list[str] = field(default_factory=list)

    @property
    def obs_dim(self) -> int:
        return int(self.layers[0][1].shape[1])

    @property
    def width(self) -> int:
        return int(self.layers[-1][1].shape[0])


# ---------------------------------------------------------------- telling and reading the files


def is_torchrl_folder(path: Path) -> bool:
    """Whether ``path`` is a folder holding a ``manifest.json`` of ``format`` ``torchrl.checkpoint``."""
    manifest = Path(path) / MANIFEST
    try:
        if not manifest.is_file() or manifest.stat().st_size > MAX_JSON_BYTES:
            return False
        return json.loads(manifest.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def is_torchrl_state_dict(path: Path) -> bool:
    """Whether the torch zip ``path`` pickles a ProbabilisticActor's state_dict (a key
    ``module.0.module.<...>.weight`` and the ``module.1``, the probabilistic module, its ``_metadata``
    names) or a loss module's (``actor_network_params.module.0.module.<...>``), read from the pickle's
    opcodes without unpickling anything."""
    from ..readers.checkpoints import pickled_strings

    strings = pickled_strings(path)
    prefixes = {m["prefix"] for m in map(_KEY.fullmatch, strings) if m}
    return ("" in prefixes and "module.1" in strings) or LOSS_ACTOR in prefixes


def _read_json(path: Path, what: str):
    from ...io.limits import check_json_bytes

    try:
        size = path.stat().st_size
    except OSError:
        raise BadModelError(f"{what} lacks {path.name}") from None
    if size > MAX_JSON_BYTES:
        raise BadModelError(f"{path} takes {size:,} bytes; a TorchRL checkpoint's {path.name} holds names and shapes "
                            f"(at most {MAX_JSON_BYTES:,} bytes read)")
    check_json_bytes(size, str(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise BadModelError(f"{path} is not readable JSON: {e}") from None


def read_tensordict_folder(folder: Path, what: str) -> dict[str, np.ndarray]:
    """The arrays of a folder ``tensordict.save`` wrote (one level: ``meta.json`` and ``<key>.memmap``).

    Args:
        folder: the folder.
        what: the source, for messages.

    Returns:
        key -> array, in the dtype and shape ``meta.json`` gives (little-endian, C order).

    Raises:
        BadModelError: no or malformed ``meta.json``; an entry of unknown dtype or a nested tensordict;
            a ``.memmap`` file missing or of another size than its shape and dtype say.
        LimitExceededError: the arrays together would take more than the array limit.
    """
    from ...io.limits import check_array_bytes

    meta = _read_json(folder / "meta.json", what)
    if not isinstance(meta, dict):
        raise BadModelError(f"{folder / 'meta.json'} is not a JSON object")
    planned: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
    total = 0
    for key, entry in meta.items():
        if key in ("shape", "device", "_type", "names", "batch_size") or key.startswith("_"):
            continue
        if not isinstance(entry, dict) or "shape" not in entry or "dtype" not in entry:
            raise BadModelError(f"{folder / 'meta.json'}: entry {key!r} is not a tensor's (shape, dtype); policyport "
                                "reads the flat tensordicts TorchRL's Checkpoint writes")
        if entry.get("is_nested"):
            raise BadModelError(f"{folder / 'meta.json'}: {key!r} is a nested tensor, which a state_dict does not hold")
        if entry["dtype"] not in DTYPES:
            raise BadModelError(f"{folder / 'meta.json'}: {key!r} has dtype {entry['dtype']!r}; policyport reads "
                                f"{', '.join(DTYPES)}")
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise BadModelError(f"{folder / 'meta.json'}: {key!r} has shape {shape!r:.80}, not a list of sizes")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", key):
            raise BadModelError(f"{folder / 'meta.json'}: key {key!r:.80} is not a file name tensordict writes")
        dtype = np.dtype(DTYPES[entry["dtype"]])
        nbytes = math.prod(shape) * dtype.itemsize
        total += nbytes
        planned.append((key, dtype, tuple(shape), nbytes))
    check_array_bytes(total, f"{folder} ({len(planned)} arrays)")
    arrays: dict[str, np.ndarray] = {}
    for key, dtype, shape, nbytes in planned:
        file = folder / f"{key}.memmap"
        if file.exists() and folder.resolve() not in file.resolve().parents:
            raise BadModelError(f"{file} links outside {folder}; a checkpoint's arrays lie in its own folder")
        try:
            size = file.stat().st_size
        except OSError:
            raise BadModelError(f"{what}: {file} is missing; meta.json declares {key!r}") from None
        if size != nbytes:
            raise BadModelError(f"{file} holds {size:,} bytes; meta.json declares {key!r} as {dtype.name} of shape "
                                f"{list(shape)}, {nbytes:,} bytes: the file is truncated or not this checkpoint's")
        with open(file, "rb") as f:
            data = f.read(nbytes)
        if len(data) != nbytes:
            raise BadModelError(f"{file} ended after {len(data):,} of {nbytes:,} bytes")
        arrays[key] = np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=True)
    return arrays


def _decode(value, tensors: dict[str, np.ndarray], where: str):
    """A state_dict from the structure ``StateDictCheckpointAdapter`` writes to ``state.json``
    (``_encode_state_dict_value``): mappings, tensors and plain values; anything else is kept as ``None``."""
    if not isinstance(value, dict):
        raise BadModelError(f"{where} is malformed: {value!r:.60} where an entry is expected")
    kind = value.get("kind")
    if kind in ("tensor", "numpy"):
        if value.get("key") not in tensors:
            raise BadModelError(f"{where} names the tensor {value.get('key')!r:.60}, which state/meta.json does not declare")
        return tensors[value["key"]]
    if kind in ("dict", "ordered_dict"):
        out = {}
        items = value.get("items", [])
        for item in items if isinstance(items, list) else [None]:
            if not (isinstance(item, list) and len(item) == 2):
                raise BadModelError(f"{where} is malformed: a mapping item is not a (key, value) pair")
            key = _decode(item[0], tensors, where)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise BadModelError(f"{where} is malformed: a mapping key is a {type(key).__name__}")
            out[key] = _decode(item[1], tensors, where)
        return out
    if kind == "value":
        return value.get("value")
    return None


def _metadata_names(value) -> set[str]:
    """The module paths a ``state.json``'s ``_metadata`` names."""
    metadata = value.get("metadata") if isinstance(value, dict) else None
    items = metadata.get("items") if isinstance(metadata, dict) else None
    names = set()
    for item in items if isinstance(items, list) else []:
        if isinstance(item, list) and item and isinstance(item[0], dict) and isinstance(item[0].get("value"), str):
            names.add(item[0]["value"])
    return names


@dataclass
class ObservationNorm:
    """An ``ObservationNorm``'s state in a checkpoint component.

    Attributes:
        component: the component's name.
        prefix: the transform's module path in the component's state_dict (``""``, ``"transform."``,
            ``"transforms.0."``).
        loc, scale: float arrays (shape ``()`` or ``(obs_dim,)``).
        standard_normal: ``(x - loc) / scale`` if true, else ``x * scale + loc``.
    """

    component: str
    prefix: str
    loc: np.ndarray
    scale: np.ndarray
    standard_normal: bool

    def name(self, key: str) -> str:
        return f"{self.component}.{self.prefix}{key}"


def read_folder(path: Path, what: str, component: str | None) -> tuple[str, dict[str, np.ndarray], set[str], dict]:
    """The state_dict of the actor component of a TorchRL checkpoint folder.

    Args:
        path: the folder (holding ``manifest.json``).
        what: the source, for messages.
        component: the component's name (``--policy-id``); ``None``: the one component whose
            state_dict holds a ProbabilisticActor's keys.

    Returns:
        ``(component name, state_dict of numpy arrays, module paths its _metadata names, manifest)``.

    Raises:
        BadModelError: no manifest of format ``torchrl.checkpoint`` version 1; no component holding an
            actor; an archive payload (``state.tdz``, ``state.tdc``); the files' faults
            (:func:`read_tensordict_folder`).
        OptionError: several components hold an actor and ``component`` names none of them, or
            ``component`` names no component.
    """
    manifest = _read_json(path / MANIFEST, what)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BadModelError(f"{path / MANIFEST} is not a TorchRL checkpoint manifest (format {FORMAT!r})")
    if manifest.get("format_version") != 1:
        raise BadModelError(f"{path / MANIFEST} has format_version {manifest.get('format_version')!r}; policyport "
                            "reads version 1 (TorchRL 0.14)")
    components = manifest.get("components")
    if not isinstance(components, dict):
        raise BadModelError(f"{path / MANIFEST} lists no components")

    def folder_of(name):
        return _component_folder(path, components[name], name)

    state_dicts = [n for n, r in components.items() if isinstance(r, dict) and r.get("adapter") == "torchrl.state_dict"]
    if component is not None:
        if component not in components:
            raise OptionError(f"--policy-id {component}: {what} has no component {component!r}; its components are "
                              f"{', '.join(components)}")
        chosen = [component]
    else:
        chosen = []
        for name in state_dicts:
            if any(_KEY.fullmatch(k) for k in _schema_keys(folder_of(name))):
                chosen.append(name)
            elif (folder_of(name) / "state.pt").is_file():
                chosen.append(name)
        if not chosen:
            raise BadModelError(f"{what} is a TorchRL checkpoint whose components ({', '.join(components)}) hold no "
                                "ProbabilisticActor state_dict (keys module.0.module.*)")
        if len(chosen) > 1:
            raise OptionError(f"{what} holds several components that may be the actor ({', '.join(chosen)}); name one "
                              "with --policy-id NAME")
    name = chosen[0]
    return (name, *_component_state(folder_of(name), components[name], name, what), manifest)


def _component_folder(path: Path, record, name: str) -> Path:
    """The folder of the component ``name`` (its manifest ``record``), refused unless inside ``path``."""
    relative = record.get("path") if isinstance(record, dict) else None
    folder = (path / str(relative)).resolve() if relative else None
    if folder is None or path.resolve() not in folder.parents:
        raise BadModelError(f"{path / MANIFEST}: component {name!r} has path {relative!r:.80}, not a folder inside "
                            "the checkpoint")
    return folder


def _schema_keys(folder: Path) -> list[str]:
    """The strings a component's ``state.json`` holds as values (its state_dict's keys among them)."""
    schema = folder / "state.json"
    if not schema.is_file() or schema.stat().st_size > MAX_JSON_BYTES:
        return []
    return re.findall(r'"value":"([^"]*)"', schema.read_text(encoding="utf-8", errors="replace"))


def _component_state(folder: Path, record: dict, name: str, what: str) -> tuple[dict, set[str]]:
    """The state_dict of one ``torchrl.state_dict`` component and the module paths its ``_metadata`` names."""
    if record.get("adapter") != "torchrl.state_dict":
        raise BadModelError(f"{what}: component {name!r} was saved by {record.get('adapter')!r}; policyport reads "
                            "torchrl.state_dict components")
    if (folder / "state.pt").is_file():
        from ..readers.checkpoints import pickled_strings, read_checkpoint

        return read_checkpoint(folder / "state.pt", "TorchRL"), pickled_strings(folder / "state.pt")
    if not (folder / "state").is_dir():
        found = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        raise BadModelError(f"{what}: component {name!r} holds {', '.join(found) or 'nothing'}; policyport reads the "
                            "directory payload (state/ and state.json, the default) and state.pt, not the tensordict "
                            "archives state.tdz and state.tdc")
    tensors = read_tensordict_folder(folder / "state", what)
    schema = _read_json(folder / "state.json", what)
    try:
        state = _decode(schema, tensors, str(folder / "state.json"))
    except RecursionError:
        raise BadModelError(f"{folder / 'state.json'} nests deeper than a state_dict does") from None
    if not isinstance(state, dict):
        raise BadModelError(f"{folder / 'state.json'} holds no state_dict")
    return state, _metadata_names(schema)


def read_normalizers(path: Path, what: str, actor: str) -> list[ObservationNorm]:
    """The ``ObservationNorm`` states the other ``torchrl.state_dict`` components of the checkpoint
    folder ``path`` hold (see the module docstring), in the components' order.

    Raises:
        BadModelError: a component holding ``VecNorm`` statistics (``*_sum``, ``*_ssq``, ``*_count``),
            whose ``eps`` no file records; an ``ObservationNorm`` whose ``loc`` or ``scale`` is not
            floating point; the files' faults (:func:`read_tensordict_folder`).
    """
    manifest = _read_json(path / MANIFEST, what)
    found = []
    for name, record in manifest["components"].items():
        if name == actor or not isinstance(record, dict) or record.get("adapter") != "torchrl.state_dict":
            continue
        folder = _component_folder(path, record, name)
        keys = _schema_keys(folder)
        if any(re.search(r"(_sum|_ssq|_count)$", k) for k in keys):
            raise BadModelError(f"{what}: component {name!r} holds VecNorm statistics, whose eps (and decay) no file "
                                "records; policyport bakes in ObservationNorm only: --no-filter converts the actor "
                                "alone (the observations then normalised as the environment does)")
        if not any(k.endswith("standard_normal") for k in keys):
            continue
        state, _ = _component_state(folder, record, name, what)
        for key, flag in state.items():
            if not (isinstance(key, str) and key.endswith("standard_normal")):
                continue
            prefix = key.removesuffix("standard_normal")
            loc, scale = state.get(f"{prefix}loc"), state.get(f"{prefix}scale")
            if not all(isinstance(a, np.ndarray) and a.dtype.kind == "f" for a in (loc, scale)):
                raise BadModelError(f"{what}: component {name!r} has {key} but no floating-point {prefix}loc and "
                                    f"{prefix}scale: an ObservationNorm whose statistics were never initialised")
            flag = np.asarray(flag)
            if flag.size != 1 or flag.dtype.kind not in "biuf":
                raise BadModelError(f"{what}: component {name!r} has {key} of shape {flag.shape} and dtype {flag.dtype}, "
                                    "not the one flag ObservationNorm records")
            found.append(ObservationNorm(name, prefix, loc, scale, bool(flag.reshape(-1)[0])))
    return found


def read_layout(state: dict, names: set[str], what: str) -> Layout:
    """Place the MLP of a ProbabilisticActor's state_dict (see the module docstring).

    Args:
        state: key -> array.
        names: the strings of its ``_metadata`` (module paths), to tell a ``NormalParamExtractor``.
        what: the source, for messages.

    Raises:
        BadModelError: no ``module.0.module.*`` Linear layers; keys under several prefixes; layers
            that do not chain; parameters at odd indices (normalisation layers); a continuous
            actor's output of odd width.
    """
    from ..readers.checkpoints import state_dict

    sd = state_dict({k: v for k, v in state.items() if isinstance(k, str) and isinstance(v, np.ndarray)}, what)
    matched = {k: _KEY.fullmatch(k) for k in sd}
    matched = {k: m for k, m in matched.items() if m}
    prefixes = sorted({m["prefix"] + ("seq" if m["seq"] else "") for m in matched.values()})
    if not matched:
        raise BadModelError(f"{what} holds {', '.join(list(sd)[:6]) or 'no tensors'}: no module.0.module.* Linear "
                            "layers, the keys of a ProbabilisticActor's state_dict")
    if len(prefixes) > 1:
        trained = [p for p in prefixes if p.startswith(LOSS_ACTOR)]
        if len(trained) != 1:
            raise BadModelError(f"{what} holds actor-like keys under several prefixes ({', '.join(prefixes)}); "
                                "policyport reads one ProbabilisticActor (save actor.state_dict())")
        matched = {k: m for k, m in matched.items() if m["prefix"] == LOSS_ACTOR}
    m0 = next(iter(matched.values()))
    base = f"{m0['prefix']}module.0.module.{'0.' if m0['seq'] else ''}"
    indices = sorted({int(m["index"]) for m in matched.values()})
    if any(i % 2 for i in indices):
        raise BadModelError(f"{what}: the MLP holds parameters at odd indices ({indices}), where torchrl's MLP puts "
                            "its activations: a normalisation or dropout layer's parameters are not read")
    layers = []
    for i in indices:
        w, b = sd.get(f"{base}{i}.weight"), sd.get(f"{base}{i}.bias")
        if w is None or b is None or w.ndim != 2 or b.shape != (w.shape[0],):
            raise BadModelError(f"{what}: {base}{i} is not a Linear layer with a bias (weight "
                                f"{None if w is None else w.shape}, bias {None if b is None else b.shape})")
        layers.append((f"{base}{i}.weight", w, f"{base}{i}.bias", b))
    for (wa, a, _, _), (wb, b, _, _) in zip(layers, layers[1:]):
        if a.shape[0] != b.shape[1]:
            raise BadModelError(f"{what}: {wa} outputs {a.shape[0]} features but {wb} takes {b.shape[1]}")
    told = f"{m0['prefix']}module.0.module.1.scale_mapping" in names
    extractor = bool(m0["seq"]) and told
    layout = Layout(layers, extractor, told=told or not m0["seq"])
    if extractor and layout.width % 2:
        raise BadModelError(f"{what}: the NormalParamExtractor splits the last layer's output in halves, but "
                            f"{layers[-1][0]} outputs {layout.width}")
    used = {n for layer in layers for n in (layer[0], layer[2])}
    layout.left_out = sorted(k for k in sd if k not in used)
    return layout


# ---------------------------------------------------------------- the graph


@dataclass
class Plan:
    """What the graph computes beyond the arrays: the hidden activation (``None``: linear), the
    distribution (a :data:`DISTRIBUTIONS` name), TanhNormal's bounds (``None``: -1 and 1) and the
    ``ObservationNorm`` applied to the observations first (``None``: none)."""

    activation: object
    distribution: str
    bounds: tuple[np.ndarray, np.ndarray] | None = None
    normalizer: ObservationNorm | None = None


def _scale_bias() -> np.float32:
    """``biased_softplus(1.0)``'s shift, ``inv_softplus(1.0 - 0.01)`` = ``log(expm1(0.99))``, as
    ``tensordict/nn/utils.py`` computes it (in float32, then ``.item()``)."""
    return np.float32(np.log(np.expm1(np.float32(1.0 - SCALE_MIN_VAL))))


def _build(layout: Layout, plan: Plan, opset: int, metadata: dict[str, str]):
    import onnx

    from ..build import Dense, MlpBuilder

    helper, f32, FLOAT = onnx.helper, np.float32, onnx.TensorProto.FLOAT
    b = MlpBuilder(opset, np.dtype(f32))
    const = b.scalar
    x = "obs"
    norm = plan.normalizer
    if norm is not None:  # ObservationNorm._apply_transform, its statistics kept under their names
        loc = b.initializer(norm.loc, norm.name("loc"), norm.name("loc"))
        scale = b.initializer(norm.scale, norm.name("scale"), norm.name("scale"))
        if norm.loc.dtype != f32 or norm.scale.dtype != f32:
            loc = b.node("Cast", [loc], "observation_norm/loc_float32", to=FLOAT)
            scale = b.node("Cast", [scale], "observation_norm/scale_float32", to=FLOAT)
        if norm.standard_normal:
            x = b.node("Div", [b.node("Sub", [x, loc], "observation_norm/centered"), scale], "observation_norm")
        else:
            x = b.node("Add", [b.node("Mul", [x, scale], "observation_norm/scaled"), loc], "observation_norm")
    x = b.torch_mlp(layout.layers[:-1], plan.activation, x)
    wname, w, bname, bias = layout.layers[-1]
    logits = b.dense(Dense(wname.rsplit(".", 1)[0], w, wname, bias, bname, "out_in"), x, "logits")
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", layout.width])]
    if not DISTRIBUTIONS[plan.distribution][1]:
        b.node("ArgMax", [logits], "action", axis=1, keepdims=0)
        outputs.append(helper.make_tensor_value_info("action", onnx.TensorProto.INT64, ["batch"]))
    else:
        n = layout.width // 2
        split = b.initializer(np.array([n, n], np.int64), "normal_param_extractor/split")
        b.nodes.append(helper.make_node("Split", [logits, split], ["loc", "normal_param_extractor/scale_raw"], axis=-1,
                                        name="normal_param_extractor"))
        shifted = b.node("Add", ["normal_param_extractor/scale_raw", const(_scale_bias(), "normal_param_extractor/bias")],
                         "normal_param_extractor/shifted")
        soft = b.node("Add", [b.node("Softplus", [shifted], "normal_param_extractor/softplus"),
                              const(SCALE_MIN_VAL, "normal_param_extractor/min_val")], "normal_param_extractor/biased_softplus")
        b.node("Max", [soft, const(SCALE_LB, "normal_param_extractor/scale_lb")], "std")
        b.node("Log", ["std"], "log_std")
        b.node("Identity", ["loc"], "mean")
        if plan.distribution == "normal":
            b.node("Identity", ["loc"], "action")
        else:
            name = "action" if plan.bounds is None else "action/tanh"
            t = b.node("Clip", [b.node("Tanh", ["loc"], "action/tanh_unclamped"), const(-TANH_LIMIT, "action/clip_min"),
                                const(TANH_LIMIT, "action/clip_max")], name)
            if plan.bounds is not None:  # _PatchedAffineTransform(loc=(high + low) / 2, scale=(high - low) / 2)
                low, high = plan.bounds
                scaled = b.node("Mul", [const((high - low) / f32(2), "action/half_range"), t], "action/scaled")
                b.node("Add", [const((high + low) / f32(2), "action/center"), scaled], "action")
        outputs = [helper.make_tensor_value_info(name, FLOAT, ["batch", n]) for name in ("action", "mean", "std", "log_std")]
        outputs.insert(0, helper.make_tensor_value_info("logits", FLOAT, ["batch", layout.width]))
    head = {"tanh-normal": "squashed", "normal": "diag-gaussian", "categorical": "categorical"}[plan.distribution]
    return b.finish(layout.obs_dim, outputs, head, metadata)


def observation_norm(norm: ObservationNorm, obs: np.ndarray) -> np.ndarray:
    """``ObservationNorm._apply_transform`` in numpy float32 (see the module docstring)."""
    loc, scale = norm.loc.astype(np.float32), norm.scale.astype(np.float32)
    return (obs - loc) / scale if norm.standard_normal else obs * scale + loc


def reference_forward(layout: Layout, plan: Plan, obs: np.ndarray) -> dict[str, np.ndarray]:
    """The actor and its distribution's ``deterministic_sample`` in numpy float32, in torchrl's order
    of operations; tensors named as the graph names them."""
    f32 = np.float32
    out: dict[str, np.ndarray] = {}
    x = np.asarray(obs, f32)
    if plan.normalizer is not None:
        x = out["observation_norm"] = observation_norm(plan.normalizer, x)
    *hidden, last = layout.layers
    for wname, w, _, bias in hidden:
        scope = wname.rsplit(".", 1)[0]
        x = out[f"{scope}/linear"] = x @ w.T + bias
        if plan.activation is not None:
            index = int(scope.rsplit(".", 1)[1])
            name = f"{scope.rsplit('.', 1)[0]}.{index + 1}/{plan.activation.label}"
            x = out[name] = plan.activation.reference(x).astype(f32)
    _, w, _, bias = last
    logits = out["logits"] = x @ w.T + bias
    if not DISTRIBUTIONS[plan.distribution][1]:
        out["action"] = np.argmax(logits, axis=1).astype(np.int64)
        return out
    loc, raw = np.split(logits, 2, axis=1)
    shifted = raw + _scale_bias()
    with np.errstate(under="ignore"):  # softplus of a very negative scale: 0, as in torch
        soft = np.logaddexp(f32(0), shifted).astype(f32) + f32(SCALE_MIN_VAL)
    out["std"] = np.maximum(soft, f32(SCALE_LB))
    out["log_std"] = np.log(out["std"])
    out["mean"] = loc
    if plan.distribution == "normal":
        out["action"] = loc
    else:
        t = np.clip(np.tanh(loc), f32(-TANH_LIMIT), f32(TANH_LIMIT))
        if plan.bounds is not None:
            low, high = plan.bounds
            t = (high + low) / f32(2) + (high - low) / f32(2) * t
        out["action"] = t
    return out


def convert_torchrl(source, options):
    """Convert a TorchRL ProbabilisticActor's state_dict file or a TorchRL checkpoint folder (see
    the module docstring) to ONNX.

    Args:
        source: the ``.pt``/``.pth`` file or the checkpoint folder.
        options: a :class:`~policyport.converter.ConvertOptions`: ``activation`` (required: the MLP's
            ``activation_class``, ``nn.Tanh`` by default in torchrl), ``distribution`` (required for a
            continuous actor: ``tanh-normal`` or ``normal``; ``categorical``, the default, for logits),
            ``action_bounds`` (TanhNormal's ``low``/``high``; default -1 and 1), ``policy_id`` (the
            checkpoint component holding the actor), ``opset``.

    Returns:
        A :class:`~policyport.converter.Converted`: input ``obs`` (float32, ``(batch, obs_dim)``),
        outputs ``logits`` (the last layer's output), ``action`` (the deterministic action), and for
        continuous actors ``mean`` (``loc``), ``std`` (``scale``) and ``log_std``; initializers
        under the state_dict's keys (``module.0.module.0.0.weight`` ...).

    Raises:
        UnreadableFileError: not a torch zip holding a dict.
        BadModelError: a layout this reader does not read; a checkpoint file of the wrong size.
        OptionError: no activation; no or an unfit distribution; action bounds that do not apply.
    """
    from ...io.kinds import sha256_file
    from ..activations import parse_activation, required_activation
    from ..assumptions import activation_assumption
    from ..options import Converted
    from ..readers.checkpoints import pickled_strings, read_checkpoint
    from ..action_bounds import action_bounds, shown

    if options.distribution is not None and options.distribution not in DISTRIBUTIONS:
        raise OptionError(f"unknown distribution {options.distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    path = Path(os.fspath(source))
    what = str(path)
    source_info: dict = {"kind": "torchrl", "file": path.name}
    if path.is_dir():
        component, state, names, manifest = read_folder(path, what, options.policy_id)
        what = f"{path}'s component {component!r}"
        source_info.update(component=component, versions=manifest.get("versions"))
    else:
        if options.policy_id is not None:
            raise OptionError("--policy-id names a component of a TorchRL checkpoint folder; "
                              f"{path} is a single state_dict file")
        if not path.is_file():
            raise UnreadableFileError(f"{path}: no such file")
        state, names = read_checkpoint(path, "TorchRL"), pickled_strings(path)
        source_info["sha256"] = sha256_file(path)
    layout = read_layout(state, names, what)
    assumptions: list[Assumption] = []
    notes: list[str] = []
    hidden = [f"{w.rsplit('.', 2)[0]}.{int(w.rsplit('.', 2)[1]) + 1}" for w, *_ in layout.layers[:-1]]
    activation_name = required_activation(options.activation, f"{what} (a TorchRL actor)", hidden,
                                          "torchrl's MLP defaults to activation_class=nn.Tanh")
    act = parse_activation(activation_name)
    if hidden:
        assumptions.append(activation_assumption([(h, activation_name) for h in hidden], f"{what} (TorchRL)",
                                                 "the MLP's activation_class is an argument of the code that built it"))
    distribution = options.distribution
    if not layout.told:
        if distribution is None:
            raise OptionNeeded(f"{what} holds the actor's MLP inside an nn.Sequential, but not the module paths that tell "
                               "whether a NormalParamExtractor follows it (a loss module's state_dict keeps none): name "
                               "the distribution with --distribution tanh-normal or normal (the output split into loc "
                               "and scale) or categorical (the output the logits)", "distribution", "categorical")
        layout.extractor = DISTRIBUTIONS.get(distribution, ("", False))[1]
        if layout.extractor and layout.width % 2:
            raise BadModelError(f"{what}: --distribution {distribution} splits the last layer's output in halves, but "
                                f"{layout.layers[-1][0]} outputs {layout.width}")
    if layout.extractor:
        if distribution is None:
            raise OptionNeeded(f"{what} is a continuous TorchRL actor (its MLP feeds a NormalParamExtractor), but no "
                               "file records its distribution_class: name it with --distribution tanh-normal (TanhNormal, "
                               "what torchrl's SAC and PPO examples use) or --distribution normal (Normal, "
                               "IndependentNormal); the deterministic action is tanh(loc) rescaled to the bounds for the "
                               "first, loc for the second", "distribution", "normal")
        if distribution not in ("tanh-normal", "normal"):
            raise OptionError(f"--distribution {distribution}: {what} splits its output into loc and scale "
                              "(NormalParamExtractor); choose tanh-normal or normal")
    else:
        if distribution not in (None, "categorical"):
            raise OptionError(f"--distribution {distribution}: {what} has no NormalParamExtractor after its MLP, so its "
                              "output is the logits of a categorical distribution (--distribution categorical)")
        distribution = "categorical"
    assumptions.append(Assumption(
        "head", f"{DISTRIBUTIONS[distribution][0]}"
        + (" with tanh_loc off" if DISTRIBUTIONS[distribution][1] else ": the argmax of the logits (its index)")
        + (" and NormalParamExtractor's biased_softplus_1.0 scale (floored at 1e-4)" if layout.extractor else ""),
        ("given by --distribution" if options.distribution else "the output is the MLP's logits")
        + "; the actor's distribution_class and distribution_kwargs are arguments of the code that built it, "
        "in no file", "--distribution names another"))
    bounds = None
    if options.action_bounds is not None:
        if distribution != "tanh-normal":
            raise OptionError(f"--action-bounds gives TanhNormal's low and high; {what} is read as "
                              f"{DISTRIBUTIONS[distribution][0]}, whose deterministic action is not rescaled")
        bounds = action_bounds(options.action_bounds, layout.width // 2, what)
        assumptions.append(Assumption("action bounds", f"low {shown(bounds[0])}, high {shown(bounds[1])}: action = "
                                      "tanh(loc) rescaled to them", "given by --action-bounds; TanhNormal's low and "
                                      "high are distribution_kwargs of the actor, in no file",
                                      "leave --action-bounds out for TanhNormal's defaults, -1 and 1"))
    elif distribution == "tanh-normal":
        assumptions.append(Assumption("action bounds", "-1 and 1 (TanhNormal's defaults): action = tanh(loc)",
                                      "TanhNormal's low and high are distribution_kwargs of the actor, in no file; "
                                      "torchrl's examples pass the environment's action spec bounds",
                                      "--action-bounds LOW:HIGH gives them"))
    normalizer = None
    if path.is_dir() and options.obs_filter:
        norms = read_normalizers(path, what, source_info["component"])
        if len(norms) > 1:
            raise BadModelError(f"{what}: several ObservationNorm states ({', '.join(n.name('loc') for n in norms)}); "
                                "policyport bakes in one: --no-filter converts the actor alone")
        if norms:
            normalizer = norms[0]
            for key, array in (("loc", normalizer.loc), ("scale", normalizer.scale)):
                if array.size not in (1, layout.obs_dim) or array.ndim > 1:
                    raise BadModelError(f"{what}: {normalizer.name(key)} has shape {array.shape}; the actor reads "
                                        f"{layout.obs_dim} observations")
    if normalizer is not None:
        formula = "(x - loc) / scale" if normalizer.standard_normal else "x * scale + loc"
        notes.append(f"baked in the ObservationNorm of component {normalizer.component!r}: {formula} "
                     f"(standard_normal {normalizer.standard_normal}, as the component records)")
    elif path.is_dir() and not options.obs_filter:
        assumptions.append(Assumption("observation normalisation", "left out (--no-filter)",
                                      f"{what}'s normaliser is not in the graph: it expects normalised observations",
                                      "leave --no-filter out to bake it in"))
    else:
        assumptions.append(Assumption(
            "observation normalisation", "none",
            f"{what} holds no normaliser: TorchRL normalises observations in the environment (ObservationNorm, VecNorm "
            "transforms of a TransformedEnv), and " + ("no component of the checkpoint holds one" if path.is_dir()
                                                      else "a state_dict file holds the actor alone"),
            "feed the observations as the transformed environment gives them"))
    if layout.left_out:
        notes.append(f"left out of the graph: {', '.join(layout.left_out)}")
    plan = Plan(None if act.name == "linear" else act, distribution, bounds, normalizer)
    metadata = {"policyport.source": json.dumps(source_info), "policyport.activation": activation_name}
    if normalizer is not None:
        metadata["policyport.observation_filter"] = json.dumps(
            {"type": "ObservationNorm", "library": "torchrl", "standard_normal": normalizer.standard_normal,
             "formula": "(x - loc) / scale" if normalizer.standard_normal else "x * scale + loc"})
    if bounds is not None:
        metadata["policyport.action_bounds"] = json.dumps({"low": bounds[0].tolist(), "high": bounds[1].tolist()})
    model = _build(layout, plan, options.opset, metadata)
    from ..assumptions import reconstruction

    return Converted(model, lambda obs: reference_forward(layout, plan, obs), "torchrl", notes=notes,
                     assumptions=assumptions, oracle=reconstruction("the arrays of a TorchRL actor"))
