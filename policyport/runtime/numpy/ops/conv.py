"""Convolution: Conv over 1, 2, 3 ... spatial axes, with groups, strides, dilations and padding.

https://onnx.ai/onnx/operators/onnx__Conv.html. Conv-11 only clarified Conv-1 (the SAME padding
formula, the defaults of strides and dilations); one function serves both, and Conv-22 added types.

The kernel is im2col and a matrix product: the padded input is viewed as its strided, dilated
sliding windows (a strided view, no copy), gathered into a (samples, groups, in_channels/group *
kernel, positions) buffer a chunk of the batch at a time and multiplied by the weights laid out as
(groups, out_channels/group, in_channels/group * kernel) straight into the (batch, out_channels,
positions) result, which needs no transpose.

:func:`window_geometry` is shared with the pooling ops.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ....io.limits import check_tensor_shape
from ..registry import op


def window_geometry(spatial, kernel, strides=None, dilations=None, pads=None, auto_pad="NOTSET", ceil_mode=0):
    """Padding and output size of a sliding window over ``spatial`` (Conv and pooling pages).

    Args:
        spatial: the input's spatial sizes (D1, D2, ...).
        kernel: the kernel's spatial sizes.
        strides, dilations: per spatial axis (default 1 each).
        pads: explicit padding [x1_begin, x2_begin, ..., x1_end, x2_end, ...] (default 0), used when
            ``auto_pad`` is NOTSET.
        auto_pad: NOTSET, VALID (no padding), SAME_UPPER or SAME_LOWER (output = ceil(input /
            stride), the total padding split evenly, the odd one at the end for SAME_UPPER and at
            the beginning for SAME_LOWER).
        ceil_mode: pooling only: the output size is ceil instead of floor of
            (input + pads - window) / stride + 1, dropping a last window that would start in the end
            padding (PyTorch's and onnxruntime's rule).

    Returns:
        ``(begin, end, out, counted_end)``: padding before and after each axis, the padding after
        including what the last window needs beyond the given padding in ceil mode; the output
        sizes; and the padding after each axis that the given pads account for (what AveragePool's
        ``count_include_pad`` counts).

    Raises:
        ValueError: an unknown ``auto_pad``, or a window larger than the padded input.
    """
    n = len(spatial)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    window = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-size // s) for size, s in zip(spatial, strides)]
        total = [max(0, (o - 1) * s + w - size) for o, s, w, size in zip(out, strides, window, spatial)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad in ("NOTSET", "VALID"):
        if auto_pad == "VALID" or not pads:
            begin, end = [0] * n, [0] * n
        else:
            begin, end = list(pads[:n]), list(pads[n:])
        out = []
        for size, b, e, w, s in zip(spatial, begin, end, window, strides):
            if ceil_mode:
                o = -(-(size + b + e - w) // s) + 1
                if (o - 1) * s >= size + b:  # the last window would start in the end padding
                    o -= 1
            else:
                o = (size + b + e - w) // s + 1
            out.append(o)
    else:
        raise ValueError(f"auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, not {auto_pad!r}")
    if min(out, default=1) < 1:
        raise ValueError(f"a window of {window} does not fit the input {list(spatial)} padded by {begin} and {end}")
    counted_end = list(end)
    end = [max(e, (o - 1) * s + w - size - b) for e, o, s, w, size, b in zip(end, out, strides, window, spatial, begin)]
    return begin, end, out, counted_end


def padded_shape(x, begin, end) -> tuple[int, ...]:
    """The shape of ``x`` (N, C, *spatial) padded by ``begin`` and ``end``, checked against the array
    limit: pads are attributes, so the padded copy is not bounded by the input's size."""
    return check_tensor_shape((*x.shape[:2], *[size + b + e for size, b, e in zip(x.shape[2:], begin, end)]),
                              x.dtype)


