"""Steering directions: the difference of two recordings' mean activations, and the action along it.

A direction for a tensor is ``mean_A - mean_B``, each recording's mean activation over its rows (the
"activation addition" and "steering vector" of Turner et al. 2023, "Activation addition: steering
language models without optimization", and of the procgen maze "cheese vector" of Mini et al. 2023,
"Understanding and controlling a maze-solving policy network"). Adding ``alpha`` times it to the tensor
(:func:`policyport.runtime.overrides.add_direction`, or ``{add: dir.npy, alpha: a}`` in an intervention
file) steers the policy; :func:`alpha_sweep` runs the model over a range of strengths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..errors import InputMismatchError, listing
from ..runtime.interventions import block_mean
from ..runtime.overrides import add_direction
from .recording import open_recording


@dataclass
class Direction:
    """The result of :func:`mean_difference`.

    Attributes:
        tensor: the tensor.
        vector: ``mean_A - mean_B``, shape the tensor's row, in the recordings' dtype.
        mean_a, mean_b: float64, each recording's mean row.
        rows: the rows of A and of B.
    """

    tensor: str
    vector: np.ndarray
    mean_a: np.ndarray
    mean_b: np.ndarray
    rows: tuple[int, int]

    @property
    def norm(self) -> float:
        """The Euclidean norm of :attr:`vector`."""
        return float(np.linalg.norm(self.vector.astype(np.float64)))


def mean_difference(recording_a, recording_b, tensor: str, *, batch_size: int = 65536) -> Direction:
    """``mean_A - mean_B`` of ``tensor`` over two recordings, each streamed block by block (memory
    bounded by the block; the sums in float64).

    Args:
        recording_a, recording_b: recordings (any format :func:`~policyport.analysis.open_recording`
            reads) that both hold ``tensor`` with the same row shape.
        tensor: the tensor's name.
        batch_size: rows per block (default 65,536).

    Returns:
        A :class:`Direction`.

    Raises:
        InputMismatchError: a recording lacks the tensor (its tensors are listed), the row shapes or
            dtypes differ, a recording is empty or its mean is not finite.
        UnreadableFileError: a recording cannot be read.
    """
    means, rows, infos = [], [], []
    for path in (recording_a, recording_b):
        rec = open_recording(path)
        info = next((t for t in rec.tensors if t.name == tensor), None)
        if info is None:
            raise InputMismatchError(f"{path} holds no tensor {tensor!r} with a row per observation; it has "
                                     f"{listing([t.name for t in rec.tensors], show=str)}")
        means.append(block_mean((b[tensor] for b in rec.iter_batches(batch_size, [tensor])), f"{path} ({tensor})"))
        rows.append(rec.rows)
        infos.append(info)
    if infos[0].shape != infos[1].shape:
        raise InputMismatchError(f"{tensor!r} has rows of shape {infos[0].shape} in {recording_a} and {infos[1].shape} "
                                 f"in {recording_b}; record both with the same model")
    dtype = np.dtype(infos[0].dtype)
    vector = (means[0] - means[1]).astype(dtype if dtype.kind == "f" else np.float64)
    return Direction(tensor, vector, means[0], means[1], (rows[0], rows[1]))


def save_direction(direction: np.ndarray, path: str | os.PathLike, force: bool = False) -> Path:
    """Write a direction as an ``.npy`` file, atomically.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    from ..io.outputs import write_atomic

    return write_atomic(path, npy_writer(direction), force)


def npy_writer(array: np.ndarray):
    """A writer (``write(file)``) of ``array`` as an ``.npy`` file."""
    return lambda f: np.save(f, array, allow_pickle=False)


@dataclass
class Sweep:
    """The result of :func:`alpha_sweep`.

    Attributes:
        output: the graph output measured.
        alphas: the strengths, in the order given.
        values: float array ``(len(alphas), rows, *output_row)``: the output at each strength.
    """

    output: str
    alphas: list[float]
    values: np.ndarray

    def mean(self) -> np.ndarray:
        """float64 ``(len(alphas), *output_row)``: the output's mean over the rows at each strength."""
        return self.values.mean(axis=1, dtype=np.float64)


def alpha_sweep(session, feeds: Mapping[str, np.ndarray], tensor: str, direction: np.ndarray,
                alphas: Sequence[float], *, output: str | None = None) -> Sweep:
    """Run the model with ``alpha * direction`` added to ``tensor`` for each alpha.

    Args:
        session: the model, a :class:`~policyport.runtime.Session` on any backend.
        feeds: the observations (input name -> array, or the array of a single-input model).
        tensor: the tensor to steer.
        direction: float array, shape ``(width,)`` or the tensor's row shape.
        alphas: the strengths.
        output: the graph output to measure; default ``action`` when the model has a floating one,
            else its first floating graph output.

    Returns:
        A :class:`Sweep`.

    Raises:
        InputMismatchError: no alphas; an unknown or non-floating output; a direction that does not
            fit the tensor; bad feeds.
    """
    from .patching import as_feeds, measured_output

    if not len(alphas):
        raise InputMismatchError("give at least one alpha")
    feeds = as_feeds(session, feeds)
    _, output = measured_output(session, session.run(dict(feeds)), output)
    values = [session.run(dict(feeds), overrides=[add_direction(tensor, direction, float(a))])[output] for a in alphas]
    return Sweep(output, [float(a) for a in alphas], np.stack(values))


def plot_sweep(sweep: Sweep, tensor: str, path: str | os.PathLike, *, force: bool = False) -> Path:
    """:func:`sweep_png` written to ``path``, atomically.

    Raises:
        MissingDependencyError: matplotlib is missing (the ``analysis`` extra).
        OutputExistsError: ``path`` exists and ``force`` is false.
    """
    from ..io.outputs import check_writable, write_atomic

    check_writable(path, force)
    return write_atomic(path, sweep_png(sweep, tensor), force)


def sweep_png(sweep: Sweep, tensor: str):
    """A writer (``write(file)``) of the PNG of the output's mean over the observations versus alpha:
    one line per output element, with a band of ± one standard deviation over the observations.

    Raises:
        MissingDependencyError: matplotlib is missing (the ``analysis`` extra).
    """
    from .plots import _figure, _quiet_matplotlib, shown

    values = sweep.values.reshape(len(sweep.alphas), sweep.values.shape[1], -1).astype(np.float64)
    mean, std = values.mean(axis=1), values.std(axis=1)
    order = np.argsort(sweep.alphas, kind="stable")
    alphas = np.asarray(sweep.alphas)[order]
    with _quiet_matplotlib():
        fig = _figure(6.0, 4.0)
        ax = fig.add_subplot()
        for j in range(mean.shape[1]):
            ax.plot(alphas, mean[order, j], marker="o", label=f"{shown(sweep.output)}[{j}]")
            ax.fill_between(alphas, (mean - std)[order, j], (mean + std)[order, j], alpha=0.2)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(f"alpha (strength of the direction added to {shown(tensor)})")
        ax.set_ylabel(f"{shown(sweep.output)}, mean ± std over {values.shape[1]:,} observations")
        if mean.shape[1] <= 12:
            ax.legend(fontsize=8)
    return lambda f: fig.savefig(f, format="png")
