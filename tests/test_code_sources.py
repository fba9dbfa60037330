"""Sources whose loading runs code they hold are read only with ``--trust``.

One canary per way such a file runs code, each creating a file of the canary folder when it runs: a
TorchScript module's ``__setstate__`` (run by ``torch.jit.load``) and ``forward`` (run when the module is
traced and checked), both through ``torch.from_file(path, shared=True)``, the first also saved as
``weights.pth``, a name that says nothing of TorchScript; a SavedModel resource's initializer (run inside
``tf.saved_model.load``) and a serving signature writing a file with ``WriteFile`` or with
``DatasetToTFRecord`` (run when the signature is traced and checked). Without ``--trust``, ``convert``,
``inspect``, ``verify --source`` and ``pack --source`` end with exit 2 and a message naming what the source
is, that loading it runs its code, and ``--trust``; no canary exists and nothing is written. With
``--trust`` each loads: it converts, and its canary shows that its code ran.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import policyport as pp
from policyport.cli import app

runner = CliRunner()

#: What the refusal says each kind of source is.
SAYS = {"torchscript": "is a TorchScript file (torch.jit.save), and loading it runs code the file holds: ",
        "savedmodel": "is a TensorFlow SavedModel, and loading it runs code the folder holds: "}
ENDS = "policyport refused it without loading it (nothing from it ran); if you trust it, pass --trust (trust=True)"


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def _torchscript_sources(folder: Path, canaries: Path) -> dict[str, Path]:
    torch = pytest.importorskip("torch")

    class SetState(torch.nn.Module):
        def __init__(self, path: str):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((2, 4), 0.5))
            self.path = path

        def forward(self, x):
            return x @ self.weight.t()

        @torch.jit.export
        def __getstate__(self):
            return (self.weight, self.path, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[torch.Tensor, str, bool]):
            self.path, self.training = state[1], state[2]
            self.weight = state[0] + torch.from_file(self.path, shared=True, size=1).sum() * 0

    class Forward(torch.nn.Module):
        def __init__(self, path: str):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.path = path

        def forward(self, x):
            return self.fc(x) + torch.from_file(self.path, shared=True, size=1).sum() * 0

    sources = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript itself
        for name, module in (("torchscript __setstate__", SetState), ("torchscript forward", Forward)):
            sources[name] = folder / f"{name.split()[1].strip('_')}.pt"
            torch.jit.save(torch.jit.script(module(str(canaries / name.replace(' ', '_')))), str(sources[name]))
    sources["torchscript __setstate__ as weights.pth"] = folder / "weights.pth"
    shutil.copy(sources["torchscript __setstate__"], folder / "weights.pth")  # the same canary as its original
    return sources


def _savedmodel_sources(folder: Path, canaries: Path) -> dict[str, Path]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf = pytest.importorskip("tensorflow")

    class Writer(tf.saved_model.experimental.TrackableResource):
        """A resource whose initializer, run inside tf.saved_model.load, writes a file."""

        def __init__(self, path: str):
            super().__init__()
            self.path = path

        def _create_resource(self):
            return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="canary")

        def _initialize(self):
            tf.io.write_file(self.path, "ran")
            return tf.raw_ops.AssignVariableOp(resource=self.resource_handle, value=1.0)

    spec = tf.TensorSpec([None, 4], tf.float32)

    class Initializer(tf.Module):
        def __init__(self, path):
            super().__init__()
            self.w, self.writer = tf.Variable(tf.fill([4, 2], 0.5)), Writer(path)

        @tf.function(input_signature=[spec])
        def serve(self, x):
            return {"output_0": tf.matmul(x, self.w)}

    def signature_writing(write):
        """A module whose serving signature writes a file with ``write(path)`` before it answers."""

        class Writes(tf.Module):
            def __init__(self, path):
                super().__init__()
                self.w, self.path = tf.Variable(tf.fill([4, 2], 0.5)), path

            @tf.function(input_signature=[spec])
            def serve(self, x):
                with tf.control_dependencies([write(self.path)]):
                    return {"output_0": tf.matmul(x, self.w)}

        return Writes

    def to_tfrecord(path):
        dataset = tf.data.Dataset.from_tensors(tf.constant("ran"))
        return tf.raw_ops.DatasetToTFRecord(input_dataset=dataset._variant_tensor, filename=path, compression_type="")

    write_file = signature_writing(lambda path: tf.io.write_file(path, "ran"))
    dataset_to_tfrecord = signature_writing(to_tfrecord)

    sources = {}
    for name, module in (("savedmodel initializer", Initializer), ("savedmodel WriteFile", write_file),
                         ("savedmodel DatasetToTFRecord", dataset_to_tfrecord)):
        made = module(str(canaries / name.replace(" ", "_")))
        sources[name] = folder / name.split()[1]
        tf.saved_model.save(made, str(sources[name]), signatures={"serving_default": made.serve})
    return sources


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """(folder of the sources, folder the canaries would appear in, an ONNX model of the sources' shape)."""
    folder = tmp_path_factory.mktemp("code_sources")
    canaries = folder / "canaries"
    canaries.mkdir()
    w = numpy_helper.from_array(np.full((4, 2), 0.5, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["obs", "w"], ["logits"])], "g",
                              [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [None, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 2])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "model.onnx")
    return folder, canaries, folder / "model.onnx"


