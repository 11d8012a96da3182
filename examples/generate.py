"""Generate images through the app's API with gradio_client, printing progress, and save them.

    python examples/generate.py [--url http://127.0.0.1:7860/] [--prompt "..."] [--out generated/]

Start the app first (`python app.py`). Every parameter of /generate but the prompt has a default;
this script sets the ones people change most.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from gradio_client import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7860/")
    parser.add_argument("--prompt", default="a yellow star on a purple background")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("generated"))
    args = parser.parse_args(argv)

    client = Client(args.url, verbose=False)
    job = client.submit(prompt=args.prompt, seed=args.seed, randomize_seed=False, num_inference_steps=args.steps,
                        num_images=args.images, api_name="/generate")
    # Each streamed output is (gallery, info); info["status"] is "waiting", "running" or "done".
    for _gallery, info in job:
        if info.get("status") == "waiting":
            print(f"waiting for the GPU: {info['ahead']} ahead", flush=True)
        elif info.get("status") == "running":
            print(f"step {info['step']}/{info['total']}", flush=True)
    # A bad field is refused when the job joins the queue: gradio_client.exceptions.ValidationError
    # names the field and its range. A job that fails on the server raises AppError with its message.
    gallery, info = job.result()
    args.out.mkdir(parents=True, exist_ok=True)
    for k, item in enumerate(gallery):
        target = args.out / f"{info['request_id']}-{k}-seed{info['seeds'][k]}.png"
        shutil.copyfile(item["image"], target)  # the PNG carries its parameters in text chunks
        print(f"saved {target}")
    took = info["timings"]["finalize_end"] - info["timings"]["received"]
    print(f"done in {took:.2f} s (inference {info['durations_ms']['inference']:.0f} ms, batch of {info['batch_size']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
