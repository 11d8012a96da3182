"""ControlNet per member (issue 51), in process, on the embedded model and its ControlNet: what a map costs
and what sharing a loop buys, side by side in one run.

    python -m bench.control [--rounds 5] [--json PATH]

Through the app's own step-level loop (``DiffusersModel.open_loop``), 64 px, 20 steps, guidance 4,
rounds alternating the order:

- **one request**: without a control (the loop's path with no map: the code before this issue), with
  the ``shapes`` ControlNet, and the raw ``StableDiffusionControlNetPipeline`` call: seconds and ratios;
- **8 callers**: four with maps (each its own disc) and four without, in one loop (this design), against
  the naive designs: one request at a time, and a loop per kind (the controlled ones, then the others),
  as a server that keys its batches by the ControlNet would: images a second.

No thresholds: figures for ``docs/performance.md#controlnet``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from bench.step_cache import run_loop

STEPS = 20


def disc(cx: float) -> Image.Image:
    image = Image.new("RGB", (64, 64), "black")
    ImageDraw.Draw(image).ellipse([cx * 64 - 11, 21, cx * 64 + 11, 43], fill="white")
    return image


def job(rid: str, seed: int, where: float | None, guidance: float) -> Any:
    from pipeline.protocol import InferenceJob

    control = (("control", "shapes" if where is not None else "none"),)
    return InferenceJob(request_id=rid, prompts=("a red circle on a blue background",), negative_prompts=("",),
                        seeds=(seed,), width=64, height=64, num_inference_steps=STEPS, guidance_scale=guidance,
                        joinable=True, options=control, controls=(disc(where),) if where is not None else ())  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch
    from diffusers import StableDiffusionControlNetPipeline

    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    model: Any = load_model(Settings(), warmup=False)
    guidance = model.profile.default_guidance
    raw = StableDiffusionControlNetPipeline.from_pipe(model.pipe, controlnet=model.controlnets["shapes"])
    raw.set_progress_bar_config(disable=True)
    run_loop(model, [job("warm", 0, 0.3, guidance), job("warm2", 1, None, guidance)])  # first calls aside

    def raw_call(seed: int) -> None:
        with torch.inference_mode():
            raw("a red circle on a blue background", image=disc(0.3), num_inference_steps=STEPS,
                guidance_scale=guidance, width=64, height=64, generator=torch.Generator().manual_seed(seed))  # fmt: skip

    def timed(fn: Any) -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    one: dict[str, list[float]] = {"no control": [], "control": [], "raw ControlNet pipeline": []}
    eight: dict[str, list[float]] = {"one loop, mixed": [], "one at a time": [], "a loop per kind": []}
    for r in range(args.rounds):
        singles = [("no control", lambda: run_loop(model, [job("n", r, None, guidance)])),
                   ("control", lambda: run_loop(model, [job("c", r, 0.3, guidance)])),
                   ("raw ControlNet pipeline", lambda: raw_call(r))]  # fmt: skip
        for name, fn in singles if r % 2 == 0 else reversed(singles):
            one[name].append(timed(fn))
        callers = [job(f"k{i}", r * 10 + i, (0.25 + 0.5 * (i % 2)) if i < 4 else None, guidance) for i in range(8)]
        designs = [("one loop, mixed", lambda: run_loop(model, callers)),
                   ("one at a time", lambda: [run_loop(model, [c]) for c in callers]),
                   ("a loop per kind", lambda: (run_loop(model, callers[:4]), run_loop(model, callers[4:])))]  # fmt: skip
        for name, fn in designs if r % 2 == 0 else reversed(designs):
            eight[name].append(timed(fn))
    base = statistics.median(one["no control"])
    shared = statistics.median(eight["one loop, mixed"])
    result = {
        "model": model.profile.name, "cores": os.cpu_count(), "steps": STEPS, "size": 64, "rounds": args.rounds,
        "one_request": {k: {"median_s": round(statistics.median(v), 4),
                            "vs_no_control": round(statistics.median(v) / base, 2)} for k, v in one.items()},
        "eight_callers": {k: {"images_per_s": round(8 / statistics.median(v), 2),
                              "vs_one_loop": round(statistics.median(v) / shared, 2)} for k, v in eight.items()},
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
