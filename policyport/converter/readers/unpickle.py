"""A restricted unpickler: numpy arrays and plain containers come back; nothing from the file runs.

RLlib checkpoints and SB3's ``vecnormalize.pkl`` are pickles of framework classes (``MeanStdFilter``,
``RunningStat``, ``VecNormalize``, ``RunningMeanStd``, gym spaces, a numpy ``RandomState``).
Unpickling them the usual way imports those frameworks and runs whatever callables the file names,
so a hostile file can run any command. :func:`load` instead:

* rebuilds exactly what policyport needs and nothing that can run code: numpy arrays, dtypes and
  scalars (under both ``numpy.core`` and ``numpy._core`` names), ``OrderedDict``/``defaultdict``
  and the builtin containers and scalars;
* turns every other *class* the file names into an inert :class:`Record` of what was pickled (the
  constructor arguments and the ``__setstate__`` state), without importing its module — a
  ``MeanStdFilter`` becomes a Record whose ``state`` holds its ``shape``, ``demean``, ``rs`` ...;
* refuses, before anything is called, any *function* (a global whose name is not a class name, such
  as ``os.system`` or ``builtins.eval``) and every global of a module that can reach the operating
  system or the interpreter, naming the offending global (:class:`~policyport.errors.UntrustedFileError`).

Every size a call declares in its arguments rather than in the data the file holds — the length of
a ``range`` (``list(range(n))``), a byte count (``bytearray(n)``), an array's shape (a view of a few
bytes with stride 0 declares its whole shape) — is checked against the array limit
(:func:`policyport.io.limits.limits`), all of one file's together, before the call is made. A pickle's
memo lets a few hundred bytes describe a list nested 40 deep whose two items are the same list (a
DAG of 40 lists, a tree of 2**41): what walks a value whole — hashing a tuple key, numpy or ``str``
converting a call's argument, a reader converting the result — costs its size written out as a
tree (:func:`written_items`), which is checked against the same limit before the walk, and for the
value returned (:func:`check_written_size`). Readers that convert what was unpickled follow each
object once, as :func:`plain` does.

Only ``trust=True`` falls back to :func:`pickle.loads`, which runs the file's code, with the folders
the user's own script would import from on ``sys.path`` (:func:`user_import_path`).

Class or function is told from the global's name, as Python names them (PEP 8: ``CapWords`` for
classes); a handful of numpy and pickle reconstructors that real files use for objects policyport
does not need (a ``RandomState``) are recorded inertly rather than refused, never called.

``functools.partial`` is one of them: a class, named in lower case as the builtins are, which
``tf_keras`` uses to pickle a TensorFlow variable (``ResourceVariable.__reduce__`` returns
``(functools.partial(ResourceVariable, initial_value=..., name=...), ())``, so the pickle builds the
partial, sets its state, then calls it). The partial becomes a :class:`Record`, and a record the
pickle calls (``REDUCE`` on a record) makes another record, never a call: a recorded partial of a
recorded class gives a record of that class holding the partial's and the call's arguments together
(``record.kwargs["name"]``); any other recorded object called gives a :class:`Call` record. The
function a partial wraps is a global of its own, refused or recorded by the rules above.
"""

from __future__ import annotations

import _compat_pickle
import collections
import contextlib
import io
import math
import os
import pickle
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from ...errors import LimitExceededError, UnreadableFileError, UntrustedFileError
from ...io.limits import check_array_bytes, limits


