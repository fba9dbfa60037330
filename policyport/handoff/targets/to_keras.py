"""``to-keras``: a policy as a trainable Keras 3 functional model, checked before it is written.

:func:`to_keras` builds a ``keras.Model`` from the :class:`~.plan.LayerPlan` of a model and writes
two files:

- ``FILE.keras``: the functional model. Every source layer is a ``keras.layers.Dense`` named after
  it (:func:`keras_name`: characters outside ``[A-Za-z0-9_]`` become ``_``), its kernel in Keras'
  ``[in, out]`` layout (a torch ``[out, in]`` weight is transposed), frozen where a Keras source
  froze it (``policyport.trainable``, :mod:`.plan`), else trainable; every activation node is a
  ``keras.layers.Activation`` (``LeakyReLU`` / ``ELU`` layers where the node has a slope); an
  observation normaliser ``(x - mean) / std`` is a ``keras.layers.Normalization`` holding its
  statistics (not trained); a Keras source's own ``Normalization`` layers (also ``invert=True``
  ones that turn the head's output into actions) are written again as those layers under their
  names, adapted ones with their ``mean``, ``variance`` and ``count`` weights, given ones with
  ``mean=``/``variance=``, so that the written model's trainable and non-trainable weights are the
  source's; BatchNormalization and LayerNormalization nodes are Keras' own layers; a trained tensor
  an op reads (SB3's state-independent ``log_std``, ML-Agents' ``log_sigma``) is the one row of an
  ``Embedding``, read for every observation, so that it trains (:meth:`_Builder.free_parameter` says
  why); the other steps (arithmetic, slices, clips, concatenations, ``argmax``,
  ``Squeeze``/``Unsqueeze``/``Flatten`` after the batch axis) are ``keras.ops`` calls, and steps that
  read constants only are computed once, as constants. ``Reshape``, and ``Shape``/``Expand`` other
  than a free parameter's, are refused (exit 3). The model returns a dict: the graph outputs by name,
  but those no observation reaches (ML-Agents' ``version_number``, ``memory_size`` and
  ``*_action_output_shape``), which are left out and said so (:attr:`KerasExport.constants`): a Keras
  model's outputs are per observation. It holds no ``Lambda`` layer and no custom class, so
  ``keras.saving.load_model`` loads it in safe mode with Keras alone.
- ``FILE_parameters.json``: each Keras weight path (``"default_policy_fc_1/kernel"``) -> the
  source's parameter name, the initializer it came from, its role and layout (``"transposed"``
  where a torch ``[out, in]`` weight became a ``[in, out]`` kernel).

Before anything is written the model is saved, loaded back by ``keras.saving.load_model`` (safe
mode) and run by Keras on sample observations: every graph output, and the output of every Dense,
activation and normalisation layer, must equal the numpy backend's tensor within the comparison
rule of :mod:`policyport.verification.compare`. Both files appear together or not at all
(:func:`policyport.io.outputs.write_outputs`).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import BadModelError, OptionError, UnsupportedOpError
from .plan import Dense, LayerPlan, _trained, identifier, layer_plan

#: Keras activation names for activation ops without attributes (ONNX op type -> keras.activations name).
_ACTIVATIONS = {"Tanh": "tanh", "Relu": "relu", "Sigmoid": "sigmoid", "Selu": "selu", "Softplus": "softplus",
                "Softsign": "softsign", "Mish": "mish", "HardSwish": "hard_swish"}
_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Pow": "power"}
_UNARY = {"Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Abs": "abs", "Neg": "negative", "Reciprocal": "reciprocal",
          "Erf": "erf"}


@dataclass(frozen=True)
class KerasExport:
    """What :func:`to_keras` wrote.

    Attributes:
        model: the ``.keras`` file; names: the ``_parameters.json`` beside it.
        layers: the dense layers (:meth:`~.plan.LayerPlan.describe`), each with its Keras layer name.
        trainable: Keras weight paths of the trainable weights (``model.trainable_weights``);
            non_trainable: of the others (``model.non_trainable_weights``: statistics, counters).
        samples: observations the model was checked on; max_abs: the largest absolute difference from
            the numpy backend over every tensor compared; tensors: how many were compared.
        assumptions: the model's recorded assumptions (None when it records none).
        notes: what converting the source said (empty for an ONNX model), and what the model leaves
            out (sampled outputs, :func:`~.plan.deterministic_path`; constant outputs, :func:`build`).
        constants: the constant outputs left out, name -> value (nested lists).
    """

    model: Path
    names: Path
    layers: list[dict]
    trainable: list[str]
    non_trainable: list[str]
    samples: int
    max_abs: float
    tensors: int
    assumptions: list[dict] | None = None
    notes: list[str] | None = None
    constants: dict[str, list] | None = None


def _recorded(metadata: dict[str, str]) -> set[str]:
    """The source names ``policyport.parameters`` records (plain names and ``{"name": ...}`` entries)."""
    try:
        recorded = json.loads(metadata.get("policyport.parameters", "{}"))
    except ValueError:
        return set()
    values = recorded.values() if isinstance(recorded, dict) else ()
    return {v if isinstance(v, str) else v.get("name") for v in values if isinstance(v, (str, dict))}


def keras_name(name: str) -> str:
    """A Keras layer name made from a source layer's: :func:`~.plan.identifier` (Keras 3 refuses
    ``/`` in a layer's name)."""
    return identifier(name)


