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


@pytest.mark.parametrize("case", ["plain", "terminal", "FORCE_COLOR", "TTY_COMPATIBLE", "ascii encoding",
                                  "non-ASCII cell", "control character", "no rows", "centred column"])
def test_print_table_leaves_to_rich_whatever_rich_might_draw_otherwise(monkeypatch, case):
    columns, rows = ["tensor", ("max", "right")], [["fc_1/tanh", "0.5"]]
    if case == "non-ASCII cell":
        rows = [["ф_1", "0.5"]]
    if case == "control character":
        rows = [["a\x1b[2J", "0.5"]]
    if case == "no rows":
        rows = []
    if case == "centred column":
        columns = ["tensor", ("max", "center")]
    pipe = Pipe(tty=case == "terminal", encoding="ascii" if case == "ascii encoding" else "utf-8")
    monkeypatch.setattr(sys, "stdout", pipe)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    if case in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.setenv(case, "1")
    printed = []
    monkeypatch.setattr(render, "out", type("Recorder", (), {"print": lambda self, t: printed.append(t)})())
    render.print_table("title", columns, rows)
    if case in ("plain", "control character"):  # a control character is escaped to ASCII by literal()
        assert printed == [] and pipe.getvalue() == render.plain_table("title", columns, rows)
        assert pipe.getvalue() == rich_text("title", columns, rows)
    else:
        assert pipe.getvalue() == "" and len(printed) == 1
        assert [c.header for c in printed[0].columns] == [c if isinstance(c, str) else c[0] for c in columns]
        assert len(printed[0].rows) == len(rows)
