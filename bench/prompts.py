"""The cost of reading prompts as AUTOMATIC1111 does (issue 49), in process, on the embedded model.

    python -m bench.prompts [--rounds 200] [--json PATH]

Each round times, in turn (the order reversed every other round, so the machine's drift falls on
all alike): the pipeline's own ``encode_prompt`` on a plain prompt and its negative (what the app ran
before issue 49), ``PromptEncoder.encode`` on the same texts, on a weighted prompt, on a prompt of
two chunks, and the serving side's ``validate`` of a plain request (its emphasis check and the job's
texts). And one SD loop step whose members' prompts take one and two chunks: one masked call (what
the app does) against a loop per chunk count (``loop_step_cases``). Reported: the median and
quartiles in milliseconds, and each one's median ratio, in the same round, to ``encode_prompt`` (the
loop step: to a loop per count). No thresholds: figures for ``docs/performance-history.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

PLAIN = "a red circle on a blue background"
WEIGHTED = "a (red:1.3) circle on a [blue] background, ((simple))"
TWO_CHUNKS = ", ".join([PLAIN] + [f"simple flat shape {i}" for i in range(11)])


def cases() -> dict[str, Callable[[], Any]]:
    from pipeline import fields
    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model
    from pipeline.request import limits_for, validate

    model: Any = load_model(Settings(), warmup=False)
    encoder, pipe = model.prompt_encoder, model.pipe
    limits = limits_for(Settings(), model.profile)
    raw = {**fields.defaults(), "prompt": PLAIN, "negative_prompt": "blurry", "seed": 1, "randomize_seed": False,
           "width": 64, "height": 64, "num_inference_steps": 20, "guidance_scale": 5.0, "num_images": 1,
           "live_preview": False, "scheduler": "default"}  # fmt: skip

    def diffusers() -> Any:
        return pipe.encode_prompt([PLAIN], "cpu", 1, True, ["blurry"])

    def ours(text: str) -> Callable[[], Any]:
        return lambda: encoder.encode([text], ["blurry"], "Original", model.execution_device)

    loop = loop_step_cases(model)
    return {
        **loop,
        "encode_prompt (before)": diffusers,
        "plain": ours(PLAIN),
        "weighted": ours(WEIGHTED),
        "two chunks": ours(TWO_CHUNKS),
        "validate (serving side)": lambda: validate(raw, limits).to_job(),
    }


def loop_step_cases(model: Any) -> dict[str, Callable[[], Any]]:
    """One SD loop step of four rows (two members with guidance) whose prompts take one and two chunks:
    one denoiser call, the shorter padded and masked (``loop_sd.stacked_texts``: what the app does),
    against a loop per chunk count (two calls, each its own length)."""
    from pipeline.engine.loop.loop_sd import stacked_texts, text_pooled_per_row

    unet = model.pipe.unet
    generator = torch.Generator().manual_seed(0)
    side = model.profile.default_width // model.pipe.vae_scale_factor
    x = torch.randn(4, unet.config.in_channels, side, side, generator=generator)
    t = torch.full((4,), 500)
    width = unet.config.cross_attention_dim
    one, two = torch.randn(2, 77, width, generator=generator), torch.randn(2, 154, width, generator=generator)

    def masked() -> Any:
        texts, mask = stacked_texts([one, two])
        with text_pooled_per_row(unet, mask):
            return unet(x, t, encoder_hidden_states=texts, encoder_attention_mask=mask).sample

    def keyed() -> Any:
        return unet(x[:2], t[:2], encoder_hidden_states=one).sample, unet(
            x[2:], t[2:], encoder_hidden_states=two
        ).sample

    return {"loop step: masked, one call": masked, "loop step: a loop per count": keyed}


def run(rounds: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    named = cases()
    times: dict[str, list[float]] = {name: [] for name in named}
    ratios: dict[str, list[float]] = {name: [] for name in named}
    with torch.inference_mode():
        for fn in named.values():  # warm
            fn()
        for r in range(rounds):
            order = list(named) if r % 2 == 0 else list(reversed(named))
            this: dict[str, float] = {}
            for name in order:
                t0 = time.perf_counter()
                named[name]()
                this[name] = (time.perf_counter() - t0) * 1000
            for name, ms in this.items():
                base = this["loop step: a loop per count" if name.startswith("loop") else "encode_prompt (before)"]
                times[name].append(ms)
                ratios[name].append(ms / base)
    return {
        "rounds": rounds,
        "threads": 1,
        "ms": {name: _quartiles(v) for name, v in times.items()},
        # the encodings' ratio to encode_prompt; the loop steps' to a loop per chunk count
        "ratio_to_encode_prompt": {name: round(statistics.median(v), 3) for name, v in ratios.items()},
    }


def _quartiles(values: list[float]) -> dict[str, float]:
    q1, med, q3 = statistics.quantiles(values, n=4)
    return {"median": round(med, 3), "q1": round(q1, 3), "q3": round(q3, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.rounds)
    for name, q in result["ms"].items():
        ratio = result["ratio_to_encode_prompt"][name]
        print(f"{name:26s} {q['median']:8.3f} ms  [{q['q1']:.3f}-{q['q3']:.3f}]  x{ratio:.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