def names_path(output: Path) -> Path:
    """The ``_parameters.json`` written beside ``output`` (``policy.keras`` -> ``policy_parameters.json``)."""
    return output.with_name(output.stem + "_parameters.json")


def to_keras(source, output: str | os.PathLike, *, kind: str | None = None, samples: int = 64, low: float = 0.0,
             high: float = 1.0, seed: int = 0, force: bool = False, **options) -> KerasExport:
    """Write ``output`` (a ``.keras`` file) and its ``_parameters.json``, checked first (see the module docstring).

    Args:
        source: an ``onnx.ModelProto`` or ``.onnx`` path, or any source :func:`policyport.convert`
            reads, converted and verified against its own forward pass first (on 1000 observations).
        output: the ``.keras`` file to write.
        kind, options: the source kind and :class:`~policyport.converter.ConvertOptions` fields, as
            for :func:`policyport.convert`.
        samples: observations the model is checked on (default 64), float32 drawn uniformly from
            ``[low, high)`` (default ``[0, 1)``) with numpy ``default_rng(seed)`` (default 0), as
            :func:`policyport.verification.verify.sample_inputs` draws them.
        force: replace existing files.

    Returns:
        :class:`KerasExport`.

    Raises:
        UnsupportedOpError: a node no target writes (:data:`~.plan.TARGET_OPS`), named (exit 3).
        BadModelError: a step Keras layers and ops cannot express as written (exit 3).
        OptionError: ``output`` does not end in ``.keras``; convert options given with an ONNX model.
        OutputExistsError: an output exists (without ``force``).
        VerificationError: the loaded model, run by Keras, differs from the numpy backend; nothing is written.
        MissingDependencyError: keras is not installed (``pip install 'policyport[tf]'``).
        As :func:`policyport.convert` for a source converted here.
    """
    from ...errors import require
    from ...graph.model import recorded_assumptions
    from ...io.outputs import check_writable, write_outputs
    from ..export_numpy import check_arguments
    from .to_torch import _feeds, resolve_source

    check_arguments(samples, low, high, seed)
    output = Path(output)
    if output.suffix != ".keras":
        raise OptionError(f"{output}: the Keras model to write must end in .keras (the Keras 3 format)")
    require("keras", "tf", "writing a policy as a Keras model")
    check_writable(output, force)
    check_writable(names_path(output), force)
    given = resolve_source(source, kind, options, samples, low, high, seed)
    plan = layer_plan(given.model)
    model, names, watched, constants = build(plan)
    feeds = _feeds(plan, samples, low, high, seed)
    with tempfile.TemporaryDirectory(prefix="policyport-keras-") as tmp:
        staged = Path(tmp) / "policy.keras"
        model.save(staged)
        max_abs, count = check_model(staged, plan, watched, feeds, constants)
        data = staged.read_bytes()
    text = (json.dumps(names, indent=1) + "\n").encode()
    write_outputs({output: lambda f: f.write(data), names_path(output): lambda f: f.write(text)}, force)
    layers = plan.describe()
    for entry, d in zip(layers, plan.layers):
        entry["keras"] = keras_name(d.name)
        entry["layout"] = "[in, out]" if d.transposed else "[out, in], transposed for Keras' kernel"
    notes = list(given.notes) + list(plan.notes)
    if constants:
        notes.append(f"left out the constant output{'s' if len(constants) > 1 else ''} "
                     + ", ".join(f"{k} ({v.tolist() if v.size <= 8 else f'{v.dtype} {v.shape}'})" for k, v in constants.items())
                     + ": no observation reaches them, and a Keras model's outputs are computed per observation")
    return KerasExport(output, names_path(output), layers, [w.path for w in model.trainable_weights],
                       [w.path for w in model.non_trainable_weights], samples, max_abs, count,
                       recorded_assumptions(plan.graph.metadata), notes,
                       {k: v.tolist() for k, v in constants.items()})


