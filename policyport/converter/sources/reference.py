"""The source's own forward pass of an :class:`~policyport.converter.build.MlpSpec`, in numpy or torch.

This is the source's own computation for a weights file (RLlib's ``FullyConnectedNetwork``:
``h = act(h @ kernel + bias)`` per hidden layer, then ``fc_out``; ``ray/rllib/models/tf/fcnet.py``;
SB3's ``ActorCriticPolicy``: ``mlp_extractor`` then ``action_net``, and ``predict``'s deterministic
action, ``stable_baselines3/common/policies.py``), written directly from the arrays and independent
of policyport's ONNX interpreter, so that verification has something to compare both backends against.

:func:`reference_forward` computes it with numpy; :func:`torch_forward` runs the same layers as torch
modules (``nn.Linear``, the activation and normalisation modules, with the source's parameters
loaded) and records each module's output with forward hooks, keyed by module path.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import require
from ..build import GAUSSIAN_HEADS, Dense, MlpSpec, Step


class _NumpyOps:
    """The forward pass's primitives in numpy (the source frameworks' definitions)."""

    @staticmethod
    def affine(layer: Dense, x):
        w = layer.weight if layer.weight_layout == "in_out" else layer.weight.T
        y = x @ w.astype(x.dtype, copy=False)
        return y + layer.bias.astype(x.dtype, copy=False) if layer.bias is not None else y

    @staticmethod
    def step(step: Step, x):
        if step.kind == "activation":
            return step.activation.reference(x)
        p = {k: a.astype(x.dtype, copy=False) for k, (_, a) in step.params.items()}
        if step.kind == "layer_norm":
            mean = x.mean(axis=-1, keepdims=True)
            var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
            y = (x - mean) / np.sqrt(var + x.dtype.type(step.eps))
        else:
            y = (x - p["running_mean"]) / np.sqrt(p["running_var"] + x.dtype.type(step.eps))
        # each affine parameter where the module has it (nn.LayerNorm(bias=False) has a weight alone)
        y = y * p["weight"] if "weight" in p else y
        return y + p["bias"] if "bias" in p else y

    @staticmethod
    def flatten(x):
        return x.reshape(x.shape[0], math.prod(x.shape[1:]))  # not -1: numpy cannot infer it for an empty batch

    @staticmethod
    def obs_norm(norm, x):
        # in float64 whatever the statistics' dtype, as the graph's float64 initializers hold them: a
        # float32 var plus epsilon would otherwise round in float32
        x64 = x.astype(np.float64)  # pragma: no mutate (astype(None) is astype(float64))
        std = np.sqrt(np.asarray(norm.var, np.float64) + norm.epsilon)
        y = np.clip((x64 - norm.mean) / std, -norm.clip_obs, norm.clip_obs)
        return y.astype(x.dtype)

    concat = staticmethod(lambda xs: np.concatenate(xs, axis=1))
    broadcast = staticmethod(lambda v, like: np.broadcast_to(v, like.shape))
    argmax = staticmethod(lambda x: np.argmax(x, axis=1).astype(np.int64))
    quantiles = staticmethod(lambda x, n: x.reshape(x.shape[0], n, x.shape[1] // n))
    quantile_mean = staticmethod(lambda x: x.mean(axis=1))
    clip = staticmethod(lambda x, low, high: np.minimum(np.maximum(x, low), high))
    tanh = staticmethod(np.tanh)
    asarray = staticmethod(lambda x, like: np.asarray(x, like.dtype))
    to_numpy = staticmethod(np.asarray)


def _forward(spec: MlpSpec, obs, head: str | None, ops, record, dtype: np.dtype) -> dict[str, np.ndarray]:
    """The forward pass of ``spec`` through ``ops`` in ``dtype``; ``record(name, value)`` keeps each tensor."""
    out: dict[str, np.ndarray] = {}

    def keep(name, value):
        out[name] = record(name, value)
        return value

    def dense(layer: Dense, h, output: str | None = None):
        steps = layer.steps()
        h = keep(output if output and not steps else f"{layer.name}/linear", ops.affine(layer, h))
        for i, step in enumerate(steps):
            h = keep(output if output and i == len(steps) - 1 else step.tensor, ops.step(step, h))
        return h

    h = obs
    if spec.obs_shape and len(spec.obs_shape) != 1:
        h = keep(f"{spec.flatten_scope}/flatten", ops.flatten(h))
    if spec.obs_norm is not None:
        h = keep("vec_normalize/obs", ops.obs_norm(spec.obs_norm, h))
    for layer in spec.trunk:
        h = dense(layer, h)
    trunk = h
    for layer in spec.hidden:
        h = dense(layer, h)
    if spec.free_log_std is not None:
        mean = dense(spec.output, h, f"{spec.output.name}/mean")
        logits = keep("logits", ops.concat([mean, ops.broadcast(ops.asarray(spec.free_log_std, mean), mean)]))
    else:
        logits = mean = dense(spec.output, h, "logits")
    half = spec.output.out_features
    if head in GAUSSIAN_HEADS:
        half = logits.shape[1] // 2
        keep("action", logits[:, :half])
        keep("log_std", logits[:, half:])
    elif head == "categorical":
        keep("action", ops.argmax(logits))
    elif head is None and spec.action is not None:
        action = spec.action
        if action.kind == "argmax":
            keep("action", ops.argmax(logits))
        elif action.kind == "multi_argmax":
            bounds = np.cumsum([0, *action.nvec])
            keep("action", ops.concat([ops.argmax(logits[:, a:b])[:, None] for a, b in zip(bounds, bounds[1:])]))
        elif action.kind == "quantile_argmax":
            per_quantile = keep("q_values/quantiles", ops.quantiles(logits, action.quantiles))
            keep("action", ops.argmax(keep("q_values", ops.quantile_mean(per_quantile))))
        elif action.kind == "clip":
            keep("action", ops.clip(mean, ops.asarray(action.low, mean), ops.asarray(action.high, mean)))
            if spec.free_log_std is not None:
                keep("log_std", logits[:, half:])
        else:  # squash: tanh, then SB3's unscale_action, low + 0.5 * (a + 1) * (high - low)
            a = keep(f"{action.tanh_scope}/tanh", ops.tanh(logits))
            low, high = np.asarray(action.low, dtype), np.asarray(action.high, dtype)
            keep("action", ops.asarray(low, a) + (a + 1) * ops.asarray(dtype.type(0.5), a) * ops.asarray(high - low, a))
    if spec.value_output is not None:
        v = trunk
        for layer in spec.value_hidden:
            v = dense(layer, v)
        if not spec.value_hidden:
            v = h
        dense(spec.value_output, v, "value")
    return out


def reference_forward(spec: MlpSpec, obs: np.ndarray, head: str | None = None,
                      dtype: np.dtype | None = None) -> dict[str, np.ndarray]:
    """Every tensor the exported graph names, computed in numpy from the source arrays.

    Args:
        spec: the network.
        obs: float array, shape ``(batch, *spec.input_shape)``, in the graph input's dtype; cast
            to ``dtype`` first (a half-precision module takes half-precision input).
        head: as given to :func:`~policyport.converter.build.build_mlp`.
        dtype: the dtype the source computes in, its parameters cast to it (exactly, from half
            precision: SB3 loads a half-precision ``policy.pth`` into its float32 policy);
            ``None`` (default): the parameters' own.

    Returns:
        tensor name -> array: ``<layer>/linear`` and each step's ``<module path>/<role>`` for every
        hidden layer, ``logits``, and the head's ``action``/``log_std`` and ``value`` where the graph
        has them; in ``dtype`` (bfloat16 as ``ml_dtypes.bfloat16``, as :func:`torch_forward` gives it:
        numpy computes some of ml_dtypes' operations in float32, and a verdict takes its tolerances from
        the dtype the source computed in).
    """
    obs, dtype = np.asarray(obs), spec.dtype if dtype is None else np.dtype(dtype)
    if obs.dtype.kind == "f" and obs.dtype != dtype:
        obs = obs.astype(dtype)
    out = _forward(spec, obs, head, _NumpyOps, lambda name, value: value, dtype)
    if dtype.name == "bfloat16":
        out = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in out.items()}
    return out


def torch_forward(spec: MlpSpec, obs: np.ndarray, head: str | None = None,
                  dtype: np.dtype | None = None) -> dict[str, np.ndarray]:
    """The same tensors as :func:`reference_forward`, computed by torch.

    Every layer runs as the torch module the source used (``nn.Linear`` with the source's ``[out, in]``
    weight, ``nn.Tanh`` ..., ``nn.LayerNorm``, ``nn.BatchNorm1d`` in eval mode) under its module path,
    in the parameters' dtype (a float16 or bfloat16 module computes in it, as the source's did; a
    floating ``obs`` of another dtype is cast to it first, as such a module requires); a forward hook
    on each records its output. The action head and observation normalisation use the torch
    functions SB3 and VecNormalize apply. ``dtype``: as for :func:`reference_forward`.

    Returns:
        As :func:`reference_forward`, in the dtype computed in (bfloat16 as ``ml_dtypes.bfloat16``).

    Raises:
        MissingDependencyError: torch is not installed.
    """

    ops = torch_ops()
    x, dtype = ops.tensor(obs), spec.dtype if dtype is None else np.dtype(dtype)
    if x.is_floating_point():
        x = x.to(ops.tensor(np.zeros(0, dtype)).dtype)
    return _forward(spec, x, head, ops, lambda name, value: ops.to_numpy(value), dtype)


def to_torch(array):
    """A numpy array as a torch tensor of the same element type and bits; an ``ml_dtypes.bfloat16``
    array (numpy has no bfloat16 of its own) as ``torch.bfloat16``."""
    import torch

    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.as_tensor(array)


def from_torch(tensor) -> np.ndarray:
    """A torch tensor as a numpy array of the same element type and bits (``torch.bfloat16`` as
    ``ml_dtypes.bfloat16``; see :func:`to_torch`)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        from ...graph.model import dtype_from_name

        return tensor.view(torch.int16).numpy().view(dtype_from_name("bfloat16"))
    return tensor.numpy()


