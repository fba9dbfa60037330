"""Tensor manipulation, shape ops, constants and casts.

https://onnx.ai/onnx/operators/ — each op's page for its version history. Shape-like inputs
(``shape``, ``axes``, ``starts`` ...) are int64 tensors; negative axes count from the end, as they
may from opset 11 on (before it they were non-negative, which numpy's indexing covers too).
"""

from __future__ import annotations

import math

import numpy as np

from ....io.limits import check_tensor_shape
from ....graph.model import ML_DTYPE_NAMES, onnx_dtype
from ..registry import op


@op("Identity", since=1)
def identity(x):
    return x


_CONSTANT_VALUES = ("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                    "value_strings", "sparse_value")


def _check_constant(inputs, attrs, outputs):
    """Constant-12+: "Exactly one of the attributes must be specified" (the operator page)."""
    given = [a for a in _CONSTANT_VALUES if attrs.get(a) is not None]
    if len(given) > 1:
        raise ValueError(f"it has {len(given)} value attributes ({', '.join(given)}); the operator takes exactly one")


@op("Constant", since=1, check=_check_constant)
def constant(*, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
             value_string=None, value_strings=None, sparse_value=None):
    """The one attribute given becomes the output (the value_* attributes exist from opset 12)."""
    if value is not None:
        return np.array(value)
    if value_float is not None or value_floats is not None:
        return np.array(value_float if value_floats is None else value_floats, dtype=np.float32)
    if value_int is not None or value_ints is not None:
        return np.array(value_int if value_ints is None else value_ints, dtype=np.int64)
    if value_string is not None or value_strings is not None:
        return np.array(value_string if value_strings is None else value_strings, dtype=object)
    raise ValueError("Constant node has no value attribute (sparse_value is not supported)")


@op("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value=None):
    """A tensor of shape ``shape`` filled with the one element of ``value`` (default float32 0)."""
    if value is None:
        return np.zeros(check_tensor_shape(shape.tolist(), np.float32), dtype=np.float32)
    return np.full(check_tensor_shape(shape.tolist(), value.dtype), value.reshape(-1)[0], dtype=value.dtype)


@op("Shape", since=1)
def shape_1(data):
    return np.array(data.shape, dtype=np.int64)


@op("Shape", since=15)
def shape_15(data, *, start=0, end=None):
    """Shape-15: dims ``start:end`` of the shape, the bounds clamped as in Python slicing."""
    return np.array(data.shape[start:end], dtype=np.int64)


@op("Size", since=1)
def size(data):
    return np.array(data.size, dtype=np.int64)


def _cast(x, dtype, saturate=1, round_mode="up"):
    if dtype.name in ML_DTYPE_NAMES:  # bfloat16, float8, int4 ...: see _cast_ml
        return _cast_ml(x, dtype, saturate, round_mode)
    if x.dtype.name in ML_DTYPE_NAMES:  # from one: through float32 or int64, which hold it exactly
        if dtype == object or dtype == np.bool_:
            x = x.astype(np.int64 if x.dtype.name in _ML_INTEGERS else np.float32)
    if dtype == object:  # to STRING: the shortest round-tripping decimal, as numpy prints it
        return x.astype(np.str_).astype(object)
    return x.astype(dtype, copy=False)


#: Cast's ``saturate`` (opset 19) clamps to these, the float8 types' largest finite values
#: (``ml_dtypes.finfo(t).max``); the other ml_dtypes types ignore it.
_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0}
_ML_INTEGERS = frozenset({"int4", "uint4", "int2", "uint2"})


def _cast_ml(x, dtype, saturate, round_mode):
    """Cast to an ml_dtypes type, rounding to nearest even once, as the Cast operator page asks.

    * float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) with ``saturate``: +-Inf and values out of range
      become +-max; without it they are NaN (Inf for e5m2), as ml_dtypes converts.
    * float8e8m0: see :func:`_to_e8m0`.
    * int4/uint4, int2/uint2: see :func:`_to_small_integer` (computed here, not by ml_dtypes, whose
      conversion of out-of-range floats changed between releases).
    * float4e2m1, float6: saturating, no NaN or Inf (ml_dtypes' conversion).

    ml_dtypes converts float64 through float32, rounding twice; a float64 (or integer) source is
    therefore first rounded to float32 *to odd*, whose one extra bit keeps the final rounding exact.
    """
    name = dtype.name
    if name == "float8_e8m0fnu":
        return _to_e8m0(x, dtype, saturate, round_mode)
    if name in _ML_INTEGERS:
        return _to_small_integer(x, dtype)
    src = x.dtype
    if src == object or src.kind in "iub":
        x = x.astype(np.float64)
    elif src.name in ML_DTYPE_NAMES:
        x = x.astype(np.float32)  # exact for every ml_dtypes type
    limit = _FLOAT8_MAX.get(name)
    if limit is not None and saturate:
        x = np.clip(x, -limit, limit)  # NaN stays NaN
    if x.dtype == np.float64:
        x = _float32_round_to_odd(x)
    return x.astype(dtype)


#: Width in bits and signedness of the ml_dtypes fixed-point types.
_SMALL_INTEGERS = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}