def check_model(path: Path, plan: LayerPlan, watched: dict[str, str], feeds: dict[str, np.ndarray],
                left_out=()) -> tuple[float, int]:
    """Load ``path`` with ``keras.saving.load_model`` (safe mode), run it on ``feeds`` and compare every
    graph output but those ``left_out`` (the constants :func:`build` leaves out) and every watched
    layer's output (ONNX tensor -> Keras layer name) with the numpy backend's
    (:func:`policyport.verification.compare.compare`).

    Returns:
        (the largest absolute difference, the number of tensors compared).

    Raises:
        VerificationError: a tensor differs beyond the tolerance of its dtype, or has another dtype or shape.
    """
    import keras

    from ...runtime import load
    from .to_torch import compare_tensors

    loaded = keras.saving.load_model(path, safe_mode=True, compile=False)
    session = load(plan.graph, backend="numpy")
    want = session.record(feeds, "*")
    want.update(session.run(feeds))
    ordered = [feeds[v.name] for v in plan.graph.inputs]
    given = ordered if len(ordered) > 1 else ordered[0]
    outputs = {k: keras.ops.convert_to_numpy(v) for k, v in loaded(given, training=False).items()}
    probe = keras.Model(loaded.inputs if len(ordered) > 1 else loaded.inputs[0], {t: loaded.get_layer(name).output for t, name in watched.items()})
    got = {k: keras.ops.convert_to_numpy(v) for k, v in probe(given, training=False).items()}
    got.update(outputs)
    names = [v.name for v in plan.graph.outputs if v.name not in left_out] + [t for t in watched if t not in outputs]
    return compare_tensors(want, got, names, "keras", "the Keras model (loaded in safe mode)")


