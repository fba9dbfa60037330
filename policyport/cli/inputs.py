"""Reading the observations a command is given (-i), without registering any command: ``run``
imports this alone, so that its start-up does not build the other commands' parameters."""

from __future__ import annotations

from pathlib import Path


def load_feeds(path: Path, names: list[str]) -> dict:
    """Feeds from an .npy (one array) or .npz; one array under any name feeds a single-input model."""
    from ..io.arrays import load_arrays
    from ..runtime.base import feeds_from_arrays

    return feeds_from_arrays(load_arrays(path), names, path)


def warn_of_nonfinite_rows(feeds: dict) -> None:
    """Say on stderr how many rows of each fed input hold NaN or Inf (they run, as ONNX computes them)."""
    from ..runtime.base import nonfinite_rows
    from .render import say

    for name, array in feeds.items():
        bad = nonfinite_rows(array)
        if bad:
            say(f"warning: {bad:,} of {len(array):,} rows of input {name!r} hold NaN or Inf; "
                "the outputs of those rows are likely NaN too")


def input_names(model: Path) -> list[str]:
    """The graph inputs of an .onnx file or packed folder (its non-initializer graph inputs)."""
    from ..graph.onnx_files import load_onnx

    return graph_inputs(load_onnx(model))


def graph_inputs(proto) -> list[str]:
    """The non-initializer graph inputs of an ``onnx.ModelProto``."""
    inits = {t.name for t in proto.graph.initializer}
    return [v.name for v in proto.graph.input if v.name not in inits]