def torch_ops():
    """The forward primitives of :mod:`policyport.converter.sources.reference` computed by torch modules."""
    torch = require("torch", "torch", "the torch reference forward pass")
    nn, F = torch.nn, torch.nn.functional

    def activation_module(act):
        table = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "selu": nn.SELU, "swish": nn.SiLU,
                 "softplus": nn.Softplus, "gelu": nn.GELU, "mish": nn.Mish, "hardswish": nn.Hardswish,
                 "sigmoid": nn.Sigmoid, "linear": nn.Identity}
        if act.name == "leaky_relu":
            return nn.LeakyReLU(act.alpha)
        return table[act.name]()

    class TorchOps:
        tensor = staticmethod(to_torch)
        to_numpy = staticmethod(from_torch)

        @staticmethod
        def affine(layer, x):
            w = to_torch(layer.weight if layer.weight_layout == "out_in" else layer.weight.T.copy()).to(x.dtype)
            b = None if layer.bias is None else to_torch(layer.bias).to(x.dtype)
            linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, dtype=w.dtype)
            with torch.no_grad():
                linear.weight.copy_(w)
                if b is not None:
                    linear.bias.copy_(b)
                return linear(x)

        @staticmethod
        def step(step, x):
            with torch.no_grad():
                if step.kind == "activation":
                    return activation_module(step.activation)(x)
                p = {k: to_torch(a).to(x.dtype) for k, (_, a) in step.params.items()}
                if step.kind == "layer_norm":
                    return F.layer_norm(x, (x.shape[-1],), p.get("weight"), p.get("bias"), step.eps)
                return F.batch_norm(x, p["running_mean"], p["running_var"], p.get("weight"), p.get("bias"),
                                    training=False, eps=step.eps)

        flatten = staticmethod(lambda x: nn.Flatten()(x))

        @staticmethod
        def obs_norm(norm, x):  # VecNormalize runs in numpy, outside the policy
            return to_torch(_NumpyOps.obs_norm(norm, from_torch(x)))

        concat = staticmethod(lambda xs: torch.cat(xs, dim=1))
        broadcast = staticmethod(lambda v, like: v.expand_as(like))
        argmax = staticmethod(lambda x: torch.argmax(x, dim=1))
        # sb3-contrib's QuantileNetwork: quantiles.view(-1, n_quantiles, n_actions), then .mean(dim=1)
        quantiles = staticmethod(lambda x, n: x.view(-1, n, x.shape[1] // n))
        quantile_mean = staticmethod(lambda x: x.mean(dim=1))
        clip = staticmethod(lambda x, low, high: torch.minimum(torch.maximum(x, low), high))
        tanh = staticmethod(torch.tanh)
        asarray = staticmethod(lambda x, like: to_torch(np.asarray(x)).to(like.dtype))

    return TorchOps
