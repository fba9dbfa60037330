"""Looking inside a policy over whole datasets: streaming recordings, per-neuron statistics, plots.

Above the runtime: it runs models through :class:`~policyport.runtime.Session` and reads and writes
files of any size block by block.

* :func:`record_dataset` — every activation of every observation of a dataset, streamed to an
  ``.npz`` or ``.parquet`` file with memory bounded by the batch (engines ``local`` and ``ray``);
* :func:`open_recording` — read a recording back block by block;
* :func:`statistics` — per-neuron and per-layer statistics in one pass with running moments;
* :mod:`policyport.analysis.plots` — PNG plots of recordings and verification reports (matplotlib).

The engines (and what they import) load when :func:`record_dataset` or :data:`ENGINES` is first
used, so that ``policyport run``, which counts non-finite rows with :mod:`.statistics`, skips them.
"""

from __future__ import annotations

from .recording import FORMATS, Recording, TensorInfo, open_recording
from .statistics import Statistics, TensorStats, statistics

__all__ = ["ENGINES", "FORMATS", "RecordSummary", "Recording", "Statistics", "TensorInfo", "TensorStats",
           "open_recording", "record_dataset", "statistics"]


def __getattr__(name: str):
    if name in ("ENGINES", "RecordSummary", "record_dataset"):
        from . import engines

        value = getattr(engines, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
