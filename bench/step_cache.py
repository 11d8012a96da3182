"""Step caching per request (issue 50), in process, on the embedded model: speed and quality side by side.

    python -m bench.step_cache [--rounds 5] [--json PATH]

All through the app's own step-level loop (``DiffusersModel.open_loop``, as the server runs requests),
each method beside ``off`` in the same run (rounds alternate the order, so the machine's drift falls on
all alike):

- **one request** at 20 steps, 64 px: the loop's time per method, its ratio to ``off`` and to the raw
  pipeline's own call (``pipe(...)``), and the denoiser evaluations computed and skipped;
- **8 concurrent callers** in one loop: all ``off``, against four with ``auto`` and four ``off`` (the
  mixed load a server sees), and all ``auto``: images a second;
- **FLUX.1-dev at its real width** (``wide_flux``: 3072 wide, 1 + 2 of its blocks, random weights, 512
  T5 tokens as its call pads them, 64 px), one request at 20 steps per method, with ``fbcache``'s
  hit rate (random weights: its threshold decides little; a trained model's rate is what counts),
  and the 8 callers' three loads there at 10 steps (``--flux-callers-steps``);
- **quality**: the default model's evaluation (``pipeline.default_model.evaluate``: background,
  foreground and shape scored from the pixels, held-out and seen combinations, two seeds) per method,
  and each picture's mean difference from the same request uncached (1/255 units).

No thresholds: figures for ``docs/performance.md#step-caching``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import publish

METHODS = ("off", "taylorseer", "reuse")
STEPS = 20


def cache_job(rid: str, prompt: str, seed: int, cache: str, guidance: float, steps: int = STEPS, size: int = 64) -> Any:
    """One image of ``prompt`` with ``cache`` as its step cache, joinable (a loop member)."""
    from pipeline.protocol import InferenceJob

    return InferenceJob(request_id=rid, prompts=(prompt,), negative_prompts=("",), seeds=(seed,), width=size,
                        height=size, num_inference_steps=steps, guidance_scale=guidance, joinable=True,
                        options=(("step_cache", cache),))  # fmt: skip


def run_loop(model: Any, jobs: list[Any]) -> tuple[dict[str, Any], float]:
    """Every job in one loop from its first step, as the server runs concurrent callers: (images by
    request id, seconds)."""
    started = time.perf_counter()
    loop = model.open_loop(jobs[0])
    slots = {job.request_id: loop.add(job) for job in jobs}
    images: dict[str, Any] = {}
    while loop.images:
        loop.step()
        done = [rid for rid, s in slots.items() if rid not in images and loop.steps_done(s) >= loop.total_steps(s)]
        if done:
            decoded = loop.decode([slots[rid] for rid in done])
            images.update({rid: decoded[slots[rid]] for rid in done})
    return images, time.perf_counter() - started


def speed(model: Any, rounds: int, guidance: float) -> dict[str, Any]:
    import torch

    from pipeline.engine.loop.step_cache import METHODS as SCHEDULES

    prompt = "a red circle on a blue background"
    times: dict[str, list[float]] = {name: [] for name in (*METHODS, "raw pipeline")}
    for r in range(rounds):
        order = list(METHODS) if r % 2 == 0 else list(reversed(METHODS))
        for name in order:
            times[name].append(run_loop(model, [cache_job("one", prompt, r, name, guidance)])[1])
        started = time.perf_counter()
        model.pipe(prompt, num_inference_steps=STEPS, guidance_scale=guidance, width=64, height=64,
                   generator=[torch.Generator().manual_seed(r)])  # fmt: skip
        times["raw pipeline"].append(time.perf_counter() - started)
    off = statistics.median(times["off"])
    one = {
        name: {
            "median_s": round(statistics.median(ts), 4),
            "speedup_vs_off": round(off / statistics.median(ts), 2),
            "evaluations": SCHEDULES[name].evaluations(STEPS) if name in SCHEDULES else STEPS,
        }
        for name, ts in times.items()
    }
    return {"one_request_20_steps": one, "eight_callers": eight_callers(model, rounds, guidance, STEPS)}


def quality(model: Any, guidance: float) -> dict[str, Any]:
    from pipeline.default_model import evaluate, shapes

    items = [(p, spec, seed) for p, spec in evaluate.prompt_set() for seed in evaluate.SEEDS]
    out: dict[str, Any] = {}
    uncached: dict[str, Any] = {}
    for name in METHODS:
        pictures: dict[str, Any] = {}
        seconds = 0.0
        for start in range(0, len(items), 16):
            batch = items[start : start + 16]
            jobs = [cache_job(f"i{start + i}", p, seed, name, guidance) for i, (p, _, seed) in enumerate(batch)]
            images, took = run_loop(model, jobs)
            pictures.update({rid: imgs[0] for rid, imgs in images.items()})
            seconds += took
        held: list[Any] = []
        seen: list[Any] = []
        diffs: list[float] = []
        for i, (_, spec, _) in enumerate(items):
            image = pictures[f"i{i}"]
            (held if spec.combo in shapes.HELD_OUT else seen).append((spec, shapes.score(image)))
            if name == "off":
                uncached[f"i{i}"] = np.asarray(image, dtype=np.float32)
            diffs.append(float(np.abs(np.asarray(image, dtype=np.float32) - uncached[f"i{i}"]).mean()))
        out[name] = {
            "all": evaluate.accuracy(held + seen),
            "held_out": evaluate.accuracy(held),
            "mean_difference_from_off": round(statistics.fmean(diffs), 2),
            "largest_difference_from_off": round(max(diffs), 2),
            "seconds": round(seconds, 2),
        }
    return out


# FLUX.1-dev at its real width (24 heads of 128: 3072), a few of its blocks (real: 19 and 38), tiny text
# encoders and VAE: the transformer dominates a step on this CPU, as it does on a GPU at full depth.
WIDE_FLUX = dict(num_layers=1, num_single_layers=2, attention_head_dim=128, num_attention_heads=24,
                 axes_dims_rope=(16, 56, 56))  # fmt: skip


def wide_flux(out: Path, **config: Any) -> Path:
    """A FLUX.1-dev pipeline folder with ``WIDE_FLUX``'s transformer (``config`` overriding its own) and
    seeded random weights."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    from tests.builds.components import clip_text, make_clip_tokenizer, make_t5_tokenizer, t5_encoder

    tokenizer, tokenizer_2 = make_clip_tokenizer(), make_t5_tokenizer(512)
    torch.manual_seed(1)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, joint_attention_dim=64, pooled_projection_dim=32,
                                         guidance_embeds=True, **{**WIDE_FLUX, **config})  # fmt: skip
    torch.manual_seed(2)
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        block_out_channels=(8, 16, 16, 16), layers_per_block=1, latent_channels=16, norm_num_groups=8,
                        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                        use_post_quant_conv=False)  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, base_image_seq_len=256, max_image_seq_len=4096,
                                                base_shift=0.5, max_shift=1.15, shift=3.0,
                                                use_dynamic_shifting=True)  # fmt: skip
    pipe: Any = FluxPipeline(scheduler=scheduler, vae=vae, tokenizer=tokenizer, tokenizer_2=tokenizer_2,
                        text_encoder=clip_text(tokenizer, 32, 32, act="quick_gelu", with_projection=False, seed=3),
                        text_encoder_2=t5_encoder(tokenizer_2, 64, seed=4), transformer=transformer)  # fmt: skip
    pipe.save_pretrained(out)
    return out


