"""Source kinds: the converter of each (:data:`SOURCES`) and how a file's kind is told from its name and
layout, never by unpickling (:func:`detect_kind`)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Mapping


from ..errors import ZIP_ERRORS, BadModelError, TrustRequiredError, UnreadableFileError


#: Source kind -> ``"module:function"`` converting it; the function takes ``(source, options)``
#: and returns a :class:`Converted`.
SOURCES: dict[str, str] = {
    "npz": "policyport.converter.sources.rllib_weights:convert_npz",
    "torch": "policyport.converter.sources.torch_module:convert_torch",
    "torchscript": "policyport.converter.sources.torch_module:convert_torchscript",
    "state-dict": "policyport.converter.sources.state_dict:convert_state_dict",
    "sb3": "policyport.converter.sources.sb3:convert_sb3",
    "rllib-torch": "policyport.converter.sources.state_dict:convert_rllib_torch",
    "keras": "policyport.converter.sources.keras:convert_keras",
    "savedmodel": "policyport.converter.sources.keras:convert_savedmodel",
    "rllib": "policyport.converter.sources.rllib:convert_rllib",
    "rl-games": "policyport.converter.sources.rl_games:convert_rl_games",
    "skrl": "policyport.converter.sources.skrl:convert_skrl",
    "ml-agents": "policyport.converter.sources.ml_agents:convert_ml_agents",
    "tianshou": "policyport.converter.sources.tianshou:convert_tianshou",
    "sample-factory": "policyport.converter.sources.sample_factory:convert_sample_factory",
    "torchrl": "policyport.converter.sources.torchrl_actor:convert_torchrl",
    "cleanrl": "policyport.converter.sources.cleanrl:convert_cleanrl",
    "brax": "policyport.converter.sources.brax:convert_brax",
    "rsl-rl": "policyport.converter.sources.rsl_rl:convert_rsl_rl",
}


#: Source kinds ``--from`` accepts, in the order the help lists them.
KINDS = tuple(SOURCES)


#: Source kinds that are files or folders (``torch`` is a live module), as ``--from`` takes them.
FILE_KINDS = tuple(k for k in KINDS if k != "torch")


#: How :func:`detect_kind` tells each kind of file, for messages.
FILE_KINDS_TEXT = ("npz (.npz), sb3 (.zip), torchscript, rsl-rl, rl-games, skrl, ml-agents, tianshou, sample-factory, torchrl or state-dict (.pt, .pth), "
                   "state-dict (.safetensors), keras (.keras, .h5, .hdf5), cleanrl (.cleanrl_model), brax (a pickle naming Brax's "
                   "classes), savedmodel (a folder with saved_model.pb), rllib (checkpoint-N, or a folder with rllib_checkpoint.json or checkpoint-N), "
                   "torchrl (a folder with a torchrl.checkpoint manifest.json) and brax (an orbax checkpoint folder "
                   "brax.training.checkpoint.save wrote) by their names")


class UnknownKindError(BadModelError):
    """A source whose kind cannot be told from its name or layout (exit 3); ``kind=`` / ``--from`` names it."""


def _is_zip_with(path: Path, *members: str) -> bool:
    """Whether ``path`` is a zip archive holding every name in ``members`` (at any folder depth)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = {n.rsplit("/", 1)[-1] for n in zf.namelist()} | set(zf.namelist())
    except ZIP_ERRORS:
        return False
    return all(m in names for m in members)


