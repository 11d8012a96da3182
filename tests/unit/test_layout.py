"""The layout shows the architecture: imports run one way, modules are one concept each, serving trains nothing."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tests.helpers import ROOT, LongModuleWarning

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
        "import sys, pipeline.default_model, pipeline.serving.local, pipeline.web.page.layout; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')"
        " or m.startswith('pipeline.default_model.train')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


USUAL_LINES = 400  # most modules, one concept each, read in fewer; a longer one is reported
ABSURD_LINES = 800  # no one concept takes this many: a module this long is two


def _app_modules() -> list[Path]:
    return [ROOT / "app.py", *PIPELINE.rglob("*.py"), *(ROOT / "bench").rglob("*.py"), *(ROOT / "tools").rglob("*.py")]


def test_a_module_of_the_app_the_benchmark_or_the_tools_is_one_concept_of_a_readable_length() -> None:
    """Files by concept, not by line count (issue 37): a module over ``USUAL_LINES`` is reported as a
    ``LongModuleWarning`` in the warnings summary, never split for it; only one over ``ABSURD_LINES`` fails."""
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _app_modules()}
    for path, n in sorted(lengths.items()):
        if USUAL_LINES < n <= ABSURD_LINES:
            warnings.warn(f"{path}: {n} lines (most modules take under {USUAL_LINES})", LongModuleWarning, stacklevel=1)
    absurd = {path: n for path, n in lengths.items() if n > ABSURD_LINES}
    assert not absurd, absurd


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def repository_imports(path: Path) -> set[str]:
    """The repository's modules ``path`` imports, wherever the import is: at module level, in
    ``if TYPE_CHECKING:``, or deferred into a function (it still runs one way or the other).
    ``from package import module`` is an edge to the module; a package's own ``__init__`` counts
    where it is imported by name (``from pipeline.default_model import ...``)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if _is_module(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            submodules = {f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}")}
            found |= submodules
            if len(submodules) < len(node.names) and _is_module(module):
                found.add(module)
    found.discard(_module_name(path))
    return found


# Where the no-cycle rule holds: the app, the benchmark, the tools and the tests' helpers. Not the
# ``spaces`` stub (a copy of a third-party package's own layout).
GRAPH_ROOTS = ("pipeline", "bench", "tools", "tests")


def _graph() -> dict[str, set[str]]:
    paths = [ROOT / "app.py", *(p for root in GRAPH_ROOTS for p in (ROOT / root).rglob("*.py"))]
    return {_module_name(p): repository_imports(p) for p in paths if "stubs" not in p.parts}


def test_no_import_cycle_not_even_a_type_only_or_a_deferred_one() -> None:
    """Issue 30: ``diffusers_model`` <-> ``loop_base`` was a type-only cycle; the loops now read the
    model through ``loop_base.LoopHost``. Issue 37: ``config`` -> ``web.door.identity`` -> ``config`` was a
    deferred one (an import inside ``_check``); ``config`` now parses ``--trusted-proxies`` itself. Any
    cycle, through whatever kind of import, fails here."""
    graph = _graph()
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


def test_no_module_imports_another_modules_private_name() -> None:
    """Names that say one thing (issue 37): what another module needs is public; a leading underscore
    means this module only. The mutants (``tools/mutant_*.py``) are the exception: they break private
    seams on purpose."""
    paths = [ROOT / "app.py", *(p for root in GRAPH_ROOTS for p in (ROOT / root).rglob("*.py"))]
    reached = {
        f"{path.relative_to(ROOT)} imports {node.module}.{alias.name}"
        for path in paths
        if not path.name.startswith("mutant_")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    }
    assert not reached, sorted(reached)


def test_the_shared_modules_import_no_layer_above_them() -> None:
    """``pipeline/*.py`` (``config``, ``request``, ``protocol``, ``errors``, ...) sit under serving, the
    engine, the page and Ray (docs/design.md "Imports run one way"): none of them imports any of those,
    not even inside a function."""
    layers = ("pipeline.serving", "pipeline.engine", "pipeline.web", "pipeline.ray", "pipeline.default_model")
    up = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(PIPELINE.glob("*.py"))
        for name in imports_of(path)
        if any(name == f or name.startswith(f + ".") for f in layers)
    }
    assert not up, sorted(up)


