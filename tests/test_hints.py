"""What a failure suggests: looser tolerances only where the error is within reach of them, and every
option a message names is an option of the command that prints it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from test_cli import invoke  # pytest puts tests/ on sys.path

import policyport as pp


@pytest.fixture(scope="module")
def changed(tmp_path_factory, metadrive_path, metadrive_model):
    """The expert as .onnx, and its weights with the first kernel scaled by 1.5 (a real mismatch)."""
    place = tmp_path_factory.mktemp("hints")
    onnx.save(metadrive_model, place / "m.onnx")
    with np.load(metadrive_path) as f:
        weights = {k: f[k] for k in f.files}
    weights["default_policy/fc_1/kernel"] = weights["default_policy/fc_1/kernel"] * np.float32(1.5)
    np.savez(place / "changed.npz", **weights)
    return place


def test_a_large_mismatch_names_the_diverging_tensor_and_no_tolerance_option(changed):
    result = invoke("verify", changed / "m.onnx", "--source", changed / "changed.npz", "--samples", "64")
    assert result.exit_code == 1
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("FAIL against a reconstruction that assumes activation tanh at fc_1 and fc_2; head diagonal "
                              "Gaussian, fc_out = [mean (2, the action), log_std (2)]; observation normalisation none: ")
    assert "first diverging tensor 'fc_1/linear' (float32, numpy vs source)" in verdict
    assert verdict.endswith("that is more than 100 times the float32 tolerance: the values disagree beyond rounding — "
                            "look at the node that computes 'fc_1/linear', not at the tolerances")
    assert "--atol" not in result.output and "--rtol" not in result.output
    doc = json.loads(invoke("verify", changed / "m.onnx", "--source", changed / "changed.npz", "--samples", "64",
                            "--json").stdout)
    assert doc["first_divergence"]["max_abs"] > 100 * doc["first_divergence"]["atol"]


def test_pack_refuses_a_large_mismatch_without_suggesting_tolerances(changed, tmp_path):
    result = invoke("pack", changed / "m.onnx", "-o", tmp_path / "b", "--source", changed / "changed.npz")
    assert result.exit_code == 1 and not (tmp_path / "b").exists()
    assert "the values disagree beyond rounding — look at the node that computes 'fc_1/linear'" in result.stderr
    assert "--atol" not in result.stderr
    with pytest.raises(pp.VerificationError, match="not at the tolerances") as raised:
        pp.pack(changed / "m.onnx", tmp_path / "b", source=changed / "changed.npz")
    assert "atol=" not in str(raised.value)


def test_a_small_mismatch_still_suggests_the_tolerance_options(changed, tmp_path):
    result = invoke("verify", changed / "m.onnx", "--samples", "32", "--atol", "0", "--rtol", "0", "--no-rounding")
    assert result.exit_code == 1
    assert result.stdout.rstrip().endswith("if float32 differences of this size are acceptable, loosen them with "
                                           "--atol/--rtol")


# -------------------------------------------------------------------------- contradicting options


@pytest.fixture(scope="module")
def place(changed):
    """The expert as .onnx and 20 observations."""
    np.save(changed / "obs.npy", np.random.default_rng(1).uniform(0, 1, (20, 275)).astype(np.float32))
    return changed


@pytest.mark.parametrize("args,named", [
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.npz", "--format", "parquet"],
     ["-o (out=) 'x.npz' ends in .npz but --format (format=) asks for parquet", "'x.parquet'"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.npz", "--engine", "ray"],
     ["--engine ray (engine='ray') writes a folder of .parquet files, but -o (out=) 'x.npz' ends in .npz", "'x'"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x", "--engine", "ray", "--format", "npz"],
     ["--engine ray (engine='ray') writes a folder of .parquet files, but --format (format=) asks for npz"]),
    (["record", "{m}", "-i", "{obs}", "-o", "{out}/x.bin"], ["cannot tell the recording format from -o", "--format"]),
    (["convert", "{src}", "-o", "{out}/w.onnx", "--activation", "relu,tanh"],
     ["--activation (activation=) 'relu,tanh' is a list", "npz sources take one activation name"]),
    (["run", "{m}", "-i", "{obs}", "-o", "{out}/o.npz", "--record", "{out}/o.npz"], ["is also the -o file", "--record"]),
    (["run", "{m}", "-i", "{obs}", "--profile", "--override", "fc_1/tanh[0]=1"], ["--profile", "--override/--steer"]),
])
def test_an_option_contradicting_another_is_a_usage_error_naming_both(place, metadrive_path, tmp_path, args, named):
    result = invoke(*[a.format(m=place / "m.onnx", obs=place / "obs.npy", out=tmp_path, src=metadrive_path) for a in args])
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert all(" ".join(n.split()) in message for n in named), message
    assert list(tmp_path.iterdir()) == []


def test_a_packed_folder_refuses_one_file_for_both_outputs_as_a_usage_error(place, tmp_path):
    from policyport.handoff.folder_run import main

    folder = pp.pack(place / "m.onnx", tmp_path / "b", samples=4)
    out = tmp_path / "o.npz"
    assert main(folder, ["-i", str(place / "obs.npy"), "-o", str(out), "--record", str(out)]) == 2
    assert not out.exists()


# ---------------------------------------------------------------- options named by library messages

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
MALICIOUS = ROOT / "fixtures" / "rllib" / "malicious" / "checkpoint-1"


def library_messages() -> list[tuple[str, int, str]]:
    """(file, line, option) of every ``--option`` in the text of a raise or a require() outside the
    CLI package: the messages library code gives whichever command reached it."""
    import ast

    from policyport.cli.core import OPTION_MENTION

    found = []
    for path in sorted((ROOT / "policyport").rglob("*.py")):
        if "cli" in path.relative_to(ROOT / "policyport").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_require = isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("require", "MissingDependencyError")
            if not isinstance(node, ast.Raise) and not is_require:
                continue
            texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            for option in dict.fromkeys(o for t in texts for o in OPTION_MENTION.findall(t)):
                found.append((str(path.relative_to(ROOT)), node.lineno, option))
    return found


def commands() -> dict[str, set[str]]:
    """Every ``policyport`` command -> its long options; ``run.py`` -> the packed folder's."""
    from typer.main import get_command

    from policyport.cli import _app
    from policyport.cli.core import long_options
    from policyport.handoff.folder_run import parser

    group = get_command(_app())
    found = {name: long_options(cmd) for name, cmd in group.commands.items()}
    found["run.py"] = {o for a in parser()._actions for o in a.option_strings if o.startswith("--")}
    return found


