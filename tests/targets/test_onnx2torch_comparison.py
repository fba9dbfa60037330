"""The same three graphs through onnx2torch (a comparison at test time, not a dependency): what each
tool keeps of the source's parameter names and how many parameters stay trainable. The test setup
(scripts/setup.sh test) installs onnx2torch without its dependencies into .venv/onnx2torch: its torchvision
would pull a torch other than the pinned CPU build. Skipped where onnx2torch is not there; its figures are
the README's."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import onnx
import pytest

import policyport as pp

torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[2]
#: Where scripts/setup.sh installs onnx2torch (and nothing it depends on) for this comparison.
ONNX2TORCH = ROOT / ".venv" / "onnx2torch"


@pytest.fixture
def onnx2torch(monkeypatch):
    """onnx2torch, imported. Its package imports torchvision for its NonMaxSuppression and RoiAlign
    converters only (node_converters/nms.py, roialign.py); where torchvision is missing, an empty
    stand-in lets it import, and none of these graphs has either op."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        stub = types.ModuleType("torchvision")
        stub.ops = types.ModuleType("torchvision.ops")
        stub.ops.roi_align = None
        monkeypatch.setitem(sys.modules, "torchvision", stub)
        monkeypatch.setitem(sys.modules, "torchvision.ops", stub.ops)
    if ONNX2TORCH.is_dir():
        monkeypatch.syspath_prepend(str(ONNX2TORCH))
    return pytest.importorskip("onnx2torch")


def _graphs(tmp_path: Path) -> dict[str, tuple[onnx.ModelProto, set[str]]]:
    """name -> (model, the source's parameter names)."""
    from test_to_torch import _foreign_graph

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    exported = pp.convert(net, input_shape=(4,))
    keras = pp.convert(str(ROOT / "fixtures/keras/mlp_activations.keras"))
    recorded = json.loads({p.key: p.value for p in keras.metadata_props}["policyport.parameters"])
    keras_names = {v if isinstance(v, str) else v["name"] for v in recorded.values()}
    path, _ = _foreign_graph(tmp_path)
    return {
        "torch.onnx export (Gemm)": (exported, set(dict(net.named_parameters()))),
        "tf2onnx export of a Keras model (MatMul + Add)": (keras, keras_names),
        "MatMul + Add, bias through Identity (as ML-Agents exports)": (
            onnx.load(path), {"dense/kernel:0", "dense/bias:0", "out.weight", "out.bias"}),
    }


def test_policyport_keeps_every_source_name_and_trains_every_parameter_onnx2torch_does_not(onnx2torch, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    figures, keyed = {}, {}
    for name, (model, sources) in _graphs(tmp_path).items():
        folder = tmp_path / str(len(figures))
        done = pp.to_torch(model, folder)
        names = json.loads((folder / "parameters.json").read_text())
        kept = {names[k]["source"] for k in done.parameters}
        assert kept == sources, name  # every source parameter, trainable, under its name
        keyed[name] = len(set(done.parameters) & sources)  # state_dict keys that are the source's names
        assert keyed[name] == len(sources) - len(done.renamed), name  # the others mapped in parameters.json
        theirs = onnx2torch.convert(model)
        trained = dict(theirs.named_parameters())
        figures[name] = (len(sources), len(trained), len(set(trained) & sources))
    assert keyed == {  # a Keras kernel is stored [in, out] and named fc_1/kernel; dense/kernel:0 likewise
        "torch.onnx export (Gemm)": 4,
        "tf2onnx export of a Keras model (MatMul + Add)": 0,
        "MatMul + Add, bias through Identity (as ML-Agents exports)": 2,
    }
    if getattr(onnx2torch, "__version__", "1.5.15") == "1.5.15":
        assert figures == {  # (source parameters, onnx2torch's trainable parameters, of them under a source name)
            "torch.onnx export (Gemm)": (4, 4, 0),
            "tf2onnx export of a Keras model (MatMul + Add)": (16, 0, 0),
            "MatMul + Add, bias through Identity (as ML-Agents exports)": (4, 2, 2),
        }
    assert len(figures) == 3
