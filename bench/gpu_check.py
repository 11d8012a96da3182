"""``bash bench/gpu.sh --check``: whether the GPU script is ready for the bare lent machine, checked here.

Without a GPU, in a few seconds: the carry (``bench.carry``) holds every wheel the steps need and the
device image lacks, one version of each, within the size limit; the wheels install with
``--no-index`` into a fresh target for CPython 3.12 on Linux, as the device call does; every module
each step imports imports (here, on this machine's packages); and the steps' minimum times fit the
script's budget. One line for each thing missing; exit 0 when ready.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import carry

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu.sh"
# What each step of gpu.sh imports, beyond torch.
STEP_IMPORTS = {
    "build": ("bench.sd15", "diffusers", "transformers"),
    "compile": ("numpy", "pipeline.config", "pipeline.engine.model.loading", "pipeline.engine.model.speedups"),
    "modes": ("numpy", "PIL", "pipeline.protocol", "pipeline.engine.model.modes"),
    "bench": ("bench.__main__", "gradio", "gradio_client"),
    "page": ("bench.page",),
    "lora": ("bench.lora", "peft"),
    "fast": ("bench.fast", "isal", "httptools", "uvicorn"),
    "cache": ("bench.gpu_cache", "bench.step_cache", "pipeline.engine.loop.step_cache"),
    "openloop": ("bench.openloop", "bench.servers", "httpx"),
    "control": ("bench.control", "bench.step_cache", "pipeline.engine.loop.control"),
}


def carry_problems() -> list[str]:
    if not carry.CARRY.is_dir():
        return [f"missing: the carry ({carry.CARRY.name}/); run python -m bench.carry"]
    problems = carry.missing()
    size = sum(p.stat().st_size for _v, p in carry.carried().values()) / 2**20 + carry.tree_mib()
    if size > carry.LIMIT_MIB:
        problems.append(f"too large: the tree and the wheels are {size:.1f} MiB, over {carry.LIMIT_MIB} MiB")
    return problems


def install_problems() -> list[str]:
    wheels = [str(p) for _v, p in carry.carried().values()] if carry.CARRY.is_dir() else []
    if not wheels:
        return []
    platforms = [arg for p in carry.PLATFORMS for arg in ("--platform", p)]
    with tempfile.TemporaryDirectory() as target:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platforms,
               "--target", target, *wheels]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
    return [] if done.returncode == 0 else [f"the carry does not install: {done.stderr.strip()[-400:]}"]


def import_problems() -> list[str]:
    problems = []
    for step, modules in STEP_IMPORTS.items():
        for module in modules:
            code = f"import {module}"
            done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                problems.append(f"step {step}: cannot import {module}: {last}")
    return problems


def budget_problems(script: str | None = None) -> list[str]:
    """The default steps' minimum seconds (``step``/``gpu_step NAME CAP MIN``; each fast plan 30) against
    the budget (the steps run on request, ``STEPS=...``, are a call of their own)."""
    text = script if script is not None else SCRIPT.read_text()
    budget = int(re.search(r"GPU_SH_BUDGET_S:-(\d+)", text)[1])  # type: ignore[index]
    default = re.search(r'steps="\$\{STEPS:-([^}]+)\}"', text)[1].split()  # type: ignore[index]
    mins = {m[1]: int(m[3]) for m in re.finditer(r"\b(?:gpu_)?step (\w+) (\d+) (\d+)", text) if m[1] in default}
    fast = re.search(r"for plan in ([^;]+);", text)
    plans = len(fast[1].split()) if fast and "fast" in default else 0
    total = sum(mins.values()) + 30 * plans
    if total > budget:
        return [f"the steps' minimum times add up to {total} s, over the budget of {budget} s"]
    return []


def main() -> int:
    problems = carry_problems() + install_problems() + import_problems() + budget_problems()
    for line in problems:
        print(line)
    print("gpu.sh --check:", "ready" if not problems else f"{len(problems)} thing(s) missing")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
