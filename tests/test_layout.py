"""The package reads like the flow: each stage imports only itself and the stages below it, and no
module imports one that imports it back, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "policyport"

#: The stages, lowest first. A module may import from its own stage and the ones before it.
STAGES = (
    ("errors", "text", "version", "io"),  # below every stage: errors, limits and safe file I/O, text
    ("graph",),                           # the model as ONNX and as a packed folder, and the graph passes
    ("runtime",),                         # the numpy interpreter and onnxruntime
    ("converter",),                       # sources -> ONNX
    ("verification",),                    # the comparison rule, verify, inspect's summary
    ("handoff",),                         # pack, a packed folder's own runtime entry, export-numpy
    ("analysis",),                        # record, stats, plot
    ("cli", "__main__"),                  # the command line
    ("",),                                # policyport itself: the public API, re-exported lazily
)


def stage(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(STAGES):
        if top in names:
            return i
    raise AssertionError(f"{module} belongs to no stage: add it to STAGES")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["policyport", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(module: str) -> set[str]:
    """The policyport modules ``module`` imports, anywhere in it: ``from x import y`` counts as an
    import of module ``x.y`` where that is a module, else of ``x``."""
    path = MODULES[module]
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports(m) for m in MODULES}


def test_the_stage_order_is_complete():
    assert all(stage(m) is not None for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_nothing_from_a_later_stage(module):
    later = sorted(m for m in GRAPH[module] if stage(m) > stage(module))
    assert later == [], f"{module} (stage {STAGES[stage(module)]}) imports {later}"


def test_no_module_imports_itself_back():
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert circles == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    """The walk counts an import made inside a function as much as one at the top."""
    assert "policyport.graph.passes" in imports("policyport.verification.summary")
