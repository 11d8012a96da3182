"""The physical limit: the raw pipeline called serially in-process on the same requests.

    python -m bench.raw [--device cpu] [--model PATH] [--threads 1]

Loads the pipeline once, then serves runs on stdin, one JSON line each:
``{"size": 128, "steps": 20, "n": 4, "first": 0, "batch": 1}`` runs ``n`` requests of ``batch``
images, one after another, and answers ``{"seconds": ..., "images": ...}``. A persistent process
lets the benchmark interleave raw and app rounds finely: these machines drift by +-25% within a
minute, so a reference measured minutes apart from the app is not a reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="")
    args = parser.parse_args()

    import torch
    from diffusers import DiffusionPipeline

    from pipeline.default_model import ensure_default_model

    torch.set_num_threads(args.threads)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    pipe = DiffusionPipeline.from_pretrained(args.model or str(ensure_default_model()), dtype=dtype).to(args.device)
    pipe.set_progress_bar_config(disable=True)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def call(size: int, steps: int, k: int, batch: int) -> None:
        with torch.inference_mode():
            pipe(
                [f"a red circle {k}"] * batch,
                num_inference_steps=steps,
                width=size,
                height=size,
                generator=[torch.Generator().manual_seed(k + i) for i in range(batch)],
            )

    call(64 if args.device == "cpu" else 256, 1, -1, 1)  # warm-up, as the app warms up at load
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        size, steps, batch = int(req["size"]), int(req["steps"]), int(req.get("batch", 1))
        if req.get("warm"):  # this size and batch once, briefly: allocations, not steps
            call(size, min(steps, 2), -1, batch)
        sync()
        t0 = time.perf_counter()
        for k in range(int(req["n"])):
            call(size, steps, int(req.get("first", 0)) + k, batch)
        sync()
        seconds = time.perf_counter() - t0
        print(json.dumps({"seconds": seconds, "images": int(req["n"]) * batch}), flush=True)


if __name__ == "__main__":
    main()