def _to_small_integer(x, dtype):
    """Cast to int4/uint4/int2/uint2 (Cast-21 on, the operator page's rules for fixed point).

    An integer (or bool) source out of range keeps its low bits, read in two's complement for the
    signed types: the rule the Cast page defines (``200 (int16) -> -56 (int8)``; here
    ``8 -> -8``, ``-9 -> 7`` for int4). A float source out of range is undefined on that page;
    policyport truncates toward zero and then keeps the low bits of that integer as above
    (``-9.0 -> 7``, ``15.0 -> -1``, ``-8.7 -> -8`` for int4), exactly for every finite value however
    large; NaN and +-Inf become 0. Strings are read as the floats they spell. This never raises and
    does not depend on the installed ml_dtypes, which converts out-of-range floats differently from
    release to release (0.5 wraps as above, 0.7 gives 0): only in-range int8 values reach it.
    """
    bits, signed = _SMALL_INTEGERS[dtype.name]
    modulus = 1 << bits
    if x.dtype == object:
        x = x.astype(np.float64)
    elif x.dtype.name in ML_DTYPE_NAMES and x.dtype.name not in _SMALL_INTEGERS:
        x = x.astype(np.float32)  # every ml_dtypes float is exact in float32
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            whole = np.where(np.isfinite(x), np.trunc(x), 0)
        # fmod is exact: the remainder of a float by a power of two is representable
        low = np.fmod(whole, modulus).astype(np.int64)
    else:
        low = x.astype(np.int64)  # uint64 beyond int64 wraps, keeping the low 64 bits
    low = low & (modulus - 1)
    if signed:
        low = np.where(low >= modulus >> 1, low - modulus, low)
    return np.asarray(low, dtype=np.int8).astype(dtype)


def _float32_round_to_odd(x):
    """float64 -> float32 truncated toward zero, the last bit set when inexact ("round to odd").

    Rounding this to a format of at most 22 significand bits gives what rounding ``x`` directly
    would. Beyond float32's range it is +-Inf, which every ml_dtypes type's range is inside of.
    """
    with np.errstate(under="ignore", over="ignore"):
        y = x.astype(np.float32)
        wide = y.astype(np.float64)
        inexact = (wide != x) & np.isfinite(y)  # neither NaN nor overflow to Inf
        away = inexact & (np.abs(wide) > np.abs(x))
        y = np.where(away, np.nextafter(y, np.float32(0)), y)
    bits = y.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32)


def _to_e8m0(x, dtype, saturate, round_mode):
    """To float8e8m0 (2**(code - 127), code 0..254; 255 is NaN) by ``round_mode`` (Cast-24 on).

    ``up`` rounds x to the next power of two, ``down`` to the previous one, ``nearest`` to the
    nearer of them in value, a tie (1.5 * 2**k) going up. As the operator page's table has it,
    x above E8M0_MAX = 2**127 (Inf too) gives E8M0_MAX with ``saturate`` (the default) and NaN
    without; x below E8M0_MIN = 2**-127 (zero too) gives E8M0_MIN, or NaN. NaN stays NaN. Negative
    x is unspecified; like onnxruntime we take it as below E8M0_MIN.
    """
    v = x.astype(np.float64) if x.dtype != np.float64 else x
    with np.errstate(invalid="ignore"):
        mantissa, exponent = np.frexp(v)  # |v| = m * 2**e, 0.5 <= m < 1
        fraction = np.abs(mantissa) * 2 - 1  # |v| = (1 + fraction) * 2**(e - 1)
        code = exponent.astype(np.int64) + 126
        if round_mode == "up":
            code += fraction > 0
        elif round_mode == "nearest":
            code += fraction >= 0.5
        elif round_mode != "down":
            raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', not {round_mode!r}")
        low, high = v < _E8M0_MIN, v > _E8M0_MAX  # NaN is neither
    if saturate:
        code = np.where(low, 0, np.where(high, 254, np.minimum(code, 254)))
    else:
        code = np.where(low | high, 255, np.minimum(code, 254))
    code = np.where(np.isnan(v), 255, code)
    return code.astype(np.uint8).view(dtype)


