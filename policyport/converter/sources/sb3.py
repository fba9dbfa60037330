"""Stable-Baselines3 ``.zip`` saves, read without SB3 and without unpickling anything they pickled.

An SB3 zip (``stable_baselines3/common/save_util.py``) holds ``policy.pth`` (a plain ``state_dict``,
read as :mod:`policyport.converter.sources.state_dict` reads one), ``data`` (JSON) and files policyport
ignores (``policy.optimizer.pth``, ``pytorch_variables.pth``). ``data`` stores each non-JSON value as
a base64 cloudpickle (``:serialized:``) beside its readable attributes (``str()`` of what is not
JSON). Used from them: the spaces' ``shape``/``_shape``, ``low``, ``high``, ``dtype``, ``n``,
``nvec``, and every ``policy_kwargs`` entry. The pickles are read from their opcodes
(:func:`pickled_value`, ``pickletools``), which never imports or runs anything: the policy class's
name, and the ``policy_kwargs`` entries the readable text lacks (an edited zip; a readable entry its
pickle contradicts is refused).

What is converted is what SB3's own classes compute: the policy class must be one of SB3's or
sb3-contrib's (:data:`SB3_POLICY_CLASSES`), since a class of the user's own can change ``predict``
with code the zip holds only pickled; every ``policy_kwargs`` entry is either read
(:data:`FORWARD_KWARGS`: ``net_arch`` from ``policy.pth``, ``activation_fn`` with the arguments of a
``functools.partial``, SB3's ``FlattenExtractor`` as the only features extractor) or known not to
change the deterministic action (:data:`INERT_KWARGS`); anything else is refused naming it.

The action head is what ``policy.predict(obs, deterministic=True)`` returns
(``stable_baselines3/common/policies.py``): Discrete -> argmax of the logits; MultiDiscrete -> one
argmax per sub-space; Box (PPO, A2C) -> the Gaussian mean clipped to the bounds, plus ``log_std``
expanded to the batch; SAC -> ``tanh`` of the mean rescaled to the bounds; TD3/DDPG -> the actor's
tanh output rescaled; DQN -> argmax of the Q-network's output; sb3-contrib's QR-DQN -> argmax of the
mean over quantiles; MaskablePPO -> the argmax over every action, as ``predict`` without action masks.
Which networks the policy holds is told by the keys of ``policy.pth``
(:func:`sb3_layout`), whatever SB3 version wrote the zip. ``VecNormalize`` statistics (``--obs-norm
FILE``, or ``<zip stem>/vecnormalize.pkl`` beside the zip, where RL Zoo keeps them) become graph nodes that normalise the observation first.
A Discrete or MultiDiscrete observation becomes an int64 graph input one-hot encoded as SB3's
``preprocess_obs`` does. A Box's bounds numpy summarised (``'[[[0 0 0 ... 0 0 0]'``, as SB3 writes
image spaces) are read from gymnasium's uniform ``low_repr``/``high_repr`` when present, and are only
needed for an action space.
"""

from __future__ import annotations

import base64
import hashlib
import json
import pickletools
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ZIP_ERRORS, BadModelError, LimitExceededError, OptionError, UnreadableFileError, listing
from ...io.schema import load_json
from ...text import bounded_repr
from .. import fields
from ..activations import TORCH_ACTIVATIONS, TORCH_DEFAULTS, ActivationNeeded, choose_activation
from ..assumptions import Assumption
from ..build import ActionHead, ObsNorm, Prelude
from ..fields import number_array, real_number, whole_number
from .sb3_policy import SB3_POLICY_CLASSES

#: SB3's default activation per policy family when ``policy_kwargs`` names none.
DEFAULT_ACTIVATION = {"ac": "tanh", "sac": "relu", "td3": "relu", "dqn": "relu", "qrdqn": "relu"}

#: The module path of the nn.Flatten in SB3's FlattenExtractor, per policy family.
FEATURES_FLATTEN = {"ac": "features_extractor.flatten", "sac": "actor.features_extractor.flatten",
                    "td3": "actor.features_extractor.flatten", "dqn": "q_net.features_extractor.flatten",
                    "qrdqn": "quantile_net.features_extractor.flatten"}




#: How messages name each family of policies.
FAMILY_TEXT = {"ac": "PPO/A2C actor-critic", "sac": "SAC", "td3": "TD3/DDPG", "dqn": "DQN", "qrdqn": "QR-DQN"}

#: sb3-contrib's MaskablePPO policy: its ``predict`` takes the action masks of each step.
MASKABLE = frozenset({"sb3_contrib.common.maskable.policies.MaskableActorCriticPolicy"})

#: ``policy_kwargs`` that shape the deterministic action, and how policyport reads each.
FORWARD_KWARGS = {
    "net_arch": "from the layers policy.pth holds (SB3's own policy loads them with strict=True)",
    "activation_fn": "torch.nn's activation classes (TORCH_ACTIVATIONS)",
    "features_extractor_class": "SB3's FlattenExtractor, the default",
    "features_extractor_kwargs": "none (FlattenExtractor takes none)",
    "n_quantiles": "checked against the quantile network's width",
    "use_sde": "false (gSDE is refused)",
    "squash_output": "false (SB3 squashes an ActorCriticPolicy's action only under gSDE)",
}

#: ``policy_kwargs`` SB3's and sb3-contrib's policy constructors take (``ActorCriticPolicy``,
#: ``SACPolicy``, ``TD3Policy``, ``DQNPolicy``, ``QRDQNPolicy``, SB3 1.x and 2.x) that the
#: deterministic action does not depend on, and why.
INERT_KWARGS = {
    "ortho_init": "it initialises weights that policy.pth replaces",
    "log_std_init": "it initialises the log_std that policy.pth replaces",
    "optimizer_class": "training only", "optimizer_kwargs": "training only",
    "n_critics": "the critics, which are not exported",
    "full_std": "gSDE only", "use_expln": "gSDE only", "sde_net_arch": "gSDE only", "clip_mean": "gSDE only",
    "share_features_extractor": "a FlattenExtractor holds no parameters to share",
    "normalize_images": "image observations only, which policyport refuses",
}

#: SB3's parameter-free features extractor, the one policyport converts, as ``data`` writes its class.
FLATTEN_EXTRACTOR = "stable_baselines3.common.torch_layers.FlattenExtractor"

#: What to do with a policy whose forward pass is code or parameters the zip does not record.
EXPORT_FROM_PYTHON = ("to convert it, load the zip with SB3 in Python (PPO.load and the like, its classes importable) "
                      "and convert a torch module whose forward returns model.policy._predict(obs, deterministic=True): "
                      "pp.convert(module, input_shape=<observation shape>)")