def detect_kind(source) -> str:
    """The source kind of a path or object (``--from`` overrides this).

    Files are told apart by name and layout, never by loading them: an ``.npz`` is RLlib-layout
    weights; a ``.zip`` is a Stable-Baselines3 save (one lacking its ``policy.pth`` or ``data`` is
    refused by the SB3 reader, saying so); a
    ``.pt``/``.pth`` zip holding TorchScript ``code/`` is a TorchScript file, any other is a
    ``state_dict``; ``.safetensors`` is a ``state_dict``; ``.keras``/``.h5`` are Keras files; a folder
    with ``saved_model.pb`` is a TF SavedModel; a folder with ``rllib_checkpoint.json`` or a file
    named ``checkpoint-<N>`` is an RLlib checkpoint. Objects: a mapping of arrays is ``npz``, a
    ``torch.nn.Module`` is ``torch``, a Keras model or ``tf.function`` is ``keras``.

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
        kind = _detect_path(path)
        if kind is None:
            what = "folder" if path.is_dir() else "file"
            raise UnknownKindError(
                f"cannot tell what kind of policy the {what} {path} is: policyport tells {FILE_KINDS_TEXT}; "
                f"name the kind of a source named otherwise with --from KIND (kind=KIND in Python), one of "
                f"{', '.join(FILE_KINDS)}"
            )
        return kind
    module = type(source).__module__.split(".")[0]
    if module == "torch" or any(c.__module__.startswith("torch.nn") for c in type(source).__mro__):
        return "torch"
    if any(c.__module__.split(".")[0] in ("keras", "tensorflow", "tf_keras") for c in type(source).__mro__):
        return "keras"  # a Keras model (subclasses too) or a tf.function
    raise BadModelError(f"cannot convert a {type(source).__name__}; supported sources: {', '.join(KINDS)}")


def _detect_path(path: Path) -> str | None:
    name = path.name.lower()
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return "savedmodel"
        if (path / "rllib_checkpoint.json").is_file() or any(path.glob("checkpoint-*")):
            return "rllib"
        from .sources.torchrl_actor import is_torchrl_folder

        if is_torchrl_folder(path):
            return "torchrl"
        from .readers.orbax import orbax_step_folder

        if orbax_step_folder(path):  # brax.training.checkpoint.save's folder
            return "brax"
        return None
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix == ".zip":  # a damaged one gets the SB3 reader's own account of what is wrong
        return "sb3"
    if suffix in (".pt", ".pth"):
        if _is_zip_with(path, "data.pkl", "constants.pkl"):
            return "torchscript"
        return _library_checkpoint(path) or "state-dict"
    if suffix == ".safetensors":
        return "state-dict"
    if suffix in (".keras", ".h5", ".hdf5"):
        return "keras"
    if suffix == ".cleanrl_model":  # a torch zip or Flax MessagePack: the converter tells them by content
        return "cleanrl"
    if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit():
        return "rllib"
    if _is_brax_pickle(path):
        return "brax"
    return None


#: The RL libraries' checkpoint kinds :func:`_library_checkpoint` tells, in the order it asks: kind, then
#: the module of :mod:`policyport.converter.sources` and its function telling the kind's files from the
#: keys their pickle names.
_LIBRARY_CHECKS = (
    ("rsl-rl", "rsl_rl", "is_rsl_rl_checkpoint"),
    ("rl-games", "rl_games", "is_rl_games_checkpoint"),
    ("skrl", "skrl", "is_skrl_checkpoint"),
    ("ml-agents", "ml_agents", "is_ml_agents_checkpoint"),
    ("tianshou", "tianshou", "is_tianshou_file"),
    ("sample-factory", "sample_factory", "is_sample_factory_checkpoint"),
    ("torchrl", "torchrl_actor", "is_torchrl_state_dict"),
)


def _library_checkpoint(path: Path) -> str | None:
    """The kind of an RL library's checkpoint told from the keys its pickle names (never unpickled)."""
    import importlib

    for kind, module, check in _LIBRARY_CHECKS:
        if getattr(importlib.import_module(f"{__package__}.sources.{module}"), check)(path):
            return kind
    return None


def _is_brax_pickle(path: Path) -> bool:
    """Whether ``path`` is a pickle naming Brax's classes (``brax.io.model.save_params`` writes one), told
    from its opcodes without unpickling."""
    from .readers.unpickle import pickled_globals

    try:
        with open(path, "rb") as f:
            if f.read(1) != b"\x80":
                return False
        return any(g.startswith("brax.") for g in pickled_globals(path.read_bytes()))
    except Exception:  # noqa: BLE001 - an unreadable or damaged pickle is no Brax file
        return False


