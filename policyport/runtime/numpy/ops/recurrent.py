"""Recurrent layers: RNN, GRU and LSTM, one layer each, forward, reverse or bidirectional.

https://onnx.ai/onnx/operators/onnx__RNN.html, onnx__GRU.html, onnx__LSTM.html. Versions 7 on are
implemented (before 7 they carried an ``output_sequence`` attribute); 14 added ``layout``, 22 only
types. The three share one driver, :func:`_recur`:

* the input projections of every time step, ``X W^T + Wb (+ Rb)``, are one matrix product;
* the time steps run in a Python loop, each one matrix product with ``R^T`` plus element-wise gates;
* ``reverse`` runs over each sequence's own valid steps backwards (``sequence_lens``), as
  onnxruntime does: a batch entry of length L reads steps L-1 .. 0, and its outputs beyond L are 0;
* ``Y_h`` (and LSTM's ``Y_c``) hold each sequence's state after its last valid step, zeros for a
  sequence of length 0 (onnxruntime's choice; the pages are silent).

Activations are named as on the operator pages, case-insensitively; ThresholdedRelu keeps x where
x > alpha, as the ThresholdedRelu operator and onnxruntime do (the recurrent pages write >=).
``activation_alpha`` and ``activation_beta`` are consumed in the order of the activations, each
value by the next activation that takes that parameter (Affine, LeakyRelu, ThresholdedRelu,
ScaledTanh, HardSigmoid, Elu), the operator's default when the list runs out: LeakyRelu 0.01,
HardSigmoid 0.2 and 0.5, Elu 1.0, ThresholdedRelu 1.0 (the ThresholdedRelu operator's), Affine 1.0
and 0.0, ScaledTanh 1.0 and 1.0 (onnxruntime defaults these last three's parameters to 0). ``clip``
bounds every activation's input to [-clip, clip] except that of the LSTM's output activation
``h(Ct)``, as onnxruntime does.
"""

from __future__ import annotations

import numpy as np

from ..registry import op
from .activation import _softplus


def _logistic(x):
    """1 / (1 + exp(-x)) in three ufunc calls; exp overflows to inf (giving 0) for very negative x,
    so the caller silences overflow (:func:`_recur` runs every step under ``np.errstate``)."""
    e = np.exp(-x)
    e += 1
    return np.reciprocal(e, out=e)


def _scaled_tanh(x, alpha, beta):
    return alpha * np.tanh(beta * x)


def _elu(x, alpha, beta):
    return np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))


#: name (lower case) -> (function of (x, alpha, beta), default alpha or None if it takes none,
#: default beta or None).
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, x.dtype.type(0)), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _logistic(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, x.dtype.type(0)), 1.0, None),
    "scaledtanh": (_scaled_tanh, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (_elu, 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: _softplus(x), None, None),
}


def _activation_functions(names, alphas, betas, defaults, num_directions):
    """One list of unary functions per direction, their parameters bound (see the module docstring)."""
    names = list(defaults * num_directions if names is None else names)
    per_direction = len(defaults)
    if len(names) != per_direction * num_directions:
        raise ValueError(
            f"activations lists {len(names)} functions; {per_direction * num_directions} expected "
            f"({per_direction} per direction)"
        )
    alphas, betas = list(alphas or ()), list(betas or ())
    functions = []
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise ValueError(f"unknown activation {name!r}; expected one of {', '.join(_ACTIVATIONS)}")
        fn, alpha, beta = entry
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        functions.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    return [functions[d * per_direction:(d + 1) * per_direction] for d in range(num_directions)]


def _reverse_within(x, lengths):
    """``x`` (seq, batch, ...) with each batch entry's first ``lengths[b]`` steps in reverse order."""
    seq = x.shape[0]
    t = np.arange(seq)[:, None]
    source = np.where(t < lengths, lengths - 1 - t, t)  # (seq, batch)
    return x[source, np.arange(x.shape[1])]


