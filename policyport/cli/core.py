"""The Typer application and its one error edge.

Every way a command can end is decided here: 0 ok; 1 verification found a mismatch; 2 usage error
(Click's, and option values policyport refuses); 3 bad model or input (:class:`PolicyportError`,
a run out of memory, and an OS error about the user's paths or machine: a name too long, a
permission, a full disk); 4 missing optional dependency; 70 an unexpected exception, which is a bug
in policyport (the traceback is printed only with ``--debug`` or ``POLICYPORT_DEBUG=1``); 130 on
Ctrl-C and 143 on SIGTERM, after every output in progress has been removed. A message of a command
that ends early says "nothing was written", or names the outputs already in place, which are
complete (``terminated after writing out.npz, which is complete``). Output the reader stops
taking (``policyport inspect m.onnx | head -1``) is not an error: the command ends with its own code. With ``--json`` stdout
holds exactly one JSON document, failures included: ``{"error": ..., "exit_code": ...}``.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import signal
import sys
from typing import Annotated, Callable, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from ..errors import PolicyportError, UnsupportedOpError
from ..io.outputs import ended_after, noting_placed, stdout_reader_may_leave, written, written_sentence
from ..io.limits import using_limits
from . import render
from .render import literal, say_error

from typer import Abort, Exit

try:  # newer typer vendors Click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - typer on plain Click
    from click.exceptions import ClickException, NoArgsIsHelpError


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, so that outputs in progress are cleaned up as on Ctrl-C."""


class _State:
    debug = bool(os.environ.get("POLICYPORT_DEBUG"))


state = _State()

EXIT_BUG = 70
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def _json_requested(args: list[str]) -> bool:
    return "--json" in (args[: args.index("--")] if "--" in args else args)


MAX_BYTES_HELP = ("The most the arrays of one file may take once read (an .npy, an .npz's members together, "
                  "a model's external data), and one tensor the numpy backend sizes from a value in the model: "
                  "4G, 512M, 1.5GiB ...; also POLICYPORT_MAX_ARRAY_BYTES. Given anywhere on the command line. "
                  "[default: 1G]")


def _take_max_bytes(argv: list[str]) -> str | None:
    """Remove ``--max-bytes SIZE`` / ``--max-bytes=SIZE`` (anywhere before ``--``) from ``argv``; its value."""
    end = argv.index("--") if "--" in argv else len(argv)
    for i, arg in enumerate(argv[:end]):
        if arg == "--max-bytes":
            value = argv[i + 1] if i + 1 < end else ""
            del argv[i:i + 2]
            return value
        if arg.startswith("--max-bytes="):
            del argv[i]
            return arg.split("=", 1)[1]
    return None


def _limits_from(max_bytes: str | None) -> dict:
    """The limits ``--max-bytes`` sets; the environment's checked too.

    Raises:
        click BadParameter: not a size (a usage error, exit 2).
    """
    from ..errors import InputMismatchError
    from ..io.limits import limits, parse_size

    try:
        limits()
    except InputMismatchError as e:
        raise typer.BadParameter(str(e), param_hint="environment") from None
    if max_bytes is None:
        return {}
    try:
        return {"array_bytes": parse_size(max_bytes)}
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--max-bytes") from None


#: The order ``policyport -h`` lists the commands in: the workflow, from a source to a hand-off.
WORKFLOW = ("convert", "inspect", "verify", "run", "record", "stats", "plot", "patch", "direction", "importance",
            "probe", "extract", "expose", "pack", "export-numpy", "to-torch", "to-keras", "to-sb3", "ops")


class PolicyportGroup(TyperGroup):
    """The command group; its ``main`` is the edge for errors raised outside a command's body
    (usage errors, Ctrl-C while parsing), so ``--json`` holds for those too."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)  # pragma: no mutate (TyperGroup lists its commands in order made, never reading ctx)
        return sorted(names, key=lambda n: (WORKFLOW.index(n) if n in WORKFLOW else len(WORKFLOW), n))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        prog_name = "policyport"  # also under python -m policyport, and in shell completion's variable
        argv = list(sys.argv[1:] if args is None else args)
        state.debug = bool(os.environ.get("POLICYPORT_DEBUG"))  # each invocation decides for itself
        if "--debug" in argv[: argv.index("--") if "--" in argv else len(argv)]:
            state.debug = True
            argv.remove("--debug")
        as_json = _json_requested(argv)
        with stdout_reader_may_leave():
            try:
                max_bytes = _take_max_bytes(argv)
                with using_limits(**_limits_from(max_bytes)):
                    code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            except ClickException as e:
                code = e.exit_code
                if as_json:
                    print(json.dumps({"error": e.format_message(), "exit_code": code}))
                _show_usage_error(e)
            except (Abort, KeyboardInterrupt) as e:
                code = EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
                render.err.print("terminated" if code == EXIT_TERMINATED else "interrupted")
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _show_usage_error(e: ClickException) -> None:
    """Click's usage message, printed as plain text (never as markup)."""
    if isinstance(e, NoArgsIsHelpError):  # 'policyport' alone: the help, line by line, exit 2 as Click has it
        for line in e.format_message().splitlines():
            render.err.print(literal(line))  # each line whole (wrapped at words on a narrow terminal)
        return
    ctx = getattr(e, "ctx", None)  # pragma: no mutate (every Click usage error carries ctx, if None)
    if ctx is not None:
        render.err.print(literal(ctx.get_usage()))
        render.err.print(literal(f"Try '{ctx.command_path} -h' for help."))
    render.err.print(f"error: {literal(e.format_message())}")


