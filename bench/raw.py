"""The physical limit: the raw pipeline called serially in-process on the same requests."""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from diffusers import DiffusionPipeline

    from pipeline.default_model import ensure_default_model

    torch.set_num_threads(args.threads)
    pipe = DiffusionPipeline.from_pretrained(str(ensure_default_model()))
    pipe.set_progress_bar_config(disable=True)

    def call(k: int) -> None:
        with torch.inference_mode():
            pipe(f"a red circle {k}", num_inference_steps=args.steps, width=args.size, height=args.size,
                 generator=[torch.Generator().manual_seed(k)])

    call(-1)  # warm-up, as the app warms up at load
    t0 = time.perf_counter()
    for k in range(args.n):
        call(k)
    print(json.dumps({"images_per_second": args.n / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