@dataclass(frozen=True)
class PickledGlobal:
    """A global a pickle names (``GLOBAL``, ``STACK_GLOBAL``): ``"module.QualName"``, never imported."""

    name: str


@dataclass(eq=False)
class PickledCall:
    """What a pickle would call (``REDUCE``, ``NEWOBJ``), never called: ``func`` (usually a
    :class:`PickledGlobal`), its positional ``args`` and keyword ``kwargs``, and the ``state`` a
    ``BUILD`` would then set on the result."""

    func: object
    args: tuple
    kwargs: dict = field(default_factory=dict)
    state: object = None


class _Unfollowed(Exception):
    """An opcode, or an operand, :func:`pickled_value` does not follow."""


_MARK = object()

#: Opcodes that push their operand as it is (numbers, strings, bytes), every protocol's.
_LITERAL_OPCODES = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING",
    "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
    "BINBYTES8", "BYTEARRAY8"})
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def pickled_value(serialized: str, what: str = "a pickle in the zip's data"):
    """The value a base64 pickle holds, read from its opcodes (:func:`pickletools.genops`) without
    unpickling anything: numbers, strings and containers as Python values (a set as a list), every
    global a :class:`PickledGlobal`, every call a :class:`PickledCall`. Nothing is imported or run.
    What the pickle's memo shares stays shared (a DAG, not a tree).

    Args:
        serialized: the base64 text.
        what: how to name the pickle in messages.

    Returns:
        The value; ``None`` where the text is not a base64 pickle or holds an opcode this reader does
        not follow (persistent ids, extension codes, protocol 0-1 ``INST``/``OBJ``, a container as a
        dict key).

    Raises:
        LimitExceededError: the value, written out as a tree with every shared object repeated where
            it appears, would take more than the array limit
            (:func:`policyport.converter.readers.unpickle.check_written_size`).
    """
    from ..readers.unpickle import check_written_size

    try:
        value = _follow(pickletools.genops(base64.b64decode(serialized, validate=False)))
    except Exception:  # noqa: BLE001 - not a pickle we can follow: no value
        return None
    check_written_size(value, what, _followed_children)
    return value


def _followed_children(value) -> tuple:
    """What a value :func:`_follow` built holds: a container's items, a call's function, arguments
    and state."""
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(value, PickledCall):
        return (value.func, value.args, value.kwargs, value.state)
    return ()


def _keys(items: list) -> list:
    """Dict keys as :func:`_follow` takes them: scalars only (hashing a tuple walks it, and a pickle's
    memo can nest one tuple in another 40 deep)."""
    if any(isinstance(k, (tuple, list, dict)) for k in items):
        raise _Unfollowed("a container as a dict key")
    return items


def _follow(ops):
    stack: list = []
    memo: dict[int, object] = {}

    def to_mark() -> list:
        i = len(stack) - 1 - stack[::-1].index(_MARK)
        items = stack[i + 1:]
        del stack[i:]
        return items

    for op, arg, _ in ops:
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack[-1]
        if name in _LITERAL_OPCODES:
            stack.append(arg)
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name])
        elif name == "MARK":
            stack.append(_MARK)
        elif name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET"):
            stack.append({} if name == "EMPTY_DICT" else [])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name in ("TUPLE", "LIST", "FROZENSET"):
            items = to_mark()
            stack.append(list(items) if name == "LIST" else tuple(items))
        elif name == "DICT":
            items = to_mark()
            stack.append(dict(zip(_keys(items[::2]), items[1::2])))
        elif name in ("APPEND", "APPENDS", "ADDITEMS"):
            items = [stack.pop()] if name == "APPEND" else to_mark()
            if not isinstance(stack[-1], list):
                raise _Unfollowed(name)
            stack[-1].extend(items)
        elif name in ("SETITEM", "SETITEMS"):
            items = stack[-2:] if name == "SETITEM" else to_mark()
            if name == "SETITEM":
                del stack[-2:]
            if not isinstance(stack[-1], dict):
                raise _Unfollowed(name)
            stack[-1].update(zip(_keys(items[::2]), items[1::2]))
        elif name == "GLOBAL":
            stack.append(PickledGlobal(str(arg).replace(" ", ".")))
        elif name == "STACK_GLOBAL":
            module, qualname = stack[-2:]
            del stack[-2:]
            if not isinstance(module, str) or not isinstance(qualname, str):
                raise _Unfollowed(name)
            stack.append(PickledGlobal(f"{module}.{qualname}"))
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[int(arg)])
        elif name in ("REDUCE", "NEWOBJ"):
            args = stack.pop()
            stack.append(PickledCall(stack.pop(), tuple(args)))
        elif name == "NEWOBJ_EX":
            kwargs, args = stack.pop(), stack.pop()
            stack.append(PickledCall(stack.pop(), tuple(args), dict(kwargs)))
        elif name == "BUILD":
            state = stack.pop()
            if not isinstance(stack[-1], PickledCall):
                raise _Unfollowed(name)
            stack[-1].state = state
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            to_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        else:
            raise _Unfollowed(name)
    raise _Unfollowed("no STOP")


def pickled_class_name(value) -> str | None:
    """``"module.Name"`` of a class a pickle holds (:func:`pickled_value`): by reference (a global), or
    by value, as cloudpickle pickles a class its script defined (``_make_skeleton_class(metaclass,
    name, bases, {"__module__": ...}, ...)``, ``cloudpickle/cloudpickle.py``); ``None`` for anything else."""
    if isinstance(value, PickledGlobal):
        return value.name
    if (isinstance(value, PickledCall) and isinstance(value.func, PickledGlobal)
            and value.func.name.endswith("._make_skeleton_class") and len(value.args) >= 4
            and isinstance(value.args[1], str)):
        attributes = value.args[3] if isinstance(value.args[3], dict) else {}
        return f"{attributes.get('__module__', '?')}.{value.args[1]}"
    return None


def pickled_global(serialized: str) -> str | None:
    """``"module.Name"`` of the class a base64 pickle holds (:func:`pickled_class_name`), read from its
    opcodes without unpickling; ``None`` when it holds anything else."""
    return pickled_class_name(pickled_value(serialized))


