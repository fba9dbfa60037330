"""The arrows between policyport's layers run one way: lower modules never import higher ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: module -> modules it must not pull in (directly or through anything it imports).
LOWER_LAYERS = {
    "policyport": ["onnx", "onnxruntime", "typer", "rich", "policyport.runtime", "policyport.verification.verify"],
    "policyport.runtime": ["onnx", "onnxruntime", "policyport.verification", "policyport.handoff", "policyport.cli"],
    "policyport.runtime.packed": ["onnx", "onnxruntime", "policyport.verification", "policyport.handoff"],
    "policyport.verification.compare": ["onnx", "policyport.runtime", "policyport.verification.verify"],
    "policyport.graph.model": ["onnx", "policyport.runtime"],
    # What a packed folder's run.py executes before its files are checked: the standard library only.
    "policyport.graph.folder": ["numpy", "onnx", "policyport.runtime", "policyport.graph.model", "policyport.io.limits",
                                "policyport.io.arrays"],
    "policyport.io.schema": ["numpy", "onnx", "policyport.runtime"],
    "policyport.handoff.folder_run": ["onnx", "onnxruntime", "typer", "rich", "policyport.verification.verify",
                                      "policyport.handoff.pack", "policyport.cli"],
    "policyport.handoff.golden": ["onnx", "onnxruntime", "typer", "rich", "policyport.verification.verify",
                                  "policyport.handoff.pack", "policyport.cli"],
}


@pytest.mark.parametrize("module", sorted(LOWER_LAYERS))
def test_lower_layers_do_not_import_higher_ones(module):
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                           text=True).stdout))
    forbidden = [m for m in LOWER_LAYERS[module] if m in loaded]
    assert forbidden == [], f"importing {module} loads {forbidden}"
