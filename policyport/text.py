"""Text from outside policyport shown as it is: names, paths and values from files, on a terminal.

Standard library only: a packed folder's ``run.py`` (``policyport.runtime.entry``) and the
``policyport`` command line (``policyport.cli.render``) print through the same function.
"""

from __future__ import annotations

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