class _Builder:
    """The Keras tensors, layers and weight names of the model, built step by step."""

    def __init__(self, plan: LayerPlan):
        import keras

        self.keras = keras
        self.plan = plan
        self.init = dict(plan.graph.initializers)  # and the constants the steps compute (fold)
        self.tensors: dict = {}
        self.names: dict[str, dict] = {}
        self.watched: dict[str, str] = {}  # ONNX tensor -> the Keras layer whose output it is
        self.taken: set[str] = {v.name for v in plan.graph.inputs}
        self.weights: list[tuple] = []  # (layer, [arrays]) set once the model is built
        self.skip: set[int] = set()
        self.parameters: dict = {}  # trained tensor read by an op -> its per-row Keras tensor
        self.watched_parameters: dict[str, str] = {}  # trained tensor -> the Embedding layer holding it
        self.folded: dict[str, object] = {}  # tensor no graph input reaches -> the step computing it
        self.floors: dict[str, tuple[str, str]] = {}  # Max(Sqrt(variance), epsilon) -> (variance, epsilon)

    def fresh(self, wanted: str) -> str:
        name, n = keras_name(wanted), 1
        base = name
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def value(self, t: str):
        """The Keras tensor of ``t``, or the constant array of an initializer."""
        if t in self.tensors:
            return self.tensors[t]
        if t in self.init:
            role = self.plan.roles.get(t, "constant")
            if role == "parameter":
                return self.free_parameter(t)
            if role in ("weight", "bias"):
                raise BadModelError(f"trained tensor {t!r} is a dense layer's {role} and is also read by a step "
                                    "Keras writes as an op; to-keras writes a Dense layer's weights inside it only")
            return np.asarray(self.init[t])
        raise BadModelError(f"tensor {t!r} is a Shape that to-keras writes only as the batch of a free parameter's "
                            "Expand (a Keras model's shapes are not tensors)")

    def layer(self, layer, inputs, output: str, arrays: list | None = None):
        y = layer(inputs)
        self.tensors[output] = y
        self.watched[output] = layer.name
        if arrays is not None:
            self.weights.append((layer, arrays))
        return y

    def record(self, layer_name: str, key: str, source, initializer, role: str, layout: str) -> None:
        self.names[f"{layer_name}/{key}"] = {"source": source, "initializer": initializer, "role": role,
                                             "layout": layout}

    def dense(self, d: Dense) -> None:
        keras = self.keras
        w = self.init[d.weight]
        name = self.fresh(d.name)
        has_bias = d.bias is not None or d.bias_source is not None
        trained = _trained(self.plan.graph.metadata)  # a Keras source's frozen layer stays frozen
        layer = keras.layers.Dense(d.out_features, use_bias=has_bias, name=name, dtype=str(w.dtype),
                                   trainable=trained is None or d.weight_source in trained)
        arrays = [np.ascontiguousarray(w if d.transposed else w.T)]
        self.record(name, "kernel", d.weight_source, d.weight, "weight", "as stored" if d.transposed else "transposed")
        if d.bias is not None:
            arrays.append(self.init[d.bias].reshape(-1))
            self.record(name, "bias", d.bias_source, d.bias, "bias",
                        "as stored" if self.init[d.bias].ndim == 1 else "flattened")
        elif has_bias:  # a bias of zeros the model left out: trained from zeros, as in the source
            arrays.append(np.zeros(d.out_features, w.dtype))
            self.record(name, "bias", d.bias_source, None, "bias", "zeros the model leaves out")
        self.layer(layer, self.value(d.input), d.output, arrays)

    def normalisation(self, sub, div) -> bool:
        """``(x - mean) / std`` of two normaliser statistics as one ``Normalization`` layer (its
        variance ``std ** 2``; Keras divides by ``max(sqrt(variance), epsilon)``,
        keras/src/layers/preprocessing/normalization.py). False when the nodes are not of that form."""
        init = self.init
        mean, std = sub.inputs[1], div.inputs[1]
        if (sub.inputs[0] not in self.tensors or div.inputs[0] != sub.outputs[0] or mean not in init or std not in init
                or not self.statistic(mean) or div.inputs[1] not in init or init[std].dtype.kind != "f"):
            return False
        std_value = np.asarray(init[std], np.float64)
        x = self.tensors[sub.inputs[0]]
        width = x.shape[-1]
        if width is None or np.any(std_value <= 0) or any(init[t].size not in (1, width) for t in (mean, std)):
            return False
        wanted = div.name or "normalization"
        if wanted.startswith("/"):  # torch.onnx's scope of the node, not a source name: the statistics' module
            wanted = re.split(r"[./](?=[^./]*$)", self.plan.source_names.get(mean, mean))[0] or wanted
        layer = self._normalization(x, div.outputs[0], wanted, init[mean], std_value ** 2, init[std].dtype)
        for key, t in (("mean", mean), ("variance", std)):
            source = self.described(t)  # rsl_rl's _std + eps, rl_games' sqrt(running_var + epsilon) ...
            self.names[f"{layer.name}/{key}"] = {"source": source, "initializer": t, "role": "normaliser",
                                                 "layout": "as stored" if key == "mean" else f"variance = ({source}) ** 2"}
        return True

    def statistic(self, t: str) -> bool:
        """Whether ``t`` is a normaliser statistic, or computed (folded) from statistics and constants alone: a
        float32 Cast of rl_games' float64 ``running_mean``, skrl's ``sqrt(running_variance) + epsilon``."""
        if self.plan.roles.get(t) == "normaliser":
            return True
        made = self.folded.get(t)
        return made is not None and any(self.statistic(u) for u in made.inputs if u) and all(
            self.statistic(u) or self.plan.roles.get(u, "constant") == "constant" for u in made.inputs if u)

    def described(self, t: str) -> str:
        """``t`` as the source's names make it: a statistic's source name, or the folded steps over them
        (``sqrt(running_mean_std.running_var + running_mean_std/epsilon)``; a Cast is left out)."""
        made = self.folded.get(t)
        if made is None:
            return self.plan.source_names.get(t, t)
        args = [self.described(u) for u in made.inputs if u]
        if made.op_type == "Cast" and len(args) == 1:
            return args[0]
        if made.op_type == "Sqrt" and len(args) == 1:
            return f"sqrt({args[0]})"
        if made.op_type in ("Add", "Sub", "Mul", "Div") and len(args) == 2:
            return f"{args[0]} {'+-*/'[('Add', 'Sub', 'Mul', 'Div').index(made.op_type)]} {args[1]}"
        return f"{made.op_type}({', '.join(args)})"

    def _normalization(self, x, output: str, wanted: str, mean, variance, dtype, invert: bool = False, count=0):
        """A ``Normalization`` layer whose statistics are its non-trainable weights (``mean``,
        ``variance``, ``count``, as ``adapt()`` leaves them), set once the model is built."""
        width = x.shape[-1]
        layer = self.keras.layers.Normalization(axis=-1, invert=invert, name=self.fresh(wanted),
                                                dtype=np.dtype(dtype).name)
        shaped = [np.broadcast_to(np.asarray(a, dtype).reshape(-1), (width,)).copy() for a in (mean, variance)]
        self.layer(layer, x, output, shaped + [np.array(count, np.int64)])
        return layer

    def keras_normalization(self, node, following) -> bool:
        """A Keras ``Normalization`` layer as :mod:`policyport.converter.sources.keras` writes it, as
        that layer: ``(x - mean) / max(sqrt(variance), epsilon)`` (``Sub``, then ``Div`` by
        ``Max(Sqrt(variance), epsilon)``) or, with ``invert=True``, ``mean + x * max(sqrt(variance),
        epsilon)`` (``Mul``, then ``Add``), ``epsilon`` Keras' ``keras.config.epsilon()``
        (keras/src/layers/preprocessing/normalization.py, ``call``), statistics the source does not train.
        Named as the source's layer (the last node's name); an adapted layer (one whose ``count`` the
        source records) holds ``mean``, ``variance`` and ``count`` as non-trainable weights, a layer given
        ``mean=`` and ``variance=`` holds them as those arguments (no weights), as in the source.
        False when the nodes are not of that form."""
        init, roles = self.init, self.plan.roles
        if following is None or node.op_type not in ("Sub", "Mul"):
            return False
        invert = node.op_type == "Mul"
        if invert:
            floor = next((t for t in node.inputs if t in self.floors), None)
            x = next((t for t in node.inputs if t != floor), None)
            mean = next((t for t in following.inputs if t != node.outputs[0]), None)
            if following.op_type != "Add" or node.outputs[0] not in following.inputs:
                return False
        else:
            x, mean = node.inputs
            floor = following.inputs[1] if following.op_type == "Div" and following.inputs[0] == node.outputs[0] else None
        if floor not in self.floors or x not in self.tensors or mean not in self.plan.graph.initializers:
            return False
        variance, eps = self.floors[floor]
        dtype = init[variance].dtype
        if (roles.get(mean) != "normaliser" or roles.get(variance) != "normaliser" or init[mean].dtype != dtype
                or float(init[eps]) != float(np.asarray(self.keras.config.epsilon(), dtype))
                or self.tensors[x].shape[-1] is None):
            return False
        width = self.tensors[x].shape[-1]
        if any(init[t].size not in (1, width) for t in (mean, variance)):
            return False
        source = self.plan.source_names.get(mean, mean).rpartition("/")[0] or following.name
        adapted = f"{source}/count" in _recorded(self.plan.graph.metadata)
        if adapted:
            layer = self._normalization(self.tensors[x], following.outputs[0], following.name or source, init[mean],
                                        init[variance], dtype, invert)
        else:
            layer = self.keras.layers.Normalization(
                axis=-1, invert=invert, mean=np.asarray(init[mean]).reshape(-1).tolist(),
                variance=np.asarray(init[variance]).reshape(-1).tolist(), name=self.fresh(following.name or source),
                dtype=np.dtype(dtype).name)
            self.layer(layer, self.tensors[x], following.outputs[0])
        for key, t in (("mean", mean), ("variance", variance)):
            self.names[f"{layer.name}/{key}"] = {
                "source": self.plan.source_names.get(t, t), "initializer": t, "role": "normaliser",
                "layout": "as stored" if adapted else f"as stored, the layer's {key}= argument (not a weight, as in the source)"}
        if adapted:
            self.names[f"{layer.name}/count"] = {"source": f"{source}/count", "initializer": None, "role": "normaliser",
                                                 "layout": "as the source records it"}
        return True

    def fold(self, node) -> None:
        """A step that reads constants only, computed now by the numpy backend's op (its outputs become
        constants of the steps that read them); ``Max(Sqrt(variance), epsilon)`` is remembered as a
        Keras ``Normalization``'s divisor (:meth:`keras_normalization`)."""
        from ...runtime.numpy import registry

        impl = registry.resolve(node.op_type, self.plan.graph.opset, node_name=node.name)
        args = [np.asarray(self.init[t]) if t else None for t in node.inputs]
        value = impl.fn(*args, **node.attrs)
        values = value if isinstance(value, (tuple, list)) else [value]
        for out, v in zip(node.outputs, values):
            if out:
                self.init[out] = np.asarray(v)
                self.plan.roles.setdefault(out, "constant")
        producer = self.folded.get
        if node.op_type == "Max" and len(node.inputs) == 2:
            sqrt = producer(node.inputs[0])
            if sqrt is not None and sqrt.op_type == "Sqrt" and sqrt.inputs[0] in self.plan.graph.initializers \
                    and node.inputs[1] in self.plan.graph.initializers and self.init[node.inputs[1]].size == 1:
                self.floors[node.outputs[0]] = (sqrt.inputs[0], node.inputs[1])
        for out in node.outputs:
            self.folded[out] = node

    def vec_normalize(self, nodes) -> bool:
        """SB3's ``normalize_obs`` (Sub mean, Add var + epsilon, Sqrt, Div) as one ``Normalization``
        layer of variance ``var + epsilon`` in the statistics' dtype."""
        vec = self.plan.normaliser.vec_normalize if self.plan.normaliser else None
        ops = [n.op_type for n in nodes]
        if vec is None or ops[:4] != ["Sub", "Add", "Sqrt", "Div"]:
            return False
        sub, add, _, div = nodes[:4]
        mean, var = vec["nodes"]
        x = self.tensors.get(sub.inputs[0])
        if x is None or x.shape[-1] is None:
            return False
        dtype = self.init[mean].dtype
        variance = (self.init[var] + np.asarray(vec["epsilon"], dtype)).astype(dtype)  # as the graph adds them
        layer = self._normalization(x, div.outputs[0], "vec_normalize", self.init[mean], variance, dtype)
        for key, t in (("mean", mean), ("variance", var)):
            self.names[f"{layer.name}/{key}"] = {"source": self.plan.source_names.get(t, t), "initializer": t,
                                                 "role": "normaliser",
                                                 "layout": "as stored" if key == "mean" else "variance = var + epsilon"}
        self.skip.update(id(n) for n in nodes[:4])
        return True

    def free_parameter(self, p: str, rows=None):
        """Trained tensor ``p`` read by an op, as a trainable Keras weight: the one row of an
        ``Embedding(1, p.size)`` layer named after ``p``'s source name, looked up at index 0 for every
        row of ``rows`` (default: the first graph input), then shaped ``(batch, *p.shape[1:])`` when
        ``p``'s first axis is 1 (ML-Agents' ``log_sigma``, shape ``(1, n)``), else ``(batch, p.size)``
        (SB3's ``log_std``, shape ``(n,)``); either broadcasts against a ``(batch, ...)`` operand as
        ``p`` itself does. One layer per parameter, however many ops read it.

        Why an ``Embedding``: Keras 3 has no layer that is just a trained variable, and the written
        model must load with ``keras.saving.load_model(..., safe_mode=True)`` and Keras alone, so
        neither a ``Lambda`` (refused in safe mode) nor a custom layer class (unknown to Keras without
        ``custom_objects``) may hold it; a ``keras.Variable`` given to a ``keras.ops`` call is
        serialised as a constant and would not train. An ``Embedding`` of one row is a built-in layer
        whose only weight (``embeddings``, shape ``(1, p.size)``) is ``p`` itself, trainable, and whose
        lookup copies it exactly (no arithmetic); a bias-only ``Dense`` would add an empty kernel.

        Raises:
            BadModelError: ``p`` has more than one axis and a first axis other than 1 (no per-row form
                broadcasts as it does), or there is no 2-D-or-more input to take the batch from.
        """
        if p in self.parameters and rows is None:
            return self.parameters[p]
        keras, ops = self.keras, self.keras.ops
        value = np.asarray(self.init[p])
        if value.ndim > 1 and value.shape[0] != 1:
            raise BadModelError(f"trained tensor {p!r} of shape {value.shape} is read by an op; to-keras writes such a "
                                "tensor as one row per observation, which needs a first axis of 1 (or one axis)")
        x = rows if rows is not None else self.tensors[self.plan.graph.inputs[0].name]
        if len(x.shape) < 2:
            raise BadModelError(f"trained tensor {p!r} is read by an op and the input {x.name!r} has no feature axis "
                                "to take the batch from")
        index = ops.cast(ops.zeros_like(x[(slice(None),) + (0,) * (len(x.shape) - 1)]), "int32")
        source = self.plan.source_names.get(p, p)
        layer = keras.layers.Embedding(1, max(value.size, 1), name=self.fresh(source), dtype=str(value.dtype))
        y = layer(index)
        self.weights.append((layer, [value.reshape(1, -1)]))
        self.watched_parameters[p] = layer.name
        if value.ndim > 2:
            y = ops.reshape(y, (-1, *value.shape[1:]))
        self.record(layer.name, "embeddings", source, p, "parameter",
                    "as stored" if value.ndim == 2 else "one row: the parameter, read for every observation")
        if rows is None:
            self.parameters[p] = y
        return y

    def parameter(self, node) -> bool:
        """``Expand(p, Shape(x))`` of a trained tensor ``p`` (SB3's free ``log_std``): ``p`` for each
        row of ``x`` (:meth:`free_parameter`)."""
        p = node.inputs[0]
        if self.plan.roles.get(p) != "parameter" or p not in self.init:
            return False
        producer = {o: s for s in self.plan.steps if not isinstance(s, Dense) for o in s.outputs}
        shape = producer.get(node.inputs[1])
        if shape is None or shape.op_type != "Shape" or shape.inputs[0] not in self.tensors:
            return False
        x = self.tensors[shape.inputs[0]]
        value = np.asarray(self.init[p])
        if x.shape[-1] is None or value.size != x.shape[-1] or len(x.shape) != 2:
            return False
        self.tensors[node.outputs[0]] = self.free_parameter(p, rows=x)
        self.watched[node.outputs[0]] = self.watched_parameters[p]
        return True

    def per_row_expand(self, node) -> bool:
        """``Expand(y, Shape(x))`` where ``y`` is already one row per observation of ``x``'s width
        (rsl_rl's ``Expand(Clip(std_param), Shape(logits))``, the parameter read through
        :meth:`free_parameter`): ``y`` itself, which broadcasting to ``x``'s shape leaves as it is
        (ONNX Expand, opset 13)."""
        producer = {o: s for s in self.plan.steps if not isinstance(s, Dense) for o in s.outputs}
        shape = producer.get(node.inputs[1])
        if (shape is None or shape.op_type != "Shape" or shape.inputs[0] not in self.tensors
                or node.inputs[0] not in self.tensors):
            return False
        x, y = self.tensors[shape.inputs[0]], self.tensors[node.inputs[0]]
        if len(x.shape) != 2 or len(y.shape) != 2 or x.shape[-1] is None or y.shape[-1] != x.shape[-1]:
            return False
        self.tensors[node.outputs[0]] = y
        if node.inputs[0] in self.watched:
            self.watched[node.outputs[0]] = self.watched[node.inputs[0]]
        return True

    def node(self, node, following) -> None:
        keras, ops = self.keras, self.keras.ops
        op, attrs = node.op_type, node.attrs
        if len([o for o in node.outputs if o]) != 1:
            raise UnsupportedOpError(f'{op} node "{node.name}" has several outputs; targets write one per node')
        out = node.outputs[0]
        if self.keras_normalization(node, following):
            self.skip.add(id(following))
            return
        if op == "Sub" and following is not None and following.op_type == "Div" and self.normalisation(node, following):
            self.skip.add(id(following))
            return
        if op == "Expand" and (self.parameter(node) or self.per_row_expand(node)):
            return
        if op == "Shape":
            return  # read only by the parameter's Expand (refused there otherwise)
        if op in _ACTIVATIONS or op in ("Elu", "LeakyRelu", "Gelu"):
            name = self.fresh(f"{node.name or out}_{op.lower()}" if keras_name(node.name or out) in self.taken
                              else node.name or out)
            if op == "LeakyRelu":
                layer = keras.layers.LeakyReLU(negative_slope=float(attrs.get("alpha", 0.01)), name=name)
            elif op == "Elu":
                layer = keras.layers.ELU(alpha=float(attrs.get("alpha", 1.0)), name=name)
            elif op == "Gelu":
                if attrs.get("approximate", "none") != "none":
                    raise BadModelError(f'Gelu node "{node.name}" uses the tanh approximation; Keras\' "gelu" '
                                        "activation is the exact one (erf)")
                layer = keras.layers.Activation("gelu", name=name)
            else:
                layer = keras.layers.Activation(_ACTIVATIONS[op], name=name)
            self.layer(layer, self.value(node.inputs[0]), out)
            return
        if op == "BatchNormalization":
            self.tensors[out] = self._batch_norm(node)
            return
        if op == "LayerNormalization":
            self.tensors[out] = self._layer_norm(node)
            return
        args = [self.value(t) if t else None for t in node.inputs]
        if op in _BINARY:
            y = getattr(ops, _BINARY[op])(args[0], args[1])
        elif op in _UNARY:
            y = getattr(ops, _UNARY[op])(args[0])
        elif op in ("Max", "Min"):
            y = args[0]
            for other in args[1:]:
                y = (ops.maximum if op == "Max" else ops.minimum)(y, other)
        elif op == "Clip":
            lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min")
            hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max")
            y = args[0]
            if lo is not None:
                y = ops.maximum(y, lo)
            if hi is not None:
                y = ops.minimum(y, hi)
        elif op in ("Softmax", "LogSoftmax"):
            axis = int(attrs.get("axis", -1 if self.plan.graph.opset >= 13 else 1))
            y = (ops.softmax if op == "Softmax" else ops.log_softmax)(args[0], axis=axis)
        elif op == "ArgMax":
            if attrs.get("select_last_index", 0):
                raise BadModelError(f'ArgMax node "{node.name}" selects the last index of ties; Keras\' argmax '
                                    "returns the first")
            y = ops.cast(ops.argmax(args[0], axis=int(attrs.get("axis", 0)), keepdims=bool(attrs.get("keepdims", 1))),
                         "int64")
        elif op == "Slice":
            y = args[0][self._slice(node)]
        elif op == "Concat":
            y = ops.concatenate(args, axis=int(attrs["axis"]))
        elif op in ("Identity", "Dropout"):
            y = args[0]
        elif op in ("Squeeze", "Unsqueeze"):
            axes = ([int(a) for a in np.asarray(args[1]).reshape(-1)] if len(args) > 1 and args[1] is not None
                    else [int(a) for a in attrs.get("axes", [])])
            if not axes or any(a <= 0 for a in axes):
                raise BadModelError(f'{op} node "{node.name}" has no axes, or acts on the batch axis or counts from '
                                    "the end; to-keras writes axes after the batch")
            y = args[0]
            for a in (sorted(axes, reverse=True) if op == "Squeeze" else sorted(axes)):
                y = (ops.squeeze if op == "Squeeze" else ops.expand_dims)(y, axis=a)
        elif op == "Flatten":
            size = args[0].shape[1:]
            if int(attrs.get("axis", 1)) != 1 or any(d is None for d in size):
                raise BadModelError(f'Flatten node "{node.name}" flattens from axis {attrs.get("axis", 1)} or sizes '
                                    "unknown; to-keras writes Flatten(axis=1) of known sizes")
            y = ops.reshape(args[0], (-1, int(np.prod(size))))
        elif op == "Cast":
            from ...graph.model import onnx_dtype

            y = ops.cast(args[0], np.dtype(onnx_dtype(int(attrs["to"]))).name)
        else:
            raise UnsupportedOpError(f'{op} node "{node.name}" has no Keras layer or op in to-keras; targets write '
                                     "MLP policies")
        if isinstance(y, np.ndarray):
            raise BadModelError(f'{op} node "{node.name}" computes a constant; to-keras writes steps of the observation')
        self.tensors[out] = y

    def _slice(self, node) -> tuple:
        inputs = list(node.inputs) + [""] * (5 - len(node.inputs))
        const = (lambda t: [int(v) for v in np.asarray(self.init[t]).reshape(-1)])
        if any(t and t not in self.init for t in inputs[1:]):
            raise BadModelError(f'Slice node "{node.name}" takes computed bounds; to-keras writes constant slices')
        if inputs[1]:
            starts, ends = const(inputs[1]), const(inputs[2])
            axes = const(inputs[3]) if inputs[3] else list(range(len(starts)))
            steps = const(inputs[4]) if inputs[4] else [1] * len(starts)
        else:  # opset < 10: the bounds are attributes (ONNX Slice operator page, opset 1)
            starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
            axes = list(node.attrs.get("axes", range(len(starts))))
            steps = [1] * len(starts)
        if any(s != 1 for s in steps) or any(a < 0 for a in axes):
            raise BadModelError(f'Slice node "{node.name}" steps or counts axes from the end; targets write '
                                "forward slices on counted axes")
        parts = [slice(None)] * (max(axes) + 1)
        for a, s, e in zip(axes, starts, ends):
            parts[a] = slice(s or None, None if e >= 2 ** 62 else e)
        return tuple(parts)

    def _batch_norm(self, node):
        init = self.init
        if any(t not in init for t in node.inputs[1:5]) or node.attrs.get("training_mode", 0):
            raise BadModelError(f'BatchNormalization node "{node.name}" reads computed statistics or trains; targets '
                                "write inference batch normalisation with stored statistics")
        name = self.fresh(node.name or node.outputs[0])
        layer = self.keras.layers.BatchNormalization(epsilon=float(node.attrs.get("epsilon", 1e-5)), name=name,
                                                     dtype=str(init[node.inputs[1]].dtype))
        arrays = [init[t] for t in node.inputs[1:5]]
        for key, t, role in zip(("gamma", "beta", "moving_mean", "moving_variance"), node.inputs[1:5],
                                ("parameter", "parameter", "normaliser", "normaliser")):
            self.record(name, key, self.plan.source_names.get(t, t), t, role, "as stored")
        return self.layer(layer, self.value(node.inputs[0]), node.outputs[0], arrays)

    def _layer_norm(self, node):
        init = self.init
        scale = init.get(node.inputs[1])
        if scale is None or scale.ndim != 1 or int(node.attrs.get("axis", -1)) != -1:
            raise BadModelError(f'LayerNormalization node "{node.name}" normalises over axes other than the last '
                                "with a stored scale; targets write LayerNormalization over the last axis")
        bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
        name = self.fresh(node.name or node.outputs[0])
        layer = self.keras.layers.LayerNormalization(axis=-1, epsilon=float(node.attrs.get("epsilon", 1e-5)),
                                                     center=bias is not None, name=name, dtype=str(scale.dtype))
        arrays = [scale] + ([init[bias]] if bias else [])
        for key, t in (("gamma", node.inputs[1]), ("beta", bias)):
            if t:
                self.record(name, key, self.plan.source_names.get(t, t), t, "parameter", "as stored")
        return self.layer(layer, self.value(node.inputs[0]), node.outputs[0], arrays)


