"""What a converted model rests on that its source file does not record, and what it was checked against.

A converter takes most of a policy from the file: weights, layer order, what the file's format
records (an SB3 zip's ``policy_kwargs``, an RLlib checkpoint's model config, a Keras model's layers).
Whatever it takes from anywhere else is an :class:`Assumption`: an activation a state_dict cannot
tell (given with ``--activation``), a head a weights file does not record (``--head``), the absence
of an observation normaliser where the format keeps none, a normaliser file found beside the policy,
action bounds a state_dict does not hold. Each one names what it assumes, why, and the option that
says otherwise. A converter records them in the model's metadata (:data:`ASSUMPTIONS_KEY`, a JSON
list), prints them, and every verification report against that source repeats them.

An :class:`Oracle` names what a verification compared the model against: the framework running the
source's own code (a torch module's ``forward``, TensorFlow running a Keras model, SB3's own policy
class), or policyport's reconstruction of the source from its arrays. A reconstruction makes the same
assumptions as the model, so a PASS against it is a PASS *given* those assumptions; the framework's
own code checks the assumptions it does not share (``Oracle.checks``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..graph.model import ASSUMPTIONS_KEY


@dataclass(frozen=True)
class Assumption:
    """One fact a conversion took from somewhere other than the source file.

    Attributes:
        topic: what it is about: ``"activation"``, ``"head"``, ``"observation normalisation"``,
            ``"action bounds"``, ``"action space"``, ``"action masks"`` or ``"layout"``.
        assumes: what the model takes as fact, short enough for a verdict line
            (``"tanh at 1 and 3"``).
        because: where it comes from (``"given by --activation; a state_dict records no
            activation modules"``).
        settle: the option that states it otherwise (``"--activation NAME[,NAME...]"``), or ``""``.
    """

    topic: str
    assumes: str
    because: str
    settle: str = ""

    def __str__(self) -> str:
        return f"{self.topic} {self.assumes}: {self.because}{f'; {self.settle}' if self.settle else ''}"

    @property
    def short(self) -> str:
        """``"activation tanh at 1 and 3"``: topic and what is assumed, for a verdict line."""
        return f"{self.topic} {self.assumes}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Oracle:
    """What the source side of a verification is.

    Attributes:
        name: how a report names it (``"torch running the TorchScript module's own forward"``,
            ``"policyport's reconstruction from the state_dict's arrays, run as torch modules"``).
        framework: the source framework runs the source's own code (not a reconstruction).
        checks: topics of :class:`Assumption` that the oracle settles from the source itself rather
            than sharing them with the model (a TorchScript module runs its own activations).
    """

    name: str
    framework: bool = False
    checks: frozenset[str] = field(default_factory=frozenset)

    def to_dict(self) -> dict:
        return {"name": self.name, "framework": self.framework, "checks": sorted(self.checks)}


def reconstruction(what: str, runner: str = "numpy") -> Oracle:
    """The oracle of a source policyport rebuilds from arrays: ``what`` is read (``"the .npz's
    arrays"``), the layers run in ``runner`` (``"numpy"``, ``"torch modules"``)."""
    return Oracle(f"policyport's reconstruction from {what}, run in {runner}")


#: ``head=`` spelling that states the last layer's outputs are a mean half and a log_std half.
HALVES = "diag-gaussian:halves"

#: The convention of RLlib's layouts: its ``DiagGaussian`` splits the last layer's outputs in two
#: halves unless ``free_log_std`` keeps the log_std as a separate parameter.
RLLIB_SPLIT = "RLlib's DiagGaussian splits its inputs so (ray/rllib/models/tf/tf_action_dist.py)"


def head_assumption(head: str | None, *, output: str, width: int, log_std: str | None, what: str,
                    convention: str | None = None) -> Assumption | None:
    """What a head asked for (``--head``) assumes about a source that does not record its action
    distribution, or a refusal where a wrong guess is plausible.

    Args:
        head: ``None`` or ``"none"`` (nothing assumed), ``"categorical"``, ``"diag-gaussian"`` or
            ``"diag-gaussian:halves"``.
        output: the source's name of the last layer (``"fc_out"``, ``"4"``).
        width: that layer's number of outputs (the means' width when ``log_std`` is given).
        log_std: the source's own state-independent log_std parameter, or ``None``.
        what: the source, for messages (``"the state_dict"``).
        convention: why the source's layout holds a mean and a log_std half in its last layer when it
            has no log_std parameter (:data:`RLLIB_SPLIT`), or ``None`` where nothing says so.

    Returns:
        The assumption to record, or ``None`` when nothing is assumed beyond the file.

    Raises:
        OptionError: ``diag-gaussian`` where nothing says the last layer holds both halves (give
            ``diag-gaussian:halves`` to state it, or ``none``); ``diag-gaussian:halves`` where the
            log_std is a parameter of its own.
    """
    from ..errors import OptionError

    if head is None or head == "none":
        return None
    if head == "categorical":
        return Assumption("head", f"categorical, action = argmax of {output}'s {width} outputs",
                          f"given by --head; {what} does not record its action distribution",
                          f"--head none exports {output} alone")
    if log_std is not None:
        if head == HALVES:
            raise OptionError(f"--head {HALVES} says {output}'s outputs are a mean half and a log_std half, but "
                              f"{what} keeps its log_std as a parameter of its own ({log_std}): {output}'s {width} "
                              "outputs are the means; use --head diag-gaussian")
        return Assumption("head", f"diagonal Gaussian, action = {output}'s {width} outputs (the mean), log_std = {log_std}",
                          f"given by --head; {what} holds the parameter {log_std} but does not record its action "
                          "distribution", f"--head none exports {output} alone")
    half = width // 2
    if head == HALVES:
        because = f"given by --head {HALVES}"
    elif convention is not None:
        because = f"given by --head; {convention}"
    else:
        halves = ("the first is the mean and the second the log_std" if half == 1 else
                  f"the first {half} are the mean and the last {half} the log_std")
        raise OptionError(
            f"--head diag-gaussian: nothing in {what} says that {output}'s {width} outputs are a mean and a log_std "
            f"half (it holds no log_std parameter, and its layout is not one whose convention splits them, as "
            f"RLlib's is). If {halves}, say so with --head {HALVES}; if all {width} are the mean (the log std kept "
            "elsewhere), --head none exports them as logits")
    return Assumption("head", f"diagonal Gaussian, {output} = [mean ({half}, the action), log_std ({half})]", because,
                      f"--head none exports {output} alone")


def joined(names) -> str:
    """``["fc_1", "fc_2", "fc_3"]`` -> ``"fc_1, fc_2 and fc_3"``."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def activation_assumption(activations: list[tuple[str, str]], what: str, why: str = "", unit: str = "") -> Assumption | None:
    """The activations a source's file does not record, given with ``--activation``.

    Args:
        activations: ``(where, name)`` for each place an activation sits (``("fc_1", "tanh")``);
            places of the same activation are named together.
        what: the source, for the reason (``"an .npz of weights"``).
        why: what else the reason should say (``"SB3 builds every hidden layer with one activation_fn"``).
        unit: what a place is, when its name alone does not say (``"module"``: ``"tanh at modules 1
            and 3"``).

    Returns:
        The assumption, or ``None`` when there is no activation to assume.
    """
    if not activations:
        return None
    by_name: dict[str, list[str]] = {}
    for where, name in activations:
        by_name.setdefault(name, []).append(where)
    text = ", ".join(f"{name} at {unit + ('s' if len(places) > 1 else '') + ' ' if unit else ''}{joined(places)}"
                     for name, places in by_name.items())
    return Assumption("activation", text, f"given by --activation; {what} does not record it{f', and {why}' if why else ''}",
                      "--activation names another")


def no_normaliser(what: str, where: str, settle: str = "") -> Assumption:
    """That the policy saw its observations as they are: ``what`` holds no normaliser, and ``where``
    says where the statistics would be kept if it had one."""
    return Assumption("observation normalisation", "none", f"{what} holds no normaliser statistics ({where})", settle)


def outside_normaliser(what: str, settle: str) -> Assumption:
    """That the policy saw its observations as they are, where ``what`` (``"a TorchScript file"``)
    records a network alone: a normaliser applied to the observations outside it (an environment
    wrapper such as gymnasium's ``NormalizeObservation``, which CleanRL's scripts train under) is not
    in it, and the network's own forward cannot tell whether one was there. A normaliser inside the
    network is part of its forward, not an assumption. ``settle`` says how to bring one in."""
    return Assumption("observation normalisation", "none",
                      f"{what} records the network alone: a normaliser applied to the observations outside it (an "
                      "environment wrapper such as gymnasium's NormalizeObservation, which CleanRL's scripts train "
                      "under) is not in it", settle)


def record_assumptions(model, assumptions: list[Assumption]) -> None:
    """Write ``assumptions`` into ``model.metadata_props`` under :data:`ASSUMPTIONS_KEY` (replacing
    what is there; an empty list is written too, saying that nothing was assumed)."""
    text = json.dumps([a.to_dict() for a in assumptions])
    for prop in model.metadata_props:
        if prop.key == ASSUMPTIONS_KEY:
            prop.value = text
            return
    entry = model.metadata_props.add()
    entry.key, entry.value = ASSUMPTIONS_KEY, text


__all__ = ["ASSUMPTIONS_KEY", "HALVES", "RLLIB_SPLIT", "Assumption", "Oracle", "activation_assumption", "head_assumption", "joined", "no_normaliser", "outside_normaliser", "reconstruction", "record_assumptions"]
