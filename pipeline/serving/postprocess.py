"""Images -> PNG files that carry their own parameters. Runs off the event loop, outside the gate.

Each PNG gets two text chunks: ``parameters``, the format other Stable Diffusion tools read
(AUTOMATIC1111, ComfyUI's importers, civitai), and ``generation``, the same record as JSON.
"""

from __future__ import annotations

import errno
import json
import re
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from PIL import Image

from ..errors import StorageFull
from ..loras import NONE, prompt_tag
from ..protocol import InferenceResult, ModelProfile, Timings
from ..request import DEFAULT_SCHEDULER, GenerateRequest
from .owners import key_of, owner_folder
from .png import encode_png

if TYPE_CHECKING:
    from ..protocol import End

_FULL = {errno.ENOSPC, errno.EDQUOT}  # "no space left", "quota exceeded": the disk, not the request

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


def lora_fields(request: GenerateRequest, p: ModelProfile) -> dict[str, Any]:
    """The adapter's A1111 short hash, for the PNG's ``Lora hashes`` and the info record ({} for none)."""
    info = next((i for i in p.loras if i.name == request.lora), None) if request.lora else None
    return {"lora_hash": info.hash} if info is not None else {}


def scheduler_used(request: GenerateRequest, p: ModelProfile) -> str:
    """The sampler a request ran with: the one it chose, or the model's own for "default"."""
    return sampler_name(p.scheduler) if request.scheduler == DEFAULT_SCHEDULER else request.scheduler


def a1111_parameters(params: dict[str, Any], seed: int, model: str, scheduler_class: str) -> str:
    """The ``parameters`` text that AUTOMATIC1111-compatible tools parse.

    One line of prompt, one of negative prompt, one of settings, whatever the texts hold: a line
    break in a prompt is written as a space (the text encoders read it as one), so a prompt cannot
    plant a ``Negative prompt:`` or settings line of its own. The exact texts are in the
    ``generation`` chunk. Settings values are quoted the way A1111 quotes them (``quote``).
    """
    lines = [one_line(params["prompt"])]
    lora = params.get("lora")
    if lora and lora != NONE:  # A1111 writes the adapter into the prompt, and Civitai reads its hash
        lines[0] += f" {prompt_tag(lora, params.get('lora_scale', 1.0))}"
    if params.get("negative_prompt"):
        lines.append(f"Negative prompt: {one_line(params['negative_prompt'])}")
    settings = {
        "Steps": params["num_inference_steps"],
        "Sampler": sampler_name(scheduler_class),
        "CFG scale": f"{params['guidance_scale']:g}",
        "Seed": seed,
        "Size": f"{params['width']}x{params['height']}",
        "Model": model,
    }
    if lora and lora != NONE and params.get("lora_hash"):
        settings["Lora hashes"] = f"{lora}: {params['lora_hash']}"
    settings["RNG"] = "CPU"  # the noise comes from a CPU generator on every device (A1111's "RNG: CPU")
    lines.append(", ".join(f"{key}: {quote(str(value))}" for key, value in settings.items()))
    return "\n".join(lines)


def quote(text: str) -> str:
    """A1111's ``quote``: a value with a comma, a colon or a line break as a JSON string, else as it is."""
    if "," not in text and ":" not in text and "\n" not in text and '"' not in text[:1]:
        return text
    return json.dumps(text, ensure_ascii=False)


def one_line(text: str) -> str:
    """``text`` with every kind of line break (``str.splitlines``' set) written as a space."""
    return " ".join(text.splitlines())


def encode_pngs(
    images: Sequence[Image.Image],
    out_dir: Path,
    request_id: str,
    params: dict[str, Any],
    model: str,
    scheduler_class: str,
    owner: str | None = None,
) -> list[Path]:
    """Write each image as ``<out_dir>/<YYYYMMDD>/<owner folder>/<request_id>-<i>.png`` with its metadata.

    ``scheduler_class``: the sampler used, as a diffusers class or A1111 name (``scheduler_used``).
    ``owner``: the identity that asked (``owner_folder``), whose share of the disk budget it counts in.
    """
    day = output_folder(out_dir, owner)
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
    _mkdir(day)
    return day


def output_folder(out_dir: Path, owner: str | None) -> Path:
    """``<out_dir>/<YYYYMMDD>/<owner folder>``, created if needed (``sweeper`` counts shares by it)."""
    folder = day_folder(out_dir) / owner_folder(owner, key_of(out_dir))
    _mkdir(folder)
    return folder


def write_then_rename(path: Path, write: Callable[[Path], object]) -> Path:
    """Write through a temporary name, then rename: a reader never sees half a file.

    A full disk (or quota) leaves nothing behind and raises ``StorageFull`` (retry later). A folder
    that is gone by the time the file opens (the sweeper removes empty folders, and an owner's folder
    is empty between its ``mkdir`` and its first file) is made again: seen failing a job in a soak.
    """
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        for attempt in range(3):
            try:
                write(tmp)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
                _mkdir(tmp.parent)
        tmp.replace(path)  # the folder is not empty now (tmp is in it): the sweeper cannot remove it
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in _FULL:
            raise StorageFull() from None
        raise
    return path


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in _FULL:
            raise StorageFull() from None
        raise


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
        **lora_fields(request, p),
        "lora_switch_ms": round(result.lora_switch_ms, 3),
        "model_loads": result.model_loads,
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
