"""Options several commands share, spelled and documented once."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

def finite_tolerance(value: Optional[float]) -> Optional[float]:
    """A tolerance option's callback: NaN would fail every comparison and infinity pass all of them (exit 2)."""
    import math

    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return None if value is None else abs(value)  # -0.0 (already refused below 0) reads as 0


def tensor_patterns(value: Optional[str]) -> Optional[str]:
    """``--tensors``' callback: a list of no pattern at all (only commas and blanks, as an unset shell
    variable leaves it) is refused (exit 2) rather than read as "nothing but the graph outputs"."""
    if value is not None and not any(p.strip() for p in value.split(",")):
        raise typer.BadParameter(f"{value!r} holds no tensor name or glob; give comma-separated names or globs, "
                                 "e.g. 'fc_1/*,logits' (the graph outputs alone: their names)")
    return value


def given_path(value: str) -> Path:
    """The parser of a path option or argument: an empty name is refused (exit 2), not read as the
    current folder ``.``."""
    if not value:
        raise typer.BadParameter("the name is empty; give a file name")
    return Path(value)


AtolOpt = Annotated[Optional[float], typer.Option("--atol", min=0.0, metavar="A", callback=finite_tolerance, help="Absolute tolerance for floating tensors  [default: by dtype: float32 1e-5, float16 1e-3, bfloat16 1e-2, float64 1e-9]")]
RtolOpt = Annotated[Optional[float], typer.Option("--rtol", min=0.0, metavar="R", callback=finite_tolerance, help="Relative tolerance, times |reference|  [default: by dtype, as --atol]")]
RoundingOpt = Annotated[bool, typer.Option("--rounding/--no-rounding", help="Also pass a floating tensor that fails the tolerance when a float64 run shows the difference is float32 rounding (see 'Verification' in the README).")]
LowOpt = Annotated[float, typer.Option("--low", metavar="L", help="Lower end of the range observations are drawn from.")]
HighOpt = Annotated[float, typer.Option("--high", metavar="H", help="Upper end of the range observations are drawn from.")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, metavar="S", help="Seed of the drawn observations.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite existing output files. An output is written whole beside its path and renamed into place, so it must be a file or folder name: a device or pipe (/dev/null, a FIFO) is refused.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
TrustOpt = Annotated[bool, typer.Option("--trust", help="Allow loading files that run code they hold: a TorchScript file, a SavedModel, a whole pickled torch module (the current folder and the file's own are on the import path while it loads), a Keras Lambda stored as bytecode. Only for files you trust.")]
InputShapeOpt = Annotated[Optional[list[str]], typer.Option("--input-shape", metavar="[NAME=]D[,D...]", help="For torch modules: the observation's shape without the batch axis, e.g. 2,3, where the first layer does not tell it; for a forward of several inputs, once per input, named after forward's parameter: --input-shape obs=8 --input-shape action_mask=4 (the graph inputs take those names).")]
InputDtypeOpt = Annotated[Optional[list[str]], typer.Option("--input-dtype", metavar="NAME=DTYPE", help="For torch modules: the dtype of forward's input NAME (bool, int64, int32, uint8, float32, float64 ...), repeatable; e.g. --input-dtype action_mask=bool  [default: the module's floating dtype]")]

#: Convert options, shared by 'convert' and the target commands (to-torch, to-keras, to-sb3).
PolicyIdOpt = Annotated[Optional[str], typer.Option("--policy-id", metavar="ID", help="Which policy of a multi-policy checkpoint  [default: default_policy]")]
KeepValueOpt = Annotated[bool, typer.Option("--keep-value", help="Also export the value function as output 'value'.")]
FilterOpt = Annotated[bool, typer.Option("--filter/--no-filter", help="Bake the source's observation filter into the graph.")]
ObsNormOpt = Annotated[Optional[Path], typer.Option("--obs-norm", metavar="FILE", parser=given_path, help="An observation-normalisation file to bake in (SB3's vecnormalize.pkl).")]
ActionBoundsOpt = Annotated[Optional[str], typer.Option("--action-bounds", metavar="LOW:HIGH", help="The environment's action bounds, for sources whose player clips and rescales the action to them (rl_games' clip_actions, skrl's clip_mean_actions, Tianshou's action_scaling) or whose file does not hold them (a CleanRL PPO policy's ClipAction, a CleanRL JAX TD3/DDPG actor's action_scale and action_bias): one number per side or one per action dimension, comma-separated, e.g. -1:1 or -1,-2:1,2  [default: the action as the policy outputs it]")]
ActionBoundMethodOpt = Annotated[Optional[str], typer.Option("--action-bound-method", metavar="NAME", help="How the policy bounds a continuous action to [-1, 1] before scaling it to --action-bounds (Tianshou's action_bound_method): clip, tanh or none; required for a continuous Tianshou policy, whose file does not record it.")]
DistributionOpt = Annotated[Optional[str], typer.Option("--distribution", metavar="NAME", help="The action distribution where the source does not record it (a TorchRL actor's distribution_class): tanh-normal (action = tanh(loc), rescaled to --action-bounds), normal (action = loc) or categorical (action = argmax of the logits)  [default: refused where a wrong guess is plausible]")]
WeightsDtypeOpt = Annotated[str, typer.Option("--weights-dtype", metavar="keep|float32", help="Half-precision (float16, bfloat16) parameters of a state_dict: keep stores each in its own dtype, so extract gives it back bit for bit (float16: a float16 model; bfloat16: each initializer cast to float32 in the graph, which computes in float32), float32 casts each to float32 (exact) for a float32 model.")]
ModelArg = Annotated[Path, typer.Argument(metavar="MODEL", parser=given_path, help="An .onnx model or a folder written by 'policyport pack'.")]


def check_range(low: float, high: float) -> None:
    """Refuse a sampling range that is empty or not finite (a usage error, exit 2)."""
    import math

    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(high - low)):
        raise typer.BadParameter(f"--low {low} and --high {high} must be finite numbers, and so must --high minus --low",
                                 param_hint="--low/--high")
    if not low < high:
        raise typer.BadParameter(f"--low {low} must be below --high {high}", param_hint="--low/--high")


