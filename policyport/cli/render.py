"""Rendering for people: Rich consoles and tables in which text from files and users stays literal.

Names in a model (producer, inputs, outputs, nodes, tensors), keys of an input file and paths come
from outside policyport. They are shown exactly as written with control characters escaped
(``\\x1b``, ``\\n``, bidirectional overrides as ``\\u202e``), and never interpreted as Rich markup,
so no name can clear the screen, set the window title, add a fake table row or a hidden link.
When stdout is not a terminal, tables are laid out without a width limit, so names are never cut.
"""

from __future__ import annotations

import unicodedata
from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

_WIDE = 1_000_000  # "no width limit" for output that goes to a file or a pipe
_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _console(stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False, width=_WIDE)
    return console


out = _console(stderr=False)
err = _console(stderr=True)


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
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _ESCAPED else ch
                   for ch in text)


def cell(value: object, style: str | None = None) -> Text:
    """A table cell showing ``value`` literally (see :func:`literal`)."""
    return Text(literal(value), style=style or "")


def table(title: object, columns: Iterable[str | tuple[str, str]]) -> Table:
    """A Rich table with a literal title; a column is a name or ``(name, justify)``.

    Right-justified columns hold figures and are never wrapped (a number split over two lines reads
    as two numbers); the others fold when the terminal is narrow, so no name is ever cut short.
    """
    t = Table(title=cell(title))
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=justify, overflow="fold", no_wrap=justify == "right")
    return t


def fits(t: Table) -> bool:
    """Whether ``t`` printed on stdout fits its width with no cell wrapped (always, for a file or a pipe)."""
    return out.measure(t, options=out.options.update_width(_WIDE)).maximum <= out.width


def add_row(t: Table, *values: object) -> None:
    """Add a row whose cells are shown literally (a ``Text`` is kept as it is)."""
    t.add_row(*(v if isinstance(v, Text) else cell(v) for v in values))


def say(text: object) -> None:
    """A status line for people, on stderr."""
    err.print(literal(text))


def say_error(text: object) -> None:
    """``error: <text>`` on stderr, the text literal."""
    err.print(Text.assemble(("error:", "bold red"), " ", literal(text)))


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 tensor``, ``7 tensors``, ``1,000 observations``: a count with its noun in the right number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def shape_text(shape) -> str:
    """``(1000, 256)`` for a tuple of ints, ``(256,)`` for one dimension."""
    return str(tuple(shape))