def _array(text, what: str, path: Path | None = None) -> np.ndarray:
    """A numpy array printed by ``str(array)`` (``'[-1. -1. -8.]'``), or numbers as JSON holds them, as float64.

    Args:
        text: the value ``data`` holds.
        what: the field, ``"action_space.low"``.
        path: the zip, named in messages when given.

    Raises:
        BadModelError: missing (``None``), text numpy summarised (``'[[[0 0 0 ... 0 0 0]'``: large
            arrays print only their edges), anything but numbers (bools, ragged lists, numbers beyond
            float64), or NaN.
    """
    where = f"{path}: " if path is not None else ""
    if isinstance(text, (list, int, float)) and not isinstance(text, bool):
        return number_array(text, f"{where}the zip's {what}")
    if text is None:
        raise BadModelError(f"{where}the zip's {what} is missing")
    if not isinstance(text, str):
        raise BadModelError(f"{where}the zip's {what} is a {type(text).__name__} ({str(text)[:60]!r}), not numbers or "
                            "their text")
    if "..." in text:
        raise BadModelError(f"{where}the zip's {what} is not readable text ({str(text)[:60]!r}): numpy summarised it")
    try:
        values = [float(t) for t in text.replace("[", " ").replace("]", " ").split()]
    except ValueError as e:
        raise BadModelError(f"{where}the zip's {what} is not a list of numbers: {text[:60]!r}") from e
    return number_array(values, f"{where}the zip's {what}")


def _bound(entry: dict, which: str, what: str, shape, path: Path) -> np.ndarray | BadModelError:
    """A Box's ``low`` or ``high``; for a large Box numpy summarised (SB3's image spaces), the
    scalar gymnasium keeps in ``low_repr``/``high_repr`` when the bound is uniform, spread over
    ``shape``. A bound that cannot be read comes back as the error, raised only if it is needed
    (an observation space's bounds never are)."""
    try:
        return _array(entry.get(which), what, path)
    except BadModelError as e:
        uniform = entry.get(f"{which}_repr")  # gymnasium's text of the scalar, "-1.0"
        try:
            value = float(uniform) if isinstance(uniform, str) else real_number(uniform, what, finite=False)
            return np.full(tuple(shape), value, dtype=np.float64)
        except (ValueError, BadModelError):
            return e


def _space(data: dict, key: str, path: Path) -> dict:
    """``{"type": "Box"|"Discrete"|..., "shape", "low", "high", "n", "nvec", "dtype"}`` of a space.

    Raises:
        BadModelError: no such space, no class named, a shape that is not whole numbers, a Discrete
            ``n`` or MultiDiscrete ``nvec`` that is not whole numbers of at least 1 (naming ``path``
            and the field).
    """
    entry = data.get(key)
    if not isinstance(entry, dict):
        raise BadModelError(f"the zip's data has no readable {key}")
    type_text = str(entry.get(":type:", ""))
    kind = re.sub(r".*\.", "", type_text.strip("<>'\" ").replace("class '", ""))
    if not kind:
        raise BadModelError(f"the zip's {key} does not name its space class (no :type: entry)")
    field_name = "_shape" if "_shape" in entry else "shape"
    shape = entry.get(field_name)
    space = {"type": kind, "shape": None if shape is None else fields.shape(shape, f"{path}: the zip's {key}.{field_name}"),
             "dtype": entry.get("dtype")}
    if kind == "Box":
        space["low"], space["high"] = (_bound(entry, which, f"{key}.{which}", space["shape"] or (), path)
                                       for which in ("low", "high"))
    elif kind == "Discrete":
        space["n"] = whole_number(entry.get("n"), f"{path}: the zip's {key}.n", minimum=1, text=True)
    elif kind == "MultiDiscrete":
        space["nvec"] = tuple(whole_number(v, f"{path}: the zip's {key}.nvec", minimum=1)
                              for v in _array(entry.get("nvec"), f"{key}.nvec", path).ravel())
    return space


def read_zip(path: Path) -> tuple[dict, bytes, str | None]:
    """``(data JSON, policy.pth bytes, SB3 version)`` of an SB3 zip.

    Raises:
        UnreadableFileError: not a zip, a damaged one, no ``data``/``policy.pth``, or a ``data`` member
            that is not a JSON object (not UTF-8, not JSON, nested too deeply to parse).
        LimitExceededError: a member read declares more than the array limit (checked before it is
            decompressed).
    """
    from ...io.arrays import read_zip_member

    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if not {"data", "policy.pth"} <= names:
                raise UnreadableFileError(f"{path} is not a Stable-Baselines3 save: it lacks {sorted({'data', 'policy.pth'} - names)}")
            text = read_zip_member(zf, "data", str(path))
            policy = read_zip_member(zf, "policy.pth", str(path))
            version = (read_zip_member(zf, "_stable_baselines3_version", str(path)).decode("utf-8", "replace").strip()
                       if "_stable_baselines3_version" in names else None)
    except (UnreadableFileError, LimitExceededError):  # an OSError and a MemoryError: not to be wrapped below
        raise
    except ZIP_ERRORS as e:
        if Path(path).is_file() and Path(path).stat().st_size == 0:
            raise UnreadableFileError(f"{path} is empty (an SB3 save is a zip archive)") from e
        raise UnreadableFileError(f"{path} is not a readable zip archive: {e}") from e
    data = load_json(text, f"{path}: its data member", error=UnreadableFileError)
    if not isinstance(data, dict):
        raise UnreadableFileError(f"{path}: its data member is not a JSON object")
    return data, policy, version


def _as_written(value, done: dict[int, tuple] | None = None):
    """A value :func:`pickled_value` read, as SB3 writes it readable beside its pickle
    (``stable_baselines3/common/save_util.py``, ``data_to_json``: JSON as it is, anything else as its
    ``str()``): a class ``"<class 'module.Name'>"``, a ``functools.partial`` as its ``repr``, tuples as
    lists; an object only a call would build as an :class:`_Unwritten` ``"<module.Name(...) object>"``.
    Each container is converted once (``done``: id -> (container, converted)): what the pickle shares
    stays shared."""
    done = {} if done is None else done
    if isinstance(value, (list, tuple, dict)) and id(value) in done:
        return done[id(value)][1]
    if isinstance(value, (list, tuple)):
        out: list = []
        done[id(value)] = (value, out)
        out.extend(_as_written(v, done) for v in value)
        return out
    if isinstance(value, dict):
        written: dict = {}
        done[id(value)] = (value, written)
        written.update((k if isinstance(k, str) else str(k), _as_written(v, done)) for k, v in value.items())
        return written
    if isinstance(value, bytes):
        return repr(value)
    if not isinstance(value, (PickledGlobal, PickledCall)):
        return value
    name = pickled_class_name(value)
    if name is not None:
        return f"<class '{name}'>"
    func = value.func.name if isinstance(value.func, PickledGlobal) else "?"
    if func == "functools.partial":
        state = value.state if isinstance(value.state, tuple) and len(value.state) >= 3 else (
            value.args[0] if value.args else None, (), {})
        target, args, keywords = state[0], state[1] or (), state[2] or {}
        shown = [str(_as_written(target, done))] + [bounded_repr(_as_written(a, done)) for a in args] + [
            f"{k}={bounded_repr(_as_written(v, done))}" for k, v in keywords.items()]
        return f"functools.partial({', '.join(shown)})"
    return _Unwritten(f"<{func}(...) object>")