def windows(x, kernel, begin, end, out, strides=None, dilations=None, fill=0):
    """A view (N, C, *out, *kernel) of ``x`` (N, C, *spatial) padded with ``fill``: element
    ``[n, c, o1, ..., k1, ...]`` is ``padded[n, c, o1 * s1 + k1 * d1, ...]``.

    The padded copy (or ``x`` itself, when contiguous and unpadded) is the view's only memory.
    """
    n = len(kernel)
    strides = list(strides or [1] * n)
    dilations = list(dilations or [1] * n)
    if any(begin) or any(end):
        padded = np.full(padded_shape(x, begin, end), fill, dtype=x.dtype)
        padded[(slice(None), slice(None), *[slice(b, b + size) for b, size in zip(begin, x.shape[2:])])] = x
    else:
        padded = np.ascontiguousarray(x)
    step = padded.strides
    return np.ndarray(
        (*padded.shape[:2], *out, *kernel), padded.dtype, buffer=padded,
        strides=(*step[:2], *[t * s for t, s in zip(step[2:], strides)], *[t * d for t, d in zip(step[2:], dilations)]),
    )


@op("Conv", since=1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Y = the cross-correlation of X with W (+ B per output channel); Conv-1 to Conv-22.

    Args:
        x: (N, C, D1, ..., Dn). w: (M, C / group, k1, ..., kn). b: (M,) or None.
        auto_pad, pads, strides, dilations: see :func:`window_geometry`.
        group: input and output channels split into ``group`` independent convolutions.
        kernel_shape: if given, must match W's spatial shape.

    Returns:
        (N, M, O1, ..., On), x's dtype.
    """
    kernel = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != kernel:
        raise ValueError(f"kernel_shape {list(kernel_shape)} differs from the weights' spatial shape {kernel}")
    batch, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
    out_channels = w.shape[0]
    if channels != w.shape[1] * group or out_channels % group:
        raise ValueError(f"X has {channels} channels and W {tuple(w.shape)} with group {group}: "
                         "C must be W.shape[1] * group and M a multiple of group")
    begin, end, out, _ = window_geometry(spatial, kernel, strides, dilations, pads, auto_pad)
    n = len(kernel)
    rows, positions = (channels // group) * math.prod(kernel), math.prod(out)
    check_tensor_shape((batch, out_channels, positions), np.result_type(x, w))
    check_tensor_shape((group, rows, positions), x.dtype)  # one sample's im2col, the least scratch used
    view = windows(x, kernel, begin, end, out, strides, dilations)  # (N, C, *out, *kernel)
    # (N, C, *out, *kernel) -> (N, C, *kernel, *out) = (N, group, C/group * K, positions) in C order
    columns = view.transpose(0, 1, *range(2 + n, 2 + 2 * n), *range(2, 2 + n))
    weights = w.reshape(group, out_channels // group, rows)
    y = np.empty((batch, group, out_channels // group, positions), dtype=np.result_type(x, w))
    step = max(1, _CHUNK // (channels * math.prod(kernel) * positions))
    for start in range(0, batch, step):
        stop = min(batch, start + step)
        cols = _scratch((stop - start, group, rows, positions), x.dtype)
        np.copyto(cols.reshape(stop - start, channels, *kernel, *out), columns[start:stop])
        np.matmul(weights, cols, out=y[start:stop])
    y = y.reshape(batch, out_channels, *out)
    if b is not None:
        y += b.reshape(-1, *[1] * n)
    return y


#: Elements of the im2col buffer per chunk of the batch (256 KiB of float32): the batch is convolved
#: in chunks so that the buffer stays in cache and is reused, not allocated (and page-faulted in)
#: again for every call.
_CHUNK = 1 << 16
_SCRATCH = threading.local()


def _scratch(shape, dtype) -> np.ndarray:
    """This thread's reusable im2col buffer as an array of ``shape`` (contents undefined). It never
    leaves :func:`conv`, which does not call back into other code while using it. It holds
    ``max(_CHUNK, one sample's im2col)`` elements of the largest such buffer asked for."""
    size = math.prod(shape)
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.size < size or buffer.dtype != dtype:
        buffer = _SCRATCH.buffer = np.empty(max(size, _CHUNK), dtype)
    return buffer[:size].reshape(shape)