OverrideOpt = Annotated[Optional[list[str]], typer.Option(
    "--override", metavar="SPEC",
    help="Set, scale or clamp neurons before the rest of the graph reads them: 'fc_2/tanh[17]=1.0', "
         "'fc_1/tanh[*]*=0.5', 'fc_2/tanh[0:8]=clip(-0.5,0.5)' (repeatable).")]
SteerOpt = Annotated[Optional[str], typer.Option("--steer", metavar="NAME", help="Apply the named override set of --overrides FILE.")]
OverridesFileOpt = Annotated[Optional[Path], typer.Option(
    "--overrides", metavar="FILE", parser=given_path, help='JSON file of named override sets: {"brake": {"fc_2/tanh": {"17": 1.0}}}.')]
#: Suffixes that name a format policyport reads or writes, and what a file of that format is.
_FORMATS = {".onnx": "an ONNX model", ".npz": "an .npz archive of arrays", ".json": "a JSON document",
            ".npy": "an .npy array", ".png": "a PNG image", ".pt": "", ".pth": "", ".zip": "", ".keras": "", ".h5": "", ".hdf5": "", ".safetensors": "",
            ".pkl": "", ".msgpack": "", ".py": "", ".csv": "", ".parquet": ""}


def check_output_format(path: Path, suffix: str, option: str = "-o") -> None:
    """Refuse an output named as a format other than the ``suffix`` one it is written in (an ONNX
    model named ``.npz`` reads back as a broken ``.npz``, an ``.npz`` named ``.npy`` loads as an
    archive, not an array); ``suffix``, a suffix no format claims, or none are the user's choice.

    Args:
        path: the output file given.
        suffix: the suffix of the format written, a key of ``_FORMATS`` with a description.
        option: the option that gave ``path``, for the message.

    Raises:
        typer.BadParameter: such a name (exit 2).
    """
    if path.suffix.lower() in _FORMATS and path.suffix.lower() != suffix:
        raise typer.BadParameter(f"{path} is named as a {path.suffix} file, but the output is {_FORMATS[suffix]}; "
                                 f"name it {suffix}", param_hint=option)


