"""The layout shows the architecture: imports run one way, modules stay small, serving trains nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PIPELINE = ROOT / "pipeline"


def imports_of(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def modules(folder: str) -> list[Path]:
    return sorted((PIPELINE / folder).rglob("*.py"))


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("serving", ("torch", "diffusers", "gradio", "pipeline.engine", "pipeline.web", "pipeline.ray")),
        ("engine", ("gradio", "pipeline.serving", "pipeline.web", "pipeline.ray")),
        ("web", ("torch", "diffusers", "pipeline.engine", "pipeline.ray", "pipeline.serving.local")),
    ],
)
def test_imports_run_one_way(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules(folder)
        for name in imports_of(path)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    }
    assert not bad, sorted(bad)


def test_only_the_backend_choice_imports_ray() -> None:
    importers = {
        str(path.relative_to(ROOT))
        for path in [ROOT / "app.py", *PIPELINE.rglob("*.py")]
        if "pipeline/ray/" not in str(path) and any(n.startswith("pipeline.ray") for n in imports_of(path))
    }
    assert importers == {"app.py"}


def test_serving_imports_only_the_default_models_public_surface() -> None:
    from pipeline import default_model

    public = set(default_model.__all__)
    for path in [ROOT / "app.py", *PIPELINE.rglob("*.py")]:
        if "default_model" in path.parts:
            continue
        deep = {n for n in imports_of(path) if n.startswith("pipeline.default_model.")}
        deep -= {f"pipeline.default_model.{name}" for name in public}
        assert not deep, f"{path.relative_to(ROOT)} reaches into {sorted(deep)}"
    code = (
        "import sys, pipeline.default_model, pipeline.serving.local, pipeline.web.layout; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')"
        " or m.startswith('pipeline.default_model.train')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_module_of_the_app_or_the_benchmark_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in [ROOT / "app.py", *PIPELINE.rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


def _top_level_imports(path: Path) -> set[str]:
    """The pipeline modules ``path`` imports at module level, ``if TYPE_CHECKING:`` blocks included
    (a function's own deferred import is not an edge: it runs after both modules are loaded)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text())
    nodes = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If):  # if TYPE_CHECKING: ...
            nodes.extend(node.body)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found.update(t for t in targets if (ROOT / (t.replace(".", "/") + ".py")).exists())
    return found


def test_no_import_cycle_in_the_pipeline_not_even_a_type_only_one() -> None:
    """Issue 30: ``diffusers_model`` <-> ``loop_base`` was a type-only cycle; the loops now read the
    model through ``loop_base.LoopHost``. Any module-level cycle (type-only ones too) fails here."""
    graph = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): _top_level_imports(p)
        for p in PIPELINE.rglob("*.py")
        if p.name != "__init__.py"
    }
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif len(path) < 12:
                visit(nxt, [*path, nxt])

    for start in graph:
        visit(start, [start])
    assert not cycles, sorted({" -> ".join(c) for c in cycles})[:5]