def build(plan: LayerPlan):
    """The Keras model of ``plan``, its weight names (Keras weight path -> source, for
    ``_parameters.json``), the layer outputs to compare (ONNX tensor -> Keras layer name) and the
    graph outputs left out because no observation reaches them (name -> value; ML-Agents'
    ``version_number``, ``memory_size``, ``*_action_output_shape``): a Keras model's outputs are per
    observation (``predict`` concatenates them over batches).

    Raises:
        UnsupportedOpError, BadModelError: a step Keras layers and ops cannot express as written.
    """
    import keras

    b = _Builder(plan)
    graph = plan.graph
    inputs = []
    for v in graph.inputs:
        if v.shape is None or any(not isinstance(d, int) for d in v.shape[1:]):
            raise BadModelError(f"input {v.name!r} has shape {v.shape}; Keras' Input needs every size after the batch")
        x = keras.Input(tuple(v.shape[1:]), name=keras_name(v.name), dtype=np.dtype(v.dtype).name)
        inputs.append(x)
        b.tensors[v.name] = x
    steps = plan.steps
    normaliser = set(plan.normaliser.nodes) if plan.normaliser else set()
    first = [s for s in steps if not isinstance(s, Dense) and s.name in normaliser]
    trained = set(plan.trainable)
    for step in steps:  # first every step of constants alone (rsl_rl's std + eps), in order, so that a step
        # of the observation that reads one (its Div) sees a constant, whatever comes between them
        if not isinstance(step, Dense) and all(t in b.init and t not in trained for t in step.inputs if t):
            b.fold(step)  # Constant nodes too; a step of a trained tensor (rsl_rl's Clip of std_param) stays a
            # step: it trains
            b.skip.add(id(step))
    for i, step in enumerate(steps):
        if id(step) in b.skip:
            continue
        if isinstance(step, Dense):
            b.dense(step)
            continue
        if step is next((s for s in first if s.op_type != "Cast"), None):
            rest = [s for s in first if s.op_type != "Cast"]
            if b.vec_normalize(rest):
                continue
        following = next((s for s in steps[i + 1:] if not isinstance(s, Dense) and id(s) not in b.skip
                          and step.outputs[0] in s.inputs), None)
        b.node(step, following)
    constants = {v.name: np.asarray(b.init[v.name]) for v in graph.outputs if v.name not in b.tensors}
    if len(constants) == len(graph.outputs):
        raise BadModelError(f"every output of the graph ({', '.join(constants)}) is a constant that no observation "
                            "reaches; a Keras model's outputs are computed per observation")
    outputs = {v.name: b.tensors[v.name] for v in graph.outputs if v.name not in constants}
    model = keras.Model(inputs if len(inputs) > 1 else inputs[0], outputs, name="policy")
    for layer, arrays in b.weights:
        layer.set_weights(arrays)
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()  # its mean and variance as used by call(), from the weights just set
    return model, b.names, b.watched, constants
