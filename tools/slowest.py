"""The suite's slowest tests in ``docs/testing.md``, from pytest's own ``--durations`` report.

    python -m tools.slowest               # run the whole suite with --durations=20 and rewrite the table
    python -m tools.slowest LOG           # rewrite it from a saved run's output (``pytest --durations=N``)
    python -m tools.slowest --check       # exit 1 if the table's rows are not in the doc's own format

The table sits between ``<!-- slowest -->`` and ``<!-- /slowest -->``: one row a test phase (setup,
call or teardown, as pytest reports it), its seconds and its node id, the slowest 20.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "testing.md"
START, END = "<!-- slowest -->", "<!-- /slowest -->"
LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)\s*$")
COUNT = 20


def slowest(report: str, count: int = COUNT) -> list[tuple[float, str, str]]:
    """(seconds, phase, node id) of the slowest ``count`` phases in a pytest ``--durations`` report."""
    rows = [(float(m[1]), m[2], m[3]) for line in report.splitlines() if (m := LINE.match(line))]
    return sorted(rows, key=lambda row: -row[0])[:count]


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
        run = [sys.executable, "-m", "pytest", "-q", f"--durations={COUNT}"]
        report = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, check=False).stdout
    found = slowest(report)
    if not found:
        raise SystemExit("no durations in the report: run pytest with --durations=N")
    rewrite(found)
    print(f"wrote the {len(found)} slowest tests into {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
