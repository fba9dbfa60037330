"""The errors policyport raises on purpose.

Every one derives from :class:`PolicyportError` and also from the built-in exception that fits, so
callers can catch either. The CLI maps each to an exit code (see ``EXIT_CODES``): 1 verification
mismatch, 3 bad model or input, 4 missing optional dependency. Usage errors (exit 2) are Click's.
"""

from __future__ import annotations


class PolicyportError(Exception):
    """Root of every error policyport raises on purpose."""

    exit_code = 3


class BadModelError(PolicyportError, ValueError):
    """A model, weights file or source that cannot be read or placed (exit 3)."""


class UnsupportedOpError(PolicyportError, NotImplementedError):
    """A node whose op type or opset version the chosen backend does not implement (exit 3)."""


class LimitExceededError(BadModelError, MemoryError):
    """A file, model or command that would need more memory (or nodes) than a limit allows (exit 3).

    Raised before anything that large is allocated: an array whose header claims more bytes than
    the limit, a node whose output would be too large, a graph with too many nodes, a command whose
    data would not fit. The message names the size needed, the limit and how to raise it (see
    :class:`policyport.files.Limits`).
    """


class InputMismatchError(PolicyportError, ValueError):
    """Feeds whose names, rank, widths or dtypes do not match the graph inputs (exit 3)."""


class UnreadableFileError(PolicyportError, OSError):
    """A file that is missing, unreadable or not of the expected format (exit 3)."""


class UntrustedFileError(PolicyportError, PermissionError):
    """A file whose loading could execute code, refused without an explicit trust flag (exit 3)."""


class OutputExistsError(PolicyportError, FileExistsError):
    """An output path that exists and was not allowed to be overwritten (exit 3)."""


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
