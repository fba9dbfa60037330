"""Hand-off commands: ``export-numpy`` (one generated numpy module) and the targets ``to-torch``,
``to-keras`` and ``to-sb3`` (the policy in another framework, trainable); each checks what it writes
before writing it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..verification.compare import source_lines
from .core import app, emit_json, guard
from .options import (
    ActionBoundMethodOpt,
    ActionBoundsOpt,
    DistributionOpt,
    FilterOpt,
    ForceOpt,
    HighOpt,
    InputDtypeOpt,
    InputShapeOpt,
    JsonOpt,
    KeepValueOpt,
    LowOpt,
    ModelArg,
    ObsNormOpt,
    PolicyIdOpt,
    SeedOpt,
    TrustOpt,
    WeightsDtypeOpt,
    check_range,
    drawing_advice,
    given_path,
)
from .render import counted, literal, out, say


@app.command("export-numpy")
def export_numpy(
    model: ModelArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="MODULE.py", help="The module to write (.py); its weights go beside it as .npz.")],
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Observations the module is checked on before it is written.")] = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the policy as one readable numpy module (forward with record and overrides) plus its weights,
    after checking it reproduces the numpy backend bit for bit."""

    def body():
        from ..handoff.export_numpy import export_numpy as run_export

        check_range(low, high)
        if not output.name.endswith(".py") or output.name == ".py":
            raise typer.BadParameter(f"{literal(output)}: the module's file name must end in .py after a name, e.g. "
                                     "policy.py (its weights go beside it as policy.npz)", param_hint="-o/--output")
        with drawing_advice("export-numpy", takes_inputs=False):
            done = run_export(model, output, samples=samples, low=low, high=high, seed=seed, force=force)
        if as_json:
            emit_json({"module": str(done.module), "weights": str(done.weights), "lines": done.lines,
                       "tensors": done.tensors, "samples": done.samples, "assumptions": done.assumptions})
            return
        say(f"wrote {done.module} and {done.weights}")
        if not output.stem.isidentifier():
            say(f"note: {output.stem!r} is not a Python identifier, so 'import {output.stem}' cannot load it; load it "
                "by path (importlib.util.spec_from_file_location) or rename both files")
        out.print(literal(f"{done.module}: {done.lines} lines, numpy only; forward() reproduces the numpy backend "
                          f"bit for bit on {counted(done.samples, 'observation')}, "
                          + ("the one tensor" if done.tensors == 1 else f"all {done.tensors} tensors")))
        for line in source_lines(None, done.assumptions or []):  # as verify prints them; the module's ASSUMPTIONS
            out.print(literal(line))

    guard(as_json, body)


#: Convert options a target command takes for a source that is not ONNX yet (see 'convert').
FromOpt = Annotated[Optional[str], typer.Option("--from", metavar="KIND", help="Source kind, as for 'convert'  [default: detected; an .onnx file is used as it is]")]
ActivationOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="Hidden activation where the source does not record it (an .npz, a state_dict), as for 'convert'.")]
HeadOpt = Annotated[Optional[str], typer.Option(metavar="NAME", help="Action head, as for 'convert': none, diag-gaussian, diag-gaussian:halves or categorical  [default: the source's own]")]

#: The source of a target command, and the observations the target is checked on before it is written.
SourceArg = Annotated[Path, typer.Argument(metavar="SRC", parser=given_path, help="The policy: an .onnx model or any source 'convert' reads.")]
CheckSamplesOpt = Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Observations the target is checked on before it is written.")]


