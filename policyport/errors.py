"""The errors policyport raises on purpose.

Every one derives from :class:`PolicyportError` and also from the built-in exception that fits, so
callers can catch either. The CLI maps each to an exit code (see ``EXIT_CODES``): 1 verification
mismatch, 3 bad model or input, 4 missing optional dependency. Usage errors (exit 2) are Click's, an
:class:`OptionError`'s, and a :class:`TrustRequiredError`'s (a source that loads only with ``--trust``).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Iterable

#: How many names a message lists before it says how many more there are.
LISTED_NAMES = 10


def listing(names: Iterable[object], first: int = LISTED_NAMES, show=repr) -> str:
    """Names for a message, however many a file holds: ``'a', 'b', 'c'``, or the first ``first``
    (default :data:`LISTED_NAMES`) then ``… and 17 more``; ``show`` formats each (default repr)."""
    names = list(names)
    shown = ", ".join(show(n) for n in names[:first])
    return shown + (f" … and {len(names) - first:,} more" if len(names) > first else "")


class PolicyportError(Exception):
    """Root of every error policyport raises on purpose."""

    exit_code = 3


class OptionError(PolicyportError, ValueError):
    """An option value policyport refuses, or an option that does not apply to what it was given
    (exit 2, a usage error)."""

    exit_code = 2


class OptionNeeded(OptionError):
    """An option that a source's file does not settle, that the user did not give, and that policyport
    will not guess because a wrong guess is plausible and converts to another policy (exit 2).

    Attributes:
        field: the :class:`~policyport.converter.ConvertOptions` field that settles it (``"head"``).
    """

    def __init__(self, message: str, field: str, placeholder: str | None = None):
        super().__init__(message)
        self.field, self._placeholder = field, placeholder

    def placeholder(self) -> str:
        """A value of :attr:`field` under which the source's layers and their shapes can be shown
        (``policyport inspect`` of a source), never offered as the policy's own."""
        return self._placeholder


class BadModelError(PolicyportError, ValueError):
    """A model, weights file or source that cannot be read or placed (exit 3)."""


@dataclass(frozen=True)
class MissingOp:
    """One op type a backend lacks at the model's opset, and the nodes that use it.

    Attributes:
        op_type: the ONNX op type, e.g. ``"LSTM"``.
        domain: its operator domain, ``""`` for the default ai.onnx domain.
        opset: the model's opset version for ``domain``.
        nodes: the names of the nodes of this op type, in node order (``""`` for an unnamed node).
        versions: the opset versions the backend implements ``op_type`` from (all above ``opset``);
            empty if it has no implementation at any opset.
    """

    op_type: str
    domain: str
    opset: int
    nodes: tuple[str, ...]
    versions: tuple[int, ...] = ()

    def describe(self) -> str:
        """``LSTM node "lstm" (opset 9; no LSTM at any opset)``, for a message."""
        shown = listing(self.nodes, 3, lambda n: f'"{n}"')
        where = f" in domain {self.domain!r}" if self.domain else ""
        noun = "node" if len(self.nodes) == 1 else "nodes"
        have = (f"implemented from opset {self.versions[0]}" if self.versions
                else f"no {self.op_type} at any opset")
        return f"{self.op_type} {noun} {shown}{where} (opset {self.opset}; {have})"


