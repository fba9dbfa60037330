"""Activation functions a converter can name: their ONNX nodes and their source-framework formula.

Names follow RLlib's ``get_activation_fn`` vocabulary (``ray/rllib/models/utils.py``) plus the
common torch/Keras ones. ``leaky_relu`` takes its negative slope after a colon
(``"leaky_relu:0.2"``); the default 0.01 is torch's ``nn.LeakyReLU`` default.

Each activation emits ONNX nodes through an :class:`~policyport.converter.build.MlpBuilder` and has a
numpy ``reference`` written from the source framework's definition, independent of policyport's
interpreter, which verification compares against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import BadModelError, OptionError, OptionNeeded

ALIASES = {"silu": "swish", "identity": "linear", "none": "linear", "leakyrelu": "leaky_relu"}
NAMES = ("tanh", "relu", "elu", "selu", "swish", "silu", "softplus", "leaky_relu", "gelu", "mish", "hardswish",
         "sigmoid", "linear")


@dataclass(frozen=True)
class Activation:
    """A parsed activation: its canonical name and parameter (the leaky_relu slope)."""

    name: str
    alpha: float | None = None

    @property
    def label(self) -> str:
        """Used in tensor names: ``fc_1/<label>``."""
        return self.name

    def reference(self, x: np.ndarray) -> np.ndarray:
        """The activation as the source frameworks define it, in ``x``'s dtype."""
        return _REFERENCE[self.name](x, self)


def parse_activation(spec: str) -> Activation:
    """Parse ``"tanh"``, ``"silu"``, ``"leaky_relu:0.2"`` ...

    Raises:
        BadModelError: an unknown name or a malformed slope.
    """
    name, _, arg = spec.strip().lower().partition(":")
    name = ALIASES.get(name, name)
    if name not in _REFERENCE:
        raise BadModelError(f"unknown activation {spec!r}; choose one of {', '.join(NAMES)}")
    if arg and name != "leaky_relu":
        raise BadModelError(f"activation {name!r} takes no parameter (got {spec!r})")
    if name == "leaky_relu":
        try:
            slope = float(arg) if arg else 0.01
        except ValueError:
            raise BadModelError(f"leaky_relu slope must be a number, got {arg!r}") from None
        if not math.isfinite(slope):
            raise BadModelError(f"leaky_relu slope must be finite, got {arg!r}")
        return Activation(name, slope)
    return Activation(name)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


_REFERENCE: dict[str, Callable[[np.ndarray, Activation], np.ndarray]] = {
    "tanh": lambda x, a: np.tanh(x),
    "relu": lambda x, a: np.maximum(x, 0),
    "elu": lambda x, a: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "selu": lambda x, a: (1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0)))).astype(x.dtype),
    "swish": lambda x, a: x / (1 + np.exp(-x.astype(np.float64))).astype(x.dtype),
    "softplus": lambda x, a: np.logaddexp(0, x.astype(np.float64)).astype(x.dtype),
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * x.dtype.type(a.alpha)),
    "gelu": lambda x, a: (0.5 * x * (1 + _erf(x / np.sqrt(2)))).astype(x.dtype),
    # torch.nn.Mish: x * tanh(softplus(x)); torch.nn.Hardswish: x * relu6(x + 3) / 6
    "mish": lambda x, a: (x * np.tanh(np.logaddexp(0, x.astype(np.float64)))).astype(x.dtype),
    "hardswish": lambda x, a: (x * np.clip(x.astype(np.float64) + 3, 0, 6) / 6).astype(x.dtype),
    "sigmoid": lambda x, a: (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype),
    "linear": lambda x, a: x,
}


class ActivationNeeded(OptionNeeded):
    """An activation the source file does not record and no ``--activation`` named (exit 2).

    Attributes:
        places: how many activations are needed, and ``listed``: whether they must be named one
            per place (a plain ``nn.Sequential``); ``inspect`` uses both to show the layers without
            activations rather than refuse.
    """

    def __init__(self, message: str, places: int = 1, listed: bool = False):
        super().__init__(message, "activation")
        self.places, self.listed = places, listed

    def placeholder(self) -> str:
        """``--activation`` naming no activation at every place: ``linear`` (or ``linear,linear``)."""
        return ",".join(["linear"] * (self.places if self.listed else 1))


