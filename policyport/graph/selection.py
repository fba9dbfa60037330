"""Tensors chosen by name or glob from a graph's tensor names (:func:`select_tensors`)."""

from __future__ import annotations

import fnmatch
from typing import Iterable, Mapping

from ..errors import ArgumentTypeError, InputMismatchError, listing


def select_tensors(available: Iterable[str], patterns: str | Iterable[str] | None, *,
                   exact: bool = False, where: str = "the model") -> list[str]:
    """The tensor names in ``available`` that ``patterns`` select, in ``available``'s order.

    Names are names: a pattern that is exactly the name of an available tensor selects that tensor
    alone, so ``h[0]`` or ``fc*`` written as a tensor's full name means that tensor; any other
    pattern is an ``fnmatch`` glob (``fc_1/*``). ``*`` alone always selects everything, also in a
    model with a tensor named ``*``.

    Args:
        available: candidate tensor names.
        patterns: names or globs, as one comma-separated string (``"fc_1/*,logits"``) or an
            iterable; ``None`` or ``"*"`` selects everything.
        exact: every pattern is a name, never a glob (for callers passing names they took from
            the model; a string is then one name).
        where: what ``available`` are the tensors of, for the error message (default ``"the model"``;
            ``"the recording"`` for a recording's).

    Raises:
        InputMismatchError: a pattern matches no tensor (the message lists what exists).
        ArgumentTypeError: ``patterns`` is not a string, an iterable of strings or None.
    """
    available = list(available)
    if patterns is None:
        return available
    if isinstance(patterns, str):
        patterns = [patterns] if exact else [p.strip() for p in patterns.split(",") if p.strip()]
    if isinstance(patterns, (bytes, Mapping)) or not isinstance(patterns, Iterable):
        raise ArgumentTypeError(f"tensors must be a name or glob, a comma-separated string of them, a list of them or "
                                f"None, not {type(patterns).__name__} {patterns!r:.80}")
    patterns = list(patterns)
    wrong = [p for p in patterns if not isinstance(p, str)]
    if wrong:
        raise ArgumentTypeError(f"tensors must be names or globs (strings); found {type(wrong[0]).__name__} "
                                f"{wrong[0]!r:.80}")
    present = set(available)
    if not exact:  # "*" selects everything, also where a tensor is named "*"
        present.discard("*")
    names = {p for p in patterns if p in present}
    globs = [] if exact else [p for p in patterns if p not in present]
    chosen = [t for t in available if t in names or any(fnmatch.fnmatchcase(t, g) for g in globs)]
    if exact:
        unmatched = [p for p in patterns if p not in present]
    else:
        unmatched = [g for g in globs if g != "*" and not any(fnmatch.fnmatchcase(t, g) for t in available)]
    if unmatched:
        what = "tensor name(s)" if exact else "tensor pattern(s)"
        raise InputMismatchError(f"{what} [{listing(unmatched)}] match no tensor of {where}; it has: "
                                 f"{listing(available, show=str)}")
    return chosen
