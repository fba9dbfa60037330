"""Text from outside policyport shown as it is: names, paths and values from files, on a terminal.

Standard library only: a packed folder's ``run.py`` (``policyport.handoff.folder_run``) and the
``policyport`` command line (``policyport.cli.render``) print through the same function.
"""

from __future__ import annotations

import itertools
import reprlib
import unicodedata

#: The Unicode categories escaped: controls, format characters, line and paragraph separators,
#: lone surrogates.
ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def literal(text: object) -> str:
    """``text`` with every control, format and line-separator character escaped as Python does it.

    Args:
        text: anything; it is passed through ``str`` first.

    Returns:
        A string holding no character of Unicode categories Cc, Cf, Zl, Zp or Cs (ESC, newline, tab,
        CSI, zero-width and bidirectional controls, the lone surrogates that undecodable bytes of a
        path become): each becomes ``\\xNN``, ``\\uNNNN`` or ``\\n``/``\\t``/``\\r``.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ESCAPED else ch
                   for ch in text)


class _Bounded(reprlib.Repr):
    """``reprlib.Repr`` with room for the class paths and short lists messages show whole, a dict's
    items in their order, and subclasses of the builtin containers bounded as those are."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 4, 300, 300, 60
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 12

    def repr_dict(self, x, level):
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in itertools.islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items + (["..."] if len(x) > self.maxdict else [])) + "}"

    def repr_instance(self, x, level):
        for kind, method in ((dict, self.repr_dict), (list, self.repr_list), (tuple, self.repr_tuple),
                             (set, self.repr_set), (frozenset, self.repr_frozenset)):
            if isinstance(x, kind):
                return method(x, level)
        return super().repr_instance(x, level)


_BOUNDED = _Bounded()


def bounded_repr(value: object) -> str:
    """``repr(value)`` for a message about a value read from a file, bounded whatever the value: at
    most 4 levels deep, 12 items a container, 300 characters a string (``...`` where cut). A value
    whose containers share objects (an unpickled DAG) is never written out as a tree; small values
    read as ``repr`` writes them.
    """
    return _BOUNDED.repr(value)