def test_every_option_a_library_message_names_is_an_option_of_some_command():
    found = library_messages()
    options = {o for _, _, o in found}
    assert len(found) >= 25 and {"--trust", "--from", "--force", "--backend", "--outputs", "--activation"} <= options
    everywhere = set().union(*commands().values()) | {"--max-bytes"}  # a root option
    for file, line, option in found:
        assert option in everywhere, f"{file}:{line}: {option} is an option of no command"


def test_each_command_says_whose_option_a_message_names_when_it_is_not_its_own():
    """Every option found in library messages, under every command: its own left alone, another's noted."""
    from typer.main import get_command

    from policyport.cli import _app
    from policyport.cli.core import foreign_options

    try:
        from typer._click.core import Context
    except ImportError:  # pragma: no cover
        from click import Context

    group = get_command(_app())
    table = commands()
    for option in sorted({o for _, _, o in library_messages()} - {"--max-bytes"}):
        owners = " and ".join(f"policyport {n}" for n in sorted(table) if n != "run.py" and option in table[n])
        for name, command in group.commands.items():
            message = f"refused; pass {option} (keyword= in Python)"
            with Context(command, info_name=name, parent=Context(group, info_name="policyport")):
                got = foreign_options(message)
            if option in table[name]:
                assert got == message, (name, option)
            else:
                assert got == f"{message} ({option} is an option of {owners}, not of policyport {name})", (name, option)


@pytest.mark.parametrize("command", [["inspect", "{src}"], ["pack", "{m}", "-o", "{out}/b", "--source", "{src}"],
                                     ["verify", "{m}", "--source", "{src}", "--samples", "4"],
                                     ["convert", "{src}", "-o", "{out}/c.onnx"]])
def test_every_command_that_loads_a_source_refuses_a_pickle_saying_to_pass_its_own_trust(place, tmp_path, command):
    result = invoke(*[a.format(src=MALICIOUS, m=place / "m.onnx", out=tmp_path) for a in command])
    assert result.exit_code == 3
    assert " ".join(result.stderr.split()).endswith("If you trust this file, pass --trust (trust=True)")
    assert "--trust" in commands()[command[0]]
    assert not list(tmp_path.iterdir())


def test_the_node_limit_names_backend_as_run_and_records_option(place, tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYPORT_MAX_NODES", "3")
    verified = invoke("verify", place / "m.onnx", "--samples", "4")
    assert verified.exit_code == 3 and " ".join(verified.stderr.split()).endswith(
        "or run it with --backend onnxruntime (--backend is an option of policyport direction and policyport "
        "importance and policyport patch and policyport record and policyport run, not of policyport verify)")
    ran = invoke("run", place / "m.onnx", "-i", place / "obs.npy", "-o", tmp_path / "o.npz")
    assert ran.exit_code == 3 and " ".join(ran.stderr.split()).endswith("or run it with --backend onnxruntime")


def test_a_packed_folder_says_which_options_are_the_policyport_commands(place, tmp_path, monkeypatch, capsys):
    from policyport.handoff.folder_run import main

    folder = pp.pack(place / "m.onnx", tmp_path / "b", samples=4)
    monkeypatch.setenv("POLICYPORT_MAX_NODES", "3")
    assert main(folder, ["-i", str(place / "obs.npy"), "-o", str(tmp_path / "o.npz")]) == 3
    assert capsys.readouterr().err.rstrip().endswith(
        "or run it with --backend onnxruntime (--backend is an option of the policyport command, not of run.py)")
