"""What the tests of the RL libraries' checkpoint sources share: the CLI run without a traceback, and
the round trip a converted checkpoint must make (convert, verify against the source, pack, and the
packed folder's own run.py --verify)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from typer.testing import CliRunner

from policyport.cli import app


def arrays(path) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path`` (what a library's own policy returned, for instance)."""
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def fixture_script(folder):
    """The ``make_fixtures.py`` of a fixtures folder, imported under a name of its own (each library's
    script is called make_fixtures: a plain import would return whichever was imported first)."""
    import importlib.util

    name = f"make_fixtures_{folder.name}"
    if name not in sys.modules:  # registered, so that what it defines pickles (a dist_fn saved with a policy)
        spec = importlib.util.spec_from_file_location(name, folder / "make_fixtures.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def invoke(*args):
    """``policyport ARGS`` in process; asserts no traceback reached the output."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def convert_verify_pack(tmp_path: Path, source: Path, *options) -> list[str]:
    """Convert ``source`` with ``options``, verify it against the source, pack it and run the packed
    folder's ``run.py --verify``, asserting each passes; returns the topics of the conversion's assumptions."""
    converted = invoke("convert", source, *options, "-o", tmp_path / "a.onnx", "--json")
    assert converted.exit_code == 0, converted.output
    verified = invoke("verify", tmp_path / "a.onnx", "--source", source, "--json")
    assert verified.exit_code == 0 and json.loads(verified.stdout)["passed"] is True, verified.output
    packed = invoke("pack", tmp_path / "a.onnx", "-o", tmp_path / "pack")
    assert packed.exit_code == 0, packed.output
    run = subprocess.run([sys.executable, str(tmp_path / "pack" / "run.py"), "--verify"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout
    return [a["topic"] for a in json.loads(converted.stdout)["assumptions"]]


#: The observation normalisers of the RL libraries (shared/notes/rl-library-checkpoints.md), as keyword
#: arguments of :func:`elu_policy_under`: the epsilon on the variance or on the std, and the clip.
NORMALISERS = {"rl_games": dict(eps_on_var=1e-5, clip=5), "skrl": dict(eps_on_std=1e-8, clip=5),
               "rsl_rl": dict(eps_on_std=1e-2), "gymnasium": dict(eps_on_var=1e-8, clip=10)}


def elu_policy_under(obs, mean, var, layers, head, *, eps_on_var=None, eps_on_std=None, clip=None):
    """An elu MLP's output, in float64, on observations normalised by one library's formula:
    ``(obs - mean) / sqrt(var + eps_on_var)`` or ``(obs - mean) / (sqrt(var) + eps_on_std)``, clipped to
    ``[-clip, clip]`` when ``clip`` is given; ``layers`` and ``head`` as ``(_, weight (out, in), _, bias)``."""
    x = (obs - mean) / (np.sqrt(var + eps_on_var) if eps_on_var is not None else np.sqrt(var) + eps_on_std)
    if clip is not None:
        x = np.clip(x, -clip, clip)
    for _, w, _, b in layers:
        x = x @ w.T.astype(np.float64) + b
        x = np.where(x > 0, x, np.expm1(np.minimum(x, 0)))
    _, w, _, b = head
    return x @ w.T.astype(np.float64) + b


def code_running_payload(marker: Path) -> dict:
    """Entries for a checkpoint that, unpickled by ``torch.load(weights_only=False)``, would create ``marker``
    (a ``__reduce__`` naming ``subprocess.call``), beside a plain ``collections.Counter``."""
    import collections

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    return {"hook": Payload(), "counter": collections.Counter(a=1)}
