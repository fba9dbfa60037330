"""What the CLI prints, piece by piece: the verification table, notes and verdict for every kind of
result, the option helpers (--max-bytes, --json detection, shapes and names), and the help layout."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Annotated, List, Optional

import numpy as np
import pytest
import typer
from rich.console import Console

from policyport.cli import core
from policyport.cli.convert import check_convert_options, parse_names, parse_shape
from policyport.cli.options import check_range
from policyport.cli.render import add_row, cell, literal, shape_text, table
from policyport.cli.verify import report_lines, verification_table
from policyport.verification.compare import tolerance_text, verdict
from policyport.verification.compare import Comparison, Report, Skipped


def _text(renderable) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None, markup=False, highlight=False)
    console.print(renderable)
    return console.file.getvalue()


def _cmp(tensor="t", cand="onnxruntime", ref="numpy", passed=True, **kw) -> Comparison:
    values = {"shape": (4, 2), "dtype": "float32", "max_abs": 2.5e-6, "max_rel": 1e-6, "atol": 1e-5, "rtol": 1e-5}
    values.update(kw)
    shape, dtype, max_abs, max_rel = values.pop("shape"), values.pop("dtype"), values.pop("max_abs"), values.pop("max_rel")
    return Comparison(tensor, cand, ref, shape, dtype, max_abs, max_rel, passed, **values)


# ------------------------------------------------------------------------------------ the report


def test_the_table_has_one_column_per_pair_and_marks_rounding_and_failures():
    report = Report(["numpy", "onnxruntime"], "source", 4, None, None, [
        _cmp("fc_1", max_abs=2.5e-6),
        _cmp("fc_1", "numpy", "source", max_abs=0.0),
        _cmp("fc_2", rule="rounding", max_abs=3.7e-4, candidate_vs_float64=4e-4, reference_vs_float64=2.9e-4,
             rounding_bound=2.3e-3),
        _cmp("ids", dtype="int64", passed=False, rule="exact", max_abs=1.0, detail="1 of 4 elements differ"),
    ], [Skipped("noise", "depends on the random RandomNormal node 'r'")])
    text = _text(verification_table(report))
    assert "max abs error on 4 observations (float32: atol 1e-05, rtol 1e-05)" in " ".join(text.split())
    lines = [line for line in text.splitlines() if "│" in line]
    assert [c.strip() for c in lines[0].split("│")[1:-1]] == ["fc_1", "(4, 2)", "2.5e-06", "0"]
    assert [c.strip() for c in lines[1].split("│")[1:-1]] == ["fc_2", "(4, 2)", "0.00037 ≈", ""]
    assert [c.strip() for c in lines[2].split("│")[1:-1]] == ["ids", "(4, 2)", "1 of 4 elements differ ✗", ""]
    assert [c.strip() for c in lines[3].split("│")[1:-1]] == ["noise", "", "skipped", "skipped"]
    header = text.split("┡")[0]
    assert "onnxruntime" in header and "vs numpy" in header and "vs source" in header
    one = Report(["numpy"], None, 1, None, None, [_cmp()])
    assert "on 1 observation (" in " ".join(_text(verification_table(one)).split())


def test_tolerance_text_given_by_dtype_or_exact():
    assert tolerance_text(Report(["numpy"], None, 1, 1e-3, 2e-4)) == "atol 0.001, rtol 0.0002"
    mixed = Report(["numpy"], None, 1, None, None, [_cmp(dtype="float16", atol=1e-3, rtol=1e-3), _cmp()])
    assert tolerance_text(mixed) == "float16: atol 0.001, rtol 0.001; float32: atol 1e-05, rtol 1e-05"
    exact = Report(["numpy"], None, 1, None, None, [_cmp(dtype="int64", rule="exact", atol=0.0, rtol=0.0)])
    assert tolerance_text(exact) == "exact"
    half_given = Report(["numpy"], None, 1, 1e-3, None, [_cmp()])
    assert tolerance_text(half_given) == "float32: atol 1e-05, rtol 1e-05"


def test_report_lines_rounding_figures_and_skipped_not_the_notes():
    report = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("plain"),
        _cmp("a", rule="rounding", max_abs=3.7e-4, candidate_vs_float64=4e-4, reference_vs_float64=2.9e-4, rounding_bound=2.3e-3),
        _cmp("b", rule="rounding", passed=False, max_abs=1e-2, candidate_vs_float64=1e-2, reference_vs_float64=1e-7,
             rounding_bound=8e-7),
        _cmp("c")], [Skipped("noise", "depends on the random RandomNormal node 'r'")], ["using the first 4 of 9"])
    assert report_lines(report) == [  # the notes are status, said on stderr
        "a (onnxruntime vs numpy): 0.00037 exceeds the tolerance, within float32 rounding: against a float64 run "
        "onnxruntime is 0.0004 off and numpy 0.00029, bound 0.0023",
        "b (onnxruntime vs numpy): 0.01 exceeds the tolerance, beyond float32 rounding: against a float64 run "
        "onnxruntime is 0.01 off and numpy 1e-07, bound 8e-07",
        "skipped noise: depends on the random RandomNormal node 'r'",
    ]


def test_the_verdict_of_a_pass():
    report = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("a", max_abs=1e-6), _cmp("b", max_abs=3e-6), _cmp("c", rule="rounding", max_abs=2e-6)],
        [Skipped("n", "random")])
    assert verdict(report) == ("PASS: 3 comparisons within float32: atol 1e-05, rtol 1e-05, 1 by rounding against a "
                               "float64 run; 1 random tensor(s) skipped; worst 3e-06 on b (onnxruntime vs numpy)")
    assert verdict(Report(["numpy"], None, 1, None, None, [])) == "PASS: 0 comparisons within exact"


def test_the_verdict_of_each_kind_of_failure():
    tolerance = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("a"), _cmp("b", passed=False, max_abs=2e-4, max_rel=0.5), _cmp("c", passed=False)])
    assert verdict(tolerance) == (
        "FAIL: 2 of 3 comparisons fail; first diverging tensor 'b' (float32, onnxruntime vs numpy): max abs 0.0002, "
        "max rel 0.5 > atol 1e-05 + rtol 1e-05 * |numpy|; if float32 differences of this size are acceptable, "
        "loosen them with --atol/--rtol")
    exact = Report(["numpy"], "source", 4, None, None, [
        _cmp("ids", "numpy", "source", passed=False, dtype="int64", rule="exact", max_abs=3.0, max_rel=1.0)])
    assert verdict(exact).endswith("first diverging tensor 'ids' (int64, numpy vs source): max abs 3, max rel 1 "
                                   "(int64 compares exactly)")
    detail = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("s", passed=False, detail="shape (4, 2) vs (2, 4)", max_abs=np.inf)])
    assert verdict(detail).endswith("first diverging tensor 's' (float32, onnxruntime vs numpy): shape (4, 2) vs (2, 4)")
    rounding = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("r", passed=False, rule="rounding", max_abs=1e-4, max_rel=0.1, candidate_vs_float64=1e-4,
             reference_vs_float64=1e-7, rounding_bound=8e-7)])
    assert verdict(rounding) == (
        "FAIL: 1 of 1 comparisons fail; first diverging tensor 'r' (float32, onnxruntime vs numpy): max abs 0.0001, "
        "max rel 0.1 > atol 1e-05 + rtol 1e-05 * |numpy|, and not float32 rounding: against a float64 run "
        "onnxruntime is 0.0001 off, numpy 1e-07; if float32 differences of this size are acceptable, loosen them "
        "with --atol/--rtol")


def test_a_failure_far_beyond_the_tolerance_suggests_no_tolerance_but_the_diverging_tensor():
    far = Report(["numpy", "onnxruntime"], "source", 4, None, None, [
        _cmp("fc_1", "numpy", "source", passed=False, max_abs=4.87, max_rel=3.2)])
    assert verdict(far) == (
        "FAIL: 1 of 1 comparisons fail; first diverging tensor 'fc_1' (float32, numpy vs source): max abs 4.87, "
        "max rel 3.2 > atol 1e-05 + rtol 1e-05 * |source|; that is more than 100 times the float32 tolerance: the "
        "values disagree beyond rounding — look at the node that computes 'fc_1', not at the tolerances")
    # a near failure first, a far one after it: the far one decides, and is named
    later = Report(["numpy", "onnxruntime"], None, 4, None, None, [
        _cmp("h", passed=False, max_abs=3e-5, max_rel=2e-5), _cmp("logits", passed=False, max_abs=0.5, max_rel=0.2)])
    assert verdict(later).endswith(
        "max abs 3e-05, max rel 2e-05 > atol 1e-05 + rtol 1e-05 * |numpy|; but 'logits' (onnxruntime vs numpy) is off "
        "by up to 0.5 (max rel 0.2), more than 100 times the float32 tolerance: the values disagree beyond rounding "
        "— look at the node that computes 'logits', not at the tolerances")
    for kind in ({"detail": "shape (4, 2) vs (2, 4)", "max_abs": np.inf}, {"dtype": "int64", "rule": "exact", "max_abs": 2.0}):
        mixed = Report(["numpy", "onnxruntime"], None, 4, None, None, [
            _cmp("h", passed=False, max_abs=3e-5, max_rel=2e-5), _cmp("ids", passed=False, **kind)])
        assert "; but 'ids' (onnxruntime vs numpy) differs" in verdict(mixed) and "--atol" not in verdict(mixed)


@pytest.mark.parametrize("max_abs,max_rel,atol,rtol,dtype,within", [
    (1e-3, 1.0, 1e-5, 1e-5, "float32", True),       # exactly 100 x atol
    (1.01e-3, 1.0, 1e-5, 1e-5, "float32", False),
    (1.0, 1e-3, 1e-5, 1e-5, "float32", True),       # large values, small relative error
    (7e-7, 5e-4, 0.0, 0.0, "float32", True),        # a tolerance of 0: the dtype's default sets the reach
    (4.87, 3.2, 1e-5, 1e-5, "float32", False),
    (0.05, 0.05, 1e-3, 1e-3, "float16", True),
    (0.05, 0.05, 1e-5, 1e-5, "float64", False),     # the given tolerance is larger than float64's default
    (5e-4, 5e-4, 1e-5, 1e-5, "float64", True),
])
def test_within_reach_measures_the_error_against_the_tolerance_or_the_dtype_default(max_abs, max_rel, atol, rtol,
                                                                                     dtype, within):
    from policyport.verification.compare import within_reach

    assert within_reach(_cmp(passed=False, max_abs=max_abs, max_rel=max_rel, atol=atol, rtol=rtol, dtype=dtype)) is within
    assert not within_reach(_cmp(passed=False, rule="exact", dtype="int64", max_abs=1.0, max_rel=1.0, atol=0, rtol=0))
    assert not within_reach(_cmp(passed=False, detail="NaN", max_abs=np.inf, max_rel=np.inf))


# ------------------------------------------------------------------------------------ option helpers


@pytest.mark.parametrize("argv,value,left", [
    (["--max-bytes", "4G", "run"], "4G", ["run"]),
    (["run", "--max-bytes=1M", "-i", "x"], "1M", ["run", "-i", "x"]),
    (["run", "--max-bytes"], "", ["run"]),
    (["run", "--", "--max-bytes", "4G"], None, ["run", "--", "--max-bytes", "4G"]),
    (["run", "x"], None, ["run", "x"]),
    (["run", "--", "--max-bytes", "4G", "--"], None, ["run", "--", "--max-bytes", "4G", "--"]),
    (["--max-bytes=a=b", "run"], "a=b", ["run"]),
    (["run", "m.onnx", "--max-bytes", "4G"], "4G", ["run", "m.onnx"]),
])
def test_max_bytes_is_taken_from_anywhere_before_a_double_dash(argv, value, left):
    argv = list(argv)
    assert core._take_max_bytes(argv) == value and argv == left


def test_max_bytes_values():
    assert core._limits_from(None) == {}
    assert core._limits_from("1K") == {"array_bytes": 1024}
    with pytest.raises(typer.BadParameter, match="is not a size") as refused:
        core._limits_from("lots")
    assert refused.value.param_hint == "--max-bytes"


def test_a_bad_limit_in_the_environment_is_a_usage_error_naming_it(monkeypatch):
    monkeypatch.setenv("POLICYPORT_MAX_ARRAY_BYTES", "lots")
    with pytest.raises(typer.BadParameter) as refused:
        core._limits_from(None)
    assert refused.value.param_hint == "environment"
    assert "POLICYPORT_MAX_ARRAY_BYTES" in refused.value.message and "'lots'" in refused.value.message


def test_json_is_requested_only_before_a_double_dash():
    assert core._json_requested(["inspect", "m", "--json"])
    assert not core._json_requested(["inspect", "--", "--json"])
    assert not core._json_requested(["inspect", "--", "--json", "--"])
    assert not core._json_requested(["inspect", "m"])


@pytest.mark.parametrize("text,shape", [("2,3", (2, 3)), ("2x3", (2, 3)), ("7", (7,)), ("1, 2", (1, 2)), (None, None)])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "0", "2,-1", "a", "2,,3", "+2", "2.5"])
def test_parse_shape_refuses(text):
    with pytest.raises(typer.BadParameter, match="give positive integers separated by commas"):
        parse_shape(text)


def test_parse_names():
    assert parse_names(" mean , value ") == ("mean", "value") and parse_names(None) is None
    for bad in ("a,,b", "a,a", ""):
        with pytest.raises(typer.BadParameter, match="give distinct, non-empty names"):
            parse_names(bad)


def test_check_convert_options_takes_none_as_a_head_of_its_own_and_refuses_unknown_heads():
    for head in (None, "none", "categorical", "diag-gaussian", "diag-gaussian:halves"):  # "none" is passed on as given
        check_convert_options("npz", "tanh,relu", head, 11, "dynamo")
    with pytest.raises(typer.BadParameter, match=r"^'None'; choose one of none, diag-gaussian, diag-gaussian:halves, "
                                                 r"categorical$"):
        check_convert_options(None, None, "None", 17, "torchscript")


def test_check_range_accepts_a_finite_non_empty_range():
    check_range(-1.0, 1.0)
    check_range(-1e300, 1e300)
    finite = "must be finite numbers, and so must --high minus --low"
    for low, high, message in ((1.0, 1.0, "--low 1.0 must be below --high 1.0"),
                               (2.0, 1.0, "--low 2.0 must be below --high 1.0"),
                               (0.0, float("inf"), f"--low 0.0 and --high inf {finite}"),
                               (float("nan"), 1.0, f"--low nan and --high 1.0 {finite}"),
                               (-1e308, 1e308, f"--low -1e+308 and --high 1e+308 {finite}")):
        with pytest.raises(typer.BadParameter) as refused:
            check_range(low, high)
        assert (refused.value.message, refused.value.param_hint) == (message, "--low/--high")


def test_tolerances_threads_and_override_options_are_checked_with_exact_messages(tmp_path):
    import math

    from policyport.cli.options import finite_tolerance, overrides_from, thread_count
    from policyport.runtime import MAX_THREADS

    assert finite_tolerance(None) is None and finite_tolerance(1e-3) == 1e-3
    assert math.copysign(1.0, finite_tolerance(-0.0)) == 1.0
    for value in (float("inf"), float("nan")):
        with pytest.raises(typer.BadParameter, match=rf"^{value} is not a finite number$"):
            finite_tolerance(value)
    assert thread_count(0) == 0 and thread_count(MAX_THREADS) == MAX_THREADS
    with pytest.raises(typer.BadParameter) as refused:
        thread_count(MAX_THREADS + 1)
    assert refused.value.message == "1,025 is more than 1,024 threads; give at most 1,024 (0: one per core)"

    sets = tmp_path / "sets.json"
    sets.write_text('{"brake": {"fc_2/tanh": {"17": 1.0}}, "calm": ["fc_1/tanh[*]*=0.5"]}')
    assert overrides_from(None, None, None) is None and overrides_from([], None, None) is None
    edits = overrides_from(["fc_2/tanh[0:8]=clip(-0.1,0.1)"], "calm", sets)
    assert [e.spec for e in edits] == ["fc_1/tanh[*]*=0.5", "fc_2/tanh[0:8]=clip(-0.1,0.1)"]  # the set first
    assert [e.spec for e in overrides_from(None, "calm", sets)] == ["fc_1/tanh[*]*=0.5"]
    together = ("--steer NAME and --overrides FILE go together: the file holds named sets, --steer picks one",
                "--steer/--overrides")
    for specs, steer, file, (message, hint) in [
            (None, "brake", None, together), (None, None, sets, together),
            (None, "fast", sets, (f"{sets} has no set 'fast'; it has: brake, calm", "--steer")),
            (["fc_2/tanh[17]"], None, None, (None, "--override"))]:
        with pytest.raises(typer.BadParameter) as refused:
            overrides_from(specs, steer, file)
        assert refused.value.param_hint == hint
        if message is not None:
            assert refused.value.message == message
    assert "does not read as TENSOR[INDEX]=VALUE" in refused.value.message


# ------------------------------------------------------------------------------------ rendering


def test_cells_tables_and_shapes_are_literal():
    t = table("title [bold]x[/bold]", ["name", ("n", "right")])
    add_row(t, "a[red]b", 3)
    add_row(t, cell("kept", "bold"), "")
    text = _text(t)
    assert "title [bold]x[/bold]" in " ".join(text.split()) and "a[red]b" in text and "kept" in text
    assert t.columns[1].justify == "right" and t.columns[0].justify == "left"
    assert t.columns[0].overflow == "fold"
    assert shape_text((1000, 256)) == "(1000, 256)" and shape_text([256]) == "(256,)"
    assert literal(3) == "3" and literal("\x1b") == "\\x1b"


def test_option_names_list_short_ones_first():
    assert sorted(["--help", "-h"], key=core._prefix_length) == ["-h", "--help"]
    assert core._prefix_length("/x") == 1 and core._prefix_length("--x") == 2 and core._prefix_length("x") == 0


# ------------------------------------------------------------------------------------ set-up


def test_consoles_are_plain_and_unbounded_when_not_a_terminal(monkeypatch):
    from policyport.cli import render

    made = []

    class Recorder:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.is_terminal = terminal

    monkeypatch.setattr(render, "Console", Recorder)
    plain = {"highlight": False, "markup": False, "emoji": False}
    terminal = True
    render._console(stderr=True)
    assert made == [{"stderr": True, **plain, "soft_wrap": False}]  # wrapped by Rich, at words
    made.clear()
    terminal = False
    render._console(stderr=False)
    assert made == [{"stderr": False, **plain, "soft_wrap": False},
                    {"stderr": False, **plain, "soft_wrap": True, "width": 1_000_000}]


def terminal_console(monkeypatch, width: int, stderr: bool = True):
    """The console :func:`render._console` makes for a terminal of ``width`` columns, writing to a buffer."""
    from policyport.cli import render

    screen = io.StringIO()

    def on_a_terminal(**kwargs):
        return Console(**kwargs, file=screen, force_terminal=True, color_system=None, width=kwargs.pop("width", width))

    with monkeypatch.context() as patched:
        patched.setattr(render, "Console", on_a_terminal)
        return render._console(stderr=stderr), screen


def split_words(lines: list[str], text: str) -> bool:
    """Whether ``lines`` break ``text`` anywhere but between words (each break stands for one space)."""
    return " ".join(line.rstrip() for line in lines) != text


@pytest.mark.parametrize("width", [100, 80])
def test_status_lines_wrap_between_words_on_a_terminal(monkeypatch, width):
    from policyport.cli import render

    note = ("note: the source computes 9 of the model's 18 compared tensors; not compared with it: "
            + ", ".join(repr(f"vec_normalize/step_{i}") for i in range(12)))
    console, screen = terminal_console(monkeypatch, width)
    monkeypatch.setattr(render, "err", console)
    render.say(note)
    render.say_error(f"{note} — and 1,234,567 more")
    said = screen.getvalue().split("error: ")
    for text, shown in ((note, said[0]), (f"{note} — and 1,234,567 more", said[1])):
        lines = shown.splitlines()
        assert len(lines) > 1 and max(len(line) for line in lines) <= width
        assert not split_words(lines, text), lines
    assert not split_words(["a", "b c"], "a b c") and split_words(["a b", "c"], "a bc")  # the check itself


def test_a_word_longer_than_a_line_is_folded_and_nothing_is_lost(monkeypatch):
    from policyport.cli import render

    path = "/data/" + "x" * 130 + "/rec.npz"
    console, screen = terminal_console(monkeypatch, 100)
    monkeypatch.setattr(render, "err", console)
    render.say(f"cannot read {path}")
    lines = screen.getvalue().splitlines()
    assert lines[0].rstrip() == "cannot read" and "".join(lines[1:]) == path and max(map(len, lines)) <= 100


def test_commands_of_the_application_render_help_plainly_unless_they_choose_otherwise():
    from typer.core import TyperCommand
    from typer.main import get_command

    app = core.PolicyportTyper()

    @app.command()
    def first(model: Path) -> None:
        """First."""

    @app.command(cls=TyperCommand)
    def second(model: Path) -> None:
        """Second."""

    @app.command("third-name", help="Named and helped.")
    def third(model: Path) -> None:
        pass

    commands = get_command(app).commands
    assert type(commands["first"]) is core.PolicyportCommand and type(commands["second"]) is TyperCommand
    assert type(commands["third-name"]) is core.PolicyportCommand and commands["third-name"].help == "Named and helped."


def test_given_options_are_those_written_on_the_command_line():
    class Source:
        def __init__(self, name):
            self.name = name

    class Context:
        sources = {"samples": Source("COMMANDLINE"), "low": Source("DEFAULT"), "high": Source("ENVIRONMENT"),
                   "output_names": Source("COMMANDLINE")}

        def get_parameter_source(self, name):
            return self.sources.get(name)

    from policyport.cli.options import given_options

    assert given_options(Context(), "samples", "low", "high", "seed", "output_names") == ["--samples", "--output-names"]


def test_main_runs_the_application_and_says_which_extra_the_command_needs(monkeypatch, capsys):
    import sys

    import policyport as pp
    import policyport.cli as cli

    asked = []
    monkeypatch.setattr(sys, "argv", ["policyport", "--version"])
    monkeypatch.setattr(cli, "_app", lambda argv=None, real=cli._app: asked.append(argv) or real(argv))
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 0 and capsys.readouterr().out.startswith("policyport ")
    assert asked == [["--version"]]  # the words after the program's name choose what is imported

    for name, package in (("typer", "typer"), ("typer.core", "typer"), ("rich.console", "rich"), ("click", "click")):
        def no_package(argv=None, name=name):
            raise ImportError(f"No module named {name!r}", name=name)

        monkeypatch.setattr(cli, "_app", no_package)
        monkeypatch.setattr(sys, "argv", ["policyport", "--version"])
        with pytest.raises(SystemExit) as ended:
            cli.main()  # the version needs numpy alone
        assert ended.value.code == 0 and capsys.readouterr() == (f"policyport {pp.__version__}\n", "")
        monkeypatch.setattr(sys, "argv", ["policyport", "ops", "--version"])
        with pytest.raises(SystemExit) as ended:
            cli.main()
        assert ended.value.code == 4
        assert capsys.readouterr().err == (f"error: the policyport command needs the Python package '{package}', which "
                                           "is not installed; install it with: pip install 'policyport[cli]' (or pip "
                                           "install -e '.[cli]' in a clone of the repository)\n")

    def broken(argv=None):
        raise ImportError("No module named 'somethingelse'", name="somethingelse.sub")

    monkeypatch.setattr(cli, "_app", broken)
    with pytest.raises(ImportError, match="somethingelse"):
        cli.main()


@pytest.mark.parametrize("argv,command", [
    (["run", "m.onnx"], "run"), (["--max-bytes", "9", "inspect", "m.onnx"], "inspect"), (["--debug", "verify"], "verify"),
    (["--max-bytes"], None), (["--", "run"], None), (["--help"], None), ([], None), (["-x", "stats", "run"], "stats"),
])
def test_the_command_a_command_line_names(argv, command):
    from policyport.cli import _command

    assert _command(argv) == command


def test_the_app_attribute_and_no_other():
    import policyport.cli as cli

    assert cli.app is core.app
    with pytest.raises(AttributeError, match="^module 'policyport.cli' has no attribute 'nope'$"):
        cli.nope  # noqa: B018


def test_usage_lines_of_variadic_and_optional_arguments_and_hidden_options():
    from typer.main import get_command
    from typer.testing import CliRunner

    app = core.PolicyportTyper(cls=core.PolicyportGroup, context_settings={"help_option_names": ["-h", "--help"]},
                               rich_markup_mode=None)

    @app.command()
    def go(files: Annotated[List[Path], typer.Argument(help="Files.")],
           secret: Annotated[int, typer.Option(hidden=True)] = 1,
           count: Annotated[int, typer.Option(help="How many.")] = 2) -> None:
        """Go."""

    @app.command()
    def maybe(name: Annotated[Optional[str], typer.Argument()] = None) -> None:
        """Maybe."""

    result = CliRunner().invoke(app, ["go", "-h"])
    lines = result.stdout.splitlines()
    assert lines[0] == "Usage: policyport go [OPTIONS] FILES..."
    assert "Arguments:" in lines and "Options:" in lines
    assert any(line.startswith("  FILES  Files.") for line in lines)
    assert any(line.startswith("  --count COUNT  How many.") for line in lines) and "--secret" not in result.stdout
    usage = get_command(app).commands["maybe"].collect_usage_pieces(get_command(app).make_context("maybe", []))
    assert usage == ["[OPTIONS]", "[NAME]"]


def test_usage_errors_print_their_message_literally():
    from typer.testing import CliRunner

    from policyport.cli import app

    result = CliRunner().invoke(app, ["run", "m.onnx", "-i", "x", "-o", "y", "--backend", "[red]x[/red]"])
    assert result.exit_code == 2 and "'[red]x[/red]' is not one of 'numpy', 'onnxruntime'" in result.stderr


def test_a_bug_report_in_json_and_with_debug(capsys, monkeypatch):
    import json

    with pytest.raises(typer.Exit) as ended:
        core._bug(KeyError("k"), as_json=True)
    assert ended.value.exit_code == 70
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": "this is a bug in policyport: KeyError: 'k'. Nothing was written. Re-run with "
                                        "--debug for the traceback, and please report it.", "exit_code": 70}
    monkeypatch.setattr(core.state, "debug", True)
    try:
        raise ValueError("[bold]deep[/bold]")
    except ValueError as e:
        with pytest.raises(typer.Exit):
            core._bug(e, as_json=False)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "ValueError: [bold]deep[/bold]" in lines
    assert lines[-1] == "error: this is a bug in policyport: ValueError: [bold]deep[/bold]. Nothing was written."


def test_emit_json_is_indented_by_one(capsys):
    core.emit_json({"a": [1, "é"]})
    assert capsys.readouterr().out == '{\n "a": [\n  1,\n  "\\u00e9"\n ]\n}\n'


def test_array_summaries_of_bools_and_strings():
    from policyport.cli.run import array_summary

    assert array_summary("b", np.array([True, False])) == {"name": "b", "dtype": "bool", "shape": [2], "min": False,
                                                            "max": True}
    assert array_summary("s", np.array(["a", "b"])) | {"dtype": ""} == {"name": "s", "dtype": "", "shape": [2],
                                                                          "min": None, "max": None}


def test_one_array_for_several_inputs_names_the_file(tmp_path):
    from policyport.cli.verify import load_feeds
    from policyport.errors import InputMismatchError

    path = tmp_path / "obs.npy"
    np.save(path, np.zeros((2, 3), np.float32))
    with pytest.raises(InputMismatchError, match=f"^{path} holds one array but the model has inputs"):
        load_feeds(path, ["a", "b"])


def test_the_table_columns_and_the_style_of_a_failure():
    report = Report(["numpy", "onnxruntime"], None, 4, None, None, [_cmp("a", passed=False)])
    t = verification_table(report)
    assert [c.header for c in t.columns] == ["tensor", "shape", "onnxruntime\nvs numpy"]
    assert [c.justify for c in t.columns] == ["left", "left", "right"]
    failed = list(t.columns[2].cells)[0]
    assert failed.plain == "2.5e-06 ✗" and str(failed.style) == "bold red"


def test_parse_errors_name_their_option():
    for call, hint in ((lambda: parse_names("a,a"), "--output-names"), (lambda: parse_shape("x"), "--input-shape")):
        with pytest.raises(typer.BadParameter) as caught:
            call()
        assert caught.value.param_hint == hint


def test_errors_are_prefixed_and_styled(monkeypatch):
    from rich.text import Text

    from policyport.cli import render

    shown = []
    monkeypatch.setattr(render, "err", type("Recorder", (), {"print": lambda self, *a, **k: shown.append((a, k))})())
    render.say_error("x [bold]y")
    render.say("status\x1b")
    (error,), _ = shown[0]
    assert isinstance(error, Text) and error.plain == "error: x [bold]y"
    assert [(error.plain[s.start:s.end], str(s.style)) for s in error.spans] == [("error:", "bold red")]
    assert shown[1][0] == ("status\\x1b",)


def test_the_verdict_is_styled_by_its_outcome(monkeypatch):
    from policyport.cli import verify

    shown = []
    monkeypatch.setattr(verify, "out", type("Recorder", (), {"print": lambda self, *a, **k: shown.append(a[0])})())
    assert verify.print_report(Report(["numpy"], None, 1, None, None, [_cmp()]), as_json=False) == 0
    assert verify.print_report(Report(["numpy"], None, 1, None, None, [_cmp(passed=False)]), as_json=False) == 1
    passed, failed = shown[1], shown[3]
    assert passed.plain.startswith("PASS") and str(passed.style) == ""
    assert failed.plain.startswith("FAIL") and str(failed.style) == "bold red"
    assert str(cell("x").style) == "" and str(cell("x", "bold").style) == "bold"


# ------------------------------------------------------------------------------------ the error edge


def _guarded(capsys, as_json, body):
    with pytest.raises(typer.Exit) as ended:
        core.guard(as_json, body)
    out, err = capsys.readouterr()
    return ended.value.exit_code, out, err


def _raise(error):
    def body():
        raise error
    return body


@pytest.mark.parametrize("error,code,word", [(KeyboardInterrupt(), 130, "interrupted"), (core.Terminated(), 143, "terminated")])
def test_interruptions_exit_with_their_code_and_say_nothing_was_written(capsys, error, code, word):
    import json

    assert _guarded(capsys, False, _raise(error)) == (code, "", f"{word}; nothing was written\n")
    exit_code, out, err = _guarded(capsys, True, _raise(error))
    assert exit_code == code and json.loads(out) == {"error": f"{word}; nothing was written", "exit_code": code}


def test_os_errors_about_the_users_paths_are_bad_input(capsys):
    import errno
    import json

    long = OSError(errno.ENAMETOOLONG, "File name too long", "a\x1b/b.npz")
    assert _guarded(capsys, False, _raise(long)) == (
        3, "", "error: cannot use a\\x1b/b.npz: File name too long; nothing was written\n")
    full = OSError(errno.ENOSPC, "No space left on device")
    exit_code, out, err = _guarded(capsys, True, _raise(full))
    assert exit_code == 3 and json.loads(out) == {"error": "cannot use: No space left on device; nothing was written",
                                                  "exit_code": 3}
    other = OSError(errno.EBADF, "Bad file descriptor")
    exit_code, out, err = _guarded(capsys, True, _raise(other))
    assert exit_code == 70 and json.loads(out)["error"].startswith("this is a bug in policyport: OSError: [Errno 9]")
    bare = OSError(errno.EACCES, None)
    assert "cannot use: [Errno 13] None; nothing was written" in _guarded(capsys, False, _raise(bare))[2]


def test_running_out_of_memory_is_bad_input_with_the_size_when_known(capsys):
    import json

    exit_code, out, err = _guarded(capsys, True, _raise(MemoryError("Unable to allocate 3.00 GiB")))
    assert exit_code == 3 and json.loads(out) == {
        "error": "not enough memory to finish (Unable to allocate 3.00 GiB); nothing was written — use fewer samples, "
                 "a smaller input, or a machine with more memory", "exit_code": 3}
    assert _guarded(capsys, False, _raise(MemoryError()))[2] == (
        "error: not enough memory to finish; nothing was written — use fewer samples, a smaller input, or a machine "
        "with more memory\n")


def test_sigterm_is_caught_only_while_a_body_runs_in_the_main_thread():
    import signal
    import threading

    before = signal.getsignal(signal.SIGTERM)
    seen = []
    core.guard(False, lambda: seen.append(signal.getsignal(signal.SIGTERM)))
    assert seen == [core._on_sigterm] and signal.getsignal(signal.SIGTERM) is before
    assert core._in_main_thread()
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append((core._in_main_thread(), core.guard(False, lambda: None))))
    thread.start()
    thread.join()
    assert elsewhere == [(False, None)] and signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(core.Terminated):
        core._on_sigterm(signal.SIGTERM, None)


def test_literal_keeps_printable_text_around_what_it_escapes():
    assert literal("é\x1b漢 x") == "é\\x1b漢 x"


def test_debug_from_the_environment_and_max_bytes_before_the_command(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from policyport.cli import app

    from test_cli_usage import _tiny  # pytest puts tests/ on sys.path

    model = tmp_path / "m.onnx"
    _tiny(model)
    np.save(tmp_path / "obs.npy", np.zeros((2, 4), np.float32))
    run = ["run", str(model), "-i", str(tmp_path / "obs.npy"), "-o", str(tmp_path / "o.npz")]
    limited = CliRunner().invoke(app, ["--max-bytes", "1", *run])
    assert limited.exit_code == 3 and "above the limit of 1 B" in limited.stderr and not (tmp_path / "o.npz").exists()
    import policyport.verification.summary

    monkeypatch.setattr(policyport.verification.summary, "summarize", lambda model: {}["boom"])
    shown = CliRunner().invoke(app, ["inspect", str(model)], env={"POLICYPORT_DEBUG": "1"})
    assert shown.exit_code == 70 and "Traceback" in shown.stderr
    assert "Traceback" not in CliRunner().invoke(app, ["inspect", str(model)], env={"POLICYPORT_DEBUG": ""}).stderr


def test_sizes_and_figures_of_the_analysis_tables():
    from policyport.cli.analysis import _fig, _pct, _size

    assert [_size(n) for n in (0, 999, 1000, 123_456, 999_999_999, 4_160_000_000, 2_500_000_000_000, 4 * 10**18)] == [
        "0 B", "999 B", "1 KB", "123 KB", "1e+03 MB", "4.16 GB", "2.5 TB", "4e+06 TB"]
    assert (_pct(None), _pct(0.1234), _pct(1.0)) == ("", "12.3%", "100.0%")
    assert (_fig(None), _fig(0.000123456), _fig(12345.6)) == ("", "0.0001235", "1.235e+04")


def test_rich_names_and_consoles_are_made_on_first_use_and_kept(monkeypatch, capsys):
    import rich.console
    import rich.table
    import rich.text

    from policyport.cli import render

    for name in ("Console", "Table", "Text", "out", "err"):
        monkeypatch.delitem(render.__dict__, name, raising=False)  # restored afterwards
    made = render.cell("a\x1b")  # the module's own functions make them too
    assert isinstance(made, rich.text.Text) and made.plain == "a\\x1b" and render.__dict__["Text"] is rich.text.Text
    render.say("done")
    assert capsys.readouterr().err == "done\n" and render.__dict__["err"].stderr is True
    monkeypatch.delitem(render.__dict__, "err")
    assert (render.Console, render.Table, render.Text) == (rich.console.Console, rich.table.Table, rich.text.Text)
    out, err = render.out, render.err
    assert isinstance(out, rich.console.Console) and out.stderr is False and err.stderr is True
    assert render.__dict__["Table"] is rich.table.Table and render.__dict__["out"] is out and render.err is err
    with pytest.raises(AttributeError, match=r"^module 'policyport.cli.render' has no attribute 'nope'$"):
        render.nope  # noqa: B018


def test_help_lists_the_workflow_in_order_and_other_commands_after_it_by_name():
    import click

    group = core.PolicyportGroup(commands={n: click.Command(n) for n in ("zeta", "run", "alpha", "convert")})
    assert group.list_commands(click.Context(group)) == ["convert", "run", "alpha", "zeta"]


def test_a_command_line_imports_the_module_of_its_command_alone(monkeypatch):
    import importlib

    import policyport.cli as cli

    imported, import_module = [], importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, package=None: imported.append((name, package))
                        or import_module(name, package))
    every = [(f".{m}", "policyport.cli") for m in sorted(set(cli.COMMANDS.values()))]
    for argv, modules in [(["--max-bytes", "1G", "run", "m.onnx"], [(".run", "policyport.cli")]),
                          (["stats", "acts.npz"], [(".analysis", "policyport.cli")]),
                          (["--help"], every), (["nonsense"], every), (["--", "run"], every), (None, every)]:
        imported.clear()
        assert cli._app(argv) is core.app
        assert imported == modules, argv


def test_a_table_fits_a_terminal_as_wide_as_it_and_not_a_narrower_one(monkeypatch):
    from policyport.cli import render

    t = table("", ["tensor", ("max", "right")])
    add_row(t, "fc_1/tanh", "0.5")
    width = len(_text(t).splitlines()[0])  # the top border spans the table
    for columns, fit in ((width + 1, True), (width, True), (width - 1, False)):
        monkeypatch.setattr(render, "out", Console(file=io.StringIO(), width=columns, force_terminal=True))
        assert render.fits(t) is fit, columns


def test_foreign_options_notes_only_inside_a_command():
    from typer.main import get_command

    try:
        from typer._click.core import Context
    except ImportError:  # pragma: no cover - typer on plain Click
        from click import Context

    from policyport.cli import _app

    message = "refused; pass --trust (trust=True)"
    assert core.foreign_options(message) == message  # no command running: the Python API
    group = get_command(_app())
    with Context(group, info_name="policyport"):  # the group itself, no command chosen
        assert core.foreign_options(message) == message
    with Context(group.commands["extract"], info_name="extract", parent=Context(group, info_name="policyport")):
        assert core.foreign_options("refused: nothing to pass") == "refused: nothing to pass"
        assert core.foreign_options(message) == (f"{message} (--trust is an option of policyport convert and "
                                                 "policyport inspect and policyport pack and policyport to-keras and policyport to-sb3 and "
                                                 "policyport to-torch and policyport verify, not of policyport extract)")
        both = "refused; pass --trust, or use --backend onnxruntime"
        assert core.foreign_options(both) == (f"{both} (--trust is an option of policyport convert and policyport "
                                              "inspect and policyport pack and policyport to-keras and policyport to-sb3 and policyport to-torch and "
                                              "policyport verify; --backend is an "
                                              "option of policyport direction and policyport importance and policyport "
                                              "patch and policyport record and policyport run, not of policyport extract)")


# ------------------------------------------------------------------------------------ the error edge

MEMORY = "nothing was written — use fewer samples, a smaller input, or a machine with more memory"


@pytest.mark.parametrize("raised, code, message", [
    (KeyboardInterrupt(), 130, "interrupted; nothing was written"),
    (core.Terminated(), 143, "terminated; nothing was written"),
    (PermissionError(13, "Permission denied", "out dir/m.onnx"), 3,
     "error: cannot use out dir/m.onnx: Permission denied; nothing was written"),
    (OSError(28, "No space left on device"), 3, "error: cannot use: No space left on device; nothing was written"),
    (MemoryError("Unable to allocate 8.00 GiB"), 3, f"error: not enough memory to finish (Unable to allocate 8.00 GiB); {MEMORY}"),
    (MemoryError(), 3, f"error: not enough memory to finish; {MEMORY}"),
    (ConnectionResetError(104, "Connection reset by peer"), 70,
     "error: this is a bug in policyport: ConnectionResetError: [Errno 104] Connection reset by peer. Nothing was "
     "written. Re-run with --debug for the traceback, and please report it."),
    (ValueError("boom"), 70, "error: this is a bug in policyport: ValueError: boom. Nothing was written. Re-run with "
                             "--debug for the traceback, and please report it."),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_guard_ends_each_kind_of_failure_with_its_code_and_one_message(raised, code, message, as_json, capsys,
                                                                        monkeypatch):
    import json

    monkeypatch.setattr(core.state, "debug", False)

    def body():
        raise raised

    with pytest.raises(typer.Exit) as ended:
        core.guard(as_json, body)
    assert ended.value.exit_code == code
    printed = capsys.readouterr()
    assert " ".join(printed.err.split()) == message
    assert (json.loads(printed.out) if as_json else printed.out) == (
        {"error": message.removeprefix("error: "), "exit_code": code} if as_json else "")


@pytest.mark.parametrize("raised, code, message", [
    (core.Terminated(), 143, "terminated after writing {a} and {b}, which are complete"),
    (KeyboardInterrupt(), 130, "interrupted after writing {a} and {b}, which are complete"),
    (OSError(28, "No space left on device"), 3,
     "error: cannot use: No space left on device; {a} and {b} had been written and are complete"),
    (MemoryError(), 3, "error: not enough memory to finish; {a} and {b} had been written and are complete — use fewer "
                       "samples, a smaller input, or a machine with more memory"),
    (ValueError("boom"), 70, "error: this is a bug in policyport: ValueError: boom. It came after writing {a} and {b}, "
                             "which are complete. Re-run with --debug for the traceback, and please report it."),
])
def test_an_end_after_outputs_are_in_place_names_them_as_complete(raised, code, message, tmp_path, capsys, monkeypatch):
    from policyport.io.outputs import write_outputs

    monkeypatch.setattr(core.state, "debug", False)
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"

    def body():
        write_outputs({a: lambda f: f.write(b"a"), b: lambda f: f.write(b"b")})
        raise raised

    with pytest.raises(typer.Exit) as ended:
        core.guard(False, body)
    assert ended.value.exit_code == code
    assert " ".join(capsys.readouterr().err.split()) == message.format(a=a, b=b)
    assert a.read_bytes() == b"a" and b.read_bytes() == b"b"
    with pytest.raises(typer.Exit):  # each command its own: the next one wrote nothing
        core.guard(False, _raise(core.Terminated()))
    assert capsys.readouterr().err == "terminated; nothing was written\n"


def test_outputs_whose_placing_is_undone_are_not_named(tmp_path, capsys, monkeypatch):
    """A signal the moment both files are in place and noted: they are removed, and not named."""
    from policyport.io import outputs as files

    noted = files.note_placed

    def noted_then_terminated(*paths):
        noted(*paths)
        raise core.Terminated()

    monkeypatch.setattr(files, "note_placed", noted_then_terminated)

    def body():
        files.write_outputs({tmp_path / "a.npz": lambda f: f.write(b"a"), tmp_path / "b.npz": lambda f: f.write(b"b")})

    with pytest.raises(typer.Exit) as ended:
        core.guard(False, body)
    assert ended.value.exit_code == 143 and capsys.readouterr().err == "terminated; nothing was written\n"
    assert list(tmp_path.iterdir()) == []


def test_guard_exits_with_the_code_the_body_returns_and_holds_sigterm_only_meanwhile():
    import signal
    import threading

    def handler(signum, frame):
        pass

    seen = []
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        assert core.guard(False, lambda: seen.append(signal.getsignal(signal.SIGTERM))) is None
        assert seen == [core._on_sigterm] and signal.getsignal(signal.SIGTERM) is handler
        with pytest.raises(typer.Exit) as ended:
            core.guard(False, lambda: 1)
        assert ended.value.exit_code == 1 and signal.getsignal(signal.SIGTERM) is handler
        done = []
        worker = threading.Thread(target=lambda: done.append(core.guard(False, lambda: done.append("ran"))))
        worker.start()
        worker.join()
        assert done == ["ran", None] and signal.getsignal(signal.SIGTERM) is handler  # no signals off the main thread
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def group_main(monkeypatch):
    """The command group's main() with Click's own replaced: it records what it was given, and
    returns or raises what the test sets in ``then``."""
    from typer.core import TyperGroup
    from typer.main import get_command

    from policyport.io.limits import limits

    calls = []

    def clicks_main(self, args, prog_name, complete_var, standalone_mode=True, **extra):
        calls.append({"args": list(args), "prog_name": prog_name, "standalone_mode": standalone_mode,
                      "debug": core.state.debug, "array_bytes": limits().array_bytes, **extra})
        if isinstance(calls.then, BaseException):
            raise calls.then
        return calls.then

    calls = type("Calls", (list,), {"then": None})()
    monkeypatch.setattr(TyperGroup, "main", clicks_main)
    monkeypatch.delenv("POLICYPORT_DEBUG", raising=False)
    return get_command(core.app), calls


def test_the_group_takes_its_own_options_out_before_click_parses(group_main, monkeypatch):
    import sys

    group, calls = group_main
    assert group.main(["--debug", "--max-bytes", "1K", "inspect", "m", "--json"], standalone_mode=False) == 0
    assert calls[-1] == {"args": ["inspect", "m", "--json"], "prog_name": "policyport", "standalone_mode": False,
                         "debug": True, "array_bytes": 1024}
    assert group.main(["inspect", "--", "--debug", "--"], standalone_mode=False) == 0
    assert calls[-1]["args"] == ["inspect", "--", "--debug", "--"] and calls[-1]["debug"] is False
    monkeypatch.setenv("POLICYPORT_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["policyport", "ops"])
    calls.then = 5
    assert group.main(standalone_mode=False) == 5
    assert calls[-1]["args"] == ["ops"] and calls[-1]["debug"] is True
    monkeypatch.setenv("POLICYPORT_DEBUG", "")
    with pytest.raises(SystemExit) as ended:
        group.main(["ops"])
    assert ended.value.code == 5 and calls[-1]["debug"] is False
    calls.then = "not a code"
    assert group.main(["ops"], standalone_mode=False, obj="passed on") == 0
    assert calls[-1]["obj"] == "passed on"  # what Click's main takes besides


@pytest.mark.parametrize("raised, code, stderr", [(KeyboardInterrupt(), 130, "interrupted"),
                                                  (core.Terminated(), 143, "terminated"),
                                                  (typer.Abort(), 130, "interrupted")])
def test_an_interruption_before_a_command_runs_ends_with_its_code(group_main, capsys, raised, code, stderr):
    group, calls = group_main
    calls.then = raised
    assert group.main(["ops", "--json"], standalone_mode=False) == code
    assert capsys.readouterr() == ("", f"{stderr}\n")


def test_a_usage_error_before_a_command_runs_is_one_json_document(group_main, capsys):
    import json

    group, calls = group_main
    calls.then = typer.BadParameter("no such thing", param_hint="--outputs")
    assert group.main(["ops", "--json"], standalone_mode=False) == 2
    printed = capsys.readouterr()
    assert json.loads(printed.out) == {"error": "Invalid value for --outputs: no such thing", "exit_code": 2}
    assert printed.err == "error: Invalid value for --outputs: no such thing\n"


def test_in_a_narrow_terminal_names_fold_and_figures_stay_whole():
    t = table("", ["tensor", ("max", "right")])
    add_row(t, "fc_" * 20, "1234567.25")
    console = Console(file=io.StringIO(), width=20, force_terminal=True, color_system=None, highlight=False)
    console.print(t)
    lines = console.file.getvalue().splitlines()
    assert all(len(line) <= 20 for line in lines)
    assert any("1234567.25" in line for line in lines)  # a figure split over two lines reads as two figures
    assert "".join(line.split("│")[1].strip() for line in lines if line.startswith("│")) == "fc_" * 20


# ------------------------------------------------------------------------------------ progress


def progress_lines(width: int, description: str = "recording", done: int = 1_234_567, total: int = 25_000_000):
    """What the progress bar of record, stats and plot shows on a terminal of ``width`` columns."""
    import time

    from policyport.cli.analysis import row_progress

    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    bar = row_progress(console)
    task = bar.add_task(description, total=total)
    bar.update(task, completed=done // 2)
    time.sleep(0.05)  # a rate and an estimate to show
    bar.update(task, completed=done)
    for renderable in bar.get_renderables():
        console.print(renderable)
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [140, 100, 80, 60, 40])
def test_the_progress_bar_counts_with_separators_and_labels_its_times(width):
    lines = progress_lines(width)
    assert max(len(line) for line in lines) <= width
    figures = [r" 1,234,567/25,000,000 rows", r"[\d,]+ rows/s", r"elapsed \d:\d\d:\d\d, remaining \d:\d\d:\d\d"]
    for figure in figures:  # each whole on one line
        assert any(re.search(figure, line) for line in lines), (figure, lines)
    assert "25000000" not in "".join(lines) and re.match(r"recording [━╸╺ ]{10}", lines[0])  # a bar of 10 at least
    # one line when it holds everything; else the figures under the bar, on as many lines as they need
    assert len(lines) == 1 if width >= 140 else len(lines) >= {100: 1, 80: 2, 60: 2, 40: 3}[width]


def test_a_long_description_moves_the_figures_under_the_bar():
    lines = progress_lines(100, "recording: finishing", 25_000_000)
    assert len(lines) == 2 and re.match(r"recording: finishing ━{10}", lines[0])
    assert re.fullmatch(r"25,000,000/25,000,000 rows [\d,]+ rows/s elapsed \d:\d\d:\d\d, remaining 0:00:00 *", lines[1])
