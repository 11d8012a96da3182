"""Images -> PNG files that carry their own parameters. Runs off the event loop, outside the gate.

Each PNG gets two text chunks: ``parameters``, the format other Stable Diffusion tools read
(AUTOMATIC1111, ComfyUI's importers, civitai), and ``generation``, the same record as JSON.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from PIL import Image, PngImagePlugin

_SCHEDULER_NAMES = {
    "EulerDiscreteScheduler": "Euler",
    "EulerAncestralDiscreteScheduler": "Euler a",
    "DPMSolverMultistepScheduler": "DPM++ 2M",
    "DDIMScheduler": "DDIM",
    "PNDMScheduler": "PLMS",
    "LCMScheduler": "LCM",
    "FlowMatchEulerDiscreteScheduler": "Euler (flow match)",
}


def sampler_name(scheduler_class: str) -> str:
    return _SCHEDULER_NAMES.get(scheduler_class, scheduler_class)


def a1111_parameters(params: dict[str, Any], seed: int, model: str, scheduler_class: str) -> str:
    """The ``parameters`` text that AUTOMATIC1111-compatible tools parse."""
    lines = [params["prompt"]]
    if params.get("negative_prompt"):
        lines.append(f"Negative prompt: {params['negative_prompt']}")
    lines.append(
        f"Steps: {params['num_inference_steps']}, Sampler: {sampler_name(scheduler_class)}, "
        f"CFG scale: {params['guidance_scale']:g}, Seed: {seed}, "
        f"Size: {params['width']}x{params['height']}, Model: {model}"
    )
    return "\n".join(lines)


def encode_pngs(
    images: Sequence[Image.Image],
    out_dir: Path,
    request_id: str,
    params: dict[str, Any],
    model: str,
    scheduler_class: str,
) -> list[Path]:
    """Write each image as ``<out_dir>/<YYYYMMDD>/<request_id>-<i>.png`` with its metadata."""
    day = out_dir / datetime.now(timezone.utc).strftime("%Y%m%d")
    day.mkdir(parents=True, exist_ok=True)
    safe_id = re.sub(r"[^A-Za-z0-9_-]", "", request_id) or "request"
    paths = []
    for i, (image, seed) in enumerate(zip(images, params["seeds"])):
        own = {**params, "seed": seed, "seeds": [seed], "num_images": 1, "image_index": i, "model": model}
        info = PngImagePlugin.PngInfo()
        info.add_text("parameters", a1111_parameters(own, seed, model, scheduler_class))
        info.add_text("generation", json.dumps(own, ensure_ascii=False))
        path = day / f"{safe_id}-{i}.png"
        tmp = path.with_suffix(".png.tmp")
        image.save(tmp, format="PNG", pnginfo=info, compress_level=4)
        tmp.replace(path)
        paths.append(path)
    return paths
