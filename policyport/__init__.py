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
    ArgumentTypeError,
    BadModelError,
    InputMismatchError,
    LimitExceededError,
    MissingDependencyError,
    NoSpaceError,
    OptionError,
    OutputExistsError,
    PolicyportError,
    TrustRequiredError,
    UndrawableInputError,
    UnreadableFileError,
    UnsupportedOpError,
    UntrustedFileError,
    VerificationError,
)

from .version import __version__  # noqa: F401  (the package's version)

#: Public name -> (module relative to this package, attribute). Relative, so that the copy of the
#: numpy runtime a packed folder carries (under a private package name) resolves its own modules.
_LAZY = {
    "convert": (".converter", "convert"),
    "ConversionNote": (".converter.options", "ConversionNote"),
    "load": (".runtime", "load"),
    "Session": (".runtime", "Session"),
    "BACKENDS": (".runtime", "BACKENDS"),
    "verify": (".verification.verify", "verify"),
    "extract_weights": (".graph.passes", "extract_weights"),
    "expose": (".runtime.expose", "expose"),
    "pack": (".handoff.pack", "pack"),
    "export_numpy": (".handoff.export_numpy", "export_numpy"),
    "to_torch": (".handoff.targets.to_torch", "to_torch"),
    "to_keras": (".handoff.targets.to_keras", "to_keras"),
    "to_sb3": (".handoff.targets.to_sb3", "to_sb3"),
    "layer_plan": (".handoff.targets.plan", "layer_plan"),
    "verify_bundle": (".handoff.golden", "verify_bundle"),
}

__all__ = [
    "ArgumentTypeError",
    "BadModelError",
    "InputMismatchError",
    "LimitExceededError",
    "MissingDependencyError",
    "NoSpaceError",
    "OptionError",
    "OutputExistsError",
    "PolicyportError",
    "TrustRequiredError",
    "UndrawableInputError",
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
        try:
            found = importlib.import_module(module, __name__)
        except ModuleNotFoundError as e:
            if e.name != __name__ + module:
                raise
            # The numpy runtime a packed folder carries holds the modules that load, run and verify it only.
            raise AttributeError(f"{name!r} is not part of the numpy runtime of a packed folder (it offers "
                                 "load, Session, BACKENDS and verify_bundle); install policyport for it") from None
        value = getattr(found, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