def check_onnx_output(path: Path) -> None:
    """:func:`check_output_format` for an ``-o`` written as an ONNX model."""
    check_output_format(path, ".onnx")


def thread_count(value: int) -> int:
    """--threads' callback: more than the runtime's MAX_THREADS is refused (exit 2), not clamped."""
    from ..runtime import MAX_THREADS

    if value > MAX_THREADS:
        raise typer.BadParameter(f"{value:,} is more than {MAX_THREADS:,} threads; give at most {MAX_THREADS:,} "
                                 "(0: one per core)")
    return value


ThreadsOpt = Annotated[int, typer.Option("--threads", min=0, metavar="N", callback=thread_count, help="Threads a run may use: on numpy, threads sharing the row blocks of a batch of 1,024 rows or more (the same result on any number); on onnxruntime, intra-op threads. 0: one per core; at most 1,024 (more is refused, exit 2).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


def overrides_from(specs: list[str] | None, steer: str | None, file: Path | None, session=None):
    """The overrides ``--override``, ``--steer`` and ``--overrides`` ask for (the named set first),
    or None. A malformed spec or an unknown set is a usage error (exit 2).

    ``--overrides`` is an intervention file (JSON or YAML, :mod:`policyport.runtime.interventions`);
    ``session`` (a Session or a function returning one) runs the model for the set's ``dataset``
    statistics and patches. A recording it names is read in any format ``policyport`` records."""
    from ..errors import InputMismatchError, listing
    from ..runtime.interventions import read_document, read_interventions
    from ..runtime.overrides import parse_spec

    if (steer is None) != (file is None):
        raise typer.BadParameter("--steer NAME and --overrides FILE go together: the file holds named sets, "
                                 "--steer picks one", param_hint="--steer/--overrides")
    edits = []
    if file is not None:
        sets = read_document(file)
        if steer not in sets:
            raise typer.BadParameter(f"{file} has no set {steer!r}; it has: {listing(sets, show=str)}", param_hint="--steer")
        edits = read_interventions(file, steer, session, recording_blocks=recorded_blocks)
    for spec in specs or []:
        try:
            edits.append(parse_spec(spec))
        except InputMismatchError as e:
            raise typer.BadParameter(str(e), param_hint="--override") from None
    return edits or None


def recorded_blocks(path: Path, tensor: str):
    """A recorded tensor's rows block by block, from a recording of any format (``.npz``, ``.parquet``,
    a folder of ``.npy`` or ``.parquet`` files)."""
    from ..analysis.recording import open_recording

    for block in open_recording(path).iter_batches(65536, [tensor]):
        yield block[tensor]


def given_options(ctx, *names: str) -> list[str]:
    """Of the parameters ``names`` (Python names), the options the user wrote on the command line, as
    ``--samples`` ..., so that options a command would ignore can be refused instead."""
    return [f"--{n.replace('_', '-')}" for n in names
            if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]


@contextmanager
def drawing_advice(command: str, takes_inputs: bool):
    """Turn a refusal to draw observations for an input into advice for ``command``: ``-i`` where
    the command takes observations, ``--low/--high`` for an integer input it can draw."""
    from ..errors import UndrawableInputError

    try:
        yield
    except UndrawableInputError as e:
        span = "--low/--high spanning the integers it takes (e.g. --low 0 --high 10)"
        if takes_inputs:
            remedy = "give its observations with -i OBS.npz (an .npy for a single-input model)" + (
                f", or {span}" if e.integer else "")
        elif e.integer:
            remedy = f"give {span}"
        else:
            remedy = f"'policyport {command}' draws its observations at random (it has no -i) and cannot for this input"
        raise e.advise(remedy) from None

