"""Rendering for people: Rich consoles and tables in which text from files and users stays literal.

Names in a model (producer, inputs, outputs, nodes, tensors), keys of an input file and paths come
from outside policyport. They are shown exactly as written with control characters escaped
(``\\x1b``, ``\\n``, bidirectional overrides as ``\\u202e``), and never interpreted as Rich markup,
so no name can clear the screen, set the window title, add a fake table row or a hidden link.
When stdout is not a terminal, tables are laid out without a width limit, so names are never cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from ..text import literal

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

_WIDE = 1_000_000  # "no width limit" for output that goes to a file or a pipe

#: Rich is imported when something is first rendered, so that a command printing JSON or nothing
#: (``policyport run --json``) starts without it: these names, and the consoles ``out`` and ``err``,
#: are attributes of this module made on first use.
_RICH = {"Console": "rich.console", "Table": "rich.table", "Text": "rich.text"}


def __getattr__(name: str):
    if name in _RICH:
        import importlib

        value = getattr(importlib.import_module(_RICH[name]), name)
    elif name in ("out", "err"):
        value = _console(stderr=name == "err")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _get(name: str):
    """This module's attribute ``name`` (see :func:`__getattr__`), as set or replaced."""
    return globals()[name] if name in globals() else __getattr__(name)


def _console(stderr: bool) -> Console:
    """A console for stdout or stderr. On a terminal, text wraps at word boundaries to its width (a
    word longer than a line is folded); left to the terminal (soft wrapping), a line would break
    wherever it reaches the last column, in the middle of a word or a number. Elsewhere (a pipe, a
    file), lines are written whole, without a width limit."""
    Console = _get("Console")  # noqa: N806
    console = Console(stderr=stderr, highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False, emoji=False, width=_WIDE)
    return console


def cell(value: object, style: str | None = None) -> Text:
    """A table cell showing ``value`` literally (see :func:`literal`)."""
    return _get("Text")(literal(value), style=style or "")


def table(title: object, columns: Iterable[str | tuple[str, str]]) -> Table:
    """A Rich table with a literal title; a column is a name or ``(name, justify)``.

    Right-justified columns hold figures and are never wrapped (a number split over two lines reads
    as two numbers); the others fold when the terminal is narrow, so no name is ever cut short.
    """
    t = _get("Table")(title=cell(title))
    for col in columns:
        name, justify = (col, "left") if isinstance(col, str) else col
        t.add_column(name, justify=justify, overflow="fold", no_wrap=justify == "right")
    return t


def fits(t: Table) -> bool:
    """Whether ``t`` printed on stdout fits its width with no cell wrapped (always, for a file or a pipe)."""
    out = _get("out")
    return out.measure(t, options=out.options.update_width(_WIDE)).maximum <= out.width


def add_row(t: Table, *values: object) -> None:
    """Add a row whose cells are shown literally (a ``Text`` is kept as it is)."""
    Text = _get("Text")  # noqa: N806
    t.add_row(*(v if isinstance(v, Text) else cell(v) for v in values))


def print_table(title: object, columns: list[str | tuple[str, str]], rows: list[list[object]]) -> None:
    """Print a table of plain cells on stdout, as ``out.print(table(title, columns))`` with ``rows``
    added prints it.

    When stdout is a pipe or a file and Rich would draw the table exactly as :func:`plain_table`
    does (see :func:`_plain_stdout`; every text ASCII and printable, at least one row), the text is
    written without importing Rich, which takes about as long as the rest of ``policyport run``
    on a small model; anything else is rendered by Rich.
    """
    texts = [literal(title), *(literal(c if isinstance(c, str) else c[0]) for c in columns),
             *(literal(v) for row in rows for v in row)]
    justified = all(isinstance(c, str) or c[1] in ("left", "right") for c in columns)
    if rows and justified and all(t.isascii() and t.isprintable() for t in texts) and _plain_stdout():
        import sys

        sys.stdout.write(plain_table(title, columns, rows))
        return
    t = table(title, columns)
    for row in rows:
        add_row(t, *row)
    _get("out").print(t)


def plain_table(title: object, columns: list[str | tuple[str, str]], rows: list[list[object]]) -> str:
    """The text Rich prints for ``table(title, columns)`` with ``rows`` on a console that is not a
    terminal (see :func:`_console`): the title as it is, then Rich's default box (heavy head),
    columns as wide as their widest cell plus one space each side. Texts must be ASCII (one column
    per character), justify "left" or "right"."""
    specs = [(c, "left") if isinstance(c, str) else c for c in columns]  # pragma: no mutate (any justify but "right" is laid out left)
    cells = [[literal(v) for v in row] for row in [[name for name, _ in specs], *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(specs))]

    def line(left: str, fill: str, middle: str, right: str) -> str:
        return left + middle.join(fill * (w + 2) for w in widths) + right

    def text_row(edge: str, row: list[str]) -> str:
        justified = (v.rstrip().rjust(w) if justify == "right" else v.ljust(w)  # Rich strips what it right-justifies
                     for v, w, (_, justify) in zip(row, widths, specs))
        return edge + edge.join(f" {v} " for v in justified) + edge

    lines = [literal(title)] if literal(title) else []
    lines += [line("┏", "━", "┳", "┓"), text_row("┃", cells[0]), line("┡", "━", "╇", "┩"),
              *(text_row("│", row) for row in cells[1:]), line("└", "─", "┴", "┘")]
    return "\n".join(lines) + "\n"


def _plain_stdout() -> bool:
    """Whether Rich would print to stdout without any terminal feature: stdout is not a terminal
    and encodes UTF-8, and none of what makes Rich decide otherwise applies (``FORCE_COLOR``,
    ``TTY_COMPATIBLE``, Jupyter, IDLE, Windows consoles)."""
    import builtins
    import os
    import sys

    if os.environ.get("FORCE_COLOR") is not None or os.environ.get("TTY_COMPATIBLE", "") != "":
        return False
    if sys.platform == "win32" or hasattr(builtins, "get_ipython") or "idlelib" in sys.modules:
        return False
    stdout = sys.stdout
    try:
        if stdout is None or stdout.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    return (getattr(stdout, "encoding", "utf-8") or "utf-8").lower().startswith("utf")


def say(text: object) -> None:
    """A status line for people, on stderr."""
    _get("err").print(literal(text))


def say_error(text: object) -> None:
    """``error: <text>`` on stderr, the text literal."""
    _get("err").print(_get("Text").assemble(("error:", "bold red"), " ", literal(text)))


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 tensor``, ``7 tensors``, ``1,000 observations``: a count with its noun in the right number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def shape_text(shape) -> str:
    """``(1000, 256)`` for a tuple of ints, ``(256,)`` for one dimension."""
    return str(tuple(shape))