class Record:
    """An object of a class policyport does not rebuild: what the pickle held for it, inert.

    Attributes:
        global_name: the class as the pickle names it, ``"module.QualName"``.
        args: the positional arguments the pickle would have called the class with.
        kwargs: the keyword arguments (``NEWOBJ_EX``, or a recorded ``functools.partial``'s keywords).
        state: what the pickle would have passed to ``__setstate__`` (usually the instance
            ``__dict__``), or ``None``.
        items: key -> value pairs set on it (an instance of a ``dict`` subclass).
        list_items: values appended to it (an instance of a ``list`` subclass).

    Attribute access falls through to ``state`` when it is a dict: ``record.obs_rms.mean`` reads
    ``record.state["obs_rms"].state["mean"]``.
    """

    global_name = "?"

    def __new__(cls, /, *args, **kwargs):  # pickle's NEWOBJ calls __new__ alone, without __init__
        self = super().__new__(cls)
        self.__dict__.update(args=args, kwargs=kwargs, state=None, items={}, list_items=[])
        return self

    def __init__(self, /, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)) \
                and isinstance(state[1], dict):  # (__dict__, __slots__ values)
            merged = dict(state[0] or {})
            merged.update(state[1])
            state = merged
        self.__dict__["state"] = state

    def __setitem__(self, key, value):
        self.__dict__["items"][key] = value

    def append(self, value):
        self.__dict__["list_items"].append(value)

    def extend(self, values):
        self.__dict__["list_items"].extend(values)

    def __getattr__(self, name: str):
        state = self.__dict__.get("state")
        if isinstance(state, dict) and name in state:
            return state[name]
        raise AttributeError(f"{self.global_name} record has no attribute {name!r}")

    def get(self, name: str, default=None):
        """``state[name]`` when the state is a dict holding it, else ``default``."""
        state = self.__dict__.get("state")
        return state.get(name, default) if isinstance(state, dict) else default

    def __repr__(self) -> str:
        state = self.__dict__.get("state")
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        return f"<Record {self.global_name} state={keys}>"


class Call(Record):
    """What a pickle's call of a :class:`Record` (``REDUCE`` with a record as the callable) would
    have returned, inert: ``state`` is ``{"callee": the record}``, ``args`` and ``kwargs`` the call's."""

    global_name = "call"


def _called(callee: Record, args: tuple) -> Record:
    """A pickle's call ``callee(*args)`` of a record, recorded and never made.

    A recorded ``functools.partial`` holds ``(func, args, keywords, __dict__)`` as its state
    (``functools.partial.__reduce__``); when ``func`` is a stand-in class the call would construct
    that class, so the result is its record with the partial's arguments then the call's, and the
    partial's keywords. Anything else gives a :class:`Call` record naming the callee.
    """
    state = callee.state
    if callee.global_name == "functools.partial" and isinstance(state, tuple) and len(state) == 4 \
            and isinstance(state[0], type) and issubclass(state[0], Record):
        func, bound, keywords = state[0], state[1] if isinstance(state[1], tuple) else (), state[2]
        return func(*bound, *args, **(keywords if isinstance(keywords, dict) else {}))
    call = Call(*args)
    call.__dict__["global_name"] = f"{callee.global_name}(...)"
    call.__dict__["state"] = {"callee": callee}
    return call


def _stand_in(module: str, name: str) -> type:
    """A fresh subclass of :class:`Record` standing for the class ``module.name``."""
    return type(name.rsplit(".", 1)[-1], (Record,), {"global_name": f"{module}.{name}", "__module__": "policyport.inert"})


def _numpy_core(name: str):
    """``numpy._core.<name>`` (numpy >= 2) or ``numpy.core.<name>`` (numpy 1), imported."""
    import importlib

    for prefix in ("numpy._core", "numpy.core"):
        try:
            return importlib.import_module(f"{prefix}.{name}")
        except ImportError:
            continue
    raise UnreadableFileError(f"numpy has no module core.{name}")


def _reconstructor(cls, base, state):
    """``copyreg._reconstructor`` for the classes this unpickler lets through, stand-ins included."""
    if isinstance(cls, type) and issubclass(cls, Record):  # protocols 0-1 pass a dict or list subclass's items here
        record = cls()
        if isinstance(state, dict):
            record.items.update(state)
        elif isinstance(state, list):
            record.list_items.extend(state)
        elif state is not None:
            record.args = (state,)
        return record
    if base is object:
        return object.__new__(cls)
    obj = base.__new__(cls, state)
    if base.__init__ != object.__init__:
        base.__init__(obj, state)
    return obj


def _newobj(cls, *args):
    """``copyreg.__newobj__``: ``cls.__new__(cls, *args)`` for an allowed class or a stand-in (whose
    ``__new__`` records the arguments)."""
    return cls.__new__(cls, *args)


#: The bytes one item of a sequence takes at least once it is built (a pointer in a list or tuple, an
#: int64 in an array): what a ``range`` and a value written out as a tree are sized by.
ITEM_BYTES = 8


def _length(r: range) -> int:
    """``len(r)``, also beyond ``sys.maxsize``."""
    try:
        return len(r)
    except OverflowError:
        return (abs(r.stop - r.start) + abs(r.step) - 1) // abs(r.step)


