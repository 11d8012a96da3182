"""Images -> PNG files that carry their own parameters. Runs off the event loop, outside the gate.

Each PNG gets two text chunks: ``parameters``, the format other Stable Diffusion tools read
(AUTOMATIC1111, ComfyUI's importers, civitai), and ``generation``, the same record as JSON.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from PIL import Image

from ..protocol import InferenceResult, ModelProfile
from ..request import DEFAULT_SCHEDULER, GenerateRequest
from .events import Timings
from .png import encode_png

if TYPE_CHECKING:
    from .line import End

_SCHEDULER_NAMES = {
    "EulerDiscreteScheduler": "Euler",
    "EulerAncestralDiscreteScheduler": "Euler a",
    "DPMSolverMultistepScheduler": "DPM++ 2M",
    "DDIMScheduler": "DDIM",
    "UniPCMultistepScheduler": "UniPC",
    "PNDMScheduler": "PLMS",
    "LCMScheduler": "LCM",
    "FlowMatchEulerDiscreteScheduler": "Euler (flow match)",
}


def sampler_name(scheduler_class: str) -> str:
    """A1111's name for a diffusers scheduler class (a name that is not a class is returned as it is)."""
    return _SCHEDULER_NAMES.get(scheduler_class, scheduler_class)


def scheduler_used(request: GenerateRequest, p: ModelProfile) -> str:
    """The sampler a request ran with: the one it chose, or the model's own for "default"."""
    return sampler_name(p.scheduler) if request.scheduler == DEFAULT_SCHEDULER else request.scheduler


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
    """Write each image as ``<out_dir>/<YYYYMMDD>/<request_id>-<i>.png`` with its metadata.

    ``scheduler_class``: the sampler used, as a diffusers class or A1111 name (``scheduler_used``).
    """
    day = day_folder(out_dir)
    safe_id = re.sub(r"[^A-Za-z0-9_-]", "", request_id) or "request"
    paths = []
    for i, (image, seed) in enumerate(zip(images, params["seeds"])):
        own = {**params, "seed": seed, "seeds": [seed], "num_images": 1, "image_index": i, "model": model}
        own["scheduler"] = sampler_name(scheduler_class)
        texts = (
            ("parameters", a1111_parameters(own, seed, model, scheduler_class)),
            ("generation", json.dumps(own, ensure_ascii=False)),
        )
        path = day / f"{safe_id}-{i}.png"
        write_then_rename(path, partial(_write_png, image, texts))
        paths.append(path)
    return paths


def _write_png(image: Image.Image, texts: tuple[tuple[str, str], ...], path: Path) -> None:
    path.write_bytes(encode_png(image, texts))


def day_folder(out_dir: Path) -> Path:
    """``<out_dir>/<YYYYMMDD>`` (UTC), created if needed: the sweeper ages files out of it."""
    day = out_dir / datetime.now(UTC).strftime("%Y%m%d")
    day.mkdir(parents=True, exist_ok=True)
    return day


def write_then_rename(path: Path, write: Callable[[Path], object]) -> Path:
    """Write through a temporary name, then rename: a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    write(tmp)
    tmp.replace(path)
    return path


def info_record(
    request: GenerateRequest,
    result: InferenceResult,
    t: Timings,
    p: ModelProfile,
    end: End,
) -> dict[str, Any]:
    """The info record a request's caller gets with its images (the API's second output).

    ``end`` says how it was batched: ``batching`` is "step" for a step-level loop (with
    ``joined_at_step``, the loop steps run before it joined) or "job".
    """
    params = request.parameters()
    return {
        "request_id": request.request_id,
        "model": p.name,
        **params,
        "scheduler": scheduler_used(request, p),
        "batch_size": end.batch_size,
        "batch_requests": end.batch_requests,
        "batching": end.batching,
        "joined_at_step": end.joined_at_step,
        "device": p.device,
        "dtype": p.dtype,
        "steps_done": result.steps_done,
        "peak_memory_bytes": result.peak_memory_bytes,
        "warnings": list(request.warnings),
        "timings": t.as_dict(),
        "durations_ms": t.durations_ms(),
        "reproduce": {
            "api_name": "/generate",
            "params": {**{k: v for k, v in params.items() if k != "seeds"}, "randomize_seed": False},
            "note": "The same parameters and seed give the same pixels on the same machine. "
            "Image i alone: seed = seeds[i], num_images = 1 (the same noise; batch "
            "arithmetic may differ by under 1/255 on average).",
        },
    }