class UnsupportedOpError(PolicyportError, NotImplementedError):
    """Ops of a model that the chosen backend does not implement at the model's opset (exit 3).

    The message names every missing op with its nodes and opset, and ends with what to do when
    calling the library. Interfaces that offer other remedies (the CLI's flags) phrase them with
    :meth:`message_for`.

    Args:
        missing: every op the backend lacks, one :class:`MissingOp` per (domain, op type); or a
            message of its own, for an op refused for another reason (then ``missing`` is empty and
            the message is used as it is, by :meth:`message_for` too).
        backend: the backend's name (``"numpy"``).

    Attributes:
        missing: the :class:`MissingOp` list. backend: as given.
    """

    def __init__(self, missing: list[MissingOp] | tuple[MissingOp, ...] | str, backend: str = "numpy"):
        self._text = missing if isinstance(missing, str) else None
        self.missing = [] if isinstance(missing, str) else list(missing)
        self.backend = backend
        super().__init__(self.message_for(None))

    @property
    def subject(self) -> str:
        """What is missing, without the remedy."""
        if len(self.missing) == 1:
            return f"{self.missing[0].describe()} is not supported by the {self.backend} backend"
        return (f"the {self.backend} backend lacks {len(self.missing)} ops of this model: "
                + "; ".join(m.describe() for m in self.missing))

    @property
    def reexport_opset(self) -> int | None:
        """The lowest opset at which the backend implements every missing op, or None if some op
        has no implementation at any opset (re-exporting cannot help then)."""
        if not self.missing or not all(m.versions for m in self.missing):
            return None
        return max(m.versions[0] for m in self.missing)

    def message_for(self, command: str | None, *, source_given: bool = False) -> str:
        """The message with a remedy that works where the error surfaced.

        Args:
            command: the ``policyport`` CLI command that met the error (``"run"``, ``"verify"``,
                ``"pack"`` ...), or None for a library call.
            source_given: ``verify``/``pack`` only: whether ``--source`` was given.

        Returns:
            ``subject — remedy``; the remedy names options of ``command`` itself where one exists.
        """
        if self._text is not None:
            return self._text
        return f"{self.subject} — {self.remedy(command, source_given=source_given)}"

    def remedy(self, command: str | None = None, *, source_given: bool = False) -> str:
        """What to do instead (see :meth:`message_for`)."""
        opset = self.reexport_opset
        reexport = f"re-export the model at opset {opset} or newer, or " if opset else ""
        if command is None:
            return f"{reexport}load it with backend=\"onnxruntime\" (policyport inspect lists the ops it has)"
        if command == "verify":
            if source_given:
                return f"{reexport}verify onnxruntime against the source alone: add --backends onnxruntime"
            return (f"{reexport}verify onnxruntime against the source the model came from "
                    "(--backends onnxruntime --source SRC); with no source, "
                    "'policyport run --backend onnxruntime' runs it")
        if command == "convert":
            return (f"{reexport}--no-verify writes the model without checking it on the numpy backend "
                    "(check it afterwards with 'policyport verify --backends onnxruntime --source SRC')")
        if command in ("pack", "export-numpy"):
            return (f"a packed policy runs on numpy alone, so this model cannot be packed; {reexport}"
                    "run it on onnxruntime with 'policyport run --backend onnxruntime'")
        return f"{reexport}use --backend onnxruntime (policyport inspect lists the ops it has)"


class LimitExceededError(BadModelError, MemoryError):
    """A file, model or command that would need more memory (or nodes) than a limit allows (exit 3).

    Raised before anything that large is allocated: an array whose header claims more bytes than
    the limit, a node whose output would be too large, a graph with too many nodes, a command whose
    data would not fit. The message names the size needed, the limit and how to raise it (see
    :class:`policyport.io.limits.Limits`).
    """


class ArgumentTypeError(PolicyportError, TypeError):
    """An argument of the Python API of the wrong type: ``tensors=5`` where names are expected
    (exit 2, a usage error)."""

    exit_code = 2


class InputMismatchError(PolicyportError, ValueError):
    """Feeds whose names, rank, widths or dtypes do not match the graph inputs (exit 3)."""


class UndrawableInputError(InputMismatchError):
    """A graph input observations cannot be drawn for at random (exit 3): a dtype with no range to
    draw from, an unknown rank, or an integer input whose valid range the model does not record
    and the asked range does not span.

    Attributes:
        subject: what cannot be drawn and why, without advice.
        integer: whether a range spanning at least two integers would let it be drawn.
    """

    def __init__(self, subject: str, integer: bool, remedy: str | None = None):
        self.subject, self.integer = subject, integer
        if remedy is None:
            remedy = "pass observations for it (inputs=)" + (
                ", or low/high spanning the integers it takes" if integer else "")
        super().__init__(f"{subject}; {remedy}")

    def advise(self, remedy: str) -> UndrawableInputError:
        """The same refusal with the advice a caller (a command) can give: what to do there."""
        return UndrawableInputError(self.subject, self.integer, remedy)