def _recur(cell, x, w, r, b, sequence_lens, initial, *, gates, direction, layout, hidden_size,
           clip, node_outputs, fold_recurrence_bias=True):
    """Run ``cell`` over the sequence in each direction; return (Y, final states ...) per node_outputs.

    ``cell(projected, state, r_t, rb, d, clip)`` -> (new state tuple, hidden) advances one step;
    ``projected`` is the input projection of that step (batch, gates * hidden), ``state`` the tuple
    of the states (hidden first), ``r_t`` = R[d]^T, ``rb`` the recurrence bias (None if folded into
    the projection).
    """
    num_directions = 2 if direction == "bidirectional" else 1
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ValueError(f"direction must be forward, reverse or bidirectional, not {direction!r}")
    if layout:
        x = np.swapaxes(x, 0, 1)
        initial = [None if s is None else np.swapaxes(s, 0, 1) for s in initial]
    seq, batch = x.shape[0], x.shape[1]
    hidden = hidden_size or r.shape[-1]
    if w.shape[0] != num_directions or w.shape[1] != gates * hidden or r.shape[1:] != (gates * hidden, hidden):
        raise ValueError(
            f"W {w.shape} and R {r.shape} do not fit {num_directions} direction(s), {gates} gates and "
            f"hidden_size {hidden}"
        )
    lengths = None
    if sequence_lens is not None:
        lengths = np.asarray(sequence_lens).astype(np.int64)
        if lengths.shape != (batch,) or lengths.min(initial=0) < 0 or lengths.max(initial=0) > seq:
            raise ValueError(f"sequence_lens {lengths.tolist()} must hold {batch} lengths in [0, {seq}]")
        if (lengths == seq).all():
            lengths = None
    dtype = x.dtype
    y = np.zeros((seq, num_directions, batch, hidden), dtype)
    finals = []
    for d, reverse in enumerate([direction == "reverse"] if num_directions == 1 else [False, True]):
        bias_w = bias_r = None
        if b is not None:
            bias_w, bias_r = b[d, :gates * hidden], b[d, gates * hidden:]
            if fold_recurrence_bias:
                bias_w, bias_r = bias_w + bias_r, None
        xs = x if not reverse else (x[::-1] if lengths is None else _reverse_within(x, lengths))
        projected = np.matmul(xs, w[d].T)
        if bias_w is not None:
            projected += bias_w
        state = tuple(np.zeros((batch, hidden), dtype) if s is None else s[d].astype(dtype, copy=True)
                      for s in initial)
        r_t = r[d].T
        ys = np.zeros((seq, batch, hidden), dtype)
        with np.errstate(over="ignore", under="ignore"):  # saturating activations (see _logistic)
            for t in range(seq):
                new_state, h = cell(projected[t], state, r_t, bias_r, d, clip)
                if lengths is not None:
                    active = (t < lengths)[:, None]
                    new_state = tuple(np.where(active, n, s) for n, s in zip(new_state, state))
                    h = np.where(active, h, dtype.type(0))
                state = new_state
                ys[t] = h
        if reverse:
            ys = ys[::-1] if lengths is None else _reverse_within(ys, lengths)
        if lengths is not None and not lengths.all():
            state = tuple(np.where((lengths > 0)[:, None], s, dtype.type(0)) for s in state)
        y[:, d] = ys
        finals.append(state)
    outputs = [y] + [np.stack([f[k] for f in finals]) for k in range(len(initial))]
    if layout:
        outputs = [np.ascontiguousarray(y.transpose(2, 0, 1, 3))] + [np.ascontiguousarray(np.swapaxes(s, 0, 1))
                                                                  for s in outputs[1:]]
    return outputs[0] if node_outputs == 1 else tuple(outputs[:node_outputs])


def _clipped(v, clip):
    return v if clip is None else np.clip(v, -clip, clip)


# --- RNN ------------------------------------------------------------------------------------------

def _rnn(x, w, r, b, sequence_lens, initial_h, *, activations, activation_alpha, activation_beta, clip,
         direction, hidden_size, layout, node_outputs):
    funcs = _activation_functions(activations, activation_alpha, activation_beta, ["Tanh"],
                                  2 if direction == "bidirectional" else 1)

    def cell(projected, state, r_t, rb, d, clip):
        (f,) = funcs[d]
        h = f(_clipped(projected + state[0] @ r_t, clip))
        return (h,), h

    return _recur(cell, x, w, r, b, sequence_lens, [initial_h], gates=1, direction=direction, layout=layout,
                  hidden_size=hidden_size, clip=clip, node_outputs=node_outputs)


