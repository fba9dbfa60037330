"""Stable-Baselines3's own policy as the oracle of an SB3 zip, built without unpickling the zip.

``PPO.load`` unpickles the zip's ``data`` (cloudpickle: code from the file), so the oracle is built
the way SB3 builds a policy before it loads weights: the policy class the zip records, imported from
policyport's own table of SB3's and sb3-contrib's classes
(:data:`SB3_POLICY_CLASSES`, never a module read from the file), gymnasium
spaces rebuilt from the zip's readable ``observation_space`` and ``action_space`` fields, and every
``policy_kwargs`` entry the zip records that the constructor takes: ``net_arch`` and the other literal
entries as they are, ``activation_fn`` as the ``torch.nn`` class (and ``functools.partial``
arguments) the zip names, ``features_extractor_class`` as SB3's own ``FlattenExtractor``. The
``policy.pth`` state_dict is then loaded with ``load_state_dict(strict=True)``, which refuses any
parameter the architecture does not have, and ``predict(obs, deterministic=True)`` computes the
action with SB3's own code (its head, its clipping or rescaling to the bounds). A VecNormalize file
is applied with SB3's own ``VecNormalize.normalize_obs``.

Every layer's output is recorded with forward hooks under the names the converted graph gives them
(``mlp_extractor.policy_net.0/linear``, ``mlp_extractor.policy_net.1/tanh``), so verification
compares each with the model, not only the action.
"""

from __future__ import annotations

import ast
from typing import Callable

import numpy as np

from ..assumptions import Oracle

def import_sb3():
    """``stable_baselines3``, imported without TensorFlow.

    SB3 imports ``torch.utils.tensorboard`` (``stable_baselines3/common/utils.py``, for its logger), which
    reads TensorBoard's ``tensorboard.compat.tf``; that imports TensorFlow whenever it is installed
    (``tensorboard/compat/__init__.py``), seconds of start-up that nothing here uses. TensorBoard's own
    switch, a module named ``tensorboard.compat.notf``, makes it take its TensorFlow stub instead (what it
    does where TensorFlow is not installed, and what torch's ``SummaryWriter`` is written for); the switch
    is set only while SB3 is imported, and only when TensorFlow is not imported already.

    Returns:
        The ``stable_baselines3`` module.

    Raises:
        ImportError: SB3 (or torch) is not installed.
    """
    import sys
    import types

    switch = "tensorboard.compat.notf"
    if "stable_baselines3" in sys.modules or "tensorflow" in sys.modules or switch in sys.modules:
        import stable_baselines3

        return stable_baselines3
    sys.modules[switch] = types.ModuleType(switch)
    try:
        import stable_baselines3
    finally:
        sys.modules.pop(switch, None)
    return stable_baselines3


#: ``policy_kwargs`` read from the zip's ``data`` and passed on as the literals they are; the
#: activation and the features extractor are built from policyport's own tables.
KWARGS = ("net_arch", "n_critics", "n_quantiles", "share_features_extractor", "log_std_init", "squash_output",
          "use_expln", "full_std", "ortho_init", "normalize_images", "clip_mean", "use_sde")

#: What SB3's own policy settles independently of policyport's reading of the zip: its action head
#: (argmax, clipping, rescaling to the bounds) is SB3's code.
CHECKS = frozenset({"head", "action bounds", "action space"})


class LazySource:
    """SB3's own policy as the source side, built the first time it is needed (a conversion that is not
    verified never imports SB3): ``reference`` and ``oracle`` stand for those of :func:`sb3_oracle`,
    or, where SB3 cannot build the policy, the reconstruction ``fallback()`` returns, whose oracle
    says why SB3's own policy was not used.
    """

    def __init__(self, build: Callable[[], tuple[Callable, Oracle]], fallback: Callable[[str], tuple[Callable, Oracle]]):
        self._build, self._fallback, self._built = build, fallback, None

    def _resolved(self) -> tuple[Callable, Oracle]:
        if self._built is None:
            try:
                self._built = self._build()
            except OracleUnavailable as e:
                self._built = self._fallback(str(e))
        return self._built

    def reference(self, obs) -> dict[str, np.ndarray]:
        return self._resolved()[0](obs)

    @property
    def oracle(self) -> Oracle:
        return self._resolved()[1]


class LazyOracle:
    """An :class:`Oracle` that is what a :class:`LazySource`'s oracle turns out to be when first read."""

    def __init__(self, source: LazySource):
        self._source = source

    def __getattr__(self, name):
        return getattr(self._source.oracle, name)


class OracleUnavailable(Exception):
    """SB3's own policy cannot be built for this zip (SB3 missing, a kwarg it refuses, a state_dict that
    does not load); the converter falls back to its reconstruction, saying why."""