class _Unwritten(str):
    """An object :func:`_as_written` names without knowing its ``str()``, the text SB3 writes for it."""


def _same(a, b) -> bool:
    """Whether a value :func:`_as_written` wrote (which may share containers) and one read from
    JSON (a tree) are equal as JSON: lists and tuples alike, anything but containers and JSON
    scalars by its ``str()``. The walk follows ``b``, so it ends within the size of the JSON."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
            if not (isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y)):
                return False
            pending.extend(zip(x, y))
        elif isinstance(x, dict) or isinstance(y, dict):
            if not (isinstance(x, dict) and isinstance(y, dict)) or {str(k) for k in x} != {str(k) for k in y}:
                return False
            by_text = {str(k): v for k, v in y.items()}
            pending.extend((v, by_text[str(k)]) for k, v in x.items())
        elif json.dumps(x, default=str) != json.dumps(y, default=str):
            return False
    return True


def _policy_kwargs(data: dict) -> dict:
    """The policy's ``policy_kwargs`` as the zip records them: the readable entries ``data`` writes
    beside their pickle, and those only the pickle holds, read from its opcodes
    (:func:`pickled_value`, nothing unpickled) and written as SB3 writes readable ones
    (:func:`_as_written`).

    Raises:
        BadModelError: a readable entry that shapes the action (:data:`FORWARD_KWARGS`) and its
            pickle disagree (an edited zip).
    """
    raw = data.get("policy_kwargs")
    if not isinstance(raw, dict):
        return {}
    readable = {k: v for k, v in raw.items() if not k.startswith(":")}
    pickled = pickled_value(raw[":serialized:"], "the pickle of the zip's policy_kwargs") if ":serialized:" in raw else None
    if not isinstance(pickled, dict):
        return readable
    kwargs = dict(readable)
    for key, value in pickled.items():
        written = _as_written(value)
        if key not in readable:
            kwargs[str(key)] = written
        elif key in FORWARD_KWARGS and not isinstance(written, _Unwritten) and not _same(written, readable[key]):
            raise BadModelError(f"the zip's policy_kwargs disagree with themselves: {key} reads {readable[key]!r}, and "
                                f"their pickle holds {bounded_repr(written)}; the zip was edited after SB3 saved it: save the "
                                "model again with SB3 (model.save)")
    return kwargs


def _kwargs_unreadable(data: dict) -> bool:
    """``policy_kwargs`` stored only as a pickle this reader cannot follow, with no readable entry."""
    raw = data.get("policy_kwargs")
    return (isinstance(raw, dict) and ":serialized:" in raw and not any(not k.startswith(":") for k in raw)
            and not isinstance(pickled_value(raw[":serialized:"]), dict))


@dataclass(frozen=True)
class TorchActivation:
    """An ``activation_fn`` as a zip records it: a ``torch.nn`` class (``"LeakyReLU"``) and the
    arguments a ``functools.partial`` binds to it (``args=(0.2,)``, ``kwargs={"alpha": 3.0}``).

    Attributes:
        text: as ``data`` writes it (``"<class 'torch.nn.modules.activation.ReLU'>"``).
    """

    cls: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    text: str = ""

    @property
    def name(self) -> str:
        """The policyport activation that computes it (``"leaky_relu:0.2"``).

        Raises:
            BadModelError: a class policyport does not build, or parameters its activation of that
                name does not compute (ELU with alpha 3, tanh-approximated GELU).
        """
        if self.cls not in TORCH_ACTIVATIONS:
            raise _unbuilt(self.text, "")
        name, parameters = TORCH_ACTIVATIONS[self.cls]
        if len(self.args) > len(parameters) or set(self.kwargs) - set(parameters) or any(
                k in parameters[:len(self.args)] for k in self.kwargs):
            raise _unbuilt(self.text, f"arguments that torch.nn.{self.cls}({', '.join(parameters)}) does not take")
        bound = dict(zip(parameters, self.args), **self.kwargs)
        if "negative_slope" in bound:
            slope = bound["negative_slope"]
            if isinstance(slope, bool) or not isinstance(slope, (int, float)):
                raise _unbuilt(self.text, f"its negative_slope {slope!r} is not a number")
            return f"{name}:{float(slope)!r}"
        other = {k: v for k, v in bound.items() if k in TORCH_DEFAULTS and v != TORCH_DEFAULTS[k]}
        if other:
            said = ", ".join(f"{k}={v!r}" for k, v in other.items())
            raise _unbuilt(self.text, f"{self.cls} with {said}; policyport's {name} is "
                           f"{', '.join(f'{k}={TORCH_DEFAULTS[k]!r}' for k in other)}")
        return name


def _unbuilt(text: str, detail: str) -> BadModelError:
    classes = ", ".join(c for c in TORCH_ACTIVATIONS if c not in ("LeakyReLU", "ELU", "CELU", "GELU", "Softplus"))
    return BadModelError(
        f"the policy's activation_fn is {text!r}, which policyport does not build{f' ({detail})' if detail else ''}. "
        f"It builds torch.nn's "
        f"{classes}, LeakyReLU with any negative_slope, and ELU, CELU, GELU and Softplus with their default "
        f"parameters (in functools.partial too). The zip records its activation, so --activation cannot stand in for "
        f"it; {EXPORT_FROM_PYTHON}")


_CLASS_TEXT = r"<class '([\w.]+)'>"


def torch_activation(text) -> TorchActivation:
    """An ``activation_fn`` as ``data`` writes it (``str()`` of the class, or of a
    ``functools.partial`` of it: ``"functools.partial(<class '...LeakyReLU'>, 0.2)"``), read
    without running anything (the partial's arguments as Python literals).

    Raises:
        BadModelError: text that names no ``torch.nn`` class (a class of another module, an
            object), or arguments that are not literals.
    """
    shown = (text if isinstance(text, str) else bounded_repr(text)).strip()
    partial = re.fullmatch(rf"functools\.partial\({_CLASS_TEXT}(?:, (.*))?\)", shown, re.DOTALL)
    whole = re.fullmatch(_CLASS_TEXT, shown) or re.fullmatch(r"(torch\.nn\.[\w.]+)", shown)
    match = partial or whole
    module, _, cls = (match.group(1) if match else "").rpartition(".")
    if match is None or not (module == "torch.nn" or module.startswith("torch.nn.")):
        raise _unbuilt(shown, "")
    args, kwargs = (), {}
    if partial and partial.group(2):
        import ast

        try:
            call = ast.parse(f"f({partial.group(2)})", mode="eval").body
            args = tuple(ast.literal_eval(a) for a in call.args)
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except (SyntaxError, ValueError, TypeError):
            raise _unbuilt(shown, "its arguments are not literals") from None
        if any(k is None for k in kwargs):
            raise _unbuilt(shown, "its arguments are not literals")
    return TorchActivation(cls, args, kwargs, shown)


def _check_policy_class(policy_class: str, path: Path) -> str:
    """The family of networks of an SB3 or sb3-contrib policy class (:data:`SB3_POLICY_CLASSES`).

    Raises:
        BadModelError: any other class, a subclass included: its methods can change what
            ``predict`` computes, and the zip holds their code only as a pickle policyport does not run.
    """
    if policy_class in SB3_POLICY_CLASSES:
        return SB3_POLICY_CLASSES[policy_class]
    converted = ", ".join(c.rsplit(".", 1)[1] for c in SB3_POLICY_CLASSES)
    if policy_class == "?":
        raise BadModelError(f"{path}: the policy class the zip records cannot be read (its pickle names no class), so "
                            "policyport cannot tell whether it is one of the SB3 or sb3-contrib policy classes it "
                            f"converts ({converted}); {EXPORT_FROM_PYTHON}")
    raise BadModelError(f"{path}: the policy class the zip records is {policy_class}, not a policy class of SB3 or "
                        f"sb3-contrib that policyport converts ({converted}). A class of its own (a subclass of one of "
                        "them included) can change what predict computes (_predict, extract_features, forward), and "
                        f"the zip holds that code only as a pickle, which policyport does not run; {EXPORT_FROM_PYTHON}")


def _check_policy_kwargs(kwargs: dict) -> None:
    """Refuse a ``policy_kwargs`` entry that changes the deterministic action in a way policyport
    does not build: a features extractor other than SB3's ``FlattenExtractor`` (its forward pass is
    code the zip does not record, parameter-free or not), arguments for it, ``squash_output``
    without gSDE, or an entry none of SB3's policy classes takes (:data:`FORWARD_KWARGS`,
    :data:`INERT_KWARGS`).

    Raises:
        BadModelError: naming the entry and what policyport converts.
    """
    extractor = kwargs.get("features_extractor_class")
    if extractor is not None and not (isinstance(extractor, str) and re.fullmatch(
            rf"(<class ')?{re.escape(FLATTEN_EXTRACTOR)}('>)?", extractor.strip())):
        raise BadModelError(f"the policy's features extractor is {bounded_repr(extractor)} (policy_kwargs' features_extractor_class), "
                            "and policyport converts SB3's FlattenExtractor (the default) only: another extractor's "
                            "forward pass, parameter-free or not, is code the zip does not record; "
                            f"{EXPORT_FROM_PYTHON}")
    extractor_kwargs = kwargs.get("features_extractor_kwargs")
    if extractor_kwargs not in (None, {}):
        raise BadModelError(f"the policy's policy_kwargs give its features extractor the arguments {bounded_repr(extractor_kwargs)} "
                            "(features_extractor_kwargs), which SB3's FlattenExtractor, the one policyport converts, "
                            f"does not take; {EXPORT_FROM_PYTHON}")
    if kwargs.get("squash_output") not in (None, False):
        raise BadModelError(f"the policy's policy_kwargs set squash_output={bounded_repr(kwargs['squash_output'])}, which SB3 "
                            "allows under gSDE only; policyport converts the plain Gaussian and squashed policies")
    unknown = sorted(k for k in kwargs if k not in FORWARD_KWARGS and k not in INERT_KWARGS)
    if unknown:
        shown = ", ".join(f"{k}={bounded_repr(kwargs[k])}" for k in unknown)
        raise BadModelError(f"the policy's policy_kwargs hold {shown}, which none of the SB3 or sb3-contrib policy "
                            "classes policyport converts takes, so policyport cannot tell whether it changes the action "
                            f"(it reads {', '.join(FORWARD_KWARGS)}, and {', '.join(INERT_KWARGS)} change no "
                            f"deterministic action); {EXPORT_FROM_PYTHON}")


def sb3_layout(arrays, policy_class: str, path) -> str:
    """The state_dict layout of an SB3 policy, told by the networks its keys hold: ``"sb3-actor"``
    (``actor.*``: SAC, TD3, DDPG), ``"sb3-q"`` (``q_net.q_net.*``: DQN; ``quantile_net.quantile_net.*``:
    QR-DQN) or ``"sb3"`` (``ActorCriticPolicy``: PPO, A2C; its ``action_net`` is one Linear, never the
    Sequential ``action_net.<i>`` of sb3-contrib's ARS), as every SB3 version names them.

    Raises:
        BadModelError: keys of none of these networks, naming the policy class ``data`` records.
    """
    from .state_dict import SB3_AC_PREFIXES, SB3_Q_KEY

    keys = list(arrays)
    if any(k.startswith("actor.") for k in keys):
        return "sb3-actor"
    if any(SB3_Q_KEY.match(k) for k in keys):
        return "sb3-q"
    if not keys or any(k.startswith(SB3_AC_PREFIXES) and not re.match(r"action_net\.\d", k) for k in keys):
        return "sb3"
    raise BadModelError(
        f"{path}: the policy.pth of {policy_class} holds {listing(sorted(keys), show=str)}, which fit none of the "
        "SB3 networks policyport converts (ActorCriticPolicy mlp_extractor.*/action_net.*, SAC/TD3/DDPG actor.*, "
        "DQN q_net.q_net.*, QR-DQN quantile_net.quantile_net.*)")


def read_vecnormalize(path: Path) -> ObsNorm | None:
    """The observation statistics of a ``vecnormalize.pkl``, read with the restricted unpickler.

    Returns:
        An :class:`ObsNorm`, or ``None`` when the file normalises no observation (``norm_obs`` false).

    Raises:
        UntrustedFileError: the pickle asks to call a function.
        BadModelError: dict observations, statistics missing, or statistics that are not numbers
            (text, NaN, a negative variance; an ``epsilon`` or ``clip_obs`` that is not one number).
    """
    from ..readers.unpickle import Record, load

    venv = load(path, what=str(path))
    if not isinstance(venv, Record):
        raise BadModelError(f"{path} holds a {type(venv).__name__}, not a pickled VecNormalize")
    if not venv.get("norm_obs", True):
        return None
    rms = venv.get("obs_rms")
    if isinstance(rms, dict):
        raise BadModelError(f"{path} normalises a dict observation ({', '.join(map(str, rms))}); policyport converts Box observations")
    if not isinstance(rms, Record) or not isinstance(rms.get("mean"), np.ndarray) or not isinstance(rms.get("var"), np.ndarray):
        raise BadModelError(f"{path} has no obs_rms mean/var arrays; is it a VecNormalize save?")
    var = number_array(rms.var, f"{path}: obs_rms.var")
    if (var < 0).any():
        raise BadModelError(f"{path}: obs_rms.var holds negative variances ({var.min():g})")
    epsilon = real_number(venv.get("epsilon", 1e-8), f"{path}: epsilon")
    if epsilon < 0:
        raise BadModelError(f"{path}: epsilon is {epsilon:g}; a variance's epsilon is at least 0")
    clip_obs = real_number(venv.get("clip_obs", 10.0), f"{path}: clip_obs", finite=False)
    if np.isnan(clip_obs):
        raise BadModelError(f"{path}: clip_obs is NaN")
    return ObsNorm(mean=number_array(rms.mean, f"{path}: obs_rms.mean"), var=var, epsilon=epsilon, clip_obs=clip_obs)


def convert_sb3(source, options):
    """Convert a Stable-Baselines3 ``.zip`` (PPO, A2C; the actor of SAC, TD3, DDPG; the Q-network of DQN
    and of sb3-contrib's QR-DQN) to ONNX.

    Args:
        source: the zip's path.
        options: :class:`~policyport.converter.ConvertOptions`: ``activation`` (default: the zip's
            ``policy_kwargs``, else SB3's default), ``keep_value``, ``obs_norm`` (a
            ``vecnormalize.pkl``), ``obs_filter`` (false: no VecNormalize picked up), ``opset``.

    Returns:
        A :class:`~policyport.converter.Converted`: outputs ``logits`` (a DQN's Q-values, a QR-DQN's
        quantiles), ``action`` as ``predict`` returns it (``log_std`` for a Gaussian, ``q_values`` for
        QR-DQN), ``value`` with ``keep_value``.

    Raises:
        BadModelError: gSDE, CNN feature extractors, dict observations, recurrent policies and
            action spaces without a deterministic head policyport builds, each said so; a policy
            class other than SB3's and sb3-contrib's own (:data:`SB3_POLICY_CLASSES`), or one whose
            networks are not those of policy.pth; a ``policy_kwargs`` entry that changes the action
            in a way policyport does not build (:func:`_check_policy_kwargs`), an ``activation_fn``
            it does not build (:meth:`TorchActivation.name`), readable entries their pickle
            contradicts; action bounds that cannot be read.
        OptionError: ``head`` given, an activation contradicting the zip's; ``policy_kwargs`` whose
            pickle cannot be followed and no ``--activation`` (:class:`ActivationNeeded`).
        UnreadableFileError: not an SB3 zip.
    """
    from ..options import Converted
    from ..assumptions import activation_assumption, reconstruction
    from ..build import build_mlp
    from .sb3_policy import LazyOracle, LazySource, sb3_oracle
    from .state_dict import has_torch, parse_layout, reference_for, weights_dtype_notes
    from ..readers.torch_files import as_state_dict, keep_state_dict_layout, load_torch_file

    path = Path(source)
    if options.head is not None:
        raise OptionError("--head does not apply to an SB3 zip: its action head comes from its action space")
    data, policy_bytes, version = read_zip(path)
    recorded_class = data.get("policy_class")
    serialized = recorded_class.get(":serialized:") if isinstance(recorded_class, dict) else None
    policy_class = (pickled_global(serialized) if isinstance(serialized, str) else None) or "?"
    kwargs = _policy_kwargs(data)
    obs_space, act_space = _space(data, "observation_space", path), _space(data, "action_space", path)
    _refuse_unsupported(data, kwargs, policy_class, obs_space, act_space)
    arrays = as_state_dict(load_torch_file(policy_bytes, what=f"{path}:policy.pth"), f"{path}:policy.pth")
    layout = sb3_layout(arrays, policy_class, path)
    if any(k.startswith(("lstm_actor.", "lstm_critic.")) for k in arrays):
        raise BadModelError(f"{path} is a recurrent policy (LSTM weights); policyport converts feed-forward MLP policies")
    class_family = _check_policy_class(policy_class, path)
    _check_policy_kwargs(kwargs)
    recorded = torch_activation(kwargs["activation_fn"]) if "activation_fn" in kwargs else None
    raw = data.get("policy_kwargs")
    what = ("the zip's policy_kwargs" if isinstance(raw, dict) and "activation_fn" in raw else
            "the pickle of the zip's policy_kwargs")
    unreadable = recorded is None and _kwargs_unreadable(data)
    activation = recorded.name if recorded is not None else None
    if recorded is None and not unreadable:
        # policy_kwargs read whole and naming no activation_fn: the policy class's default built it
        activation = DEFAULT_ACTIVATION[class_family]
        what = "SB3's default for this policy (its policy_kwargs name no activation_fn)"
    if unreadable and options.activation is None:
        raise ActivationNeeded(f"{path}: its policy_kwargs are stored only as a pickle whose opcodes policyport cannot "
                               "follow, so the activation is unknown: name it with --activation (SB3 builds PPO/A2C "
                               "policies with tanh unless told otherwise, SAC/TD3/DQN with relu, and RL Zoo's tunings "
                               "often change it)")
    if activation is not None and options.activation is not None:
        choose_activation(options.activation, activation, what)  # refuses a contradiction
    activation = activation or options.activation
    spec, notes, family = parse_layout(arrays, layout, activation, options.keep_value)
    if family != class_family:
        raise BadModelError(f"{path}: the zip records the policy class {policy_class}, a {FAMILY_TEXT[class_family]} "
                            f"policy, but its policy.pth holds the networks of a {FAMILY_TEXT[family]} policy")
    assumptions = []
    if unreadable:
        assumptions.append(activation_assumption(spec.activation_slots, "an SB3 zip whose policy_kwargs are pickled",
                                                 "SB3 builds every hidden layer with one activation_fn", unit="module"))
    if policy_class in MASKABLE:
        assumptions.append(Assumption("head", "argmax over every action (no action mask)", "MaskablePPO's predict "
                                      "masks the logits with the action_masks given at each step, which a zip does not "
                                      "hold", "mask logits before the argmax where some actions are invalid"))
    spec.action = _action_head(spec, family, act_space, data.get("n_quantiles"))
    prelude = _observation_prelude(obs_space)
    if prelude:
        notes.append(f"observation space {_space_text(obs_space)}: the graph takes int64 indices and one-hot encodes "
                     "them, as SB3's preprocess_obs does")
    if obs_space["shape"] and len(obs_space["shape"]) > 1:
        spec.obs_shape = tuple(obs_space["shape"])
        spec.flatten_scope = FEATURES_FLATTEN[family]
    norm_path, spec.obs_norm, assumption = _observation_normaliser(path, options, prelude, spec)
    if norm_path is not None and spec.obs_norm is None:
        notes.append(f"{norm_path} normalises no observation (its norm_obs is false): nothing baked in")
    assumptions.append(assumption)
    spec.source = {"kind": "sb3", "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                   "policy_class": policy_class, "sb3_version": version, "action_space": act_space["type"],
                   **({"obs_norm": norm_path.name} if norm_path and spec.obs_norm is not None else {})}
    # SB3's set_parameters loads policy.pth into its float32 policy (load_state_dict casts each tensor)
    notes += weights_dtype_notes(spec.dtype, options.weights_dtype, "policy.pth's parameters", np.float32,
                                 ", as SB3 does: it loads them into its float32 policy")
    model = build_mlp(spec, opset=options.opset, prelude=prelude or None, weights_dtype=options.weights_dtype,
                      dtype=computes(spec), metadata={
        "policyport.activation": activation or DEFAULT_ACTIVATION[family], "policyport.layout": layout})
    keep_state_dict_layout(model, arrays)
    network = reference_for(spec, None, computes(spec))
    if prelude:
        def network(obs: np.ndarray, _network=network) -> dict[str, np.ndarray]:
            x, out = prelude.reference(obs, computes(spec))
            out.update(_network(x))
            return out

    def fallback(why: str):
        runner = "torch modules" if has_torch() else "numpy"
        return network, reconstruction(f"the zip's policy.pth and data (not SB3's own policy: {why})", runner)

    source = LazySource(lambda: sb3_oracle(policy_class, kwargs, recorded or activation, obs_space, act_space, arrays,
                                           spec.obs_norm, options.keep_value), fallback)
    return Converted(model, source.reference, "sb3", notes, assumptions, LazyOracle(source))


#: Where SB3 and RL Zoo save the VecNormalize statistics of a policy saved as ``<folder>/<stem>.zip``:
#: ``(path relative to the folder, where it is)``; ``{stem}`` is the zip's stem. RL Zoo
#: (``rl_zoo3/exp_manager.py``) writes ``<env>.zip`` beside ``<env>/vecnormalize.pkl``; SB3's
#: documentation saves ``vec_normalize.pkl`` beside the model; both names are looked for beside it.
NORMALISER_PLACES = (
    ("{stem}/vecnormalize.pkl", "in the folder named after the zip, where RL Zoo saves it"),
    ("vecnormalize.pkl", "beside the zip, under RL Zoo's name"),
    ("vec_normalize.pkl", "beside the zip, under the name SB3's documentation saves it with"),
)


def normaliser_candidates(path: Path) -> list[tuple[Path, str]]:
    """Every file where SB3's tools save the VecNormalize statistics of the policy in ``path``, that
    exists: :data:`NORMALISER_PLACES`; SB3's ``CheckpointCallback`` (``<prefix>_<N>_steps.zip`` beside
    ``<prefix>_vecnormalize_<N>_steps.pkl``); and RL Zoo's run folder, whose ``<env>/`` holds
    ``config.yml`` beside ``vecnormalize.pkl`` (its ``best_model.zip`` sits beside that folder).

    Returns:
        ``(path, where)`` pairs, each file once.
    """
    folder, stem = path.parent, path.stem
    places = [(folder / rel.format(stem=stem), where) for rel, where in NORMALISER_PLACES]
    steps = re.fullmatch(r"(.*)_(\d+)_steps", stem)
    if steps:
        places.append((folder / f"{steps[1]}_vecnormalize_{steps[2]}_steps.pkl",
                       "beside the zip, where SB3's CheckpointCallback saves it"))
    try:
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        subfolders = []
    places += [(sub / "vecnormalize.pkl", f"in RL Zoo's hyperparameter folder {sub.name}/ beside the zip")
               for sub in subfolders if (sub / "config.yml").is_file()]
    found, seen = [], set()
    for candidate, where in places:
        if candidate.is_file() and candidate.resolve() not in seen:
            seen.add(candidate.resolve())
            found.append((candidate, where))
    return found


def _observation_normaliser(path: Path, options, prelude, spec) -> tuple[Path | None, ObsNorm | None, Assumption]:
    """The VecNormalize file to bake in (``None``: none), its statistics (``None``: none, also for a
    file whose ``norm_obs`` is false) and what that assumes: ``--obs-norm`` as given; else every file
    of :func:`normaliser_candidates`, which must agree; ``--no-filter`` leaves them out.

    Raises:
        OptionError: found files that disagree, or one that cannot be this policy's (another
            observation width, a Discrete observation): ``--obs-norm`` or ``--no-filter`` settles it.
        UnreadableFileError: ``--obs-norm`` names no file.
    """
    topic = "observation normalisation"
    if options.obs_norm is not None:
        given = Path(options.obs_norm)
        if not given.is_file():
            raise UnreadableFileError(f"{given}: no such file")
        if prelude:
            raise BadModelError(f"{given} normalises Box observations; this policy's observation space is "
                                f"{_space_text_of(prelude)}")
        norm = read_vecnormalize(given)
        _check_width(given, norm, spec, "--obs-norm")
        return given, norm, Assumption(topic, _statistics_text(given, norm), "given by --obs-norm; an SB3 zip does "
                                       "not record whether the policy was trained under VecNormalize")
    candidates = normaliser_candidates(path)
    looked = ", ".join(f"{path.parent / rel.format(stem=path.stem)}" for rel, _ in NORMALISER_PLACES)
    if not options.obs_filter:
        left = f" ({', '.join(str(c) for c, _ in candidates)} would be baked in otherwise)" if candidates else ""
        return None, None, Assumption(topic, "none", f"left out by --no-filter{left}", "convert without --no-filter")
    if not candidates:
        return None, None, Assumption(topic, "none", f"no VecNormalize statistics where SB3 and RL Zoo save them ({looked} "
                                      "...), and an SB3 zip does not record whether the policy was trained under "
                                      "VecNormalize", "--obs-norm FILE bakes one in")
    if prelude:
        raise OptionError(f"{candidates[0][0]} (found {candidates[0][1]}) normalises Box observations, and this policy "
                          f"takes {_space_text_of(prelude)} observations: it is not this policy's; --no-filter "
                          "converts without it")
    read = [(c, where, read_vecnormalize(c)) for c, where in candidates]
    for c, where, norm in read:
        _check_width(c, norm, spec, f"found {where}")
    first = read[0][2]
    differ = [c for c, _, norm in read[1:] if not _same_statistics(first, norm)]
    if differ:
        raise OptionError(f"VecNormalize files found for {path.name} disagree: {read[0][0]} and "
                          f"{', '.join(map(str, differ))} hold other statistics; name the one the policy was trained "
                          "with, --obs-norm FILE, or leave them out with --no-filter")
    chosen, where = read[0][0], read[0][1]
    also = f" (the same statistics as {', '.join(str(c) for c, _, _ in read[1:])})" if len(read) > 1 else ""
    return chosen, first, Assumption(topic, _statistics_text(chosen, first), f"found {where}{also}; an SB3 zip does "
                                     "not record whether the policy was trained under VecNormalize",
                                     "--obs-norm FILE names another" + (", --no-filter leaves it out" if first else ""))


def _statistics_text(path: Path, norm: ObsNorm | None) -> str:
    """What the model does with the observation, given the VecNormalize file ``path``."""
    if norm is None:
        return f"none: {path} normalises no observation (its norm_obs is false)"
    return f"VecNormalize statistics of {path}"


def _check_width(path: Path, norm, spec, how: str) -> None:
    """Refuse statistics of another observation width than the policy's (exit 2: the option that
    named or found them is what is wrong)."""
    if norm is not None and norm.mean.shape != (spec.obs_dim,):
        raise OptionError(f"{path} ({how}) normalises observations of shape {norm.mean.shape}, and the policy takes "
                          f"{spec.obs_dim} features: it is not this policy's; --obs-norm FILE names the right one, "
                          "--no-filter converts without")


def _same_statistics(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (a.mean.shape == b.mean.shape and np.array_equal(a.mean, b.mean) and np.array_equal(a.var, b.var)
            and a.epsilon == b.epsilon and a.clip_obs == b.clip_obs)


def _space_text_of(prelude) -> str:
    return f"Discrete({prelude.one_hot})" if prelude.one_hot is not None else f"MultiDiscrete{list(prelude.one_hot_nvec)}"


def _q_head(family: str, n: int, space: dict, n_quantiles) -> ActionHead:
    """A DQN's action, the argmax of its Q-values (``stable_baselines3/dqn/policies.py``,
    ``QNetwork._predict``), or a QR-DQN's, the argmax of the mean over its ``n / actions`` quantiles
    (``sb3_contrib/qrdqn/policies.py``); ``n_quantiles``, when ``data`` records it, must agree."""
    algorithm = "QR-DQN" if family == "qrdqn" else "DQN"
    if space["type"] != "Discrete":
        raise BadModelError(f"a {algorithm} acts in a Discrete action space, but the zip's action space is {space['type']}")
    if family == "dqn":
        if n != space["n"]:
            raise BadModelError(f"a Discrete({space['n']}) action space, but the Q-network outputs {n} values")
        return ActionHead("argmax")
    quantiles, rest = divmod(n, space["n"])
    if rest or not quantiles or isinstance(n_quantiles, int) and n_quantiles != quantiles:
        recorded = f" and n_quantiles {n_quantiles}" if isinstance(n_quantiles, int) else ""
        raise BadModelError(f"a Discrete({space['n']}) action space{recorded}, but the quantile network outputs {n} "
                            "values, not n_quantiles per action")
    return ActionHead("quantile_argmax", quantiles=quantiles)


def _observation_prelude(space: dict) -> Prelude:
    """The one-hot encoding SB3's ``preprocess_obs`` (``stable_baselines3/common/preprocessing.py``)
    applies to a Discrete or MultiDiscrete observation; an empty :class:`Prelude` for a Box."""
    if space["type"] == "Discrete":
        return Prelude(one_hot=space["n"])
    if space["type"] == "MultiDiscrete":
        return Prelude(one_hot_nvec=space["nvec"])
    return Prelude()


def _space_text(space: dict) -> str:
    return f"Discrete({space['n']})" if space["type"] == "Discrete" else f"{space['type']}{list(space.get('nvec', ()))}"


def _refuse_unsupported(data: dict, kwargs: dict, policy_class: str, obs_space: dict, act_space: dict) -> None:
    if data.get("use_sde") or kwargs.get("use_sde"):
        raise BadModelError(
            "the policy uses gSDE (use_sde=True): its exploration noise depends on the latent features and its "
            "log_std is a matrix; policyport converts the plain Gaussian and squashed policies"
        )
    name = policy_class.rsplit(".", 1)[-1]
    if "Cnn" in name or obs_space["type"] == "Box" and obs_space["shape"] and len(obs_space["shape"]) == 3:
        raise BadModelError(f"{policy_class} takes image observations {obs_space['shape']} through a CNN features "
                            "extractor; policyport converts MLP policies")
    if "MultiInput" in name or obs_space["type"] == "Dict":
        raise BadModelError("the policy takes dict observations (MultiInputPolicy); policyport converts a single Box observation")
    if "Recurrent" in name or "sb3_contrib" in policy_class and "Recurrent" in policy_class:
        raise BadModelError(f"{policy_class} is a recurrent policy; policyport converts feed-forward MLP policies")
    if obs_space["type"] not in ("Box", "Discrete", "MultiDiscrete"):
        raise BadModelError(f"the observation space is {obs_space['type']}; policyport converts Box, Discrete and "
                            "MultiDiscrete observations")
    if act_space["type"] not in ("Box", "Discrete", "MultiDiscrete"):
        raise BadModelError(f"the action space is {act_space['type']}; policyport builds the deterministic action of "
                            "Box, Discrete and MultiDiscrete spaces")


def computes(spec) -> np.dtype:
    """The dtype SB3 computes a policy of ``spec`` in: float32 for half-precision parameters, which
    ``set_parameters`` loads into its float32 policy (``load_state_dict`` casts each tensor,
    ``stable_baselines3/common/base_class.py``); else the parameters' own."""
    from ..build import HALF_DTYPES

    return np.dtype(np.float32) if spec.dtype.name in HALF_DTYPES else spec.dtype


