"""Submit several jobs at once through gradio_client, cancel one, and collect the others.

    python examples/concurrent_jobs.py [--url http://127.0.0.1:7860/] [--jobs 4] [--cancel 1]

The app runs one inference at a time (compatible waiting requests may share it) and keeps the rest
in line; a cancelled job leaves the line at once, or stops at its next denoising step if it was
already running, and the others are not affected.
"""

from __future__ import annotations

import argparse
import time

from gradio_client import Client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7860/")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--cancel", type=int, default=1, help="which job to cancel (0-based)")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)

    # One Client per job, as separate users would have: jobs of one Client share its session, and
    # cancelling one of them there can leave the others' results waiting (gradio_client 2.7).
    clients = [Client(args.url, verbose=False) for _ in range(args.jobs)]
    prompts = ["a red circle on a blue background", "a yellow star on a purple background",
               "a green triangle on a yellow background", "a blue square on a white background"]
    jobs = [clients[k].submit(prompt=prompts[k % len(prompts)], seed=k, randomize_seed=False,
                          num_inference_steps=args.steps, api_name="/generate") for k in range(args.jobs)]
    time.sleep(0.5)  # let them join the queue
    jobs[args.cancel].cancel()
    print(f"job {args.cancel}: cancelled")
    for k, job in enumerate(jobs):
        if k == args.cancel:
            continue
        gallery, info = job.result()
        print(f"job {k}: {len(gallery)} image(s), seed {info['seed']}, waited "
              f"{info['durations_ms']['gpu_wait']:.0f} ms for the GPU, batch of {info['batch_size']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