def required_activation(given: str | None, what: str, places: list[str], default: str) -> str:
    """``--activation`` for a source whose file does not record its activation: required, since a
    wrong guess (tanh for a policy trained with relu) converts silently to another policy.

    Args:
        given: the option's value, or ``None``.
        what: the source, for the message (``"an .npz of RLlib weights"``).
        places: where the activations sit (``["fc_1", "fc_2"]``); none: nothing is needed.
        default: what the source's library defaults to, for the message (``"RLlib's fcnet_activation
            defaults to tanh"``).

    Raises:
        OptionError: ``given`` is ``None`` while ``places`` is not empty (exit 2).
    """
    if given is None and places:
        shown = ", ".join(places[:6]) + (" ..." if len(places) > 6 else "")
        raise ActivationNeeded(f"{what} does not record the activation after its hidden layers ({shown}); name it with "
                          f"--activation NAME (activation= in Python): {default}, but relu, elu and others are as "
                          "common, and a wrong one converts to another policy that still passes a check against "
                          "the same reconstruction")
    return given or "linear"


def choose_activation(given: str | None, recorded: str | None, what: str) -> tuple[str | None, list[str]]:
    """The activation of a source that may record its own: ``recorded`` wins, ``given`` fills a gap.

    Args:
        given: ``--activation`` (``ConvertOptions.activation``), or ``None``.
        recorded: the activation the source's own files name (SB3's ``activation_fn``, RLlib's
            ``fcnet_activation``), or ``None`` when they name none.
        what: the source, for messages (``"the SB3 zip's policy_kwargs"``).

    Returns:
        The activation to use (``None``: the source kind's default), and notes for the user.

    Raises:
        OptionError: ``given`` contradicts ``recorded`` (converting with it would export another
            network than the one trained, and the source check could not tell, since it would use
            the same wrong activation).
    """
    if given is None:
        return recorded, []
    if recorded is None:
        return given, [f"{what} names no activation; using --activation {given} (the source check cannot tell "
                       "whether that is the one the policy was trained with)"]
    if parse_activation(given) != parse_activation(recorded):
        raise OptionError(f"--activation {given} contradicts {what}, which names {recorded}; leave --activation out "
                            "to use the recorded one")
    return recorded, []


#: ``torch.nn`` activation classes policyport builds -> (policyport activation name, the class's
#: constructor parameters in order). ``inplace`` changes no value; ``negative_slope`` becomes the
#: ``leaky_relu`` slope; every other parameter must hold :data:`TORCH_DEFAULTS`' value, the function
#: the name stands for (``torch/nn/modules/activation.py``). CELU with alpha 1 is ELU with alpha 1.
TORCH_ACTIVATIONS = {
    "Tanh": ("tanh", ()), "Sigmoid": ("sigmoid", ()), "Identity": ("linear", ()),
    "ReLU": ("relu", ("inplace",)), "SELU": ("selu", ("inplace",)), "SiLU": ("silu", ("inplace",)),
    "Mish": ("mish", ("inplace",)), "Hardswish": ("hardswish", ("inplace",)),
    "LeakyReLU": ("leaky_relu", ("negative_slope", "inplace")),
    "ELU": ("elu", ("alpha", "inplace")), "CELU": ("elu", ("alpha", "inplace")),
    "GELU": ("gelu", ("approximate",)), "Softplus": ("softplus", ("beta", "threshold")),
}


#: The values of ``torch.nn`` activation parameters that policyport's activation of the same name
#: computes (torch's defaults).
TORCH_DEFAULTS = {"alpha": 1.0, "approximate": "none", "beta": 1.0, "threshold": 20.0}
