"""Score the default model (or any model folder) on shapes prompts, with no model in the judging.

    python -m pipeline.default_model.evaluate [--model assets/default-model] [--json docs/default-model-eval.json]
                                              [--grid assets/examples.png]

For a fixed list of combinations -- every held-out one (never drawn in training) and as many seen
ones -- it generates with two caption styles and two seeds at 64 px, 20 steps, and scores each
picture with ``shapes.score``: background colour from the border, foreground colour from the
pixels that differ from it, shape by outline. Prints accuracy per attribute, seen vs held out.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from . import shapes
from .folder import DEFAULT_MODEL_DIR, STAMP
from .prompts import EXAMPLE_PROMPTS

STEPS = 20
SEEDS = (0, 1)
SHOWCASE = EXAMPLE_PROMPTS


def seen_combos(n: int = 16) -> list[tuple[str, str, str]]:
    """``n`` training combinations spread over the list (fixed)."""
    combos = shapes.training_combos()
    return [combos[(i * 37) % len(combos)] for i in range(n)]


def prompt_set() -> list[tuple[str, shapes.Spec]]:
    """(prompt, what it asks for) for every evaluated combination, in two caption styles."""
    out = []
    for k, (fg, shape, bg) in enumerate(sorted(shapes.HELD_OUT) + seen_combos()):
        out.append((shapes.caption(shapes.Spec(fg, shape, bg)), shapes.Spec(fg, shape, bg)))
        position = list(shapes.POSITIONS)[k % len(shapes.POSITIONS)]
        size = "small" if k % 2 else "large"
        detailed = shapes.Spec(fg, shape, bg, position, size, detailed=True)
        out.append((shapes.caption(detailed), detailed))
    return out


def load(model: str | Path, threads: int | None = None) -> Any:
    import torch
    from diffusers import DiffusionPipeline

    if threads:
        torch.set_num_threads(threads)
    pipe = DiffusionPipeline.from_pretrained(str(model), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def guidance_of(model: str | Path, default: float = 4.0) -> float:
    try:
        stamp = json.loads((Path(model) / STAMP).read_text())
        return float(stamp["defaults"]["guidance"])
    except (OSError, ValueError, KeyError):
        return default


def round_trip(vae: Any, size: int, per_combo: int = 2) -> dict[str, float]:
    """The VAE's encode and decode of held-out shapes (never drawn in training) at ``size`` px: the mean
    and the worst picture's mean absolute difference, in 0-255 units (issue 48's aim: under 6)."""
    import numpy as np
    import torch

    rng = random.Random(0)
    specs = [shapes.random_spec(rng, combo) for combo in sorted(shapes.HELD_OUT) for _ in range(per_combo)]
    pictures = np.stack([np.asarray(shapes.render(spec, size), dtype=np.float32) for spec in specs])
    x = torch.from_numpy(pictures).permute(0, 3, 1, 2) / 127.5 - 1.0
    errors = []
    with torch.no_grad():
        for i in range(0, len(x), 8):
            back = vae.decode(vae.encode(x[i : i + 8]).latent_dist.mean).sample.clamp(-1, 1)
            errors.append(((back - x[i : i + 8]).abs() * 127.5).mean(dim=(1, 2, 3)))
    per_picture = torch.cat(errors)
    return {"mean": round(float(per_picture.mean()), 2), "worst": round(float(per_picture.max()), 2)}


def generate(
    pipe: Any, prompts: list[str], seeds: list[int], guidance: float, size: int = 64, steps: int = STEPS
) -> list[Any]:
    """One image per (prompt, seed), in batches of 16, each from its own seeded generator."""
    import torch

    images = []
    for i in range(0, len(prompts), 16):
        gens = [torch.Generator().manual_seed(s) for s in seeds[i : i + 16]]
        images += pipe(
            prompts[i : i + 16],
            num_inference_steps=steps,
            guidance_scale=guidance,
            width=size,
            height=size,
            generator=gens,
        ).images
    return images


def accuracy(scored: list[tuple[shapes.Spec, shapes.Score]]) -> dict[str, float]:
    n = max(1, len(scored))
    return {
        "background": sum(s.bg == sp.bg for sp, s in scored) / n,
        "foreground": sum(s.fg == sp.fg for sp, s in scored) / n,
        "shape": sum(s.shape == sp.shape for sp, s in scored) / n,
        "images": len(scored),
    }


def evaluate(pipe: Any, guidance: float) -> dict[str, Any]:
    items = [(p, spec, seed) for p, spec in prompt_set() for seed in SEEDS]
    t0 = time.monotonic()
    images = generate(pipe, [p for p, _, _ in items], [s for _, _, s in items], guidance)
    seconds = time.monotonic() - t0
    held: list[tuple[Any, Any]] = []
    seen: list[tuple[Any, Any]] = []
    for (_, spec, _), image in zip(items, images):
        (held if spec.combo in shapes.HELD_OUT else seen).append((spec, shapes.score(image)))
    scored = held + seen
    return {
        "seen": accuracy(seen),
        "held_out": accuracy(held),
        "all": accuracy(scored),
        "large": accuracy([x for x in scored if x[0].size == "large"]),
        "small": accuracy([x for x in scored if x[0].size == "small"]),
        "guidance": guidance,
        "steps": STEPS,
        "size": 64,
        "seconds_per_image": seconds / len(items),
    }


def grid(pipe: Any, guidance: float, path: Path, scale: int = 2) -> None:
    """The showcase prompts, two seeds each, as one PNG (prompts in column order, seeds in rows)."""
    from PIL import Image

    images = generate(pipe, list(SHOWCASE) * 2, [0] * len(SHOWCASE) + [1] * len(SHOWCASE), guidance)
    tile = 64 * scale
    sheet = Image.new("RGB", (tile * len(SHOWCASE) + 4 * (len(SHOWCASE) - 1), tile * 2 + 4), "white")
    for k, image in enumerate(images):
        col, row = k % len(SHOWCASE), k // len(SHOWCASE)
        sheet.paste(image.resize((tile, tile), Image.Resampling.NEAREST), (col * (tile + 4), row * (tile + 4)))
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path, optimize=True)


def render_table(r: dict[str, Any]) -> str:
    lines = ["| combinations | images | background colour | foreground colour | shape |", "|---|---|---|---|---|"]
    for name, key in (
        ("seen in training", "seen"),
        ("held out", "held_out"),
        ("all", "all"),
        ("all, large shapes", "large"),
        ("all, small shapes", "small"),
    ):
        a = r[key]
        lines.append(f"| {name} | {a['images']} | {a['background']:.1%} | {a['foreground']:.1%} | {a['shape']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--guidance", type=float, default=None, help="default: the one saved with the model")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--grid", type=Path, default=None, help="also save the showcase grid here")
    args = parser.parse_args(argv)
    pipe = load(args.model, args.threads)
    guidance = args.guidance if args.guidance is not None else guidance_of(args.model)
    result = evaluate(pipe, guidance)
    result["model"] = str(args.model)
    result["round_trip"] = {f"{size}px": round_trip(pipe.vae, size) for size in (shapes.SIZE, 256)}
    print(render_table(result))
    print("VAE round trip on held-out shapes (0-255, mean / worst):", result["round_trip"])
    print(
        f"guidance {guidance}, {STEPS} steps, 64 px, "
        f"{result['seconds_per_image'] * 1000:.0f} ms per image (batches of 16)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if args.grid:
        grid(pipe, guidance, args.grid)


if __name__ == "__main__":
    main()
