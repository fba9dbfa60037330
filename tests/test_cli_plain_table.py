"""policyport run's table on a pipe or file is written without Rich, byte for byte as Rich draws it."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from policyport.cli import render

ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
COLUMN = st.one_of(ASCII, st.tuples(ASCII, st.sampled_from(["left", "right"])))


def rich_text(title, columns, rows) -> str:
    """What Rich prints for the table on the console :func:`render._console` makes for a pipe."""
    file = io.StringIO()
    console = Console(file=file, highlight=False, soft_wrap=True, markup=False, emoji=False, width=render._WIDE)
    assert not console.is_terminal
    t = render.table(title, columns)
    for row in rows:
        render.add_row(t, *row)
    console.print(t)
    return file.getvalue()


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_the_plain_table_is_richs_table(data):
    columns = data.draw(st.lists(COLUMN, min_size=1, max_size=5))
    rows = data.draw(st.lists(st.lists(ASCII, min_size=len(columns), max_size=len(columns)), min_size=1, max_size=4))
    title = data.draw(ASCII)
    assert render.plain_table(title, columns, rows) == rich_text(title, columns, rows)


def test_the_run_table_is_richs_table():
    columns = ["tensor", "dtype", "shape", ("min", "right"), ("max", "right")]
    rows = [["logits", "float32", "(1, 4)", "-2.572", "1.133"], ["log_std", "float32", "(1, 2)", "-2.511", "0.4774"],
            ["empty", "float32", "(0, 2)", "", ""]]
    title = "numpy: outputs written to out dir/y [bold].npz"
    assert render.plain_table(title, columns, rows) == rich_text(title, columns, rows)
    assert render.plain_table(title, columns, rows).splitlines()[:3] == [
        title, "┏━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┓", "┃ tensor  ┃ dtype   ┃ shape  ┃    min ┃    max ┃"]


class Pipe(io.StringIO):
    def __init__(self, tty=False, encoding="utf-8"):
        super().__init__()
        self._tty, self._encoding = tty, encoding

    def isatty(self):
        return self._tty

    @property
    def encoding(self):
        return self._encoding


class Bare:
    """A stdout with no ``encoding`` attribute at all."""

    def __init__(self):
        self.file = io.StringIO()

    def write(self, text):
        return self.file.write(text)

    def isatty(self):
        return False

    def getvalue(self):
        return self.file.getvalue()


class Closed(Pipe):
    def isatty(self):
        raise ValueError("I/O operation on closed file")


PLAIN = ["plain", "control character", "left column", "no encoding", "encoding None"]


@pytest.mark.parametrize("case", [*PLAIN, "terminal", "FORCE_COLOR", "TTY_COMPATIBLE", "ascii encoding",
                                  "non-ASCII cell", "no rows", "centred column", "non-ASCII title",
                                  "non-ASCII column", "non-ASCII right column", "Windows", "IPython", "IDLE",
                                  "closed stdout"])
def test_print_table_leaves_to_rich_whatever_rich_might_draw_otherwise(monkeypatch, case):
    import builtins

    title, columns, rows = "title", ["tensor", ("max", "right")], [["fc_1/tanh", "0.5"], ["logits", "12"]]
    if case == "non-ASCII cell":
        rows = [["ф_1", "0.5"]]
    if case == "control character":
        rows = [["a\x1b[2J", "0.5"]]
    if case == "no rows":
        rows = []
    if case == "centred column":
        columns = ["tensor", ("max", "center")]
    if case == "left column":
        columns = [("tensor", "left"), ("max", "right")]
    if case == "non-ASCII title":
        title = "µs per node"
    if case == "non-ASCII column":
        columns = ["tensor µs", ("max", "right")]
    if case == "non-ASCII right column":  # a no-break space: Python's repr would escape it to ASCII
        columns = ["tensor", ("max\xa0s", "right")]
    pipe = {"closed stdout": Closed(), "no encoding": Bare(), "encoding None": io.StringIO()}.get(
        case, Pipe(tty=case == "terminal", encoding="ascii" if case == "ascii encoding" else "utf-8"))
    monkeypatch.setattr(sys, "stdout", pipe)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    if case in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.setenv(case, "1")
    if case == "Windows":
        monkeypatch.setattr(sys, "platform", "win32")
    if case == "IPython":
        monkeypatch.setattr(builtins, "get_ipython", lambda: None, raising=False)
    if case == "IDLE":
        monkeypatch.setitem(sys.modules, "idlelib", sys)
    printed = []
    monkeypatch.setattr(render, "out", type("Recorder", (), {"print": lambda self, t: printed.append(t)})())
    render.print_table(title, columns, rows)
    if case in PLAIN:  # a control character is escaped to ASCII by literal()
        assert printed == [] and pipe.getvalue() == render.plain_table(title, columns, rows)
        assert pipe.getvalue() == rich_text(title, columns, rows)
    else:
        assert pipe.getvalue() == "" and len(printed) == 1
        assert printed[0].title.plain == title
        assert [c.header for c in printed[0].columns] == [c if isinstance(c, str) else c[0] for c in columns]
        assert [[cell.plain for cell in c.cells] for c in printed[0].columns] == \
            [[render.literal(row[i]) for row in rows] for i in range(len(columns))]
