"""Looking inside a policy over whole datasets: streaming recordings, per-neuron statistics, plots.

Above the runtime: it runs models through :class:`~policyport.runtime.Session` and reads and writes
files of any size block by block.

* :func:`record_dataset` — every activation of every observation of a dataset, streamed to an
  ``.npz`` or ``.parquet`` file with memory bounded by the batch (engines ``local`` and ``ray``);
* :func:`open_recording` — read a recording back block by block;
* :func:`statistics` — per-neuron and per-layer statistics in one pass with running moments;
* :mod:`policyport.analysis.plots` — PNG plots of recordings and verification reports (matplotlib).
"""

from __future__ import annotations

from .engines import ENGINES, RecordSummary, record_dataset
from .recording import FORMATS, Recording, TensorInfo, open_recording
from .statistics import Statistics, TensorStats, statistics

__all__ = ["ENGINES", "FORMATS", "RecordSummary", "Recording", "Statistics", "TensorInfo", "TensorStats",
           "open_recording", "record_dataset", "statistics"]