@pytest.fixture(scope="module")
def sources(place):
    """Case name -> path of every canary source torch and tensorflow can make here."""
    folder, canaries, _ = place
    made = {}
    for make in (_torchscript_sources, _savedmodel_sources):
        try:
            made.update(make(folder, canaries))
        except pytest.skip.Exception:
            continue
    assert not list(canaries.iterdir())  # saving ran none of them
    return made


CASES = ["torchscript __setstate__", "torchscript __setstate__ as weights.pth", "torchscript forward",
         "savedmodel initializer", "savedmodel WriteFile", "savedmodel DatasetToTFRecord"]
COMMANDS = {"convert": ["convert", "{src}", "-o", "{out}/m.onnx"], "inspect": ["inspect", "{src}"],
            "verify --source": ["verify", "{model}", "--source", "{src}", "--samples", "4"],
            "pack --source": ["pack", "{model}", "-o", "{out}/b", "--source", "{src}"]}


def _source(sources, case) -> Path:
    if case not in sources:
        pytest.skip(f"{case.split()[0]} is not installed")
    return sources[case]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", CASES)
def test_without_trust_nothing_of_the_source_runs_and_the_refusal_says_why(place, sources, tmp_path, case, command):
    _, canaries, model = place
    src = _source(sources, case)
    out = tmp_path / "out"
    out.mkdir()
    result = invoke(*[a.format(src=src, out=out, model=model) for a in COMMANDS[command]])
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert message.startswith(f"error: {src} {SAYS[case.split()[0]]}") and message.endswith(ENDS), message
    assert "is an option of" not in message  # every one of these commands takes --trust
    assert list(canaries.iterdir()) == [] and list(out.iterdir()) == []


@pytest.mark.parametrize("case", ["torchscript __setstate__", "savedmodel initializer"])
def test_the_refusal_is_one_json_document_and_the_api_raises_trust_required(place, sources, case):
    _, canaries, model = place
    src = _source(sources, case)
    result = invoke("inspect", src, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 2 and doc["exit_code"] == 2 and doc["error"].startswith(f"{src} {SAYS[case.split()[0]]}")
    for call in (lambda: pp.convert(src), lambda: pp.verify(str(model), source=src, samples=4)):
        with pytest.raises(pp.TrustRequiredError) as caught:
            call()
        assert isinstance(caught.value, pp.UntrustedFileError) and caught.value.exit_code == 2
    assert list(canaries.iterdir()) == []


def test_a_torchscript_file_is_refused_whatever_it_is_named_or_read_as(place, sources, tmp_path):
    """Named so that its name tells no kind, inspect tells it from its contents; read as a state_dict,
    the refusal sends it to --from torchscript, saying that needs --trust. Nothing of it runs."""
    _, canaries, _ = place
    src = tmp_path / "policy.bin"
    shutil.copy(_source(sources, "torchscript __setstate__"), src)
    result = invoke("inspect", src)
    assert result.exit_code == 2 and " ".join(result.stderr.split()).startswith(f"error: {src} {SAYS['torchscript']}")
    result = invoke("convert", src, "--from", "state-dict", "-o", tmp_path / "m.onnx")
    assert result.exit_code == 3
    assert "policyport converts it with --from torchscript, which loads it only with --trust" in " ".join(result.stderr.split())
    result = invoke("run", src, "-i", tmp_path / "obs.npy", "-o", tmp_path / "y.npz")
    assert result.exit_code == 3 and f"-o {tmp_path / 'policy.onnx'} --trust" in " ".join(result.stderr.split())
    assert list(canaries.iterdir()) == [] and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("case", CASES)
def test_with_trust_the_source_loads_and_its_code_runs(place, sources, tmp_path, case):
    """--trust is the user's word that the file's code may run: it converts, and the canary shows it ran."""
    _, canaries, _ = place
    src = _source(sources, case)
    canary = canaries / case.removesuffix(" as weights.pth").replace(" ", "_")
    shape = ["--input-shape", "4"] if case.startswith("torchscript") else []
    try:
        result = invoke("convert", src, "-o", tmp_path / "m.onnx", "--trust", *shape, "--samples", "8", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["verification"]["passed"] and (tmp_path / "m.onnx").exists()
        assert canary.exists()
        outputs = pp.load(tmp_path / "m.onnx").run({"obs": np.ones((3, 4), np.float32)})
        assert [value.shape for value in outputs.values()] == [(3, 2)]
    finally:
        for ran in canaries.iterdir():
            ran.unlink()