def flux_speed(rounds: int, steps: int = STEPS, callers_steps: int = 10) -> dict[str, Any]:
    """The one-request and eight-caller figures on ``wide_flux`` at 64 px (the transformer's time per
    step dominates): each method against off, the First-Block Cache's hit rate, and 8 concurrent callers
    mixed cached and uncached at ``callers_steps`` steps (0: none)."""
    import tempfile

    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        model: Any = load_model(Settings(model=str(wide_flux(Path(tmp) / "flux")), device="cpu"), warmup=False)
    guidance = model.profile.default_guidance
    prompt = "a red circle on a blue background"
    methods = ("off", "taylorseer", "reuse", "fbcache")
    times: dict[str, list[float]] = {m: [] for m in methods}
    reports: dict[str, Any] = {}
    for r in range(rounds):
        for name in methods if r % 2 == 0 else tuple(reversed(methods)):
            job = cache_job("one", prompt, r, name, guidance, steps)
            loop = model.open_loop(job)
            started = time.perf_counter()
            slot = loop.add(job)
            while loop.steps_done(slot) < loop.total_steps(slot):
                loop.step()
            loop.decode([slot])
            times[name].append(time.perf_counter() - started)
            reports[name] = dict(loop.result_fields(slot)["step_cache"]) or {"computed": steps, "skipped": 0}
    callers = eight_callers(model, rounds, guidance, callers_steps) if callers_steps else {}
    off = statistics.median(times["off"])
    out = {}
    for name in methods:
        rep = reports[name]
        total = rep["computed"] + rep["skipped"]
        out[name] = {"median_s": round(statistics.median(times[name]), 3),
                     "speedup_vs_off": round(off / statistics.median(times[name]), 2),
                     "computed": rep["computed"], "skipped": rep["skipped"],
                     "hit_rate": round(rep["skipped"] / total, 3) if total else 0.0}  # fmt: skip
    return {"model": "FLUX.1-dev, real width (3072), 1 + 2 blocks, random weights", "steps": steps, "size": 64,
            "one_request": out, "eight_callers": callers, "eight_callers_steps": callers_steps}  # fmt: skip