# -- the tests' own layout: a tier per folder, marks from the folder, shared code in helper modules ----------

TESTS = ROOT / "tests"
TIERS = ("unit", "server", "browser")


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_module_lives_in_its_tier_folder() -> None:
    misplaced = [
        str(p.relative_to(ROOT)) for p in _test_modules() if p.parent.parent != TESTS or p.parent.name not in TIERS
    ]
    assert not misplaced, f"a test module lives in tests/unit, tests/server or tests/browser: {misplaced}"
    assert all((TESTS / tier / "__init__.py").exists() for tier in TIERS)
    assert {p.parent.name for p in _test_modules()} == set(TIERS)


def test_the_folder_gives_the_marks_no_module_marks_its_own_tier() -> None:
    own = {
        f"{p.relative_to(ROOT)}:{node.lineno}"
        for p in _test_modules()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("server", "browser")
        if isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
    }
    assert not own, sorted(own)


def test_a_test_module_imports_no_other_test_module() -> None:
    """What two modules share lives in a helper module (``tests/helpers.py``, ``loras.py``, ``pages.py``,
    ``bench_checks.py``, ...), not in one of the tests."""
    crossing = {
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _test_modules()
        for name in imports_of(p)
        if name.startswith("tests.") and any(part.startswith("test_") for part in name.split(".")[1:])
    }
    assert not crossing, sorted(crossing)


# What launches an app or drives a browser: none of it belongs in the fast tier.
OUTSIDE_UNIT = ("tests.helpers.running_app", "tests.helpers.app_process", "tests.pages", "playwright", "gradio_client")


def test_a_unit_module_launches_no_app_and_drives_no_browser() -> None:
    found = {
        f"{p.relative_to(ROOT)} imports {name}"
        for p in sorted((TESTS / "unit").glob("test_*.py"))
        for name in imports_of(p)
        if any(name == f or name.startswith(f + ".") for f in OUTSIDE_UNIT)
    }
    assert not found, sorted(found)


def _fixtures(path: Path) -> set[str]:
    def is_fixture(d: ast.expr) -> bool:
        target = d.func if isinstance(d, ast.Call) else d
        return isinstance(target, ast.Attribute) and target.attr == "fixture"

    return {
        node.name
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and any(is_fixture(d) for d in node.decorator_list)
    }


def test_a_conftest_fixture_is_defined_once() -> None:
    shared = {name: conftest for conftest in TESTS.rglob("conftest.py") for name in _fixtures(conftest)}
    assert {"fake", "launch", "client", "browser", "page"} <= set(shared)
    again = {
        f"{p.relative_to(ROOT)} defines {name} ({shared[name].relative_to(ROOT)} has it)"
        for p in _test_modules()
        for name in _fixtures(p) & set(shared)
    }
    assert not again, sorted(again)


def test_every_test_the_repository_names_exists() -> None:
    """A test module's path (``tests/<tier>/test_<name>.py``, or a node id ``...::test_<name>``) in the
    docs, the code or the mutants' table names a module, and a function in it, that exist; a path from
    before the tier folders (``tests/test_<name>.py``) fails."""
    import re

    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tools").rglob("*.py")]
    sources += [*PIPELINE.rglob("*.py"), *(ROOT / "bench").rglob("*.py"), *TESTS.rglob("*.py")]
    missing = set()
    for source in sources:
        for path, name in re.findall(
            r"\btests/((?:unit/|server/|browser/)?test_\w+\.py)(?:::(\w+))?", source.read_text()
        ):
            module = TESTS / path
            if not module.exists() or (name and not re.search(rf"^(async )?def {name}\(", module.read_text(), re.M)):
                missing.add(f"{source.relative_to(ROOT)} names tests/{path}{'::' + name if name else ''}")
    assert not missing, sorted(missing)
