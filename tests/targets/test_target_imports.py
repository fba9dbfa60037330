"""The to-torch and to-sb3 paths import TensorFlow only for a Keras/TensorFlow source: SB3 imports
torch.utils.tensorboard, whose TensorBoard would import TensorFlow whenever it is installed, so each command
runs in a process of its own and that process's sys.modules is checked after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]

_RUN = """
import json, sys
from policyport.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
loaded = sorted(m for m in ("tensorflow", "keras", "tf2onnx") if m in sys.modules)
print(json.dumps({"exit": code, "loaded": loaded, "sb3": "stable_baselines3" in sys.modules}), file=sys.stderr)
"""


def run_cli(*args: str) -> tuple[dict, str]:
    """Run ``policyport ARGS`` in a fresh Python; (what it reported about itself, its stderr before that)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # TensorFlow's start-up lines would show
    done = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    *lines, last = done.stderr.strip().splitlines()
    return json.loads(last), "\n".join(lines)


def test_to_torch_of_an_sb3_zip_imports_no_tensorflow(tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("tensorflow")  # installed, so that importing it is possible at all
    report, stderr = run_cli("to-torch", str(ROOT / "fixtures/sb3/ppo_pendulum.zip"), "-o", str(tmp_path / "policy"))
    assert report == {"exit": 0, "loaded": [], "sb3": True}  # SB3 ran (the source's own forward) without TensorFlow
    assert "TensorFlow" not in stderr and "oneDNN" not in stderr
    assert (tmp_path / "policy/policy.py").is_file()


def test_to_sb3_of_an_onnx_export_imports_no_tensorflow(tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("tensorflow")
    report, stderr = run_cli("to-sb3", str(ROOT / "fixtures/ml_agents/exports/Basic.onnx"), "-o",
                             str(tmp_path / "policy.zip"), "--algo", "ppo")
    assert report == {"exit": 0, "loaded": [], "sb3": True}
    assert "TensorFlow" not in stderr
    assert (tmp_path / "policy.zip").is_file()


def test_torch_s_summary_writer_still_works_after_sb3_was_imported_so(tmp_path):
    """TensorBoard's TensorFlow stub is what torch's SummaryWriter uses where TensorFlow is absent."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("tensorboard")
    code = ("import sys\nfrom policyport.converter.sources.sb3_policy import import_sb3\nimport_sb3()\n"
            "assert 'tensorflow' not in sys.modules and 'tensorboard.compat.notf' not in sys.modules\n"
            "from torch.utils.tensorboard import SummaryWriter\n"
            f"w = SummaryWriter({str(tmp_path / 'tb')!r}); w.add_scalar('reward', 1.5, 3); w.close()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"reward" in events[0].read_bytes()
