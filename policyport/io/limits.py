"""Limits: what one file or model may cost (:class:`Limits`, :func:`limits`), sizes as people
write them, and the memory and free space a command checks before it starts. Every size a
file declares (an array header, a zip member, an ONNX tensor's dims) is checked against the
actual bytes and against these limits before anything that large is allocated."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import (ArgumentTypeError, InputMismatchError, LimitExceededError, NoSpaceError,
                     check_argument)

# ------------------------------------------------------------------------------------------- limits

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

#: Environment variables that set the limits (a size: ``4G``, ``512M``, ``1.5GiB``, ``1000000``).
ENV_ARRAY_BYTES = "POLICYPORT_MAX_ARRAY_BYTES"
ENV_MEMORY = "POLICYPORT_MAX_MEMORY"
ENV_NODES = "POLICYPORT_MAX_NODES"
ENV_NPZ_ARRAYS = "POLICYPORT_MAX_NPZ_ARRAYS"

DEFAULT_ARRAY_BYTES = 1 * GIB
DEFAULT_NODES = 200_000
DEFAULT_NPZ_ARRAYS = 4096


@dataclass(frozen=True)
class Limits:
    """What policyport lets one file, one model or one command cost.

    Attributes:
        array_bytes: the most bytes the arrays of one file may take once read — an ``.npy``, all
            members of an ``.npz`` together, the external data of an ONNX model together — and the
            most one tensor may take that the numpy backend sizes from a value in the model
            (ConstantOfShape, Expand, Tile, Range). Default 1 GiB; ``POLICYPORT_MAX_ARRAY_BYTES``;
            the CLI's ``--max-bytes``.
        memory_bytes: the most memory a command may be computed to need before it starts (drawn
            observations, recorded activations). ``None`` (default): what this process can still
            get, measured when asked (:func:`available_memory`); ``POLICYPORT_MAX_MEMORY``.
        nodes: the most nodes a graph may have on the numpy backend (compiling its plan takes time
            and memory in proportion). Default 200,000; ``POLICYPORT_MAX_NODES``.
        npz_arrays: the most arrays (zip members) one ``.npz`` may hold: reading, checking and
            reporting each costs time and memory however small it is. Default 4,096;
            ``POLICYPORT_MAX_NPZ_ARRAYS``.
    """

    array_bytes: int = DEFAULT_ARRAY_BYTES
    memory_bytes: int | None = None
    nodes: int = DEFAULT_NODES
    npz_arrays: int = DEFAULT_NPZ_ARRAYS


_SET_LIMITS: contextvars.ContextVar[dict] = contextvars.ContextVar("policyport_limits", default={})


def limits() -> Limits:
    """The limits in force: those set with :func:`using_limits`, else the environment's, else the defaults.

    Raises:
        InputMismatchError: an environment variable that is not a size (or count).
    """
    found: dict[str, int | None] = {}
    for field, env in (("array_bytes", ENV_ARRAY_BYTES), ("memory_bytes", ENV_MEMORY), ("nodes", ENV_NODES),
                       ("npz_arrays", ENV_NPZ_ARRAYS)):
        text = os.environ.get(env)
        if text:
            try:
                found[field] = parse_size(text)
            except ValueError as e:
                raise InputMismatchError(f"environment variable {env}={text!r}: {e}") from None
    found.update(_SET_LIMITS.get())
    return Limits(**found)


@contextlib.contextmanager
def using_limits(**values: int | None) -> Iterator[Limits]:
    """Set limits (fields of :class:`Limits`) for the code run inside the ``with`` block.

    Example: ``with using_limits(array_bytes=8 * GIB): pp.load(...)``.
    """
    unknown = set(values) - {f.name for f in dataclasses.fields(Limits)}
    if unknown:
        raise ArgumentTypeError(f"unknown limit(s) {sorted(unknown)}; the limits are "
                                f"{[f.name for f in dataclasses.fields(Limits)]}")
    for name, value in values.items():
        check_argument(value, f"the limit {name}", "int", 0, none=name == "memory_bytes")
    token = _SET_LIMITS.set({**_SET_LIMITS.get(), **values})
    try:
        yield limits()
    finally:
        _SET_LIMITS.reset(token)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE]\d+)?)\s*(?:([KMGT])(i?)B?|B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A size in bytes from text: ``1000000``, ``1e9``, ``512K``, ``4G``, ``1.5GiB`` (binary: K = 1024),
    ``4GB`` (decimal: 10**9).

    Raises:
        ValueError: not a non-negative size.
    """
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 4G, 512M, 1.5GiB or 1000000 (bytes)")
    number, unit, binary = float(m[1]), (m[2] or "").upper(), m[3]
    if unit:
        power = "KMGT".index(unit) + 1
        decimal = text.strip().upper().endswith("B") and not binary
        number *= (1000 if decimal else 1024) ** power
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a finite size")
    return int(number)


