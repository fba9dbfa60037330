"""The command line of a packed folder's ``run.py``, with numpy and the standard library alone.

::

    python BUNDLE/run.py -i obs.npy -o actions.npz [--record activations.npz] [--tensors GLOBS] [--max-bytes SIZE] [--force]
                         [--override SPEC]... [--steer NAME --overrides FILE]
    python BUNDLE/run.py --verify [--atol A] [--rtol R] [--json]

It does what ``policyport run`` and ``policyport verify BUNDLE`` do on the numpy backend, where
policyport is not installed: ``run.py`` imports the copy of this module that the folder carries.
Exit codes are policyport's: 0 ok; 1 the golden data does not match; 2 usage error; 3 bad model or
input (a changed, refused or damaged file of the folder included); 4 missing dependency; 70 a bug
in policyport (the traceback only with ``--debug``); 130 on Ctrl-C, 143 on SIGTERM. Outputs are
written atomically, all of them or none, never into the folder itself, and an existing output is
replaced only with ``--force``; a run that ends early after its outputs are in place names them. Text from files (tensor names, paths) is shown with control
characters escaped.

This module is the folder's command-line layer, the one part of the runtime that writes to the
terminal: everything goes through :func:`emit` (stdout) and the error edge (stderr); the runtime it
calls only returns values and raises.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import traceback
from pathlib import Path

from ..verification.compare import DEFAULT_ATOL, DEFAULT_RTOL, source_lines, verdict
from ..errors import OptionError, OutputExistsError, PolicyportError
from ..io.outputs import ended_after, noting_placed, stdout_reader_may_leave, written, written_sentence
from ..text import literal

EXIT_BUG, EXIT_INTERRUPTED, EXIT_TERMINATED = 70, 130, 143


def emit(text: str) -> None:
    """One line of the command's output on stdout (tables, reports, ``--json`` documents)."""
    sys.stdout.write(text + "\n")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that outputs in progress are removed as on Ctrl-C."""


def parser(prog: str = "run.py") -> argparse.ArgumentParser:
    """The argument parser of ``run.py``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the policy packed in this folder on the numpy backend, or re-check it against the "
                    "golden data it carries. Needs Python and numpy only.",
        epilog="exit codes: 0 ok; 1 the golden data does not match; 2 usage error; 3 bad model or input "
               "(including a changed or damaged file of the folder); 4 missing dependency; 70 a bug in policyport",
    )
    p.add_argument("-i", "--input", type=Path, help=".npy (single-input model) or .npz keyed by input name")
    p.add_argument("-o", "--output", type=Path, help="the .npz of graph outputs to write")
    p.add_argument("--record", type=Path, help="also write every recorded activation to this .npz")
    p.add_argument("--tensors", help="with --record: comma-separated globs over tensor names (default: all)")
    p.add_argument("--override", action="append", metavar="SPEC",
                   help="set, scale or clamp neurons: TENSOR[INDEX]=VALUE, TENSOR[INDEX]*=FACTOR, "
                        "TENSOR[INDEX]=clip(LO,HI); repeatable")
    p.add_argument("--steer", metavar="NAME", help="apply the named set of --overrides FILE")
    p.add_argument("--overrides", type=Path, metavar="FILE",
                   help="intervention file (JSON; YAML with PyYAML) of named sets: overrides, directions, "
                        "ablations, patches")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    p.add_argument("--verify", action="store_true",
                   help="re-run the golden observations and compare every tensor; exit 1 on a mismatch")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help="with --verify: absolute tolerance")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="with --verify: relative tolerance")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="the most the arrays of the input file may take, and one tensor the model sizes from a value "
                        "in it: 4G, 512M, 1.5GiB or a number of bytes (default 1 GiB, or POLICYPORT_MAX_ARRAY_BYTES)")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout and nothing else")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error (exit 70)")
    return p