def _array_bytes(shape, dtype) -> int:
    """The bytes an array of ``shape`` and ``dtype`` takes (allocated, or viewed whatever its
    strides); 0 for arguments numpy itself refuses."""
    try:
        dims = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        itemsize = np.dtype(float if dtype is None else dtype).itemsize
    except (TypeError, ValueError, OverflowError):
        return 0
    return 0 if any(d < 0 for d in dims) else math.prod(dims) * itemsize


#: How the pickle names the reconstructors this module stands in for.
_PICKLED_NAMES = {_newobj: "copyreg.__newobj__", _reconstructor: "copyreg._reconstructor"}


def _call_text(func, args: tuple) -> str:
    """A call for a message, named as the pickle names it: classes, ranges, ints, shapes and dtypes
    as they are, anything else by its type."""
    def name(f) -> str:
        known = _PICKLED_NAMES.get(f) if callable(f) and not isinstance(f, type) else None
        return known or f"{getattr(f, '__module__', None) or '?'}.{getattr(f, '__qualname__', '?')}"

    def one(a) -> str:
        if isinstance(a, type):
            return name(a)
        if isinstance(a, (int, range, np.dtype)) or (isinstance(a, tuple) and len(a) <= 8
                                                     and all(isinstance(d, int) for d in a)):
            return repr(a)
        return type(a).__name__
    return f"{name(func)}({', '.join(one(a) for a in args[:4])}{', ...' if len(args) > 4 else ''})"


class _DeclaredSizes:
    """What the calls of one pickle allocate from sizes their arguments declare rather than from
    data the file holds — a ``range`` once listed, a byte count, an array's shape — added up and
    checked against the array limit before each call is made."""

    def __init__(self, what: str):
        self.what, self.total, self.limit = what, 0, limits().array_bytes
        self._reconstruct = _numpy_core("multiarray")._reconstruct
        self._walked: dict[int, tuple[Any, int]] = {}  # id -> (tuple or frozenset, its written size)

    def check(self, func, args: tuple, kwargs: Mapping[str, Any] | None = None) -> None:
        """Count what ``func(*args, **kwargs)`` would allocate from sizes, before it is called, and
        check the arguments it would walk whole (:meth:`walked`).

        ``copyreg.__newobj__(cls, *args)`` and ``cls.__new__`` count as ``cls`` would,
        ``copyreg._reconstructor(cls, base, state)`` as ``base(state)``, numpy's ``_reconstruct``
        as the array it makes empty.

        Raises:
            LimitExceededError: the total passes the limit, or an argument walked whole would.
        """
        kwargs = kwargs or {}
        target, sized = func, args
        if func is _newobj and args:
            target, sized = args[0], args[1:]
        elif func is _reconstructor and len(args) == 3:
            target, sized = args[1], args[2:]
        elif func is self._reconstruct and len(args) == 3:
            target, sized = np.ndarray, args[1:]
        if isinstance(target, type) and issubclass(target, Record):
            return  # a stand-in records its arguments, never builds from them
        if target in _WALKING or (isinstance(target, type) and issubclass(target, (np.generic, str))):
            for a in (*sized, *kwargs.values()):
                self.walked(a, f"{_call_text(func, args)} walks")
        nbytes = sum(_length(a) * ITEM_BYTES for a in (*sized, *kwargs.values()) if isinstance(a, range))
        if isinstance(target, type) and issubclass(target, (bytes, bytearray)) and sized and isinstance(sized[0], int):
            nbytes += max(int(sized[0]), 0)
        if isinstance(target, type) and issubclass(target, np.ndarray):
            shape = sized[0] if sized else kwargs.get("shape", ())
            nbytes += _array_bytes(shape, sized[1] if len(sized) > 1 else kwargs.get("dtype"))
        if nbytes:
            before, self.total = self.total, self.total + nbytes
            check_array_bytes(self.total, f"{self.what} asks for {_call_text(func, args)}, which"
                              + (" with what it asked for before" if before else ""),
                              self.limit, purpose="data read from a file")


    def walked(self, value, how: str) -> None:
        """Check a container about to be walked whole (a tuple hashed as a key, a call's argument
        converted), written out as a tree, against the limit; each tuple and frozenset once.

        Raises:
            LimitExceededError: naming the count, the bytes and the limit.
        """
        if not isinstance(value, (tuple, frozenset, list, dict, set)):
            return
        immutable = isinstance(value, (tuple, frozenset))
        known = self._walked.get(id(value)) if immutable else None
        n = known[1] if known else written_items(value)
        if immutable:
            self._walked[id(value)] = (value, n)  # the value kept alive: its id is not reused
        check_array_bytes(n * ITEM_BYTES, f"{self.what}: {how} objects that, written out with every object its "
                          f"pickle shares repeated where it appears, are {n:,} objects, which", self.limit,
                          purpose="data read from a file")

    def keys(self, keys) -> None:
        """Check the tuples and frozensets about to be hashed as dict keys or set items."""
        for key in keys:
            if isinstance(key, (tuple, frozenset)) and key:
                self.walked(key, "a key it hashes holds")