@op("RNN", since=7)
def rnn_7(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activations=None, activation_alpha=None,
          activation_beta=None, clip=None, direction="forward", hidden_size=None, node_outputs):
    """RNN-7: Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi); f = Tanh unless ``activations`` says otherwise.

    Args:
        x: (seq_length, batch, input_size). w: (num_directions, hidden, input_size).
        r: (num_directions, hidden, hidden). b: (num_directions, 2 * hidden), [Wb, Rb].
        sequence_lens: int32 (batch,). initial_h: (num_directions, batch, hidden).

    Returns:
        Y (seq_length, num_directions, batch, hidden) and Y_h (num_directions, batch, hidden), as
        many as the node has outputs.
    """
    return _rnn(x, w, r, b, sequence_lens, initial_h, activations=activations, activation_alpha=activation_alpha,
                activation_beta=activation_beta, clip=clip, direction=direction, hidden_size=hidden_size,
                layout=0, node_outputs=node_outputs)


@op("RNN", since=14)
def rnn_14(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activations=None, activation_alpha=None,
           activation_beta=None, clip=None, direction="forward", hidden_size=None, layout=0, node_outputs):
    """RNN-14/22: RNN-7 plus ``layout``: 1 puts the batch axis first in X (batch, seq_length, input_size),
    Y (batch, seq_length, num_directions, hidden), initial_h and Y_h (batch, num_directions, hidden)."""
    return _rnn(x, w, r, b, sequence_lens, initial_h, activations=activations, activation_alpha=activation_alpha,
                activation_beta=activation_beta, clip=clip, direction=direction, hidden_size=hidden_size,
                layout=layout, node_outputs=node_outputs)


# --- GRU ------------------------------------------------------------------------------------------

def _gru(x, w, r, b, sequence_lens, initial_h, *, activations, activation_alpha, activation_beta, clip,
         direction, hidden_size, linear_before_reset, layout, node_outputs):
    funcs = _activation_functions(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"],
                                  2 if direction == "bidirectional" else 1)

    def cell(projected, state, r_t, rb, d, clip):
        f, g = funcs[d]
        h_prev = state[0]
        n = h_prev.shape[1]
        rec = h_prev @ r_t[:, :2 * n]
        if rb is not None:
            rec += rb[:2 * n]
        rec += projected[:, :2 * n]
        update_reset = f(_clipped(rec, clip))  # z and r in one call
        z, reset = update_reset[:, :n], update_reset[:, n:]
        ph = projected[:, 2 * n:]
        if linear_before_reset:
            hidden_rec = h_prev @ r_t[:, 2 * n:]
            if rb is not None:
                hidden_rec += rb[2 * n:]
            candidate = g(_clipped(ph + reset * hidden_rec, clip))
        else:
            hidden_rec = (reset * h_prev) @ r_t[:, 2 * n:]
            if rb is not None:
                hidden_rec += rb[2 * n:]
            candidate = g(_clipped(ph + hidden_rec, clip))
        h = (1 - z) * candidate + z * h_prev
        return (h,), h

    return _recur(cell, x, w, r, b, sequence_lens, [initial_h], gates=3, direction=direction, layout=layout,
                  hidden_size=hidden_size, clip=clip, node_outputs=node_outputs, fold_recurrence_bias=False)


@op("GRU", since=7)
def gru_7(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activations=None, activation_alpha=None,
          activation_beta=None, clip=None, direction="forward", hidden_size=None, linear_before_reset=0,
          node_outputs):
    """GRU-7: gates in the order z (update), r (reset), h (hidden); f = Sigmoid, g = Tanh by default.

    zt = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz), rt likewise, then
    ht = g(Xt Wh^T + (rt (.) Ht-1) Rh^T + Rbh + Wbh), or with ``linear_before_reset``
    ht = g(Xt Wh^T + rt (.) (Ht-1 Rh^T + Rbh) + Wbh); Ht = (1 - zt) (.) ht + zt (.) Ht-1.
    Shapes as for RNN with 3 * hidden gate rows (b: 6 * hidden).
    """
    return _gru(x, w, r, b, sequence_lens, initial_h, activations=activations, activation_alpha=activation_alpha,
                activation_beta=activation_beta, clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, layout=0, node_outputs=node_outputs)


