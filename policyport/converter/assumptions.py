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

#: Model metadata key holding the assumptions, a JSON list of :meth:`Assumption.to_dict`.
ASSUMPTIONS_KEY = "policyport.assumptions"


@dataclass(frozen=True)
class Assumption:
    """One fact a conversion took from somewhere other than the source file.

    Attributes:
        topic: what it is about: ``"activation"``, ``"head"``, ``"observation normalisation"``,
            ``"action bounds"``, ``"action space"`` or ``"layout"``.
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
        return f"{self.topic}: {self.assumes} ({self.because}{f'; {self.settle}' if self.settle else ''})"

    @property
    def short(self) -> str:
        """``"activation tanh at 1 and 3"``: topic and what is assumed, for a verdict line."""
        return f"{self.topic} {self.assumes}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value) -> Assumption | None:
        """An assumption recorded by :meth:`to_dict`; ``None`` for anything else (a model written by
        hand or by another tool is read, not refused)."""
        if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("topic", "assumes", "because")):
            return None
        return cls(value["topic"], value["assumes"], value["because"], str(value.get("settle", "")))


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
RLLIB_SPLIT = "RLlib's DiagGaussian splits its inputs into these halves (ray/rllib/models/tf/tf_action_dist.py)"


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
        return Assumption("head", f"categorical: action = argmax of the {width} outputs of {output}",
                          f"given by --head; {what} does not record its action distribution",
                          "--head none exports the outputs alone")
    if log_std is not None:
        if head == HALVES:
            raise OptionError(f"--head {HALVES} says {output}'s outputs are a mean half and a log_std half, but "
                              f"{what} keeps its log_std as a parameter of its own ({log_std}): {output}'s {width} "
                              "outputs are the means; use --head diag-gaussian")
        return Assumption("head", f"diagonal Gaussian: action = the {width} outputs of {output} (the mean), "
                          f"log_std = {log_std}", f"given by --head; {what} holds the log_std {log_std} but does "
                          "not record its action distribution", "--head none exports the outputs alone")
    half = width // 2
    if head == HALVES:
        because = f"given by --head {HALVES}"
    elif convention is not None:
        because = f"given by --head; {convention}"
    else:
        raise OptionError(
            f"--head diag-gaussian: nothing in {what} says that {output}'s {width} outputs are a mean and a log_std "
            f"half (it holds no log_std parameter, and its layout is not one whose convention splits them, as "
            f"RLlib's is). If the first {half} are the mean and the last {half} the log_std, say so with --head "
            f"{HALVES}; if all {width} are the mean (the log std kept elsewhere), --head none exports them as logits")
    return Assumption("head", f"diagonal Gaussian: {output}'s {width} outputs are the mean ({half}, the action) "
                      f"and the log_std ({half})", because, "--head none exports the outputs alone")


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


def recorded_assumptions(metadata: dict[str, str]) -> list[Assumption] | None:
    """The assumptions in a model's metadata (``{key: value}``); ``None`` when the model records none
    (converted by an older policyport, or not by policyport). Entries that are not assumptions are
    skipped."""
    text = metadata.get(ASSUMPTIONS_KEY)
    if text is None:
        return None
    try:
        values = json.loads(text)
    except ValueError:
        return []
    if not isinstance(values, list):
        return []
    return [a for a in map(Assumption.from_dict, values) if a is not None]


def listed(assumptions: list[Assumption]) -> str:
    """``"activation tanh at 1 and 3; head diag-gaussian ..."``: the short forms joined."""
    return "; ".join(a.short for a in assumptions)


__all__ = ["ASSUMPTIONS_KEY", "HALVES", "RLLIB_SPLIT", "Assumption", "Oracle", "head_assumption", "listed", "reconstruction", "record_assumptions",
           "recorded_assumptions"]