def _convert_options(given: dict) -> dict:
    """The convert options a target command was given (its ``ctx.params``), checked and parsed as 'convert'
    checks and parses them (exit 2); those left at their defaults are left out, so that the source kind's
    own defaults and its refusal of options it does not read apply as they do for 'convert'."""
    from .convert import check_convert_options, parse_bounds, parse_dtypes, parse_shapes

    check_convert_options(None, given["activation"], given["head"], 17, "torchscript")
    options = {"activation": given["activation"], "head": given["head"], "trust": given["trust"] or None,
               "policy_id": given["policy_id"], "keep_value": given["keep_value"] or None,
               "obs_filter": None if given["obs_filter"] else False,
               "obs_norm": None if given["obs_norm"] is None else str(given["obs_norm"]),
               "input_shape": parse_shapes(given["input_shape"]), "input_dtypes": parse_dtypes(given["input_dtype"]),
               "action_bounds": parse_bounds(given["action_bounds"]),
               "action_bound_method": given["action_bound_method"], "distribution": given["distribution"],
               "weights_dtype": None if given["weights_dtype"] == "keep" else given["weights_dtype"]}
    return {k: v for k, v in options.items() if v is not None}


def _print_assumptions(assumptions) -> None:
    for line in source_lines(None, assumptions or []):
        out.print(literal(line))


@app.command("to-torch")
def to_torch(
    ctx: typer.Context,
    src: SourceArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="DIR", help="The folder to write: policy.py, policy.pt, policy.safetensors, parameters.json.")],
    kind: FromOpt = None,
    activation: ActivationOpt = None,
    head: HeadOpt = None,
    trust: TrustOpt = False,
    policy_id: PolicyIdOpt = None,
    keep_value: KeepValueOpt = False,
    obs_filter: FilterOpt = True,
    obs_norm: ObsNormOpt = None,
    input_shape: InputShapeOpt = None,
    input_dtype: InputDtypeOpt = None,
    action_bounds: ActionBoundsOpt = None,
    action_bound_method: ActionBoundMethodOpt = None,
    distribution: DistributionOpt = None,
    weights_dtype: WeightsDtypeOpt = "keep",
    samples: CheckSamplesOpt = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the policy as a trainable PyTorch module (one nn.Linear per source layer, nested as the source nests
    it, so that the state_dict keys are the source's parameter names where torch allows them) and its weights,
    after checking that torch's forward matches the numpy backend on every tensor."""

    def body():
        from ..handoff.targets.to_torch import to_torch as run_to_torch
        from ..io.outputs import check_distinct

        check_range(low, high)
        options = _convert_options(ctx.params)
        check_distinct(output, src)
        with drawing_advice("to-torch", takes_inputs=False):
            done = run_to_torch(str(src), output, kind=kind, samples=samples, low=low, high=high, seed=seed,
                                force=force, **options)
        if as_json:
            emit_json({"folder": str(done.folder), "layers": done.layers, "parameters": done.parameters,
                       "buffers": done.buffers, "samples": done.samples, "tensors": done.tensors,
                       "max_abs": done.max_abs, "assumptions": done.assumptions, "notes": done.notes,
                       "renamed": done.renamed})
            return
        for note in done.notes or []:
            say(note)
        say(f"wrote {done.folder}")
        out.print(literal(f"{done.folder}/policy.py: {counted(len(done.layers), 'nn.Linear layer')}, "
                          f"{counted(len(done.parameters), 'trained tensor')}, {counted(len(done.buffers), 'buffer')}; "
                          f"torch matches the numpy backend on {counted(done.samples, 'observation')}, "
                          f"{counted(done.tensors, 'tensor')} (max abs {done.max_abs:.3g})"))
        out.print(literal(_torch_keys(done.renamed)))
        _print_assumptions(done.assumptions)

    guard(as_json, body, "to-torch")


def _torch_keys(renamed: dict[str, str]) -> str:
    """The line that says whether the ``state_dict`` keys are the source's parameter names."""
    if not renamed:
        return "state_dict keys: the source's parameter names"
    shown = ", ".join(f"{key} for {source}" for key, source in list(renamed.items())[:3])
    more = f" and {len(renamed) - 3} more" if len(renamed) > 3 else ""
    return ("state_dict keys: the source's parameter names, but where torch cannot take one as a key (mapped in "
            f"parameters.json): {shown}{more}")


@app.command("to-keras")
def to_keras(
    ctx: typer.Context,
    src: SourceArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="FILE.keras", help="The Keras model to write; the source names of its weights go beside it as FILE_parameters.json.")],
    kind: FromOpt = None,
    activation: ActivationOpt = None,
    head: HeadOpt = None,
    trust: TrustOpt = False,
    policy_id: PolicyIdOpt = None,
    keep_value: KeepValueOpt = False,
    obs_filter: FilterOpt = True,
    obs_norm: ObsNormOpt = None,
    input_shape: InputShapeOpt = None,
    input_dtype: InputDtypeOpt = None,
    action_bounds: ActionBoundsOpt = None,
    action_bound_method: ActionBoundMethodOpt = None,
    distribution: DistributionOpt = None,
    weights_dtype: WeightsDtypeOpt = "keep",
    samples: CheckSamplesOpt = 64,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the policy as a trainable Keras 3 functional model (one Dense layer per source layer, named after it),
    after loading it back in safe mode and checking Keras' outputs against the numpy backend."""

    def body():
        from ..handoff.targets.to_keras import to_keras as run_to_keras
        from ..io.outputs import check_distinct

        check_range(low, high)
        if output.suffix != ".keras":
            raise typer.BadParameter(f"{literal(output)}: the Keras model's file name must end in .keras",
                                     param_hint="-o/--output")
        options = _convert_options(ctx.params)
        check_distinct(output, src)
        with drawing_advice("to-keras", takes_inputs=False):
            done = run_to_keras(str(src), output, kind=kind, samples=samples, low=low, high=high, seed=seed,
                                force=force, **options)
        if as_json:
            emit_json({"model": str(done.model), "parameters_file": str(done.names), "layers": done.layers,
                       "trainable": done.trainable, "non_trainable": done.non_trainable, "samples": done.samples,
                       "tensors": done.tensors, "max_abs": done.max_abs, "assumptions": done.assumptions,
                       "notes": done.notes, "constants": done.constants})
            return
        for note in done.notes or []:
            say(note)
        say(f"wrote {done.model} and {done.names}")
        out.print(literal(f"{done.model}: {counted(len(done.layers), 'Dense layer')}, "
                          f"{counted(len(done.trainable), 'trainable weight')}, "
                          f"{counted(len(done.non_trainable), 'non-trainable weight')}; Keras (loaded in safe mode) "
                          f"matches the numpy backend on {counted(done.samples, 'observation')}, "
                          f"{counted(done.tensors, 'tensor')} (max abs {done.max_abs:.3g})"))
        _print_assumptions(done.assumptions)

    guard(as_json, body, "to-keras")


