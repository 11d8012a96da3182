"""``bench/results/INDEX.md``: one line a published benchmark run (date, commit, machine, headline).

    python -m tools.bench_index          # rewrite the index from the JSON files
    python -m tools.bench_index --check  # exit 1 if the index is not what the files say (tests/unit/test_layout.py)

The commit is the one that published the file (``git log --follow``: the run measured its parent's
code, or the tree named in the file). The machine is what the file records (``cores``, ``machine``,
``versions``), else the 2-core CPU machine every run here was made on. The headline is the figure
the run was made for, read by the run's kind; the dated discussion is in ``docs/performance-history.md``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "INDEX.md"


def _f(x: Any, fmt: str = ".2f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def _full(d: dict[str, Any]) -> str:
    over = d.get("overhead", {})
    ratios = ", ".join(f"{size} px {_f(v.get('throughput_ratio'))}" for size, v in over.items() if isinstance(v, dict))
    gated = d.get("designs", {}).get("gated", {})
    return f"app / raw images/s: {ratios}; gated {_f(gated.get('images_per_second'))} img/s"


def _openloop(d: dict[str, Any]) -> str:
    return "open-loop arrivals: " + ", ".join(f"{s.get('model', '?')} {s.get('size', '?')} px" for s in d["sections"])


def _cpu(d: dict[str, Any]) -> str:
    return "server CPU per request, alternated: " + ", ".join(
        f"{name} {_f(c.get('median'), '.1f')} ms" for name, c in d["configs"].items() if isinstance(c, dict)
    )


def _fast(d: dict[str, Any]) -> str:
    return "fast device: " + ", ".join(
        f"{r['profile']} ×{r['clients']} {_f(r.get('images_per_second'), '.1f')} img/s" for r in d["rows"][:4]
    )


def _page(d: dict[str, Any]) -> str:
    return "page / API server CPU: " + ", ".join(
        f"{s['section']} {_f(s.get('page_over_api_server_cpu'))}" for s in d["sections"]
    )


def _lora(d: dict[str, Any]) -> str:
    return (f"img/s single {_f(d['single']['images_per_second'])}, mixed {_f(d['mixed']['images_per_second'])}, "
            f"separate {_f(d['mixed-separate']['images_per_second'])}; switch {_f(d['switch']['other_adapter_ms'])} ms")  # fmt: skip


def _fairness(d: dict[str, Any]) -> str:
    light = [r["total_ms"] for r in d.get("light_requests", [])]
    return f"{d['heavy']} heavy + {d['light']} light: light total {max(light) if light else '-'} ms at most"


def _ray(d: dict[str, Any]) -> str:
    return f"ray2 / ray1 {_f(d.get('ray2_over_ray1'))}, ray1 / local {_f(d.get('ray1_over_local'))}"


def _imagejoin(d: dict[str, Any]) -> str:
    r = d["step_over_job"]
    return f"img2img into a text loop, step / job: late wait {_f(r['late_wait'])}x, mixed img/s {_f(r['mixed_throughput'])}x"


def _hostile(d: dict[str, Any]) -> str:
    rows = d["designs"]
    parts = [f"{name}: /health worst {max(r['health_worst_s'] for r in by.values()):.2f} s, "
             f"bystander {max(r['victim_over_idle'] for r in by.values()):.1f}x idle" for name, by in rows.items()]  # fmt: skip
    return "hostile round three, worst over the attacks: " + "; ".join(parts)


def _gpu(d: dict[str, Any]) -> str:
    if "compiled" in d:
        row = d["compiled"].get("512px_20steps", {})
        return f"--compile / eager at 20 steps {_f(row.get('speedup'))}x; loop join/leave recompiles {d['compiled'].get('loop_join_leave', {}).get('recompiles', '-')}"
    rows = d.get("rows", {})
    return "modes, median s: " + ", ".join(f"{name} {_f(r.get('median_s'))}" for name, r in rows.items())


def _what(d: dict[str, Any]) -> str:
    return str(d.get("what", ""))[:110]


def _step_cache(d: dict[str, Any]) -> str:
    one, q = d["one_request_20_steps"], d["quality"]
    return (f"step cache, one request at 20 steps: taylorseer {_f(one['taylorseer']['speedup_vs_off'])}x, reuse "
            f"{_f(one['reuse']['speedup_vs_off'])}x; shape {_f(100 * q['off']['all']['shape'], '.1f')} % off, "
            f"{_f(100 * q['taylorseer']['all']['shape'], '.1f')} % taylorseer")  # fmt: skip


def _control(d: dict[str, Any]) -> str:
    one, eight = d["one_request"], d["eight_callers"]
    return (f"ControlNet: one request {_f(one['control']['vs_no_control'])}x a plain one (raw pipeline "
            f"{_f(one['raw ControlNet pipeline']['vs_no_control'])}x); 8 mixed callers "
            f"{_f(eight['one loop, mixed']['images_per_s'])} img/s in one loop, "
            f"{_f(eight['one at a time']['images_per_s'])} one at a time")  # fmt: skip


def _models(d: dict[str, Any]) -> str:
    t = d["traffic"]
    return (f"two models: a switch {_f(d['switch_ms']['from CPU memory'])} ms from CPU memory, a load from disk "
            f"{_f(d['load_from_disk_ms'])} ms; alternating callers {_f(t['two models, this design']['images_per_s'])} "
            f"img/s ({_f(t['two models, this design']['switches'])} switches) against one model's "
            f"{_f(t['one model']['images_per_s'])}, one at a time {_f(t['two models, one at a time']['images_per_s'])}")  # fmt: skip


HEADLINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "bench-full": _full, "bench-quick": _full, "bench-openloop": _openloop, "bench-cpu": _cpu,
    "bench-fast": _fast, "bench-page": _page, "bench-lora": _lora, "bench-fairness": _fairness,
    "bench-ray": _ray, "bench-loadgen": _what, "ab-fast": _what, "gpu-h200": _gpu,
    "bench-imagejoin": _imagejoin, "bench-hostile": _hostile, "bench-step": _step_cache, "bench-control": _control,
    "bench-models": _models,
}  # fmt: skip


def kind_of(name: str) -> str:
    return "-".join(name.split("-")[:2])


def machine_of(d: dict[str, Any]) -> str:
    versions = d.get("versions") or {}
    machine: dict[str, Any] = d["machine"] if isinstance(d.get("machine"), dict) else {}
    cores = d.get("cores") or machine.get("cores") or versions.get("cores")
    if isinstance(d.get("device"), str):
        return f"{cores or 16} cores, CUDA {d['device']}"  # the lent device's runs (bench/gpu.sh)
    device = "CUDA" if "cuda" in json.dumps(versions).lower() and "+cpu" not in json.dumps(versions) else "CPU"
    return f"{cores or 2} cores, {device}"


def commit_of(path: Path) -> str:
    out = subprocess.run(["git", "log", "--follow", "--diff-filter=A", "--format=%h", "--", str(path)],
                         cwd=ROOT, capture_output=True, text=True).stdout.split()  # fmt: skip
    return out[-1] if out else "(uncommitted)"


def line(path: Path) -> str:
    d = json.loads(path.read_text())
    date = re.search(r"\d{4}-\d{2}-\d{2}", path.name)
    try:
        headline = HEADLINES.get(kind_of(path.name), _what)(d) if isinstance(d, dict) else ""
    except (KeyError, TypeError, AttributeError):
        headline = ""
    headline = headline or "see docs/performance-history.md"
    machine = machine_of(d) if isinstance(d, dict) else "2 cores, CPU"
    return f"| {date[0] if date else '-'} | `{path.name}` | {commit_of(path)} | {machine} | {headline} |"


def published() -> list[Path]:
    """The runs in ``bench/results/``: every JSON file there but those git ignores (a run's default
    output, ``latest.json`` or ``ray.json``, stays local: running the benchmark breaks no test)."""
    files = sorted(RESULTS.glob("*.json"))
    try:
        ignored = subprocess.run(
            ["git", "check-ignore", "--stdin"],
            input="\n".join(str(p.relative_to(ROOT)) for p in files),
            capture_output=True, text=True, cwd=ROOT, check=False,
        ).stdout.split()  # fmt: skip
    except OSError:  # no git: every file counts
        ignored = []
    return [p for p in files if str(p.relative_to(ROOT)) not in ignored]


def render() -> str:
    rows = [line(p) for p in sorted(published(), key=lambda p: (p.name[len(kind_of(p.name)) :], p.name))]
    return "\n".join([
        "# Published benchmark runs", "",
        "One line a run: when, the file, the commit that published it, the machine, and its headline. The",
        "current figures are in `docs/performance.md`; the dated discussion of each run in",
        "`docs/performance-history.md`. Rewritten by `python -m tools.bench_index`.", "",
        "| date | file | commit | machine | headline |", "|---|---|---|---|---|", *rows, "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        names = set(re.findall(r"`([^`]+\.json)`", INDEX.read_text())) if INDEX.exists() else set()
        missing = {p.name for p in published()} - names
        if missing:
            print("not in bench/results/INDEX.md:", ", ".join(sorted(missing)))
            raise SystemExit(1)
        return
    INDEX.write_text(text)
    print(f"wrote {INDEX.relative_to(ROOT)} ({text.count(chr(10)) - 8} runs)")


if __name__ == "__main__":
    main()