def main(folder: str | os.PathLike, argv: list[str] | None = None, prog: str = "run.py") -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run or verify the bundle in ``folder``, print the
    result, and return the exit code. Usage errors exit 2 through ``SystemExit``, as argparse does.
    Output the reader stops taking (``python run.py --verify | head -1``) is not an error: the exit
    code is the command's own."""
    with stdout_reader_may_leave(), noting_placed() as placed:
        return _main(folder, argv, prog, placed)


def _main(folder: str | os.PathLike, argv: list[str] | None, prog: str, placed: list[Path]) -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    _check_usage(p, args)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from ..io.limits import using_limits

        with using_limits(**({} if args.max_bytes is None else {"array_bytes": args.max_bytes})):
            if args.verify:
                return _verify(Path(folder), args)
            _run(Path(folder), args)
        return 0
    except PolicyportError as e:
        return _fail(_foreign_options(str(e), p), e.exit_code, args.json)
    except KeyboardInterrupt as e:
        code = EXIT_TERMINATED if isinstance(e, _Terminated) else EXIT_INTERRUPTED
        return _fail(ended_after("terminated" if code == EXIT_TERMINATED else "interrupted", placed), code, args.json)
    except MemoryError:
        return _fail(f"not enough memory to finish; {written(placed)} — use a smaller input", 3, args.json)
    except Exception as e:  # noqa: BLE001 - the edge: anything else is a bug in policyport
        if args.debug:
            for line in "".join(traceback.format_exception(e)).splitlines():
                sys.stderr.write(literal(line) + "\n")
        hint = "" if args.debug else " Re-run with --debug for the traceback, and please report it."
        return _fail(f"this is a bug in policyport: {type(e).__name__}: {e}. {written_sentence(placed)}{hint}", EXIT_BUG,
                     args.json)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum, frame) -> None:
    raise _Terminated()