def sb3_oracle(policy_class: str, kwargs: dict, activation, obs_space: dict, act_space: dict,
               arrays: dict[str, np.ndarray], obs_norm=None, keep_value: bool = False) -> tuple[Callable, Oracle]:
    """SB3's own forward pass of the zip's policy, and its :class:`Oracle`.

    Args:
        policy_class: the class the zip records, ``"module.Name"``, one of
            :data:`SB3_POLICY_CLASSES`.
        kwargs: the zip's ``policy_kwargs`` (values as ``data`` holds them: text or JSON).
        activation: the zip's ``activation_fn``
            (:class:`~policyport.converter.sources.sb3.TorchActivation`), or the policyport name of the one
            ``--activation`` gave (``"leaky_relu:0.2"``) where the zip's cannot be read.
        obs_space, act_space: the spaces as :func:`policyport.converter.sources.sb3._space` reads them.
        arrays: the ``policy.pth`` state_dict, numpy arrays.
        obs_norm: the :class:`~policyport.converter.build.ObsNorm` baked in, or ``None``.
        keep_value: also return ``value`` (``predict_values``).

    Returns:
        ``(reference, oracle)``: ``reference(obs) -> {tensor name: array}`` with ``action``, every
        hooked layer, and ``value`` when asked.

    Raises:
        OracleUnavailable: SB3 (or gymnasium, torch, sb3-contrib) is not installed, or the policy
            cannot be built or loaded from what the zip records.
    """
    try:
        import torch
        from gymnasium import spaces

        stable_baselines3 = import_sb3()
    except ImportError as e:
        raise OracleUnavailable(f"{e.name or 'stable-baselines3'} is not installed") from None
    import importlib

    from .reference import to_torch


    if policy_class not in SB3_POLICY_CLASSES:
        raise OracleUnavailable(f"policyport does not build SB3's policy class {policy_class}")
    family = SB3_POLICY_CLASSES[policy_class]
    module, name = policy_class.rsplit(".", 1)
    try:
        built_class = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise OracleUnavailable(f"{module.split('.')[0]} is not installed ({e.name})") from None
    built = {k: _literal(kwargs[k]) for k in KWARGS if k in kwargs}
    if "features_extractor_class" in kwargs:  # the converter accepts SB3's FlattenExtractor alone
        from stable_baselines3.common.torch_layers import FlattenExtractor

        built["features_extractor_class"] = FlattenExtractor
    if "features_extractor_kwargs" in kwargs:
        built["features_extractor_kwargs"] = _literal(kwargs["features_extractor_kwargs"])
    try:
        policy = built_class(_gym_space(spaces, obs_space), _gym_space(spaces, act_space), lambda _: 0.0,
                             activation_fn=_activation_fn(torch, activation), **built)
        # SB3's set_parameters: load_state_dict copies each tensor into the float32 policy (half precision exactly)
        policy.load_state_dict({k: to_torch(np.array(v)) for k, v in arrays.items()}, strict=True)
    except OracleUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - whatever SB3 refuses: the oracle is unavailable, and says why
        raise OracleUnavailable(f"SB3 {stable_baselines3.__version__} could not build {name} from the zip's "
                                f"readable data: {_first_line(e)}") from None
    policy.set_training_mode(False)
    normalizer = _vec_normalize(obs_norm, obs_space) if obs_norm is not None else None
    names = _hook_names(policy, family)

    def reference(obs) -> dict[str, np.ndarray]:
        x = normalizer.normalize_obs(np.asarray(obs)) if normalizer is not None else np.asarray(obs)
        recorded: dict[str, np.ndarray] = {}
        handles = [module.register_forward_hook(_keeper(recorded, tensor)) for module, tensor in names]
        try:
            action, _ = policy.predict(x, deterministic=True)
            if keep_value and family == "ac":
                with torch.no_grad():
                    recorded["value"] = policy.predict_values(policy.obs_to_tensor(x)[0]).numpy()
        finally:
            for handle in handles:
                handle.remove()
        if normalizer is not None:
            recorded["vec_normalize/obs"] = x
        recorded["action"] = np.asarray(action)
        return recorded

    oracle = Oracle(f"SB3 {stable_baselines3.__version__}'s own {name}.predict(deterministic=True)", framework=True,
                    checks=CHECKS)
    return reference, oracle


def _activation_fn(torch, activation):
    """The ``activation_fn`` SB3 builds the policy with: the ``torch.nn`` class the zip names (with
    the arguments of its ``functools.partial``), or the class of a policyport activation name.

    Raises:
        OracleUnavailable: a name or class ``torch.nn`` does not have.
    """
    import functools

    from ..activations import parse_activation
    from ..activations import TORCH_ACTIVATIONS

    if isinstance(activation, str):
        parsed = parse_activation(activation)
        torch_name = next((c for c, (n, _) in TORCH_ACTIVATIONS.items()
                           if c != "CELU" and parse_activation(n).name == parsed.name), None)
        if torch_name is None:
            raise OracleUnavailable(f"SB3 has no activation module policyport maps to {activation!r}")
        args, keywords = ((parsed.alpha,) if parsed.name == "leaky_relu" else ()), {}
    else:
        torch_name, args, keywords = activation.cls, activation.args, activation.kwargs
    cls = getattr(torch.nn, torch_name, None)
    if cls is None:
        raise OracleUnavailable(f"torch.nn has no {torch_name}")
    return functools.partial(cls, *args, **keywords) if args or keywords else cls