def eight_callers(model: Any, rounds: int, guidance: float, steps: int, size: int = 64) -> dict[str, Any]:
    """8 concurrent callers in one loop of ``model``: all off, four auto (taylorseer) beside four off, all
    auto; images a second and the ratio to all off (rounds alternate the order)."""
    prompt = "a red circle on a blue background"
    loads = (("8 off", 0), ("4 auto + 4 off", 4), ("8 auto", 8))
    mixed: dict[str, list[float]] = {label: [] for label, _ in loads}
    for r in range(rounds):
        for label, cached in loads if r % 2 == 0 else tuple(reversed(loads)):
            jobs = [cache_job(f"c{i}", prompt, r * 10 + i, "taylorseer" if i < cached else "off", guidance, steps,
                              size) for i in range(8)]  # fmt: skip
            mixed[label].append(run_loop(model, jobs)[1])
    eight_off = statistics.median(mixed["8 off"])
    return {label: {"images_per_s": round(8 / statistics.median(ts), 3),
                    "vs_8_off": round(eight_off / statistics.median(ts), 2)} for label, ts in mixed.items()}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-quality", action="store_true", help="speed only (the test's quick run)")
    parser.add_argument("--flux-rounds", type=int, default=1, help="rounds of the wide FLUX.1-dev section (0: none)")
    parser.add_argument("--flux-callers-steps", type=int, default=10,
                        help="steps of the wide FLUX.1-dev 8-caller loads (0: none; 8 rows a step cost ~8x one)")  # fmt: skip
    args = parser.parse_args(argv)

    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    model: Any = load_model(Settings(), warmup=False)
    guidance = model.profile.default_guidance
    run_loop(model, [cache_job("warm", "a red circle", 0, "off", guidance, steps=2)])  # first-call costs aside
    result: dict[str, Any] = {"model": model.profile.name, "cores": os.cpu_count(), "steps": STEPS, "size": 64,
                              "guidance": guidance}  # fmt: skip
    result.update(speed(model, args.rounds, guidance))
    if not args.no_quality:
        result["quality"] = quality(model, guidance)
    if args.flux_rounds:
        result["flux"] = flux_speed(args.flux_rounds, callers_steps=args.flux_callers_steps)
    publish(result, args.json)


if __name__ == "__main__":
    main()
