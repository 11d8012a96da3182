"""The suite's slowest tests in ``docs/testing.md``, from pytest's own ``--durations`` report.

    python -m tools.slowest               # run the whole suite with --durations=0 and rewrite both
    python -m tools.slowest LOG           # rewrite them from a saved run's output (``pytest --durations=0``)
    python -m tools.slowest --check       # exit 1 if the table's rows are not in the doc's own format

The table sits between ``<!-- slowest -->`` and ``<!-- /slowest -->``: one row a test phase (setup,
call or teardown, as pytest reports it), its seconds and its node id, the slowest 20.

``tests/durations.json`` holds each test module's seconds from the same report: ``tests/conftest.py``
hands the modules to pytest-xdist's workers longest first, so that no long module starts last and
runs alone while the other workers idle. A module missing from it (a new one) goes last, in its place.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
MODULES = ROOT / "tests" / "durations.json"
START, END = "<!-- slowest -->", "<!-- /slowest -->"
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)\s*$")
COUNT = 20


def slowest(report: str, count: int = COUNT) -> list[tuple[float, str, str]]:
    """(seconds, phase, node id) of the slowest ``count`` phases in a pytest ``--durations`` report."""
    rows = [(float(m[1]), m[2], m[3]) for line in report.splitlines() if (m := LINE.match(line))]
    return sorted(rows, key=lambda row: -row[0])[:count]


def module_seconds(report: str) -> dict[str, float]:
    """Each test module's seconds (every phase of every test summed) in a ``--durations=0`` report, longest first."""
    seconds: dict[str, float] = {}
    for line in report.splitlines():
        if m := LINE.match(line):
            module = m[3].split("::", 1)[0]
            seconds[module] = seconds.get(module, 0.0) + float(m[1])
    return {module: round(s, 1) for module, s in sorted(seconds.items(), key=lambda item: -item[1])}


def table(rows: list[tuple[float, str, str]]) -> str:
    lines = ["| seconds | phase | test |", "|---:|---|---|"]
    lines += [f"| {seconds:.1f} | {phase} | `{node}` |" for seconds, phase, node in rows]
    return "\n".join(lines)


def rewrite(rows: list[tuple[float, str, str]]) -> None:
    text = DOC.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{table(rows)}\n{END}{tail}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        section = DOC.read_text().split(START, 1)[1].split(END, 1)[0]
        lines = section.strip().splitlines()[2:]
        if not lines or not all(re.match(r"^\| \d+\.\d \| (setup|call|teardown) \| `tests/\S+` \|$", r) for r in lines):
            print("docs/testing.md: the slowest tests' table is missing or not in its format")
            raise SystemExit(1)
        return
    if args:
        report = Path(args[0]).read_text()
    else:
        run = [sys.executable, "-m", "pytest", "-q", "--durations=0"]
        report = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=False).stdout
    found = slowest(report)
    if not found:
        raise SystemExit("no durations in the report: run pytest with --durations=N")
    rewrite(found)
    modules = module_seconds(report)
    MODULES.write_text(json.dumps(modules, indent=1) + "\n")
    print(
        f"wrote the {len(found)} slowest tests into {DOC.relative_to(ROOT)}, {len(modules)} modules' seconds into "
        f"{MODULES.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
