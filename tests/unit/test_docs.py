"""The front door and the manual (issue 30): a README of at most 12 KB that still carries the two
commands, every flag and its variable, a ``gradio_client`` example, the architecture and the latest
figures; the reference in ``docs/``; the published benchmark runs in ``bench/results/`` with an index;
and every link between them resolving (a file that exists, an anchor that is a heading there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

README = ROOT / "README.md"
MANUAL = ("usage.md", "architecture.md", "families.md", "performance.md", "testing.md", "security.md")


def test_the_readme_is_a_front_door_of_at_most_12_kb() -> None:
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024, len(text.encode())
    assert "pip install -r requirements.txt && python app.py" in text
    assert "pip install -r requirements-dev.txt && python -m pytest" in text
    assert "from gradio_client import Client" in text and 'api_name="/generate"' in text
    assert "docs/screenshot.png" in text and "## Architecture" in text and "## Performance" in text
    for page in MANUAL:
        assert f"docs/{page}" in text, page


def test_every_flag_and_variable_is_on_the_front_door_and_in_the_manual() -> None:
    from pipeline.config import OPTIONS, build_parser

    readme, usage = README.read_text(), (ROOT / "docs" / "usage.md").read_text()
    flags = [a.option_strings[0] for a in build_parser()._actions if a.option_strings[0] != "-h"]
    for flag in flags:
        assert re.search(rf"`{re.escape(flag)}\b", readme) or f"{flag}`" in readme or f"{flag}," in readme, flag
        assert flag in usage, flag
    for _dest, env, _kind, _text in OPTIONS:
        assert env in readme and env in usage, env
    assert "T2I_LORAS" in readme and "T2I_LORA_BATCHING" in readme


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "results" / "INDEX.md"]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, broken


def test_the_benchmark_runs_live_in_bench_results_with_an_index_line_each() -> None:
    from tools import bench_index

    assert not list((ROOT / "docs").glob("bench-*.json")), "a benchmark run in docs/"
    runs = [p.name for p in bench_index.published()]
    assert "latest.json" not in runs  # a run's default output is not a published run
    index = (ROOT / "bench" / "results" / "INDEX.md").read_text()
    assert runs and all(f"`{name}`" in index for name in runs), [n for n in runs if f"`{n}`" not in index]
    rows = [line for line in index.splitlines() if line.startswith("| 20")]
    assert len(rows) == len(runs) and all(re.match(r"\| \d{4}-\d\d-\d\d \| `", r) for r in rows)
    assert all(re.search(r"\| [0-9a-f]{7,} \| \d+ cores", r) for r in rows), "a run without its commit or machine"
    bench_index.main(["--check"])


def test_the_testing_doc_lists_the_slowest_tests_in_its_format() -> None:
    """``docs/testing.md``'s table of the 20 slowest tests, as ``python -m tools.slowest`` writes it."""
    from tools import slowest

    slowest.main(["--check"])
    report = (
        "== slowest ==\n12.50s call     tests/a.py::t\n0.30s setup    tests/b.py::u\n3.00s teardown tests/c.py::v\n"
    )
    assert slowest.slowest(report, 2) == [(12.5, "call", "tests/a.py::t"), (3.0, "teardown", "tests/c.py::v")]


def test_the_modules_seconds_sum_their_phases_and_name_modules_that_exist() -> None:
    """``tests/durations.json`` (the order pytest-xdist's workers take the modules in) names only
    modules that exist, longest first, as ``tools.slowest.module_seconds`` sums a report."""
    import json

    from tools import slowest

    report = "1.50s call     tests/a.py::t\n0.50s setup    tests/a.py::t\n3.00s call     tests/b.py::u[x]\n"
    assert list(slowest.module_seconds(report).items()) == [("tests/b.py", 3.0), ("tests/a.py", 2.0)]
    known = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert known and all((ROOT / module).is_file() for module in known), [m for m in known if not (ROOT / m).is_file()]
    assert list(known.values()) == sorted(known.values(), reverse=True)