def _action_head(spec, family: str, space: dict, n_quantiles=None) -> ActionHead:
    n = spec.output.out_features
    if family in ("dqn", "qrdqn"):
        return _q_head(family, n, space, n_quantiles)
    if space["type"] == "Discrete":
        if family != "ac" or spec.free_log_std is not None or n != space["n"]:
            raise BadModelError(f"a Discrete({space['n']}) action space, but the action network outputs {n} values")
        return ActionHead("argmax")
    if space["type"] == "MultiDiscrete":
        if family != "ac" or sum(space["nvec"]) != n:
            raise BadModelError(f"a MultiDiscrete{list(space['nvec'])} action space, but the action network outputs {n} logits")
        return ActionHead("multi_argmax", nvec=space["nvec"])
    for bound in (space["low"], space["high"]):
        if isinstance(bound, BadModelError):
            raise BadModelError(f"{bound}; cannot read the action bounds")
    low, high = space["low"].astype(computes(spec)), space["high"].astype(computes(spec))
    if low.shape != (n,) or high.shape != (n,):
        raise BadModelError(f"a Box action space of shape {space['shape']}, but the action network outputs {n} values")
    if family == "ac":
        if spec.free_log_std is None:
            raise BadModelError("a Box action space, but the policy has no log_std: not a Gaussian policy")
        return ActionHead("clip", low, high)
    from .state_dict import td3_tanh_scope

    return ActionHead("squash", low, high, tanh_scope=td3_tanh_scope(spec) if family == "td3" else "action")