_E8M0_MIN, _E8M0_MAX = 2.0**-127, 2.0**127


@op("Cast", since=6)
def cast(x, *, to, saturate=1, round_mode="up"):
    """Cast-6 on (``to`` is a TensorProto data type code; before 6 it was a string).

    Float to integer truncates toward zero; strings parse as Python floats ("INF", "NaN" ...).
    ``saturate`` (opset 19) and ``round_mode`` (24) concern the float8 types, which need the
    optional ml_dtypes package (without it :func:`policyport.graph.model.onnx_dtype` refuses them):
    see :func:`_cast_ml`.
    """
    return _cast(x, onnx_dtype(to), saturate, round_mode)


@op("CastLike", since=15)
def cast_like(x, target_type, *, saturate=1, round_mode="up"):
    """Cast ``x`` to the element type of ``target_type`` (``saturate``, ``round_mode``: see Cast)."""
    return _cast(x, target_type.dtype, saturate, round_mode)


def _check_reshape_shape(new) -> None:
    if any(d < -1 for d in new):
        raise ValueError(f"shape {list(new)} has a dimension below -1 (only -1, inferred, may be negative)")
    if sum(d == -1 for d in new) > 1:
        raise ValueError(f"shape {list(new)} has more than one -1")


def _check_reshape(inputs, attrs, outputs):
    if inputs[1].value is not None:
        new = np.asarray(inputs[1].value).tolist()
        _check_reshape_shape(new)
        if attrs.get("allowzero", 0) and 0 in new and -1 in new:
            raise ValueError(f"shape {new} has both 0 and -1, which allowzero=1 forbids")


@op("Reshape", since=5, check=_check_reshape)
def reshape(data, shape, *, allowzero=0):
    """A 0 in ``shape`` copies the input dimension (unless allowzero=1, opset 14); -1 is inferred."""
    new = shape.tolist()
    _check_reshape_shape(new)
    if not allowzero:
        new = [data.shape[i] if d == 0 else d for i, d in enumerate(new)]
    return np.reshape(data, new)


@op("Flatten", since=1)
def flatten(x, *, axis=1):
    """To 2-D: (prod(shape[:axis]), prod(shape[axis:])); ``axis`` in [-rank, rank] (negative from opset 11)."""
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"axis {axis} is out of range for a rank-{x.ndim} input (allowed: {-x.ndim} to {x.ndim})")
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


@op("Squeeze", since=1)
def squeeze_1(data, *, axes=None):
    """Squeeze-1/11: ``axes`` attribute; without it every dimension of size 1 goes."""
    return np.squeeze(data, axis=None if axes is None else tuple(axes))


@op("Squeeze", since=13)
def squeeze_13(data, axes=None):
    """Squeeze-13: ``axes`` is an optional input."""
    return np.squeeze(data, axis=None if axes is None else tuple(axes.tolist()))


@op("Unsqueeze", since=1)
def unsqueeze_1(data, *, axes):
    """Unsqueeze-1/11: insert size-1 dimensions at ``axes`` of the output."""
    return np.expand_dims(data, tuple(axes))


@op("Unsqueeze", since=13)
def unsqueeze_13(data, axes):
    """Unsqueeze-13: ``axes`` is an input."""
    return np.expand_dims(data, tuple(axes.tolist()))


def _check_transpose(inputs, attrs, outputs):
    perm = attrs.get("perm")
    if perm is None:
        return
    if sorted(perm) != list(range(len(perm))):
        raise ValueError(f"perm {list(perm)} is not a permutation of 0..{len(perm) - 1}")
    rank = inputs[0].rank
    if rank is not None and rank != len(perm):
        raise ValueError(f"perm {list(perm)} has {len(perm)} entries for a rank-{rank} input")


@op("Transpose", since=1, check=_check_transpose)
def transpose(data, *, perm=None):
    """Permute the axes by ``perm`` (default: reverse them)."""
    return np.transpose(data, perm)


@op("Concat", since=4)
def concat(*inputs, axis):
    return np.concatenate(inputs, axis=axis)


def _split(x, sizes, axis, node_outputs):
    """The parts of ``x`` of ``sizes`` along ``axis``, which must add up to its length there."""
    length = x.shape[axis]
    _check_sizes(sizes, node_outputs, length)
    parts = tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))
    return parts if node_outputs > 1 else parts[0]