def _literal(value):
    """A ``policy_kwargs`` value as ``data`` holds it (``"[32, 32]"``, ``64``, ``{"pi": [..]}``), as Python."""
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise OracleUnavailable(f"a policy_kwargs value is not a literal: {value[:60]!r}") from None
    return value


def _gym_space(spaces, space: dict):
    """A gymnasium space from the fields :func:`policyport.converter.sources.sb3._space` read."""
    if space["type"] == "Discrete":
        return spaces.Discrete(space["n"])
    if space["type"] == "MultiDiscrete":
        return spaces.MultiDiscrete(list(space["nvec"]))
    low, high = space["low"], space["high"]
    if isinstance(low, Exception) or isinstance(high, Exception):
        low, high = -np.inf, np.inf  # an observation space's bounds that numpy summarised: never used
    dtype = np.dtype(space.get("dtype") or "float32")
    return spaces.Box(low=np.asarray(low, dtype), high=np.asarray(high, dtype), shape=tuple(space["shape"]), dtype=dtype)


def _vec_normalize(norm, obs_space: dict):
    """SB3's ``VecNormalize`` holding ``norm``'s statistics, for its own ``normalize_obs`` (no env
    needed: the method reads ``obs_rms``, ``epsilon``, ``clip_obs`` and ``norm_obs`` alone)."""
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env import VecNormalize

    normalizer = VecNormalize.__new__(VecNormalize)
    normalizer.obs_rms = RunningMeanStd(shape=np.asarray(norm.mean).shape)
    normalizer.obs_rms.mean, normalizer.obs_rms.var = np.asarray(norm.mean), np.asarray(norm.var)
    normalizer.epsilon, normalizer.clip_obs, normalizer.norm_obs = norm.epsilon, norm.clip_obs, True
    return normalizer


def _hook_names(policy, family: str) -> list:
    """``(module, tensor name)`` for every Linear and activation module of the deterministic path,
    named as the converted graph names them; the output layer's tensor is ``logits``
    (``action_net/mean`` before a free log_std) and the critics are left out."""
    import torch

    skip = ("critic", "critic_target", "actor_target", "q_net_target", "quantile_net_target", "value_net",
            "mlp_extractor.value_net", "actor.log_std")
    modules = dict(policy.named_modules())
    linears = [p for p, m in modules.items() if isinstance(m, torch.nn.Linear)]
    output = {"ac": "action_net", "sac": "actor.mu"}.get(family) or next(
        (p for p in reversed(linears) if p.startswith(("actor.mu.", "q_net.q_net.", "quantile_net.quantile_net."))), None)
    names = []
    for path, module in modules.items():
        if not path or any(path == s or path.startswith(s + ".") for s in skip):
            continue
        if isinstance(module, torch.nn.Linear):
            if path == output:
                names.append((module, "action_net/mean" if getattr(policy, "log_std", None) is not None
                              and family == "ac" else "logits"))
            else:
                names.append((module, f"{path}/linear"))
        elif type(module).__name__ in _LABELS and not isinstance(module, torch.nn.Sequential):
            names.append((module, f"{path}/{_LABELS[type(module).__name__]}"))
    return names


#: torch activation module class -> the label of its tensor in a converted graph.
_LABELS = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "CELU": "elu", "SELU": "selu", "SiLU": "swish", "GELU": "gelu",
           "LeakyReLU": "leaky_relu", "Softplus": "softplus", "Mish": "mish", "Hardswish": "hardswish",
           "Sigmoid": "sigmoid"}


def _keeper(recorded: dict, tensor: str):
    def hook(module, inputs, output):
        recorded[tensor] = output.detach().cpu().numpy()

    return hook


def _first_line(e: BaseException) -> str:
    """The error's first line, and the next one too where the first only introduces it (torch's
    ``Error(s) in loading state_dict for ...:``)."""
    text = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not text:
        return type(e).__name__
    said = " ".join(text[:2]) if text[0].endswith(":") else text[0]
    return f"{type(e).__name__}: {said[:300]}"


#: The policy classes of SB3 and sb3-contrib whose deterministic action policyport builds, as a zip's
#: pickle names them (``MlpPolicy`` is an alias of each), and the family of networks their
#: ``policy.pth`` holds (``stable_baselines3/*/policies.py``, ``sb3_contrib/*/policies.py``). DDPG
#: saves TD3's policy class; sb3-contrib's TRPO saves ``ActorCriticPolicy``.
SB3_POLICY_CLASSES = {
    "stable_baselines3.common.policies.ActorCriticPolicy": "ac",
    "stable_baselines3.sac.policies.SACPolicy": "sac",
    "stable_baselines3.td3.policies.TD3Policy": "td3",
    "stable_baselines3.dqn.policies.DQNPolicy": "dqn",
    "sb3_contrib.qrdqn.policies.QRDQNPolicy": "qrdqn",
    "sb3_contrib.common.maskable.policies.MaskableActorCriticPolicy": "ac",
}
