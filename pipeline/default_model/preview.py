"""Fit the default model's live-preview map and save it with the model.

    python -m pipeline.default_model.preview [--model assets/default-model] [--strip docs/preview-strip.png]

The model's VAE is its own, so SD's published latent-to-RGB factors draw the wrong colours on it
(a yellow square on blue previewed as dark brown on pale cyan), and even a linear map fitted to it
misses the colours by 0.08-0.16. This fits a per-pixel 4 -> 32 -> 3 network from the scheduler's
denoised estimates (every step of 20-step runs) to the final picture's colours, in seconds, and
writes it to ``<model>/preview/``, where the app's loader finds it. ``train`` runs it after
training; it is deterministic for a given model. Reports the mean absolute colour difference
(0-1 scale) between the last preview the app would show and the final image, on prompts the fit
did not see.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..engine.model.previews import PREVIEW_FOLDER, PreviewMap, denoised, fit_mlp
from . import shapes
from .folder import DEFAULT_MODEL_DIR, model_defaults
from .prompts import EXAMPLE_PROMPTS

STEPS = 20
SIZE = 64


def _prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    combos = shapes.training_combos()
    return [shapes.caption(shapes.random_spec(rng, rng.choice(combos))) for _ in range(n)]


@torch.inference_mode()
def trajectories(pipe: Any, prompts: list[str], guidance: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(steps, N, C, h, w) denoised estimates at every step, and (N, 3, H, W) final images in [0, 1]."""
    estimates: list[torch.Tensor] = []
    scheduler = pipe.scheduler
    original = type(scheduler).step.__get__(scheduler)

    def step(model_output: torch.Tensor, timestep: Any, sample: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = original(model_output, timestep, sample, *args, **kwargs)
        estimates.append(denoised(scheduler, out, model_output, timestep, sample).float().cpu())
        return out

    scheduler.step = step
    try:
        generators = [torch.Generator("cpu").manual_seed(seed + i) for i in range(len(prompts))]
        images = pipe(
            prompt=prompts,
            num_inference_steps=STEPS,
            guidance_scale=guidance,
            width=SIZE,
            height=SIZE,
            generator=generators,
        ).images
    finally:
        scheduler.__dict__.pop("step", None)
    finals = torch.stack([torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1) for im in images])
    return torch.stack(estimates), finals


def last_preview_step(steps: int = STEPS) -> int:
    """The last step the app previews: every max(1, steps // 8) steps, never the final one."""
    every = max(1, steps // 8)
    return max(s for s in range(every, steps, every))


def colour_difference(preview: PreviewMap, estimates: torch.Tensor, finals: torch.Tensor, step: int) -> float:
    """Mean absolute difference (0-1) between step ``step``'s previews, at full size, and the final images."""
    diffs = []
    for latents, final in zip(estimates[step - 1], finals):
        image = preview.image(latents, final.shape[2], final.shape[1])
        diffs.append(
            (torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1) - final).abs().mean()
        )
    return float(torch.stack(diffs).mean())


def fit(pipe: Any, guidance: float, n: int = 48, mlp_steps: int = 1500) -> tuple[PreviewMap, dict[str, float]]:
    estimates, finals = trajectories(pipe, _prompts(n, seed=1), guidance)
    late = estimates[STEPS // 4 :]  # the estimates a person looks at: from a quarter of the way in
    targets = torch.nn.functional.adaptive_avg_pool2d(finals, (estimates.shape[-2], estimates.shape[-1]))
    x = late.reshape(-1, *late.shape[2:])
    y = targets.repeat(len(late), 1, 1, 1)
    preview = fit_mlp(x, y, steps=mlp_steps)
    held_estimates, held_finals = trajectories(pipe, list(EXAMPLE_PROMPTS), guidance, seed=100)
    report = {
        f"step_{s}": colour_difference(preview, held_estimates, held_finals, s)
        for s in (STEPS // 4, STEPS // 2, last_preview_step())
    }
    report["last_preview_step"] = last_preview_step()
    return preview, report


def strip(pipe: Any, preview: PreviewMap, guidance: float, path: Path, prompt: str = EXAMPLE_PROMPTS[0]) -> float:
    """First, middle and last preview, then the final image, side by side (4x enlarged)."""
    estimates, finals = trajectories(pipe, [prompt], guidance, seed=7)
    every = max(1, STEPS // 8)
    steps = [every, (STEPS // 2) // every * every, last_preview_step()]
    tiles = [preview.image(estimates[s - 1][0], SIZE, SIZE) for s in steps]
    tiles.append(Image.fromarray((finals[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)))
    scale, gap = 4, 8
    canvas = Image.new("RGB", (len(tiles) * (SIZE * scale + gap) - gap, SIZE * scale), "white")
    for i, tile in enumerate(tiles):
        canvas.paste(tile.resize((SIZE * scale, SIZE * scale), Image.Resampling.NEAREST), (i * (SIZE * scale + gap), 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return colour_difference(preview, estimates, finals, last_preview_step())


def main(argv: list[str] | None = None) -> None:
    from diffusers import DiffusionPipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--strip", type=Path, default=None, help="also save a preview strip PNG here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    pipe = DiffusionPipeline.from_pretrained(str(args.model))
    pipe.set_progress_bar_config(disable=True)
    guidance = float(model_defaults(args.model).get("guidance", 4.0))
    preview, report = fit(pipe, guidance)
    preview.save(args.model / PREVIEW_FOLDER)
    print(json.dumps(report, indent=2))
    if args.strip is not None:
        print(f"strip: {args.strip}, last preview vs final: {strip(pipe, preview, guidance, args.strip):.3f}")


if __name__ == "__main__":
    main()