class _Truncating(io.BytesIO):
    """The pickle's bytes, read as the C unpickler reads them: a read that comes up short once
    something was read is a truncated pickle (``UnpicklingError``), not the ``IndexError`` the
    Python unpickler would meet."""

    def read(self, size: int = -1) -> bytes:
        at = self.tell()
        data = super().read(size)
        if at and size is not None and 0 <= len(data) < size:
            raise pickle.UnpicklingError("pickle data was truncated")
        return data


def _defaultdict(factory=None, *args):
    """``collections.defaultdict`` with an allowed factory; a stand-in factory gives a plain dict."""
    if isinstance(factory, type) and issubclass(factory, Record):
        return dict(*args)
    return collections.defaultdict(factory, *args)


#: Allowed callables that hash the items of their arguments (numpy's and ``str``'s conversions are
#: told by type): what they are given is walked whole.
_WALKING = frozenset({set, frozenset, dict, collections.OrderedDict, _defaultdict})


def _allowed() -> dict[tuple[str, str], Any]:
    """(module, name) -> what it is rebuilt as."""
    multiarray, numeric = _numpy_core("multiarray"), _numpy_core("numeric")
    real: dict[str, Any] = {
        "multiarray._reconstruct": multiarray._reconstruct,
        "multiarray.scalar": multiarray.scalar,
        "numeric._frombuffer": numeric._frombuffer,
    }
    allowed: dict[tuple[str, str], Any] = {}
    for prefix in ("numpy.core", "numpy._core"):
        for key, value in real.items():
            sub, name = key.split(".")
            allowed[(f"{prefix}.{sub}", name)] = value
    allowed.update({
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("numpy", "bool_"): np.bool_,  # numpy 1's name of the type
        ("numpy", "bool"): np.bool_,  # numpy 2's
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("collections", "defaultdict"): _defaultdict,
        ("copyreg", "_reconstructor"): _reconstructor,
        ("copyreg", "__newobj__"): _newobj,
        ("_codecs", "encode"): _latin1_encode,
    })
    for name in ("set", "frozenset", "complex", "bytearray", "bytes", "slice", "range", "list", "dict", "tuple",
                 "str", "int", "float", "bool", "object"):
        allowed[("builtins", name)] = getattr(__import__("builtins"), name)
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64"):
        allowed[("numpy", name)] = getattr(np, name)
    return allowed