def _space(text: str | None, flag: str) -> tuple[float, float] | None:
    """``"-1:1"`` -> ``(-1.0, 1.0)``; a usage error (exit 2) unless LOW:HIGH of numbers, LOW < HIGH."""
    if text is None:
        return None
    try:
        low, high = (float(v) for v in text.split(":"))
    except ValueError:
        raise typer.BadParameter(f"{text!r}; give LOW:HIGH, e.g. -1:1", param_hint=flag) from None
    if not low < high:
        raise typer.BadParameter(f"{text!r}: LOW must be below HIGH", param_hint=flag)
    return low, high


@app.command("to-sb3")
def to_sb3(
    ctx: typer.Context,
    src: SourceArg,
    output: Annotated[Path, typer.Option("-o", "--output", parser=given_path, metavar="FILE.zip", help="The SB3 model to write; a normaliser goes beside it as FILE_vecnormalize.pkl.")],
    algo: Annotated[str, typer.Option("--algo", metavar="NAME", help="ppo or a2c (a diagonal-Gaussian, categorical or MultiDiscrete policy), sac, td3 or ddpg (tanh of the last layer rescaled to the action bounds), dqn (Q-values).")],
    kind: FromOpt = None,
    activation: ActivationOpt = None,
    head: HeadOpt = None,
    trust: TrustOpt = False,
    policy_id: PolicyIdOpt = None,
    keep_value: KeepValueOpt = False,
    obs_filter: FilterOpt = True,
    obs_norm: ObsNormOpt = None,
    input_shape: InputShapeOpt = None,
    input_dtype: InputDtypeOpt = None,
    action_bounds: ActionBoundsOpt = None,
    action_bound_method: ActionBoundMethodOpt = None,
    distribution: DistributionOpt = None,
    weights_dtype: WeightsDtypeOpt = "keep",
    obs_space: Annotated[Optional[str], typer.Option("--obs-space", metavar="LOW:HIGH", help="Bounds of the observation space's Box  [default: an SB3 zip's own, else -inf:inf]")] = None,
    action_space: Annotated[Optional[str], typer.Option("--action-space", metavar="LOW:HIGH", help="Bounds of a continuous action space's Box; SB3's predict clips to them  [default: the bounds the model clips or rescales its tanh output to; required where it does not bound its action]")] = None,
    log_std: Annotated[Optional[float], typer.Option("--log-std", metavar="V", help="SB3's log_std for a source whose log_std is computed from the observation (RLlib's [mean, log_std] layer); for sac, the bias of actor.log_std (weight 0).")] = None,
    samples: Annotated[int, typer.Option("--samples", min=1, metavar="N", help="Observations SB3's model is checked on before it is written.")] = 1000,
    low: LowOpt = 0.0,
    high: HighOpt = 1.0,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the policy as a Stable-Baselines3 zip (and VecNormalize file) that SB3 loads and trains on, after
    checking SB3's network and predict() against the numpy backend."""

    def body():
        from ..handoff.targets.to_sb3 import ALGOS
        from ..handoff.targets.to_sb3 import to_sb3 as run_to_sb3
        from ..io.outputs import check_distinct

        check_range(low, high)
        if algo not in ALGOS:
            raise typer.BadParameter(f"{algo!r}; choose one of {', '.join(ALGOS)}", param_hint="--algo")
        if output.suffix != ".zip":
            raise typer.BadParameter(f"{literal(output)}: the SB3 model's file name must end in .zip", param_hint="-o/--output")
        options = _convert_options(ctx.params)
        check_distinct(output, src)
        with drawing_advice("to-sb3", takes_inputs=False):
            done = run_to_sb3(str(src), output, algo=algo, kind=kind, obs_space=_space(obs_space, "--obs-space"),
                              action_space=_space(action_space, "--action-space"), log_std=log_std, samples=samples,
                              low=low, high=high, seed=seed, force=force, **options)
        if as_json:
            emit_json({"zip": str(done.zip), "vecnormalize": None if done.vecnormalize is None else str(done.vecnormalize),
                       "algo": done.algo, "net_arch": done.net_arch, "activation_fn": done.activation_fn,
                       "observation_space": done.observation_space, "action_space": done.action_space,
                       "samples": done.samples, "tensors": done.tensors, "max_abs": done.max_abs,
                       "assumptions": done.assumptions, "model_assumptions": done.model_assumptions,
                       "notes": done.notes})
            return
        for note in done.notes:
            say(note)
        say(f"wrote {done.zip}" + (f" and {done.vecnormalize}" if done.vecnormalize else ""))
        out.print(literal(f"{done.zip}: {done.algo.upper()} MlpPolicy net_arch {done.net_arch}, {done.activation_fn}, "
                          f"{done.observation_space} -> {done.action_space}; SB3's network and predict() match the "
                          f"numpy backend on {counted(done.samples, 'observation')}, {counted(done.tensors, 'tensor')} "
                          f"(max abs {done.max_abs:.3g})"))
        _print_assumptions(done.model_assumptions)
        if done.assumptions:
            out.print("assumed (SB3 needs it, the source does not hold it):")
            for line in done.assumptions:
                out.print(literal(f"  {line}"))

    guard(as_json, body, "to-sb3")
