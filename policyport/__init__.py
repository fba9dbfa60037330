"""policyport: carry trained policy networks across frameworks.

Export a policy (RLlib/TF-layout weights, and more sources over time) to ONNX, pull its weights back
out under the source's own names, run it on onnxruntime or on policyport's own numpy interpreter
while recording every activation, and verify tensor by tensor that the backends and the source agree.

The public API is re-exported here and imported lazily, so ``import policyport`` needs numpy only::

    import policyport as pp
    model = pp.convert("policy.npz", activation="tanh", head="diag-gaussian")
    sess = pp.load(model, backend="numpy")
    outputs = sess.run({"obs": obs})
    tensors = sess.record({"obs": obs}, tensors="*")
    report = pp.verify(model, obs)
    weights = pp.extract_weights(model)
"""

from __future__ import annotations

from .errors import (
    BadModelError,
    InputMismatchError,
    LimitExceededError,
    MissingDependencyError,
    OutputExistsError,
    PolicyportError,
    UnreadableFileError,
    UnsupportedOpError,
    UntrustedFileError,
    VerificationError,
)

__version__ = "0.1.0"

_LAZY = {
    "convert": ("policyport.converter", "convert"),
    "load": ("policyport.runtime", "load"),
    "Session": ("policyport.runtime", "Session"),
    "BACKENDS": ("policyport.runtime", "BACKENDS"),
    "verify": ("policyport.verification", "verify"),
    "extract_weights": ("policyport.passes", "extract_weights"),
    "expose": ("policyport.passes", "expose"),
    "pack": ("policyport.bundle", "pack"),
    "verify_bundle": ("policyport.runtime.packed", "verify_bundle"),
}

__all__ = [
    "BadModelError",
    "InputMismatchError",
    "LimitExceededError",
    "MissingDependencyError",
    "OutputExistsError",
    "PolicyportError",
    "UnreadableFileError",
    "UnsupportedOpError",
    "UntrustedFileError",
    "VerificationError",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'policyport' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