def _check_usage(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [flag for flag, value in (("-i", args.input), ("-o", args.output), ("--record", args.record),
                                      ("--tensors", args.tensors), ("--override", args.override),
                                      ("--steer", args.steer), ("--overrides", args.overrides)) if value is not None]
    if args.verify and given:
        p.error(f"--verify re-runs the folder's own golden observations, so {', '.join(given)} "
                f"{'does' if len(given) == 1 else 'do'} not apply")
    if not args.verify and (args.input is None or args.output is None):
        p.error("give -i INPUT and -o OUTPUT to run the policy, or --verify to re-check it")
    if args.tensors is not None and args.record is None:
        p.error("--tensors selects what --record writes; give --record too")
    if (args.steer is None) != (args.overrides is None):
        p.error("--steer NAME and --overrides FILE go together: the file holds named sets, --steer picks one")
    for name in ("atol", "rtol"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            p.error(f"--{name} must be a finite number >= 0, not {value}")
    if args.max_bytes is not None:
        from ..io.limits import parse_size

        try:
            args.max_bytes = parse_size(args.max_bytes)
        except ValueError as e:
            p.error(f"--max-bytes: {e}")


def _foreign_options(message: str, p: argparse.ArgumentParser) -> str:
    """``message`` with a note on the options it names that ``run.py`` lacks: messages of the
    runtime it shares with policyport name the ``policyport`` command's options
    (``run it with --backend onnxruntime``)."""
    own = {o for action in p._actions for o in action.option_strings}
    foreign = [o for o in dict.fromkeys(re.findall(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*", message))
               if o not in own]
    if not foreign:
        return message
    return (f"{message} ({', '.join(foreign)} {'is an option' if len(foreign) == 1 else 'are options'} of the "
            f"policyport command, not of {p.prog})")


def _fail(message: str, code: int, as_json: bool) -> int:
    if as_json:
        emit(json.dumps({"error": message, "exit_code": code}))
    sys.stderr.write(f"error: {literal(message)}\n")
    return code


def _check_outputs(folder: Path, args: argparse.Namespace) -> list[Path]:
    from ..io.outputs import check_distinct, check_writable

    outputs = [args.output] + ([args.record] if args.record is not None else [])
    if len(outputs) == 2 and outputs[0].resolve() == outputs[1].resolve():
        raise OptionError(f"--record {literal(args.record)} is also the -o file; give --record another file")
    inside = folder.resolve()
    for path in outputs:
        if inside in path.resolve().parents:
            raise OutputExistsError(f"{path} is inside the packed folder {folder}; write outputs elsewhere "
                                    "(the folder holds only the files its policy.json lists)")
        check_writable(path, args.force)
        check_distinct(path, args.input)
    return outputs


def _run(folder: Path, args: argparse.Namespace) -> None:
    from ..io.arrays import load_arrays, npz_writer
    from ..io.outputs import write_outputs
    from ..runtime import load
    from ..runtime.base import feeds_from_arrays, nonfinite_rows

    outputs = _check_outputs(folder, args)
    session = load(folder, backend="numpy")
    feeds = feeds_from_arrays(load_arrays(args.input), [v.name for v in session.inputs], args.input)
    for name, array in feeds.items():  # as policyport run warns: a status line, on stderr
        bad = nonfinite_rows(array)
        if bad:
            sys.stderr.write(literal(f"warning: {bad:,} of {len(array):,} rows of input {name!r} hold NaN or Inf; "
                                     "the outputs of those rows are likely NaN too") + "\n")
    edits = _interventions(session, args)
    if args.record is not None:
        values = session.record(feeds, args.tensors or "*", overrides=edits)
        results = {v.name: values[v.name] for v in session.outputs}
    else:
        values = results = session.run(feeds, overrides=edits)
    writers = {args.output: npz_writer(results)}
    if args.record is not None:
        writers[args.record] = npz_writer(values)
    write_outputs(writers, args.force)  # both files, or neither (a file replaced with --force is restored)
    rows = [(name, v.dtype.name, str(tuple(v.shape)), *((f"{v.min():.4g}", f"{v.max():.4g}") if v.size else ("", "")))
            for name, v in values.items()]
    if args.json:
        emit(json.dumps({"output": str(outputs[0]), "record": None if args.record is None else str(outputs[1]),
                          "overrides": [e.spec for e in edits or ()],
                          "tensors": [dict(zip(("name", "dtype", "shape", "min", "max"), r)) for r in rows]}, indent=1))
        return
    recorded = f", {len(values)} tensors to {args.record}" if args.record is not None else ""
    emit(literal(f"numpy: outputs written to {args.output}{recorded}"))
    _table(("tensor", "dtype", "shape", "min", "max"), rows, right=(3, 4))
    if edits:
        emit(literal("with overrides: " + "; ".join(e.spec for e in edits)))


def _interventions(session, args: argparse.Namespace) -> list | None:
    """The edits of ``--steer NAME --overrides FILE`` (the set first) and ``--override``, or None."""
    from ..runtime.overrides import parse_spec

    edits = []
    if args.overrides is not None:
        from ..runtime.interventions import read_interventions

        edits = read_interventions(args.overrides, args.steer, session)
    edits += [parse_spec(spec) for spec in args.override or ()]
    return edits or None


def _verify(folder: Path, args: argparse.Namespace) -> int:
    from .golden import verify_bundle

    report = verify_bundle(folder, atol=args.atol, rtol=args.rtol)
    if args.json:
        emit(json.dumps(report.to_dict(), indent=1))
        return 0 if report.passed else 1
    emit(f"max abs error on {report.samples:,} observation{'' if report.samples == 1 else 's'} (atol {report.atol:g}, rtol {report.rtol:g})")
    _table(("tensor", "shape", "numpy vs golden"),
           [(c.tensor, str(tuple(c.shape)), (c.detail or f"{c.max_abs:.2g}") + ("" if c.passed else " FAIL"))
            for c in report.comparisons], right=(2,))
    for line in source_lines(report.source_oracle, report.assumptions):  # what the model rests on, as verify says
        emit(literal(line))
    emit(literal(verdict(report)))
    return 0 if report.passed else 1


def _table(header: tuple[str, ...], rows: list[tuple], right: tuple[int, ...] = ()) -> None:
    """A plain-text table on stdout, every cell shown literally."""
    cells = [header, *[tuple(literal(c) for c in row) for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        emit("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