class UnreadableFileError(PolicyportError, OSError):
    """A file that is missing, unreadable or not of the expected format (exit 3)."""


#: What ``zipfile`` raises reading a damaged, truncated, encrypted or unusual archive: a bad magic number
#: or CRC (``BadZipFile``), corrupt deflate data (``zlib.error``, ``EOFError``), a zip version or
#: compression method it lacks (``NotImplementedError``), an encrypted member (``RuntimeError``), a
#: member name flagged UTF-8 that is not (``UnicodeDecodeError``, a ``ValueError``), a corrupt extra
#: field (``struct.error``), a short read (``OSError``). Readers of zip archives (an SB3 save, a torch
#: file, an ``.npz``, a ``.keras`` file) catch these and raise :class:`UnreadableFileError`.
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError,
              ValueError, struct.error, OSError)


class UntrustedFileError(PolicyportError, PermissionError):
    """A file whose loading could execute code, refused without an explicit trust flag (exit 3)."""


class TrustRequiredError(UntrustedFileError):
    """A source of a format whose loading runs code the file holds (a TorchScript file, a TensorFlow
    SavedModel), given without the trust flag; refused, told by its layout, before anything loads it
    (exit 2: pass ``--trust``, ``trust=True``, for a file you trust)."""

    exit_code = 2


class OutputExistsError(PolicyportError, FileExistsError):
    """An output path that exists and was not allowed to be overwritten (exit 3)."""


class NoSpaceError(PolicyportError, OSError):
    """An output larger than the free space of the file system it goes to, refused before a byte
    of it is written (exit 3)."""


class MissingDependencyError(PolicyportError, ImportError):
    """An optional dependency (torch, tensorflow, tf2onnx, onnx, onnxruntime) is not installed (exit 4)."""

    exit_code = 4

    def __init__(self, module: str, extra: str, purpose: str):
        self.module = module
        self.extra = extra
        super().__init__(
            f"{purpose} needs the Python package {module!r}, which is not installed; "
            f"install it with: pip install 'policyport[{extra}]'"
        )


class VerificationError(PolicyportError, AssertionError):
    """Backends or the source disagree beyond the tolerances (exit 1)."""

    exit_code = 1


def check_argument(value, what: str, kind: str = "int", low=None, high=None, *, none: bool = False):
    """An argument of the Python API, checked before it is used: ``value`` itself.

    Args:
        value: the argument.
        what: its name and meaning in the message, e.g. ``"samples (observations to draw)"``.
        kind: ``"int"`` (a whole number, not a bool) or ``"real"`` (a finite int or float).
        low, high: the smallest and largest values allowed (inclusive), or None.
        none: None is allowed too.

    Raises:
        ArgumentTypeError: not a number of the kind (a string, a bool, an array ...).
        InputMismatchError: a number outside ``[low, high]`` (or not finite).
    """
    import math
    import numbers

    if value is None and none:
        return value
    wanted = numbers.Integral if kind == "int" else numbers.Real
    if not isinstance(value, wanted) or isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be {'a whole number' if kind == 'int' else 'a number'}"
                                f"{' or None' if none else ''}, not {type(value).__name__} {value!r:.80}")
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        bounds = " and ".join(t for t in (f">= {low}" if low is not None else "", f"<= {high}" if high is not None else "") if t)
        raise InputMismatchError(f"{what} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    return value


def require(module: str, extra: str, purpose: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip extra.

    Args:
        module: dotted module name, e.g. ``"onnxruntime"``.
        extra: the policyport extra that installs it, e.g. ``"torch"``.
        purpose: what needs it, used in the message (``"the onnxruntime backend"``).

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: the module cannot be imported.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(module.split(".")[0], extra, purpose) from e