def _latin1_encode(text, encoding="latin1"):  # pragma: no mutate (pickles always pass the encoding)
    """``_codecs.encode(str, "latin1")``: how protocol-2 pickles of Python 3 store ``bytes``."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise UntrustedFileError(f"the pickle asks for _codecs.encode(..., {encoding!r}); only latin1 bytes are rebuilt")
    return text.encode("latin1")  # pragma: no mutate (codec names ignore case)


#: Modules whose every global is refused, class names included: they reach the operating system,
#: the interpreter or the import machinery.
DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "sys", "builtins", "importlib", "runpy", "shutil",
    "socket", "pty", "code", "codeop", "pickle", "_pickle", "marshal", "types", "ctypes", "multiprocessing",
    "webbrowser", "platform", "signal", "threading", "_thread", "asyncio", "tempfile", "io", "_io", "pathlib",
    "glob", "inspect", "operator", "functools", "itertools", "timeit", "pdb", "bdb", "trace", "cProfile",
    "profile", "site", "sysconfig", "distutils", "setuptools", "pip", "zipimport", "pkgutil", "urllib",
    "http", "ftplib", "smtplib", "telnetlib", "xmlrpc", "requests", "gc", "weakref", "atexit", "cloudpickle",
    "dill", "joblib", "numpy.lib", "numpy.f2py", "numpy.distutils",
    "numpy.testing", "numpy.ctypeslib",
})

#: Reconstructor functions real files use for objects policyport does not need; they are recorded as
#: inert :class:`Record` s (never called) instead of being refused.
INERT_FUNCTIONS = frozenset({
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),  # a gymnasium space's Generator seed
    ("functools", "partial"),  # a class (lower case): tf_keras's pickled TensorFlow variables; see the module docstring
})


def _is_dangerous(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in DANGEROUS_MODULES)


class _RestrictedUnpickler(pickle._Unpickler):
    """pickle's own Python unpickler, with every global it looks up checked (:meth:`find_class`)
    and every call it makes checked for the sizes its arguments declare (:class:`_DeclaredSizes`):
    ``REDUCE``, ``NEWOBJ``, ``NEWOBJ_EX``, and protocol 0-1's ``INST`` and ``OBJ``. The C unpickler
    calls what it looked up with no way in between; the values it builds are the same."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file, what: str, inert_modules: Iterable[str], rebuilders: Mapping[tuple[str, str], Any] | None = None,
                 persistent_load: Callable[[Any], Any] | None = None):
        super().__init__(file)
        self._what = what
        self._sizes = _DeclaredSizes(what)
        self._allowed = _allowed()
        self._allowed.update(rebuilders or {})
        self._persistent_load = persistent_load
        self._inert_modules = tuple(inert_modules)
        self._stand_ins: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        # Python 2 names (protocols 0-2 write them) mapped as pickle's own find_class maps them
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        key = (module, name)
        if key in self._allowed:
            return self._allowed[key]
        inert = key in INERT_FUNCTIONS or any(module == m or module.startswith(m + ".") for m in self._inert_modules)
        is_class = name.split(".")[-1][:1].isupper()
        if not inert and (_is_dangerous(module) or not is_class):
            raise UntrustedFileError(
                f"{self._what} asks to call {module}.{name} while unpickling, which could run arbitrary "
                "code; policyport rebuilds only numpy arrays and plain containers from a pickle and "
                f"refused it (nothing from the file ran). If you trust this file, pass --trust (trust=True)"
            )
        if key not in self._stand_ins:
            self._stand_ins[key] = _stand_in(module, name)
        return self._stand_ins[key]

    def load_reduce(self):
        args = self.stack.pop()
        if isinstance(self.stack[-1], Record):  # an inert record called: recorded, never made
            self.stack[-1] = _called(self.stack[-1], tuple(args))
            return
        self._sizes.check(self.stack[-1], tuple(args))
        self.stack[-1] = self.stack[-1](*args)

    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        self._sizes.check(cls, tuple(args))
        self.append(cls.__new__(cls, *args))

    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self._sizes.check(cls, tuple(args), kwargs)
        self.append(cls.__new__(cls, *args, **kwargs))

    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _instantiate(self, klass, args):
        self._sizes.check(klass, tuple(args))
        super()._instantiate(klass, args)

    # the opcodes that hash keys and set items: a tuple nested in itself through the memo is checked first
    def load_setitem(self):
        self._sizes.keys(self.stack[-2:-1])
        pickle._Unpickler.load_setitem(self)

    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        self._sizes.keys(self.stack[::2])
        pickle._Unpickler.load_setitems(self)

    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_dict(self):
        self._sizes.keys(self.stack[::2])
        pickle._Unpickler.load_dict(self)

    dispatch[pickle.DICT[0]] = load_dict

    def load_additems(self):
        self._sizes.keys(self.stack)
        pickle._Unpickler.load_additems(self)

    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_frozenset(self):
        self._sizes.keys(self.stack)
        pickle._Unpickler.load_frozenset(self)

    dispatch[pickle.FROZENSET[0]] = load_frozenset

    def persistent_load(self, pid):
        if self._persistent_load is not None:
            return self._persistent_load(pid)
        raise UntrustedFileError(f"{self._what} uses persistent ids ({type(pid).__name__}), which this reader does not rebuild")


