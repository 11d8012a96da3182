"""The embedded model's ControlNet (issue 51), trained here on its shapes: a map says where, the prompt what.

    python -m pipeline.default_model.control [--quick] [--out assets/default-controlnet] [--steps N]

The condition is a 64 px map, white where the shape goes on black (the way a scribble or a
segmentation map works): half the time the shape's own outline, half the time a disc over its
extent, so that a person's rough disc places any shape the prompt names. The pictures put the
shape anywhere (centre uniform over the middle of the image, either size): the trained UNet alone
draws an undetailed caption's shape large and centred, and the ControlNet learns to move it where
the map says. Captions are the undetailed ones ("a red circle on a blue background"; 10 % dropped,
for classifier-free guidance); the held-out colour combinations (``shapes.HELD_OUT``) are never
drawn, as in the model's own training.

The ControlNet is ``ControlNetModel.from_unet`` of the trained UNet (its encoder copied, zero
convolutions out), with a conditioning embedding that downsamples by 4 (the VAE's factor); the UNet,
VAE and text encoder stay frozen. The loss is the UNet's own: v-prediction with min-SNR weighting, an
EMA of the weights kept. ``evaluate`` scores it from the pixels (``shapes.score`` and the found
shape's centre): discs at held-out positions, every shape, seen and held-out colours, two seeds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from tqdm import tqdm

from . import shapes
from .architecture import SCHEDULER_CONFIG
from .folder import CONTROL_NAME, DEFAULT_CONTROL_DIR, DEFAULT_MODEL_DIR
from .train import min_snr_loss, step_with_ema

log = logging.getLogger(__name__)
STAMP = "controlnet_build.json"
FULL = dict(images=8192, steps=3000, batch=32)
QUICK = dict(images=256, steps=40, batch=16)
LR = 5e-4
CAPTION_DROP = 0.1
EMBEDDING_CHANNELS = (16, 32, 64)  # the conditioning embedding: two stride-2 convolutions, the VAE's factor 4
DISC_SHARE = 0.5
MARGIN = 0.02  # a shape stays this far inside the image, as a fraction of it
# A drawn shape counts as placed when its centre is within this fraction of the image of the map's, on
# each axis (the evaluation's discs are at least OFF_CENTRE from the middle: a centred shape misses).
HIT, QUARTER = 0.125, 0.25
OFF_CENTRE = 0.15


@dataclasses.dataclass(frozen=True)
class Placed:
    """A shape anywhere: its spec (``position`` "center" with ``dx``/``dy`` moving it) and its centre."""

    spec: shapes.Spec
    centre: tuple[float, float]  # as fractions of the image
    disc: bool  # whether its map is a disc over its extent (else the shape's own outline)


def place(rng: random.Random, combo: tuple[str, str, str], disc: bool, size: str | None = None,
          off_centre: float = 0.0) -> Placed:  # fmt: skip
    """``combo`` at a random place where it fits whole (``off_centre``: at least that far from the middle
    on one axis), of ``size`` (else either)."""
    fg, shape, bg = combo
    size = size or rng.choice(list(shapes.SIZES))
    scale = rng.uniform(0.9, 1.1)
    lo = shapes.SIZES[size] * scale / 2 + MARGIN
    while True:
        cx, cy = rng.uniform(lo, 1 - lo), rng.uniform(lo, 1 - lo)
        if max(abs(cx - 0.5), abs(cy - 0.5)) >= off_centre:
            break
    spec = shapes.Spec(fg, shape, bg, "center", size, False, dx=cx - 0.5, dy=cy - 0.5, scale=scale)
    return Placed(spec, (cx, cy), disc)


def control_map(p: Placed, size: int = shapes.SIZE) -> Image.Image:
    """White where the shape goes, on black: its outline, or a disc over its extent."""
    if not p.disc:
        drawn = shapes.render(dataclasses.replace(p.spec, fg="white", bg="black", position="center"), size)
        return Image.fromarray(((shapes.to_array(drawn).mean(axis=2) > 127) * 255).astype(np.uint8)).convert("RGB")
    return disc_map(p.centre, shapes.SIZES[p.spec.size] * p.spec.scale / 2, size)


def disc_map(centre: tuple[float, float], radius: float, size: int = shapes.SIZE) -> Image.Image:
    """A white disc (centre and radius as fractions of the image) on black: what a person draws."""
    image = Image.new("RGB", (size, size), "black")
    cx, cy, r = centre[0] * size, centre[1] * size, radius * size
    ImageDraw.Draw(image).ellipse([cx - r, cy - r, cx + r, cy + r], fill="white")
    return image


def training_set(n: int, seed: int) -> list[Placed]:
    rng = random.Random(seed)
    combos = shapes.training_combos()
    return [place(rng, combos[i % len(combos)], rng.random() < DISC_SHARE) for i in range(n)]


def _tensor(images: list[Image.Image], signed: bool) -> torch.Tensor:
    arrays = np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images])
    x = torch.from_numpy(arrays).permute(0, 3, 1, 2).float() / 255.0
    return x * 2 - 1 if signed else x


def build_controlnet(unet: Any) -> Any:
    from diffusers import ControlNetModel

    return ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=EMBEDDING_CHANNELS)


def train_controlnet(pipe: Any, cfg: dict[str, int], seed: int) -> tuple[Any, dict[str, Any]]:
    """Train a ControlNet for ``pipe`` (the trained default model, frozen); its EMA copy and a report."""
    from diffusers import DDPMScheduler

    gen = torch.Generator().manual_seed(seed)
    placed = training_set(cfg["images"], seed)
    pictures = _tensor([shapes.render(p.spec) for p in placed], signed=True)
    maps = _tensor([control_map(p) for p in placed], signed=False)
    unet, vae, text_encoder, tokenizer = pipe.unet, pipe.vae, pipe.text_encoder, pipe.tokenizer
    for module in (unet, vae, text_encoder):
        module.requires_grad_(False).eval()
    with torch.no_grad():
        latents = torch.cat([vae.encode(pictures[i : i + 256]).latent_dist.mean for i in range(0, len(pictures), 256)])
        latents = latents * vae.config.scaling_factor
        captions = [shapes.caption(p.spec) for p in placed] + [""]
        ids = tokenizer(captions, padding="max_length", max_length=tokenizer.model_max_length, truncation=True,
                        return_tensors="pt").input_ids  # fmt: skip
        contexts = torch.cat([text_encoder(ids[i : i + 512])[0] for i in range(0, len(ids), 512)])
    empty, contexts = contexts[-1], contexts[:-1]
    schedule: Any = DDPMScheduler(
        **{k: v for k, v in SCHEDULER_CONFIG.items() if k not in ("timestep_spacing", "steps_offset")}
    )
    alphas_cumprod = schedule.alphas_cumprod
    controlnet = build_controlnet(unet)
    controlnet.train()
    params = list(controlnet.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    ema = copy.deepcopy(controlnet).eval()
    losses: list[float] = []
    steps, batch = cfg["steps"], cfg["batch"]
    bar = tqdm(range(steps), desc="controlnet", unit="step", mininterval=2)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / 100) * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / steps)))
        idx = torch.randint(0, len(latents), (batch,), generator=gen)
        x0, cond, context = latents[idx], maps[idx], contexts[idx].clone()
        context[torch.rand(batch, generator=gen) < CAPTION_DROP] = empty
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, schedule.config.num_train_timesteps, (batch,), generator=gen)
        noisy = schedule.add_noise(x0, noise, t)
        down, mid = controlnet(noisy, t, context, controlnet_cond=cond, return_dict=False)
        pred = unet(noisy, t, context, down_block_additional_residuals=down, mid_block_additional_residual=mid).sample
        loss = min_snr_loss(pred, schedule.get_velocity(x0, noise, t), alphas_cumprod[t])  # the UNet's own loss
        step_with_ema(opt, loss, params, list(ema.parameters()), step)
        losses.append(float(loss.detach()))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
    curve = [round(float(np.mean(losses[i : i + 200])), 4) for i in range(0, len(losses), 200)]
    return ema, {"final_loss": float(np.mean(losses[-200:])), "loss_curve": curve}


# ---- evaluation: discs at held-out positions, scored from the pixels ------------------------------


def evaluation_set(n_positions: int = 8, seed: int = 7) -> list[tuple[str, Placed]]:
    """(prompt, placed) pairs: small discs at positions drawn from another seed than training's, off the
    middle (where the model alone draws an undetailed caption's shape), every shape, one seen and one
    held-out colour combination per shape and position."""
    rng = random.Random(seed)
    seen, held = shapes.training_combos(), sorted(shapes.HELD_OUT)
    out = []
    for _ in range(n_positions):
        for shape in shapes.SHAPES:
            for pool in (seen, held):
                fg, _, bg = rng.choice([c for c in pool if c[1] == shape])
                p = place(rng, (fg, shape, bg), disc=True, size="small", off_centre=OFF_CENTRE)
                out.append((shapes.caption(p.spec), p))
    return out


def centre_of(image: Image.Image) -> tuple[float, float] | None:
    """The drawn shape's centre (fractions of the image), from the same foreground mask ``score`` uses."""
    a = shapes.to_array(image)
    border = np.concatenate([a[:2].reshape(-1, 3), a[-2:].reshape(-1, 3), a[:, :2].reshape(-1, 3),
                             a[:, -2:].reshape(-1, 3)])  # fmt: skip
    found = shapes.foreground(a, np.median(border, axis=0))
    if found is None:
        return None
    ys, xs = np.nonzero(found[0])
    return float(xs.mean() + 0.5) / a.shape[1], float(ys.mean() + 0.5) / a.shape[0]


def distance(image: Image.Image, centre: tuple[float, float]) -> float:
    """How far the drawn shape's centre is from ``centre`` on the farther axis (fractions of the image;
    1.0 where nothing is drawn)."""
    found = centre_of(image)
    return 1.0 if found is None else max(abs(found[0] - centre[0]), abs(found[1] - centre[1]))


def evaluate(pipe: Any, controlnet: Any, guidance: float, seeds: tuple[int, ...] = (0, 1), steps: int = 20,
             n_positions: int = 8) -> dict[str, Any]:  # fmt: skip
    """The rate at which the prompt's shape is drawn where the disc is (its centre within ``HIT`` of the
    image's, and within a quarter), the mean distance, the shape and colours, beside the same prompts
    without control (where the model draws an undetailed caption's shape large and centred)."""
    from diffusers import StableDiffusionControlNetPipeline

    control = StableDiffusionControlNetPipeline.from_pipe(pipe, controlnet=controlnet)
    control.set_progress_bar_config(disable=True)
    items = [(prompt, p, seed) for prompt, p in evaluation_set(n_positions) for seed in seeds]
    rows: dict[str, list[dict[str, Any]]] = {"control": [], "none": []}
    for start in range(0, len(items), 16):
        chunk = items[start : start + 16]
        kwargs = dict(prompt=[c[0] for c in chunk], num_inference_steps=steps, guidance_scale=guidance, width=64,
                      height=64, generator=[torch.Generator().manual_seed(c[2]) for c in chunk])  # fmt: skip
        with torch.inference_mode():
            controlled = control(image=[control_map(c[1]) for c in chunk], **kwargs).images
            plain = pipe(**kwargs).images
        for name, images in (("control", controlled), ("none", plain)):
            for (_, p, _), image in zip(chunk, images):
                s = shapes.score(image)
                far = distance(image, p.centre)
                rows[name].append({"placed": far <= HIT, "within_quarter": far <= QUARTER, "distance": far,
                                   "shape": s.shape == p.spec.shape,
                                   "fg": s.fg == p.spec.fg, "bg": s.bg == p.spec.bg,
                                   "held_out": p.spec.combo in shapes.HELD_OUT})  # fmt: skip

    def rates(rs: list[dict[str, Any]]) -> dict[str, float]:
        keys = ("placed", "within_quarter", "distance", "shape", "fg", "bg")
        return {k: round(float(np.mean([r[k] for r in rs])), 4) for k in keys}

    return {
        name: {"all": rates(rs), "held_out_colours": rates([r for r in rs if r["held_out"]]), "images": len(rs)}
        for name, rs in rows.items()
    }


def train(out: Path, seed: int = 0, quick: bool = False, config: dict[str, int] | None = None,
          model: Path = DEFAULT_MODEL_DIR, threads: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Train the ControlNet for ``model`` and write it to ``out`` with its stamp (and evaluation)."""
    from diffusers import StableDiffusionPipeline

    cfg = {**(QUICK if quick else FULL), **(config or {})}
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    started = time.monotonic()
    pipe = StableDiffusionPipeline.from_pretrained(str(model))
    controlnet, report = train_controlnet(pipe, cfg, seed)
    report.update(seed=seed, config=cfg, torch=torch.__version__, torch_threads=torch.get_num_threads(),
                  train_seconds=round(time.monotonic() - started, 1))  # fmt: skip
    guidance = float(json.loads((model / "default_model_build.json").read_text())["defaults"]["guidance"])
    small = quick
    report["evaluation"] = evaluate(pipe, controlnet, guidance, seeds=(0,) if small else (0, 1),
                                    n_positions=2 if small else 8)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    controlnet.save_pretrained(str(out))
    (out / STAMP).write_text(json.dumps({"trained": True, "name": CONTROL_NAME, "training": report}, indent=1) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_CONTROL_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    config = {"steps": args.steps} if args.steps else None
    report = train(args.out, args.seed, args.quick, config, threads=args.threads)
    print(json.dumps({k: v for k, v in report.items() if k != "loss_curve"}, indent=1))


if __name__ == "__main__":
    main()
