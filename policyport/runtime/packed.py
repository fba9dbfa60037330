"""Reading a packed policy folder, with numpy and the standard library alone.

:func:`policyport.handoff.pack.pack` writes the folder; :func:`load_graph` reads it back into a
:class:`~policyport.graph.model.Graph` for the numpy backend, after :func:`policyport.graph.folder.open_bundle`
has checked it (sizes, regular files only, every file's sha256);
:func:`policyport.handoff.golden.verify_bundle` re-runs the golden observations on this machine and
compares every tensor with what was recorded at pack time. Loading imports nothing beyond numpy and
the standard library (no onnx, protobuf, onnxruntime, typer or rich).

The folder (format ``policyport.bundle/1``):

``model.onnx``
    The ONNX model, serialized (for onnxruntime and other ONNX tools; the numpy path never reads it).
``weights.npz``
    The parameters under the source's names in the source's layout, exactly
    :func:`policyport.graph.passes.extract_weights` of the model (``default_policy/fc_1/kernel``: float32
    ``(275, 256)`` ...), bit for bit.
``constants.npz``
    The initializers that are not parameters (e.g. the int64 Slice bounds ``head/mid`` a head adds),
    under their initializer names, as stored in the model. Present, possibly empty, in every bundle.
``graph.json``
    :meth:`Graph.to_json` of the model, plus one key, ``"initializer_sources"``: initializer name ->
    ``{"file": "weights.npz", "key": <source parameter name>, "transpose": <perm> or null}`` or
    ``{"file": "constants.npz", "key": <initializer name>, "transpose": null}``. The initializer is
    ``numpy.transpose(array, perm)`` of the stored array (the inverse of the transpose
    ``extract_weights`` undoes), or the array itself. :meth:`Graph.from_json` ignores the extra key,
    so the file is also a plain policyport graph. Its schema is
    :data:`policyport.graph.folder.GRAPH_SCHEMA`.
``golden.npz``
    ``samples`` observations drawn as :func:`policyport.verification.verify.sample_inputs` draws them and what the
    numpy backend computed from them at pack time. Keys are ``<group>/<tensor name>``, the group being
    everything before the first ``/`` (tensor names may themselves contain ``/``):
    ``inputs/obs`` (the feeds), ``outputs/logits`` ... (what ``Session.run`` returned) and
    ``activations/fc_1/linear`` ... (what ``Session.record(feeds, "*")`` returned: every node output in
    node order, graph outputs included).
``run.py`` and ``_policyport/`` (unless packed with ``runtime=False``)
    The folder's own entry point (standard library and numpy only) and the copy of policyport's
    numpy runtime it imports under a private name: ``python run.py -i obs.npy -o actions.npz`` and
    ``python run.py --verify`` work where policyport is not installed. See
    :mod:`policyport.handoff.folder_run`.
``policy.json``
    Written last. ``format``; ``inputs`` / ``outputs`` (name, dtype, shape; a string is a symbolic
    dimension such as ``"batch"``); ``head`` (model metadata ``policyport.head``); ``observation_filter``
    (the model metadata ``policyport.observation_filter`` a converter wrote — the observation filter
    baked into the graph, such as RLlib's MeanStdFilter with its mean, std and clip, or SB3's VecNormalize with
    its mean, var, epsilon and clip_obs — or ``null``); ``provenance`` (model metadata
    ``policyport.source`` and ``policyport.activation``, policyport and numpy versions, opset,
    creation time in UTC ISO 8601); ``golden`` (how the observations were drawn, and ``samples``: how
    many observations ``golden.npz`` holds — 1 for inputs without a batch axis, whatever was asked);
    ``parity`` (the largest onnxruntime-vs-numpy absolute difference over every tensor at pack time,
    and against the source when :func:`policyport.handoff.pack.pack` was given it; the tolerances by dtype,
    the tensors that passed as float32 rounding with their float64 figures, and the random tensors
    left out); ``files`` (file name -> sha256 hex
    digest of every other file in the folder, the runtime's included); ``runtime`` (only with a
    runtime: ``package``, ``entry_point``, ``policyport_version``, ``requires_python``,
    ``requires`` and ``digest``, the sha256 of the sorted ``name sha256`` lines of the runtime
    files). Its schema is :data:`policyport.graph.folder.POLICY_SCHEMA`; the limits every file is held
    to are in :mod:`policyport.graph.folder`.

npz files are plain uncompressed numpy archives (``numpy.load(path, allow_pickle=False)`` reads them).
"""

from __future__ import annotations

import os

import numpy as np

from ..graph.folder import (  # noqa: F401  (the format's names, re-exported for readers of this module)
    BUNDLE_FORMAT,
    CONSTANTS_FILE,
    DATA_FILES,
    GOLDEN_FILE,
    GOLDEN_GROUPS,
    GRAPH_FILE,
    GRAPH_SCHEMA,
    MAX_NPZ_ARRAYS,
    MODEL_FILE,
    POLICY_FILE,
    SOURCES_KEY,
    WEIGHTS_FILE,
    data_limit,
    open_bundle,
    parse_json,
    place_initializer,
    read_bundle,
    read_policy,
)
from ..graph.model import Graph

# --------------------------------------------------------------------------------------------- load


def load_graph(directory: str | os.PathLike, *, folder_fd: int | None = None) -> Graph:
    """Read a packed folder into a :class:`Graph` for the numpy backend (needs numpy only).

    The folder is checked by :func:`policyport.graph.folder.read_bundle` first, the check every reader
    of a folder makes (sizes, regular files, every listed file's sha256, both documents against
    their schemas, every .npz member's header); the initializers are rebuilt from ``weights.npz``
    (transposed back to the model's layout where ``graph.json`` says so) and ``constants.npz``.

    Args:
        directory: a folder written by :func:`policyport.handoff.pack.pack`.
        folder_fd: a descriptor of the folder, already open, to read it through (``directory``
            then only names it in messages).

    Returns:
        The graph, with initializers as numpy arrays exactly as the model stored them.

    Raises:
        UnreadableFileError: the folder or its ``policy.json`` is missing or unreadable.
        BadModelError: not a ``policyport.bundle/1`` folder, a listed file missing, refused or with
            another sha256 than ``policy.json`` records (the message names the file), a document
            that does not fit its schema, or an initializer missing or misshapen.
    """
    return read_bundle(directory, folder_fd=folder_fd)[2]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


# ------------------------------------------------------------------------------------------- verify
