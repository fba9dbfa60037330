"""Rewrite ``policyport/graph/schemas.py``: the attributes of every operator schema of the installed onnx.

``policyport.graph.model.from_onnx`` checks each node's attributes against its operator's schema. Asking
``onnx.defs`` for the first schema builds onnx's whole schema registry, some 15-25 ms of every
``policyport run``; the table this script writes answers the same question for the onnx version it
was made from (any other version is asked directly). Run it after upgrading onnx::

    python scripts/update_onnx_schemas.py
"""

from pathlib import Path

import onnx
import onnx.defs

TARGET = Path(__file__).resolve().parents[1] / "policyport" / "graph" / "schemas.py"


def table() -> dict:
    """(domain, op type) -> {since version: ((attribute, type code, required), ...)}, in onnx's order."""
    found: dict = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        attrs = tuple((name, int(a.type.value), bool(a.required)) for name, a in schema.attributes.items())
        found.setdefault((schema.domain, schema.name), {})[schema.since_version] = attrs
    return {key: dict(sorted(found[key].items())) for key in sorted(found)}


def main() -> None:
    lines = [
        f'"""The attributes of every operator schema of onnx {onnx.__version__}, as ``onnx.defs`` holds them.',
        "",
        "Written by ``scripts/update_onnx_schemas.py``; do not edit. :func:`policyport.graph.model.schema_attributes`",
        "reads it when the installed onnx is this version, and asks ``onnx.defs`` otherwise.",
        '"""',
        "",
        f"ONNX_VERSION = {onnx.__version__!r}",
        "",
        "#: (domain, op type) -> {since version: ((attribute, AttributeProto type code, required), ...)}",
        "SCHEMAS = {",
    ]
    for key, versions in table().items():
        lines.append(f"    {key!r}: {{")
        lines += [f"        {since}: {attrs!r}," for since, attrs in versions.items()]
        lines.append("    },")
    lines.append("}")
    TARGET.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
