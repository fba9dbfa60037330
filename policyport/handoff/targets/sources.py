"""A target's source: an ONNX model as it is, or any source policyport reads, converted and checked first."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Source:
    """The model a target writes, and what converting it said.

    Attributes:
        model: the ``onnx.ModelProto``.
        converted: True when it was converted from a source here (False: an ONNX model as given).
        notes: the converter's notes; assumptions: what it assumed (dicts as in the model's metadata).
        report: the :class:`~policyport.verification.compare.Report` of the model against the
            source's own forward pass, or None for an ONNX model.
    """

    model: object
    converted: bool = False
    notes: list[str] = field(default_factory=list)
    assumptions: list[dict] = field(default_factory=list)
    report: object = None


def is_onnx(source) -> bool:
    """Whether ``source`` is an ONNX model already: an ``onnx.ModelProto`` or an ``.onnx`` path."""
    if isinstance(source, (str, os.PathLike)):
        return Path(source).suffix.lower() == ".onnx"
    return type(source).__name__ == "ModelProto"


def source_model(source, *, kind: str | None = None, options: dict | None = None, samples: int = 1000, low: float = 0.0,
                 high: float = 1.0, seed: int = 0) -> Source:
    """The ONNX model of ``source``, converted and verified against the source as ``convert`` does.

    Args:
        source: an ``onnx.ModelProto`` or ``.onnx`` path (used as it is), or any source
            :func:`policyport.convert` reads (a path or a live object).
        kind: the source kind (detected when None); options: fields of
            :class:`~policyport.converter.ConvertOptions` by name, as :func:`policyport.convert` takes them.
        samples, low, high, seed: the observations the conversion is verified on (as ``convert``).

    Returns:
        :class:`Source`.

    Raises:
        VerificationError: the converted model does not match its source (nothing is written).
        As :func:`policyport.convert` and :func:`policyport.verify`.
    """
    from ...errors import VerificationError

    if is_onnx(source) and kind is None:
        from ...graph.onnx_files import ensure_model

        return Source(ensure_model(source))
    from ...converter import convert_source
    from ...verification.compare import verdict
    from ...verification.verify import verify

    converted = convert_source(source, kind=kind, **(options or {}))
    report = verify(converted.model, None, reference=converted.reference, reference_oracle=converted.oracle,
                    samples=samples, low=low, high=high, seed=seed)
    if not report.passed:
        raise VerificationError(f"the model converted from {source} does not match the source: {verdict(report)}; "
                                "nothing was written")
    return Source(converted.model, True, list(converted.notes), [a.to_dict() for a in converted.assumptions], report)
