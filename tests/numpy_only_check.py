"""Run a packed policy where only numpy and the standard library can be imported.

Meant to be run with site disabled and the environment ignored, so that site-packages (onnx,
protobuf, onnxruntime, typer, rich ...) are out of reach::

    python -S -I tests/numpy_only_check.py SANDBOX BUNDLE OUT.npz

``SANDBOX`` is a folder holding only ``numpy`` (and ``numpy.libs``, where the wheel has it) and
``policyport`` — symlinks to the installed numpy and to the repository's package. The script puts it
first on ``sys.path``, checks that the non-numpy dependencies cannot be imported, loads ``BUNDLE``
with ``policyport.load(BUNDLE, backend="numpy")``, runs its golden observations, runs
``policyport.runtime.packed.verify_bundle`` on it, and writes ``OUT.npz`` (``outputs/<name>``: what
``Session.run`` returned) and, on stdout, one JSON document: ``{"blocked": {...}, "third_party":
[...], "forbidden_loaded": [...], "verify_passed": bool, "first_divergence": ..., "numpy_file": ...,
"policyport_file": ...}``.
"""

import sys

FORBIDDEN = ("onnx", "google.protobuf", "onnxruntime", "typer", "rich", "torch", "tensorflow")


def main(sandbox: str, bundle: str, out: str) -> None:
    sys.path.insert(0, sandbox)

    import json  # the standard library stays reachable under -S: it only drops site-packages
    import os
    import zipfile  # noqa: F401

    blocked = {}
    for name in FORBIDDEN:
        try:
            __import__(name)
        except ImportError:
            blocked[name] = True
        else:
            blocked[name] = False

    import numpy as np

    import policyport as pp
    from policyport.handoff.golden import read_golden, verify_bundle

    golden = read_golden(bundle)
    outputs = pp.load(bundle, backend="numpy").run(golden["inputs"])
    report = verify_bundle(bundle)
    with open(out, "wb") as f:
        np.savez(f, **{f"outputs/{k}": v for k, v in outputs.items()})

    stdlib = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    top = {m.split(".")[0] for m in sys.modules}
    first = report.first_divergence
    json.dump({
        "blocked": blocked,
        "third_party": sorted(m for m in top if m not in stdlib and not m.startswith("_")),
        "forbidden_loaded": sorted(m for m in sys.modules
                                   if any(m == f or m.startswith(f + ".") for f in (*FORBIDDEN, "google"))),
        "verify_passed": report.passed,
        "first_divergence": None if first is None else first.tensor,
        "numpy_file": os.path.realpath(np.__file__),
        "policyport_file": os.path.realpath(pp.__file__),
        "sys_path": sys.path,
    }, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:4])