def format_size(nbytes: int) -> str:
    """``3.64 TiB``, ``512 MiB``, ``72 B``, ``29,104 TiB``: a byte count for people (binary units)."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:,.0f} {unit}" if value >= 1000 else f"{value:.3g} {unit}"
    return f"{nbytes} B"


def check_free_space(path: str | os.PathLike, nbytes: int, what: str) -> None:
    """Refuse an output of ``nbytes`` bytes that the file system of ``path``'s folder has no room for.

    Args:
        path: the output.
        nbytes: the bytes it will take.
        what: the subject of the message, e.g. ``"the recording (100,000 rows of 61,440 bytes)"``.

    Raises:
        NoSpaceError: naming both sizes; nothing has been written.
    """
    import shutil

    folder = Path(path).parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # no answer: writing will tell
        return
    if nbytes > free:
        raise NoSpaceError(
            f"{what} would take {format_size(nbytes)} ({nbytes:,} bytes), but the file system of {folder} has "
            f"{format_size(free)} ({free:,} bytes) free; nothing was written — free some space, write it elsewhere, "
            "or record fewer tensors (--tensors) or rows"
        )


def physical_memory() -> int:
    """The machine's physical memory in bytes (a very large number where it cannot be told)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _suggest(nbytes: int) -> str:
    """A round size at or above ``nbytes`` to suggest as a new limit: ``4G``, ``300M``."""
    if nbytes >= GIB:
        return f"{math.ceil(nbytes / GIB)}G"
    return f"{max(1, math.ceil(nbytes / MIB))}M"


def check_array_bytes(nbytes: int, what: str, limit: int | None = None, *,
                      purpose: str = "arrays read from a file") -> None:
    """Refuse ``nbytes`` of arrays above the array limit.

    Args:
        nbytes: the bytes the arrays would take.
        what: the subject of the message, e.g. ``"obs.npz: array 'obs' (float32, shape (10, 4))"``.
        limit: the limit; default ``limits().array_bytes``.
        purpose: what the limit is for, in the message.

    Raises:
        LimitExceededError: naming the size, the limit and how to raise it.
    """
    limit = limits().array_bytes if limit is None else limit
    if nbytes > limit:
        physical = physical_memory()
        if nbytes > physical:
            advice = f"more than this machine's {format_size(physical)} of memory, too"
        else:
            advice = (f"if you trust it and have the memory, raise the limit with --max-bytes {_suggest(nbytes)} "
                      f"(or {ENV_ARRAY_BYTES}={_suggest(nbytes)})")
        raise LimitExceededError(
            f"{what} would take {format_size(nbytes)} ({nbytes:,} bytes), above the limit of {format_size(limit)} "
            f"for {purpose}; {advice}"
        )


#: The most memory ``json.loads`` takes per byte of the text it parses: 25 (measured on
#: ``[[],[],...]``, the text densest in objects: 64 MiB of it take 1.6 GB parsed).
JSON_BYTES = 25


def check_json_bytes(nbytes: int, what: str) -> None:
    """Refuse a JSON document of ``nbytes`` bytes (a config, a description) that, parsed, could take
    more than the array limit (:data:`JSON_BYTES` per byte of text), before it is read.

    Raises:
        LimitExceededError: naming the document, what parsing it could take and the limit.
    """
    check_array_bytes(nbytes * JSON_BYTES, f"{what} ({nbytes:,} bytes of JSON, parsed)",
                      purpose="a document parsed from a file")


def check_tensor_shape(shape, dtype) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, checked before an array of it is allocated.

    For ops whose output size is not bounded by their inputs' sizes but comes from a value, an
    attribute or an equation in the model (ConstantOfShape, Expand, Tile, Range, RandomNormal,
    Multinomial, Gather, Einsum, padded Conv and pooling): the size is computed with Python
    integers, so no product can overflow.

    Raises:
        ValueError: a negative dimension.
        LimitExceededError: the array would take more than ``limits().array_bytes``.
    """
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in the output shape {dims}")
    dtype = np.dtype(dtype)
    check_array_bytes(math.prod(dims) * dtype.itemsize, f"its output ({dtype.name}, shape {dims})",
                      purpose="one tensor sized from a value in the model")
    return dims


def available_memory() -> int:
    """Bytes this process can still allocate, roughly: the system's available memory (Linux
    ``MemAvailable``; elsewhere the physical memory), and no more than the address-space limit
    (``RLIMIT_AS``) less what the process has mapped already."""
    available = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    available = int(line.split()[1]) * KIB
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        available = physical_memory()
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm", "rb") as f:
                mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            available = min(available, max(soft - mapped, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return available


def memory_limit() -> int:
    """The most memory a command may be computed to need: the limit set (:class:`Limits`
    ``.memory_bytes``), else what this process can still get (:func:`available_memory`)."""
    set_limit = limits().memory_bytes
    return available_memory() if set_limit is None else set_limit


def check_memory(nbytes: int, what: str, advice: str | None = None) -> None:
    """Refuse to start work that is computed to need ``nbytes`` when the memory limit is lower.

    Args:
        nbytes: the bytes the work needs.
        what: what needs it, e.g. ``"verifying 100,000,000 samples (1 input, 7 tensors, 2 backends)"``.
        advice: what to do instead; default: use fewer samples or a smaller input, or a machine
            with more memory.

    Raises:
        LimitExceededError: naming the size needed and the memory there is.
    """
    set_limit = limits().memory_bytes
    limit = memory_limit()
    if nbytes > limit:
        source = (f"the limit {ENV_MEMORY} sets" if set_limit is not None
                  else "the memory this process can get")
        advice = advice or "use fewer samples or a smaller input, or a machine with more memory"
        raise LimitExceededError(
            f"{what} needs about {format_size(nbytes)}, more than {format_size(limit)} ({source}); "
            f"{advice} (or set {ENV_MEMORY})"
        )