def _check_sizes(sizes, outputs: int, length: int | None) -> None:
    """Split sizes: one per output, none negative, adding up to the axis ``length`` (if known)."""
    if len(sizes) != outputs:
        raise ValueError(f"split sizes {list(sizes)} give {len(sizes)} parts for {outputs} outputs")
    if any(v < 0 for v in sizes):
        raise ValueError(f"split sizes {list(sizes)} include a negative size")
    if length is not None and sum(sizes) != length:
        raise ValueError(f"split sizes {list(sizes)} add up to {sum(sizes)}, but the axis has length {length}")


def _equal_sizes(length, n):
    """Split-2/13 without sizes: ``n`` equal parts, so ``n`` must divide ``length``."""
    if length % n:
        raise ValueError(f"an axis of length {length} cannot be split into {n} equal parts; give the sizes")
    return [length // n] * n


def _even_sizes(length, n):
    """Split-18's ``num_outputs``: ``n`` chunks of ceil(length / n), the last one smaller."""
    chunk = -(-length // n)
    if n < 1 or chunk * (n - 1) > length:
        raise ValueError(f"an axis of length {length} cannot be split into {n} parts of ceil({length}/{n})")
    return [chunk] * (n - 1) + [length - chunk * (n - 1)]


def _check_split(version):
    """The compile-time check of Split-``version``: sizes from the ``split`` attribute (2, 11) or a
    constant ``split`` input (13, 18), ``num_outputs`` (18), the axis length when it is known."""

    def check(inputs, attrs, outputs):
        axis = attrs.get("axis", 0)
        rank = inputs[0].rank
        if rank is not None and not -rank <= axis < rank:
            raise ValueError(f"axis {axis} is out of range for a rank-{rank} input")
        length = inputs[0].dim(axis)
        given = len(inputs) > 1 and inputs[1].dtype is not None
        sizes = attrs.get("split") if version < 13 else (
            np.asarray(inputs[1].value).tolist() if given and inputs[1].value is not None else None)
        num_outputs = attrs.get("num_outputs")
        if version >= 18:
            if given and num_outputs is not None:
                raise ValueError("both the split input and num_outputs are given; the operator takes one")
            if num_outputs is not None and num_outputs != outputs:
                raise ValueError(f"num_outputs is {num_outputs} but the node has {outputs} outputs")
        if sizes is not None:
            _check_sizes(sizes, outputs, length)
        elif length is not None and not given:
            _even_sizes(length, outputs) if version >= 18 else _equal_sizes(length, outputs)

    return check


@op("Split", since=2, check=_check_split(2))
def split_2(x, *, axis=0, split=None, node_outputs):
    """Split-2/11: sizes from the ``split`` attribute, else equal parts, one per node output."""
    return _split(x, split or _equal_sizes(x.shape[axis], node_outputs), axis, node_outputs)


@op("Split", since=13, check=_check_split(13))
def split_13(x, split=None, *, axis=0, node_outputs):
    """Split-13: sizes from the optional ``split`` input, else equal parts, one per node output."""
    sizes = _equal_sizes(x.shape[axis], node_outputs) if split is None else split.tolist()
    return _split(x, sizes, axis, node_outputs)


@op("Split", since=18, check=_check_split(18))
def split_18(x, split=None, *, axis=0, num_outputs=None, node_outputs):
    """Split-18: without ``split``, ``num_outputs`` parts of ceil(dim / num_outputs), the last smaller."""
    if split is None:
        sizes = _even_sizes(x.shape[axis], num_outputs or node_outputs)
    else:
        sizes = split.tolist()
    return _split(x, sizes, axis, node_outputs)


def _check_slice_lists(starts, ends, axes, steps, rank=None) -> None:
    """starts, ends (and axes, steps when given) of one length; axes distinct and within the rank."""
    lengths = {len(starts), len(ends), *(len(v) for v in (axes, steps) if v is not None)}
    if len(lengths) > 1:
        raise ValueError(f"starts {list(starts)}, ends {list(ends)}, axes {None if axes is None else list(axes)} and "
                         f"steps {None if steps is None else list(steps)} differ in length")
    if axes is not None:
        if rank is not None and any(not -rank <= a < rank for a in axes):
            raise ValueError(f"axes {list(axes)} are out of range for a rank-{rank} input")
        normal = [a % rank for a in axes] if rank else list(axes)
        if len(set(normal)) != len(normal):
            raise ValueError(f"axes {list(axes)} repeat an axis")
    if steps is not None and 0 in list(steps):
        raise ValueError(f"steps {list(steps)} include 0")


def _check_slice_1(inputs, attrs, outputs):
    _check_slice_lists(attrs.get("starts", ()), attrs.get("ends", ()), attrs.get("axes"), None, inputs[0].rank)


def _check_slice_10(inputs, attrs, outputs):
    values = [None if i >= len(inputs) else inputs[i].value for i in range(1, 5)]
    if values[0] is not None and values[1] is not None and all(
            v is not None or i + 1 >= len(inputs) or inputs[i + 1].dtype is None for i, v in enumerate(values[2:], 2)):
        listed = [None if v is None else np.asarray(v).tolist() for v in values]
        _check_slice_lists(*listed, rank=inputs[0].rank)


def _slice(data, starts, ends, axes, steps):
    _check_slice_lists(starts, ends, axes, steps, data.ndim)
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, st)
    return data[tuple(index)]


@op("Slice", since=1, check=_check_slice_1)
def slice_1(data, *, starts, ends, axes=None):
    """Slice-1: starts, ends and axes are attributes; indices clamp as in Python slicing."""
    axes = range(len(starts)) if axes is None else axes
    return _slice(data, starts, ends, axes, [1] * len(starts))


@op("Slice", since=10, check=_check_slice_10)
def slice_10(data, starts, ends, axes=None, steps=None):
    """Slice-10/11/13: starts, ends, axes and steps are inputs; indices clamp as in Python slicing."""
    n = len(starts)
    axes = range(n) if axes is None else axes.tolist()
    steps = [1] * n if steps is None else steps.tolist()
    return _slice(data, starts.tolist(), ends.tolist(), axes, steps)


@op("Gather", since=1)
def gather(data, indices, *, axis=0):
    """numpy.take: negative indices count from the end (allowed from opset 11).

    The output, data.shape[:axis] + indices.shape + data.shape[axis + 1:], can be far larger than
    both inputs together, so its size is checked first.
    """
    if -data.ndim <= axis < data.ndim:  # else numpy names the bad axis
        axis %= data.ndim
        check_tensor_shape((*data.shape[:axis], *indices.shape, *data.shape[axis + 1:]), data.dtype)
    return np.take(data, indices, axis=axis)


@op("Expand", since=8)
def expand(x, shape):
    """Broadcast ``x`` with ``shape`` in both directions (a dim of 1 in ``shape`` keeps x's dim)."""
    out = check_tensor_shape(np.broadcast_shapes(x.shape, tuple(shape.tolist())), x.dtype)
    return np.broadcast_to(x, out).copy()


def _check_tile(inputs, attrs, outputs):
    repeats, rank = inputs[1].value, inputs[0].rank
    if repeats is not None:
        repeats = np.asarray(repeats).tolist()
        if any(r < 0 for r in repeats):
            raise ValueError(f"repeats {repeats} include a negative count")
        if rank is not None and len(repeats) != rank:
            raise ValueError(f"repeats {repeats} has {len(repeats)} entries for a rank-{rank} input")


@op("Tile", since=6, check=_check_tile)
def tile(x, repeats):
    """``x`` repeated ``repeats[i]`` times along axis i (one repeat per axis)."""
    repeats = repeats.tolist()
    if len(repeats) != x.ndim:
        raise ValueError(f"Tile needs one repeat per axis: {len(repeats)} repeats for {x.ndim} axes")
    check_tensor_shape([d * r for d, r in zip(x.shape, repeats)], x.dtype)
    return np.tile(x, tuple(repeats))


@op("Where", since=9)
def where(condition, x, y):
    return np.where(condition, x, y)


@op("Range", since=11)
def range_(start, limit, delta, *, stash_type=1):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0).

    Floats are computed in float64 and rounded once. float16 and bfloat16 (Range-27) are computed
    in the ``stash_type`` element type, float32 by default.
    """
    dtype = start.dtype
    if dtype == np.float16 or dtype.name == "bfloat16":
        work = onnx_dtype(stash_type)
    elif np.issubdtype(dtype, np.floating):
        work = np.float64
    else:
        work = dtype
    first, last, step = start.item(), limit.item(), delta.item()
    if step == 0:
        raise ZeroDivisionError("Range: delta is 0")
    # exact for integers; an infinite or NaN float count raises OverflowError or ValueError
    count = -(-(last - first) // step) if isinstance(step, int) else math.ceil((last - first) / step)
    check_tensor_shape([max(count, 0)], dtype)
    return np.arange(first, last, step, dtype=work).astype(dtype, copy=False)