#: What each kind of file source is, for the refusal of a folder given as one.
_FILE_TAKES = {"npz": "an .npz (or .npy) file of weights", "torchscript": "a TorchScript .pt file",
               "state-dict": "a .pt, .pth or .safetensors file", "sb3": "an SB3 .zip file",
               "rllib-torch": "a .pt or .pth file of RLlib torch weights", "keras": "a .keras or .h5 file",
               "rl-games": "an rl_games .pth checkpoint",
               "skrl": "an skrl agent_<timestep>.pt or policy_<timestep>.pt checkpoint",
               "ml-agents": "an ML-Agents .pt checkpoint",
               "tianshou": "a Tianshou .pt or .pth file",
               "sample-factory": "a Sample Factory .pth checkpoint",
               "cleanrl": "a CleanRL .cleanrl_model file", "brax": "a file Brax's save_params wrote or a folder brax.training.checkpoint.save wrote",
               "rsl-rl": "an rsl_rl model_<iteration>.pt checkpoint"}


#: The folder kinds :func:`detect_kind` tells, for the hint naming the kind a folder is.
_FOLDERS = {"savedmodel": "a SavedModel folder", "rllib": "an RLlib checkpoint folder",
            "torchrl": "a TorchRL checkpoint folder"}


def wrong_shape_of_source(path: Path, kind: str) -> str | None:
    """Why ``path`` cannot be a ``kind`` source because it is a folder where a file is expected or a
    file where a folder is, naming the ``--from`` it would convert with when its layout tells; ``None``
    when the shape fits (or the path does not exist).
    """
    path = Path(path)
    if path.is_dir() and kind in _FILE_TAKES:
        detected = _detect_path(path)
        if detected == kind == "brax":  # an orbax checkpoint folder
            return None
        if detected in _FOLDERS:
            return f"{path} is a folder; {_FOLDERS[detected]} converts with --from {detected}"
        return f"{path} is a folder; --from {kind} takes {_FILE_TAKES[kind]}"
    if path.is_file() and kind == "savedmodel":
        detected = _detect_path(path)
        hint = f"; a {path.suffix or 'file'} file like this converts with --from {detected}" if detected else ""
        return f"{path} is a file; --from savedmodel takes a SavedModel folder (holding saved_model.pb){hint}"
    return None


#: Source kinds whose files hold code that loading them runs: kind -> (what such a source is, what of
#: it runs and when). They are read only with ``trust``; without it :func:`refuse_code_without_trust`
#: refuses them before anything loads them. No list of allowed or refused ops stands in for that: the
#: code is the policy, and whatever it does runs.
RUNS_CODE: dict[str, tuple[str, str]] = {
    "torchscript": (
        "a TorchScript file (torch.jit.save), and loading it runs code the file holds",
        ("its __setstate__ methods run while torch.jit.load loads it and its forward when policyport traces and "
         "checks it, and TorchScript code can create, read and write files"),
    ),
    "savedmodel": (
        "a TensorFlow SavedModel, and loading it runs code the folder holds",
        ("its resources' initializers run while tf.saved_model.load loads it and its serving signature when "
         "policyport traces and checks it, and TensorFlow ops can read and write files"),
    ),
}


def refuse_code_without_trust(path, kind: str, trust: bool) -> None:
    """Refuse ``path``, a source of a kind in :data:`RUNS_CODE`, unless ``trust``.

    Called by the converters of those kinds once the path is known to be of the kind (by its
    layout, never by loading it) and before anything loads it.

    Raises:
        TrustRequiredError: ``trust`` is false (exit 2), naming what the source is, what of it would
            run and ``--trust``.
    """
    if trust:
        return
    what, runs = RUNS_CODE[kind]
    raise TrustRequiredError(f"{path} is {what}: {runs}. policyport refused it without loading it (nothing from it "
                             "ran); if you trust it, pass --trust (trust=True)")
