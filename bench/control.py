"""ControlNet per member (issue 51), in process, on the embedded model and its ControlNet (or a family's
tiny build with a random-weight ControlNet, ``--family``): what a map costs and what sharing a loop buys,
side by side in one run.

    python -m bench.control [--rounds 5] [--json PATH]
    python -m bench.control --family flux-dev [--steps 8]   # FLUX.1's loop (tests/families.py builds)
    python -m bench.control --model SD15_FOLDER --device cuda --size 512   # bench/gpu.sh's control step

Through the app's own step-level loop (``DiffusersModel.open_loop``), 64 px, 20 steps, rounds
alternating the order:

- **one request**: without a control (the loop's path with no map: the code before this issue), with
  the ControlNet, and the raw ControlNet pipeline call (the family's, ``from_pipe``): seconds and ratios;
- **8 callers**: four with maps (each its own disc) and four without, in one loop (this design), against
  the naive designs: one request at a time; a loop per kind (the controlled ones, then the others), as a
  server that keys its batches by the ControlNet would; and the controlled ones as one whole call of the
  ControlNet pipeline beside a loop of the others (what FLUX.1 ran before its loop ran a ControlNet per
  member): images a second.

With ``--model`` (an SD 1.x folder: ``bench.sd15``'s full-size build on a lent GPU) the ControlNet is
built from its UNet (``ControlNetModel.from_unet``: the real SD 1.5 ControlNet's architecture, random
weights) into a temporary folder and loaded as ``--controlnet`` is; the device is synchronised around
every timing.

No thresholds: figures for ``docs/performance.md#controlnet``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from bench.report import publish
from bench.step_cache import run_loop

STEPS = 20
SIZE = 64
NAME = "shapes"  # the control's name: the embedded model's own, "tiny" (``--family``) or "sd15" (``--model``)


@dataclass
class Queued:
    """What ``scheduler.call_job`` reads of a line's entry: its request's job and its image count."""

    job: Any
    images: int = 1

    @property
    def request(self) -> Queued:
        return self

    def to_job(self) -> Any:
        return self.job


def disc(cx: float) -> Image.Image:
    image = Image.new("RGB", (SIZE, SIZE), "black")
    r = SIZE * 11 / 64
    ImageDraw.Draw(image).ellipse([cx * SIZE - r, SIZE / 2 - r, cx * SIZE + r, SIZE / 2 + r], fill="white")
    return image


def job(rid: str, seed: int, where: float | None, guidance: float) -> Any:
    from pipeline.protocol import InferenceJob

    control = (("control", NAME if where is not None else "none"),)
    return InferenceJob(request_id=rid, prompts=("a red circle on a blue background",), negative_prompts=("",),
                        seeds=(seed,), width=SIZE, height=SIZE, num_inference_steps=STEPS, guidance_scale=guidance,
                        joinable=True, options=control, controls=(disc(where),) if where is not None else ())  # fmt: skip


def controlnet_from_unet(model: str, out: Path) -> Path:
    """``ControlNetModel.from_unet`` of the folder's UNet (random weights stay random), saved in fp16."""
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(model, subfolder="unet")
    ControlNetModel.from_unet(unet).to(torch.float16).save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str] | None = None) -> None:
    global NAME, STEPS, SIZE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--family", default=None, help="a tiny build of tests/families.py, with a random ControlNet")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--model", default=None, help="an SD 1.x folder: its ControlNet built from its UNet")
    parser.add_argument("--device", default=None)
    parser.add_argument("--size", type=int, default=SIZE)
    args = parser.parse_args(argv)
    STEPS, SIZE = args.steps, args.size

    import torch

    from pipeline.config import Settings
    from pipeline.engine.model.controls import control_pipeline
    from pipeline.engine.model.loading import load_model
    from pipeline.serving.scheduler import call_job

    settings = Settings(device=args.device or "auto")
    if args.model:
        import tempfile

        NAME = "sd15"
        built = controlnet_from_unet(args.model, Path(tempfile.mkdtemp(prefix="controlnet-")))
        settings = Settings(model=args.model, device=args.device or "auto", controlnets=(f"sd15={built}",))
    elif args.family:
        from tests.families import built_controlnet, built_family

        NAME = "tiny"
        settings = Settings(model=str(built_family(args.family)), device="cpu",
                            controlnets=(f"tiny={built_controlnet(args.family)}",))  # fmt: skip
    model: Any = load_model(settings, warmup=False)
    guidance = model.profile.default_guidance
    raw = control_pipeline(model.pipe, "text", model.controlnets[NAME])
    taken = "control_image" if "control_image" in inspect.signature(raw.__call__).parameters else "image"
    run_loop(model, [job("warm", 0, 0.3, guidance), job("warm2", 1, None, guidance)])  # first calls aside

    def raw_call(seed: int) -> None:
        with torch.inference_mode():
            raw("a red circle on a blue background", **{taken: disc(0.3)}, num_inference_steps=STEPS,
                guidance_scale=guidance, width=SIZE, height=SIZE, generator=torch.Generator().manual_seed(seed))  # fmt: skip

    def whole_call(jobs: list[Any]) -> Any:
        queued: list[Any] = [Queued(j) for j in jobs]  # what call_job reads of the line's entries
        return model.generate(call_job(queued), threading.Event(), lambda *_: None)

    cuda = str(model.profile.device).startswith("cuda")

    def timed(fn: Any) -> float:
        if cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    one: dict[str, list[float]] = {"no control": [], "control": [], "raw ControlNet pipeline": []}
    eight: dict[str, list[float]] = {"one loop, mixed": [], "one at a time": [], "a loop per kind": [],
                                     "a whole call for the controlled": []}  # fmt: skip
    for r in range(args.rounds):
        singles = [("no control", lambda: run_loop(model, [job("n", r, None, guidance)])),
                   ("control", lambda: run_loop(model, [job("c", r, 0.3, guidance)])),
                   ("raw ControlNet pipeline", lambda: raw_call(r))]  # fmt: skip
        for name, fn in singles if r % 2 == 0 else reversed(singles):
            one[name].append(timed(fn))
        callers = [job(f"k{i}", r * 10 + i, (0.25 + 0.5 * (i % 2)) if i < 4 else None, guidance) for i in range(8)]
        designs = [("one loop, mixed", lambda: run_loop(model, callers)),
                   ("one at a time", lambda: [run_loop(model, [c]) for c in callers]),
                   ("a loop per kind", lambda: (run_loop(model, callers[:4]), run_loop(model, callers[4:]))),
                   ("a whole call for the controlled", lambda: (whole_call(callers[:4]), run_loop(model, callers[4:])))]  # fmt: skip
        for name, fn in designs if r % 2 == 0 else reversed(designs):
            eight[name].append(timed(fn))
    base = statistics.median(one["no control"])
    shared = statistics.median(eight["one loop, mixed"])
    result = {
        "model": f"{args.family} (tiny build, random weights)" if args.family else model.profile.name,
        "family": args.family or ("sd 1.x, its ControlNet from its UNet" if args.model else "embedded"), "cores": os.cpu_count(), "steps": STEPS,
        "size": SIZE, "device": str(model.profile.device), "rounds": args.rounds,
        "one_request": {k: {"median_s": round(statistics.median(v), 4),
                            "vs_no_control": round(statistics.median(v) / base, 2)} for k, v in one.items()},
        "eight_callers": {k: {"images_per_s": round(8 / statistics.median(v), 2),
                              "vs_one_loop": round(statistics.median(v) / shared, 2)} for k, v in eight.items()},
    }  # fmt: skip
    publish(result, args.json)


if __name__ == "__main__":
    main()