class PolicyportCommand(TyperCommand):
    """A command whose help reads as Click's always has, whatever Typer's own style: the usage line
    ``policyport run [OPTIONS] MODEL`` (an optional argument ``[NAME]``), an option's value by its
    metavar (``-i, --input OBS``; its upper-cased name when it has none), flags bare, arguments by
    their metavar. Only Click's public parameter attributes are read."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []  # pragma: no mutate (every command has [OPTIONS])
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = _value_name(param) + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                sections["Arguments"].append((_value_name(param), record[1]))
            else:
                value = "" if param.is_flag or param.count else f" {_value_name(param)}"
                names = [", ".join(sorted(opts, key=_prefix_length)) for opts in (param.opts, param.secondary_opts)]
                sections["Options"].append((" / ".join(n + value for n in names if n), record[1]))
        for title, rows in sections.items():
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _prefix_length(opt: str) -> int:
    """``1`` for ``-h``, ``2`` for ``--help``: short names are listed first, as Click does."""
    return len(opt) - len(opt.lstrip("-/"))


def _value_name(param) -> str:
    """What a parameter's value is called in help: its metavar, else its name upper-cased."""
    return param.metavar or param.name.upper()


class PolicyportTyper(typer.Typer):
    """The application; every command it registers renders its help with :class:`PolicyportCommand`."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or PolicyportCommand, **kwargs)


app = PolicyportTyper(
    cls=PolicyportGroup,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Carry trained policy networks across frameworks: convert to ONNX, extract weights, run on "
    "numpy or onnxruntime with every activation recorded, and verify parity tensor by tensor.",
)


def _version(value: bool) -> None:
    if value:
        from ..version import __version__

        print(f"policyport {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Print the traceback of an unexpected error (exit 70).")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    max_bytes: Annotated[Optional[str], typer.Option("--max-bytes", metavar="SIZE", help=MAX_BYTES_HELP)] = None,
) -> None:
    """Carry trained policy networks across frameworks."""
    state.debug = state.debug or debug


def fail(e: PolicyportError, as_json: bool, command: str, source_given: bool) -> None:
    """Report a deliberate error and exit with its code; a missing op's remedy names ``command``'s
    options, and an option the library's message names that this command lacks is said to belong to
    the commands that have it (:func:`foreign_options`)."""
    message = str(e)
    if isinstance(e, UnsupportedOpError):
        message = e.message_for(command, source_given=source_given)
    message = foreign_options(message)
    if as_json:
        print(json.dumps({"error": message, "exit_code": e.exit_code}))
    say_error(message)
    raise typer.Exit(e.exit_code)


#: A long option named in a message (``--trust``, ``--backend``), not part of a longer word.
OPTION_MENTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: A command line a message suggests (``policyport convert x.bin --from sb3 -o x.onnx``): the command's
#: name, then its words up to a quote, a parenthesis or the end of the clause.
COMMAND_LINE = re.compile(r"policyport ([a-z][a-z-]*)((?: +[^\s'\"();,]+)*)")


def long_options(command) -> set[str]:
    """The ``--name`` options (and ``--no-name`` secondaries) of a Click command."""
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def foreign_options(message: str) -> str:
    """``message`` with a note on every option it names that the running command lacks.

    Library code is reached from several commands (the converters from ``convert``, ``inspect``,
    ``verify --source`` and ``pack --source``) and names the option of the one that has it, with the
    Python keyword (``pass --trust (trust=True)``); under another command the note says whose option
    it is: ``(--trust is an option of policyport convert and policyport verify, not of policyport pack)``.
    Options of no command (a path that looks like one) are left alone.
    """
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - typer on plain Click
        from click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None or ctx.parent is None or not OPTION_MENTION.search(message):
        return message
    commands = dict(_every_command())
    # the options of a command line the message spells out are that command's, said where they stand
    outside = COMMAND_LINE.sub(lambda m: "" if set(OPTION_MENTION.findall(m[2])) <= commands.get(m[1], set()) else m[0],
                               message)
    mentioned = list(dict.fromkeys(OPTION_MENTION.findall(outside)))
    if not mentioned:
        return message
    own = long_options(ctx.command) | long_options(ctx.parent.command)
    foreign = [o for o in mentioned if o not in own]
    if not foreign:
        return message
    notes = []
    for option in foreign:
        owners = [f"policyport {name}" for name, options in commands.items() if option in options]
        if owners:
            notes.append(f"{option} is an option of {' and '.join(owners)}")
    if not notes:
        return message
    return f"{message} ({'; '.join(notes)}, not of policyport {ctx.info_name})"


#: Imports the module of every command, each of which registers its commands on :data:`app` as it is
#: imported; set by :mod:`policyport.cli`, which lists them (this module is below them all).
register_every_command: Callable[[], object] | None = None


@functools.lru_cache(maxsize=1)
def _every_command() -> tuple[tuple[str, frozenset[str]], ...]:
    """(name, long options) of every command, sorted by name (each command's module imported)."""
    from typer.main import get_command

    if register_every_command is not None:
        register_every_command()
    return tuple((name, frozenset(long_options(cmd))) for name, cmd in sorted(get_command(app).commands.items()))


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def guard(as_json: bool, body: Callable[[], int | None], command: str = "", source=None) -> None:
    """Run a command's ``body`` behind the error edge (see the module docstring).

    ``body`` returns the exit code (``None`` for 0). Click's own exceptions (usage errors raised by
    the body, ``typer.Exit``) pass through to :class:`PolicyportGroup`. ``command`` and ``source``
    (the command's ``--source``, if any) let an error suggest a remedy in the command's own options.
    """
    with noting_placed() as placed:
        code = _guarded(as_json, body, command, source, placed)
    if code:
        raise typer.Exit(code)


def _guarded(as_json: bool, body: Callable[[], int | None], command: str, source, placed: list) -> int | None:
    """:func:`guard`'s edge around ``body``; ``placed``: the outputs in place so far, for messages."""
    previous = None
    if _in_main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return body()
    except PolicyportError as e:
        fail(e, as_json, command, source is not None)
    except (ClickException, Exit, Abort):
        raise
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        message = ended_after("terminated" if terminated else "interrupted", placed)
        if as_json:
            print(json.dumps({"error": message, "exit_code": code}))
        render.err.print(literal(message))
        raise typer.Exit(code) from None
    except OSError as e:
        if e.errno not in USER_OS_ERRORS:
            return _bug(e, as_json, placed)
        where = f" {literal(e.filename)}" if e.filename is not None else ""
        message = f"cannot use{where}: {e.strerror or e}; {written(placed)}"
        if as_json:
            print(json.dumps({"error": message, "exit_code": 3}))
        say_error(message)
        raise typer.Exit(3) from None
    except MemoryError as e:
        detail = f" ({literal(str(e))})" if str(e) else ""
        message = (f"not enough memory to finish{detail}; {written(placed)} — use fewer samples, a smaller "
                   "input, or a machine with more memory")
        if as_json:
            print(json.dumps({"error": message, "exit_code": 3}))
        say_error(message)
        raise typer.Exit(3) from None
    except Exception as e:  # noqa: BLE001 - the edge: anything else is a bug in policyport
        _bug(e, as_json, placed)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


#: OS errors that say something about the user's paths or machine, not about policyport: a name too
#: long or looping through links, a permission, a full or read-only disk, an I/O error (exit 3).
USER_OS_ERRORS = frozenset(getattr(errno, n) for n in (
    "ENAMETOOLONG", "ELOOP", "EACCES", "EPERM", "ENOSPC", "EDQUOT", "EROFS", "EIO", "ENOTDIR", "EISDIR",
    "ENXIO", "ENODEV", "ETXTBSY", "EFBIG", "EMFILE", "ENFILE", "ESTALE") if hasattr(errno, n))


def _bug(e: BaseException, as_json: bool, placed: list | None = None) -> None:
    """Report an unexpected exception as a bug in policyport (exit 70); the traceback with --debug.
    ``placed``: the outputs already in place (:func:`policyport.io.outputs.noting_placed`)."""
    message = (f"this is a bug in policyport: {type(e).__name__}: {e}. {written_sentence(placed or [])}"
               + ("" if state.debug else " Re-run with --debug for the traceback, and please report it."))
    if as_json:
        print(json.dumps({"error": message, "exit_code": EXIT_BUG}))
    if state.debug:
        import traceback

        for line in "".join(traceback.format_exception(e)).splitlines():
            render.err.print(literal(line))
    say_error(message)
    raise typer.Exit(EXIT_BUG) from None


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def emit_json(doc) -> None:
    """Print ``doc`` as the one JSON document of stdout (non-ASCII and control characters escaped)."""
    print(json.dumps(doc, indent=1))


def main() -> None:
    """Console-script entry point."""
    app()
