"""The checkpoints RL libraries write with ``torch.save`` (a dict of state_dicts beside counters,
optimizer states and whatever the library pickles: an environment's state, a config object), read
without running anything from them, and the run configuration files they keep beside them.

* :func:`pickled_strings` lists the strings a checkpoint's pickle holds (its dict keys among them),
  read from the pickle's opcodes without unpickling: what tells one library's checkpoint from
  another's.
* :func:`read_checkpoint` reads torch's zip format with policyport's own reader
  (:func:`~policyport.converter.readers.torch_files.read_torch_zip`): tensors become numpy arrays,
  and every global the pickle names outside torch's tensor rebuilders, functions included, becomes
  an inert :class:`~policyport.converter.readers.unpickle.Record` that is never called. A payload
  that would run code on an ordinary ``torch.load(weights_only=False)`` (an ``env_state`` whose
  ``__reduce__`` names ``os.system``) is read as a record of what it would have called.
* :func:`read_yaml` reads a run's YAML configuration with PyYAML's safe loader, every tag it does not
  know (``!!python/object:...``, which the libraries' ``yaml.dump`` writes for objects) read as the
  plain value under it, so no object is built.
"""

from __future__ import annotations

import _compat_pickle
import io
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import ZIP_ERRORS, BadModelError, UnreadableFileError

if TYPE_CHECKING:
    import numpy as np

#: Largest pickle (``data.pkl``) :func:`pickled_strings` reads: a checkpoint's pickle holds names and
#: small values, the tensors' bytes lie beside it in the archive.
MAX_PICKLE_BYTES = 64 << 20


def _pickle_bytes(path: Path) -> bytes:
    """The ``data.pkl`` of the torch zip ``path``; ``b""`` when it is not one (or the pickle is too large)."""
    try:
        with zipfile.ZipFile(path) as zf:
            pickles = [n for n in zf.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(pickles) != 1 or zf.getinfo(pickles[0]).file_size > MAX_PICKLE_BYTES:
                return b""
            return zf.read(pickles[0])
    except (*ZIP_ERRORS, KeyError):  # a damaged archive (a zip version, compression or CRC zipfile refuses)
        return b""


def pickled_strings(path: Path) -> set[str]:
    """Every string the pickle of the torch zip ``path`` holds (dict keys among them), read from its
    opcodes without unpickling anything; empty for a file that is not a torch zip."""
    import pickletools

    found: set[str] = set()
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(_pickle_bytes(path))):
            if isinstance(arg, str) and "UNICODE" in opcode.name:
                found.add(arg)
    except Exception:  # noqa: BLE001 - a damaged pickle: what was read before the damage
        pass
    return found


def pickled_class_names(path: Path) -> set[str]:
    """Every global (``"module.Name"``) the pickle of the torch zip ``path`` names, read from its
    opcodes without importing or calling any of them; empty for a file that is not a torch zip."""
    from .unpickle import pickled_globals

    return set(pickled_globals(_pickle_bytes(path)))


def read_checkpoint(path: Path, library: str) -> dict:
    """The top-level dict a library's ``torch.save`` wrote, tensors as numpy arrays, every other
    object an inert record (see the module docstring).

    Args:
        path: the checkpoint file.
        library: the library that writes such files, for messages (``"rl_games"``).

    Raises:
        UnreadableFileError: not a torch zip, or one that holds no dict.
    """
    from .torch_files import read_torch_zip
    from .unpickle import pickled_globals

    path = Path(path)
    if not path.is_file():
        raise UnreadableFileError(f"{path}: no such file")
    modules = set()
    for text in pickled_globals(_pickle_bytes(path)):
        module, _, name = text.rpartition(".")
        modules.add(module)
        # under its Python 2 name too, which protocol 2 writes and the unpickler maps back
        modules.add(_compat_pickle.NAME_MAPPING.get((module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module),))[0])
    inert = sorted(m for m in modules - {"torch", "torch._utils", "collections"} if m)
    loaded = read_torch_zip(str(path), what=str(path), inert_modules=inert)
    if not isinstance(loaded, dict):
        raise UnreadableFileError(f"{path} holds a {type(loaded).__name__}, not the dict a {library} checkpoint is")
    return loaded


def state_dict(value, what: str) -> dict:
    """``value`` when it is a mapping of parameter names (strings) to arrays (a saved ``state_dict``).

    Raises:
        BadModelError: anything else (a key that is no name among them), naming ``what``.
    """
    import numpy as np

    if (not isinstance(value, dict) or not all(isinstance(k, str) for k in value)
            or not all(isinstance(v, np.ndarray) for v in value.values())):
        raise BadModelError(f"{what} is not a state_dict of tensors (parameter names to arrays)")
    return value


def linear_layer(sd: dict, prefix: str, what: str) -> tuple[str, np.ndarray, str, np.ndarray]:
    """``(weight name, weight (out, in), bias name, bias (out,))`` of the torch ``Linear`` saved under
    ``prefix`` in the state_dict ``sd``.

    Raises:
        BadModelError: ``prefix.weight`` or ``prefix.bias`` is missing, not a float32 array (the
            dtype torch's ``Linear`` holds, and the library's policies train in), or of shapes that are
            not a Linear layer's (a 2-d weight and a bias of its output width), naming ``what``.
    """
    import numpy as np

    w, b = sd.get(f"{prefix}.weight"), sd.get(f"{prefix}.bias")
    if w is None or b is None:
        raise BadModelError(f"{what}: {prefix} lacks its {'weight' if w is None else 'bias'}")
    for name, array in ((f"{prefix}.weight", w), (f"{prefix}.bias", b)):
        if not isinstance(array, np.ndarray) or array.dtype != np.float32:
            held = f"{array.dtype} array" if isinstance(array, np.ndarray) else type(array).__name__
            raise BadModelError(f"{what}: {name} is a {held}; policyport reads the float32 weights the library trains")
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise BadModelError(f"{what}: {prefix}.weight {w.shape} and {prefix}.bias {b.shape} are not a Linear layer")
    return f"{prefix}.weight", w, f"{prefix}.bias", b


def read_yaml(path: Path):
    """A YAML file's plain content (dicts, lists, strings, numbers), or ``None`` when it cannot be
    read (damaged, or nested deeper than PyYAML's recursive parser reaches); tags PyYAML's safe loader
    does not know are read as the plain node under them.

    Raises:
        MissingDependencyError: PyYAML is not installed.
    """
    from ...errors import require

    yaml = require("yaml", "cli", f"reading the run configuration {path}")

    class _PlainLoader(yaml.SafeLoader):
        pass

    def plain(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    _PlainLoader.add_multi_constructor("", plain)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return yaml.load(f, Loader=_PlainLoader)  # noqa: S506 - a SafeLoader subclass
    except (OSError, yaml.YAMLError, RecursionError):  # PyYAML recurses once per nested flow collection
        return None


def lookup(config, *keys, default=None):
    """``config[k0][k1]...``, or ``default`` where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(config, dict) or key not in config:
            return default
        config = config[key]
    return config