@op("GRU", since=14)
def gru_14(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activations=None, activation_alpha=None,
           activation_beta=None, clip=None, direction="forward", hidden_size=None, linear_before_reset=0,
           layout=0, node_outputs):
    """GRU-14/22: GRU-7 plus ``layout`` (1: batch axis first, as for RNN-14)."""
    return _gru(x, w, r, b, sequence_lens, initial_h, activations=activations, activation_alpha=activation_alpha,
                activation_beta=activation_beta, clip=clip, direction=direction, hidden_size=hidden_size,
                linear_before_reset=linear_before_reset, layout=layout, node_outputs=node_outputs)


# --- LSTM -----------------------------------------------------------------------------------------

def _lstm(x, w, r, b, sequence_lens, initial_h, initial_c, p, *, activations, activation_alpha, activation_beta,
          clip, direction, hidden_size, input_forget, layout, node_outputs):
    funcs = _activation_functions(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"],
                                  2 if direction == "bidirectional" else 1)

    def cell(projected, state, r_t, rb, d, clip):
        f, g, h_act = funcs[d]
        h_prev, c_prev = state
        n = h_prev.shape[1]
        pre = h_prev @ r_t
        pre += projected  # gates i, o, f, c
        pc = pre[:, 3 * n:]
        if p is None:  # i, o and f in one call
            gates = f(_clipped(pre[:, :3 * n], clip))
            inp, out, forget = gates[:, :n], gates[:, n:2 * n], gates[:, 2 * n:]
        else:
            inp = f(_clipped(pre[:, :n] + p[d, :n] * c_prev, clip))
            forget = f(_clipped(pre[:, 2 * n:3 * n] + p[d, 2 * n:] * c_prev, clip))
        if input_forget:
            forget = 1 - inp
        c = forget * c_prev + inp * g(_clipped(pc, clip))
        if p is not None:
            out = f(_clipped(pre[:, n:2 * n] + p[d, n:2 * n] * c, clip))
        h = out * h_act(c)
        return (h, c), h

    return _recur(cell, x, w, r, b, sequence_lens, [initial_h, initial_c], gates=4, direction=direction,
                  layout=layout, hidden_size=hidden_size, clip=clip, node_outputs=node_outputs)


@op("LSTM", since=7)
def lstm_7(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activations=None,
           activation_alpha=None, activation_beta=None, clip=None, direction="forward", hidden_size=None,
           input_forget=0, node_outputs):
    """LSTM-7: gates in the order i, o, f, c; f = Sigmoid, g = Tanh, h = Tanh by default.

    it = f(Xt Wi^T + Ht-1 Ri^T + Pi (.) Ct-1 + Wbi + Rbi), ft likewise with Pf,
    Ct = ft (.) Ct-1 + it (.) g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc),
    ot = f(Xt Wo^T + Ht-1 Ro^T + Po (.) Ct + Wbo + Rbo), Ht = ot (.) h(Ct).
    ``input_forget=1`` couples the forget gate to the input gate: ft = 1 - it (the "coupled input and
    forget gate" LSTM; onnxruntime's reading of "couple the input and forget gates").

    Args:
        x: (seq_length, batch, input_size). w: (num_directions, 4 * hidden, input_size).
        r: (num_directions, 4 * hidden, hidden). b: (num_directions, 8 * hidden), [Wb, Rb].
        sequence_lens: int32 (batch,). initial_h, initial_c: (num_directions, batch, hidden).
        p: peepholes (num_directions, 3 * hidden), [Pi, Po, Pf].

    Returns:
        Y (seq_length, num_directions, batch, hidden), Y_h and Y_c (num_directions, batch, hidden),
        as many as the node has outputs.
    """
    return _lstm(x, w, r, b, sequence_lens, initial_h, initial_c, p, activations=activations,
                 activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip, direction=direction,
                 hidden_size=hidden_size, input_forget=input_forget, layout=0, node_outputs=node_outputs)


@op("LSTM", since=14)
def lstm_14(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activations=None,
            activation_alpha=None, activation_beta=None, clip=None, direction="forward", hidden_size=None,
            input_forget=0, layout=0, node_outputs):
    """LSTM-14/22: LSTM-7 plus ``layout`` (1: batch axis first in X, Y, initial_h/c and Y_h/Y_c)."""
    return _lstm(x, w, r, b, sequence_lens, initial_h, initial_c, p, activations=activations,
                 activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip, direction=direction,
                 hidden_size=hidden_size, input_forget=input_forget, layout=layout, node_outputs=node_outputs)