def load(source: bytes | str | os.PathLike, *, trust: bool = False, what: str | None = None,
         inert_modules: Iterable[str] = (), rebuilders: Mapping[tuple[str, str], Any] | None = None,
         persistent_load: Callable[[Any], Any] | None = None) -> Any:
    """Unpickle ``source`` without running anything from it (see the module docstring).

    Args:
        source: the pickle's bytes, or a path to it.
        trust: unpickle with :func:`pickle.loads`, which runs the file's code (default false).
        what: how to name the file in messages (default: its path, or "the pickle").
        inert_modules: module prefixes whose functions are recorded as inert :class:`Record` s
            instead of refused (for readers that must walk, never call, framework helpers).
        rebuilders: (module, name) -> a function of policyport's own that rebuilds that global
            from plain arguments (the torch reader's ``torch._utils._rebuild_tensor_v2`` -> a numpy
            array); the file's own callables are never reached this way.
        persistent_load: resolves the pickle's persistent ids (torch's storages in the archive);
            without it a persistent id is refused.

    Returns:
        The unpickled object: numpy arrays, builtin containers and scalars, and :class:`Record` s.

    Raises:
        UntrustedFileError: the pickle names a function or a dangerous module (without ``trust``).
        UnreadableFileError: the file cannot be read or is not a valid pickle.
        LimitExceededError: (without ``trust``) its calls declare more than the array limit (a
            ``range``, a byte count, an array's shape), or its value, written out as a tree, would
            (:func:`check_written_size`); nothing that large was allocated.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        what = what or str(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise UnreadableFileError(f"cannot read {path}: {e}") from e
    else:
        data, what = bytes(source), what or "the pickle"
    try:
        if trust:
            with user_import_path(source if isinstance(source, (str, os.PathLike)) else None):
                return pickle.loads(data)  # noqa: S301 — the user said they trust this file
        value = _RestrictedUnpickler(_Truncating(data), what, inert_modules, rebuilders, persistent_load).load()
    except (UntrustedFileError, LimitExceededError):
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            ImportError, UnicodeDecodeError, OverflowError, RecursionError,
            SystemError) as e:  # SystemError: numpy's C __setstate__ handed a state of the wrong shape
        unimportable = trust and unimportable_class(e, what, source if isinstance(source, (str, os.PathLike)) else None)
        if unimportable:
            raise UnreadableFileError(unimportable) from e
        raise UnreadableFileError(f"{what} is not a readable pickle: {type(e).__name__}: {e}") from e
    check_written_size(value, what)
    return value


@contextlib.contextmanager
def user_import_path(source: str | os.PathLike | None = None) -> Iterator[None]:
    """The folders a user's own script imports from, first on ``sys.path`` while a trusted file loads.

    A pickled object names its class by module (``mypolicy.MyPolicy``), and unpickling imports that
    module. ``python train.py`` puts the script's folder first on ``sys.path`` and ``python -m`` the
    current folder, so the script that saved the file found ``mypolicy.py`` beside it; the
    ``policyport`` console script puts neither there. Inside this context the current working directory,
    then the folder of ``source`` (when it is a path), come first on ``sys.path`` unless already on it
    (``""`` counts as the current directory); on leaving, exactly the entries added are removed again
    (the modules imported meanwhile stay in ``sys.modules``). Only trusted loads use it: the restricted
    readers import nothing from a file.

    Args:
        source: the file being loaded, or ``None`` (bytes from inside an archive).
    """
    folders = [Path.cwd()]
    if source is not None:
        folders.append(Path(source).resolve().parent)
    present = {Path(entry or ".").resolve() for entry in sys.path if isinstance(entry, str)}
    added = [str(f) for f in dict.fromkeys(f.resolve() for f in folders) if f not in present]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            if entry in sys.path:
                sys.path.remove(entry)


#: pickle's message for a class it cannot find in an imported module (``pickle.py``, ``find_class``).
_MISSING_ATTRIBUTE = re.compile(r"Can't get attribute '([^']+)' on <module '([^']+)'")


def unimportable_class(error: BaseException, what: str, source: str | os.PathLike | None = None) -> str | None:
    """What to tell a user whose trusted file needs a module or class Python cannot import, or ``None``.

    Args:
        error: what unpickling raised: a ``ModuleNotFoundError`` (a module the pickle names, or one
            it imports, is nowhere on the import path) or pickle's ``AttributeError`` for a class its
            module lacks (above all a class defined in the script that saved the file, ``__main__``).
        what: how to name the file in the message.
        source: the file's path, when it has one (its folder was searched too).

    Returns:
        A message naming the module, where it was looked for and what to do; ``None`` for any other error.
    """
    searched = f"the current folder ({Path.cwd()})"
    if source is not None and Path(source).resolve().parent != Path.cwd().resolve():
        searched += f", the file's folder ({Path(source).resolve().parent})"
    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.split(".")[0]
        return (f"{what} needs module {error.name!r} to be unpickled, and Python cannot import it ({searched} and "
                f"the installed packages were searched): run policyport from the folder that holds {top}.py (or the "
                f"package {top}/), add that folder to PYTHONPATH, or install the package that provides it")
    m = _MISSING_ATTRIBUTE.search(str(error)) if isinstance(error, AttributeError) else None
    if m is None:
        return None
    if m[2] == "__main__" or m[2].endswith(".__main__"):  # python -m runs a package's __main__ under that name
        return (f"{what} pickles class {m[1]!r} of the script that saved it (module __main__), which no other "
                "program can import: define the class in a module of its own (a .py file the script imports) and "
                "save the model again, or save its state_dict (torch.save(model.state_dict())) and convert that")
    origin = getattr(sys.modules.get(m[2]), "__file__", None)
    return (f"{what} pickles class {m[1]!r} of module {m[2]!r}, which the module imported"
            + (f" from {origin}" if origin else "") + " does not define: another version of it, or another module of "
            f"that name, comes first on the import path (searched before the installed packages: {searched})")


#: The opcodes that push a string (the operands of ``STACK_GLOBAL``), every protocol's.
_STRING_OPCODES = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING",
                             "SHORT_BINSTRING"})


def pickled_globals(data: bytes) -> list[str]:
    """Every global (``"module.name"``) the pickles at the start of ``data`` name, in order, read
    from their opcodes without unpickling anything.

    ``data`` may hold several pickles one after another (torch's legacy format writes five, then raw
    storage bytes); reading stops at the first bytes that are not a pickle. ``STACK_GLOBAL``'s two
    names are the last two strings pushed, memoised ones included: the memo is numbered as the
    unpickler numbers it (``MEMOIZE`` counts every object memoised, strings or not), so a module name
    fetched back from the memo is the one the unpickler would use.
    """
    import pickletools

    found: list[str] = []
    start = 0
    while start < len(data):  # pragma: no mutate (at the end, genops raises on no bytes: <= reads the same)
        pushed: list[Any] = []  # the strings pushed, in order ("" for a memo entry that holds no string)
        memo: dict[int, Any] = {}
        # the string on top of the stack if the last opcode pushed one, else "" (what a non-string is
        # memoised as reaches STACK_GLOBAL only in a pickle the unpickler refuses as malformed)
        top = ""  # pragma: no mutate
        try:
            for opcode, arg, pos in pickletools.genops(io.BytesIO(data[start:])):
                name = opcode.name
                if name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):  # every object memoised takes an index
                    memo[len(memo) if name == "MEMOIZE" else int(arg)] = top
                    continue
                top = ""  # pragma: no mutate
                if name in ("GLOBAL", "INST"):
                    found.append(str(arg).replace(" ", "."))
                elif name == "STACK_GLOBAL" and len(pushed) >= 2:
                    found.append(f"{pushed[-2]}.{pushed[-1]}")
                elif name in _STRING_OPCODES:
                    top = str(arg)
                    pushed.append(top)
                elif name in ("GET", "BINGET", "LONG_BINGET"):
                    top = memo.get(int(arg), "")
                    pushed.append(top)
        except Exception:  # noqa: BLE001 - the bytes after the last pickle (or a damaged one): stop reading
            break
        start += pos + 1  # genops ends at the STOP opcode or raises
    return found


def refused_global(data: bytes, allowed_roots: Iterable[str] = ()) -> str | None:
    """The first global of the pickles in ``data`` that this module's reader would refuse
    (:func:`pickled_globals`): a function or a class of a dangerous module, not among the plain
    containers and numpy types it rebuilds, nor in a module under ``allowed_roots`` (``("torch",)``
    for a torch file, whose tensor rebuilders torch's own reader allows); ``None`` if none is."""
    allowed = _allowed()
    for text in pickled_globals(data):
        module, _, name = text.rpartition(".")
        if (module, name) in allowed or any(module == r or module.startswith(r + ".") for r in allowed_roots):
            continue
        if _is_dangerous(module) or not name[:1].isupper() or (module, name) in INERT_FUNCTIONS:
            return text
    return None


def plain(value: Any) -> Any:
    """``value`` with every :class:`Record` replaced by a dict of its state (recursively), for
    readers that want plain data: ``{"__class__": "module.Name", **state}``.

    Each object is converted once: what the pickle shares (its memo makes a DAG, not a tree) stays
    shared in the result, so a list nested 40 deep whose two items are the same list costs 40 steps.
    """
    return _plain(value, {})


def _plain(value: Any, done: dict[int, tuple[Any, Any]]) -> Any:
    """:func:`plain`, with ``done``: id -> (object, what it became)."""
    if not isinstance(value, (Record, dict, list, tuple)):
        return value
    if id(value) in done:
        return done[id(value)][1]
    if isinstance(value, tuple):
        out: Any = tuple(_plain(v, done) for v in value)
        done[id(value)] = (value, out)
        return out
    out = {"__class__": value.global_name} if isinstance(value, Record) else {} if isinstance(value, dict) else []
    done[id(value)] = (value, out)  # before the items: a container holding itself holds its copy
    if isinstance(value, list):
        out.extend(_plain(v, done) for v in value)
    elif isinstance(value, dict):
        out.update((k, _plain(v, done)) for k, v in value.items())
    else:
        state = value.state
        if isinstance(state, dict):
            out.update((str(k), _plain(v, done)) for k, v in state.items())
        elif state is not None:
            out["__state__"] = _plain(state, done)
        if value.args:
            out["__args__"] = [_plain(a, done) for a in value.args]
        if value.items:
            out["__items__"] = {k: _plain(v, done) for k, v in value.items.items()}
    return out


def _children(value: Any) -> Iterable[Any]:
    """What a container holds: a list's, tuple's or set's items, a dict's keys and values, a
    :class:`Record`'s arguments, state and items; nothing for anything else."""
    if isinstance(value, Record):
        d = value.__dict__
        return (d.get("args"), d.get("kwargs"), d.get("state"), d.get("items"), d.get("list_items"))
    if isinstance(value, dict):
        return (*value.keys(), *value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    return ()


def written_items(value: Any, children: Callable[[Any], Iterable[Any]] = _children) -> int:
    """How many objects ``value`` holds written out as a tree (by ``repr``, ``json.dumps``,
    ``numpy.asarray``, a walk that converts each place it meets): an object the pickle shares is
    counted at every place it appears. Each object is visited once, so a list nested 40 deep whose
    two items are the same list, around ``[0]``, is counted in 40 steps (as 3 * 2**40 - 1 objects);
    an object holding itself counts once there.

    Args:
        value: what was unpickled.
        children: what a container holds (default: lists, tuples, sets, dicts and :class:`Record` s).

    Returns:
        The count, ``value`` itself included.
    """
    counts: dict[int, int] = {}
    on_path = {id(value)}
    stack = [(value, iter(children(value)))]
    totals = [1]
    while stack:
        obj, items = stack[-1]
        child = next(items, on_path)  # on_path: a sentinel no container holds
        if child is on_path:
            stack.pop()
            on_path.discard(id(obj))
            counts[id(obj)] = n = totals.pop()
            if totals:
                totals[-1] += n
            continue
        known = counts.get(id(child))
        if known is not None:
            totals[-1] += known
            continue
        inner = children(child)
        if id(child) in on_path or not inner:
            totals[-1] += 1
            continue
        on_path.add(id(child))
        stack.append((child, iter(inner)))
        totals.append(1)
    return counts[id(value)]


def check_written_size(value: Any, what: str, children: Callable[[Any], Iterable[Any]] = _children) -> None:
    """Refuse a value that, written out as a tree (:func:`written_items`), would take more than the
    array limit at :data:`ITEM_BYTES` an object — before anything walks it that way.

    Args:
        value: what was unpickled.
        what: how to name the file in the message.
        children: as for :func:`written_items`.

    Raises:
        LimitExceededError: naming the count, the bytes, the limit and how to raise it.
    """
    n = written_items(value, children)
    check_array_bytes(n * ITEM_BYTES, f"{what} holds objects that, written out with every object its pickle shares "
                      f"repeated where it appears, are {n:,} objects, which", purpose="data read from a file")


__all__ = ["Record", "Call", "load", "plain", "pickled_globals", "refused_global", "written_items", "check_written_size",
           "ITEM_BYTES", "DANGEROUS_MODULES", "INERT_FUNCTIONS"]
