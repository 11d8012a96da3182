"""Images -> PNG files that carry their own parameters. Runs off the event loop, outside the gate.

Each PNG gets two text chunks: ``parameters``, the format other Stable Diffusion tools read
(AUTOMATIC1111, ComfyUI's importers, civitai), and ``generation``, the same record as JSON.

PNG bytes with text chunks, as fast as the machine allows: the server's biggest cost per image.

``encode_png(image, texts)`` writes the file itself for 8-bit RGB, RGBA and L pictures: every row
gets PNG's UP filter (one numpy subtraction over the picture), and the rows are deflated at the
fastest level of Intel's ISA-L (``isal``), or, without it, zlib level 1 with the Z_RLE strategy.
Measured (``python -m bench.png`` and docs/performance-notes.md; one thread, 2-core CPU, ms per
image; KiB for a 512 px simulated picture / the default model's 512 px output):

    Pillow, level 1, adaptive filters, default strategy   23.5 ms   524 / 205 KiB   (the first encoder)
    libpng through imagecodecs, level 1, Z_RLE, AVG        5.2 ms   459 / -   KiB   (the one before this)
    UP filter + zlib level 1, Z_RLE (without isal)         4.9 ms   477 / 189 KiB
    UP filter + ISA-L level 1 (this one)                   1.7 ms   482 / 204 KiB

UP rather than AVG or adaptive filters: it costs 0.03 ms, its files are within 3 % of AVG's on
noisy pictures and smaller on flat ones (a strip of the default model's pictures: 159 KiB against
AVG's 293). Both deflaters release the GIL. ``isal`` (python-isal, PSF-2.0, over ISA-L,
BSD-3-Clause; wheels for Linux, macOS and Windows on x86-64 and ARM) is a 0.5 MB wheel. The text
chunks (tEXt for Latin-1, iTXt for the rest, as Pillow's ``PngInfo.add_text`` decides) come right
after IHDR, where every reader looks for them; the pixels are one IDAT chunk. Other modes (16-bit,
palette) go through Pillow with zlib level 1 and Z_RLE.
"""

from __future__ import annotations

import errno
import io
import json
import re
import struct
import zlib
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, PngImagePlugin

from .. import fields
from ..errors import StorageFull
from ..loras import NONE, prompt_tag
from ..protocol import InferenceResult, ModelProfile, Timings
from ..request import DEFAULT_SAMPLER, HIRES_UPSCALER, GenerateRequest
from .owners import key_of, owner_folder

try:
    from isal import isal_zlib
except ImportError:  # pragma: no cover - isal is in requirements.txt
    isal_zlib = None  # type: ignore[assignment]

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
    """The LoRA's A1111 short hash, for the PNG's ``Lora hashes`` and the info record ({} for none), and
    the model's (``Model hash``, where known)."""
    info = next((i for i in p.loras if i.name == request.lora), None) if request.lora else None
    return {**({"lora_hash": info.hash} if info is not None else {}), **({"model_hash": p.hash} if p.hash else {})}


def step_cache_record(request: GenerateRequest, result: InferenceResult) -> dict[str, Any]:
    """The info record's ``step_cache``: the method the request ran with and its own denoiser
    evaluations, computed and skipped (issue 50); "off": every step computed."""
    if result.step_cache:
        return dict(result.step_cache)
    method = str(dict(request.options).get("step_cache", "off"))
    return {"method": method, "computed": result.steps_done, "skipped": 0}


def sampler_used(request: GenerateRequest, p: ModelProfile) -> str:
    """The sampler a request ran with: the one it chose, or the model's own for "default"."""
    return sampler_name(p.sampler) if request.sampler == DEFAULT_SAMPLER else request.sampler


def a1111_parameters(params: dict[str, Any], seed: int, model: str, scheduler_class: str) -> str:
    """The ``parameters`` text that AUTOMATIC1111-compatible tools parse.

    One line of prompt, one of negative prompt, one of settings, whatever the texts hold: a line
    break in a prompt is written as a space (the text encoders read it as one), so a prompt cannot
    plant a ``Negative prompt:`` or settings line of its own. The exact texts are in the
    ``generation`` chunk. Settings values are quoted the way A1111 quotes them (``quote``).
    """
    lines = [one_line(params["prompt"])]
    lora = params.get("lora")
    if lora and lora != NONE:  # A1111 writes the LoRA into the prompt, and Civitai reads its hash
        lines[0] += f" {prompt_tag(lora, params.get('lora_scale', 1.0))}"
    if params.get("negative_prompt"):
        lines.append(f"Negative prompt: {one_line(params['negative_prompt'])}")
    settings = {
        "Steps": params["num_inference_steps"],
        "Sampler": sampler_name(scheduler_class),
        "CFG scale": f"{params['guidance_scale']:g}",
        "Seed": seed,
        "Size": f"{params['width']}x{params['height']}",
        **({"Model hash": params["model_hash"]} if params.get("model_hash") else {}),
        "Model": model,
    }
    mode = params.get("mode", "text")
    if mode != "text":  # image-to-image, inpainting, outpainting: A1111's img2img fields
        settings["Denoising strength"] = f"{params['strength']:g}"
        if mode in ("inpaint", "outpaint"):
            settings["Mask blur"] = params["mask_blur"]
    if params.get("hires_fix"):  # A1111's hires fix fields (its Size is the first pass's)
        settings["Denoising strength"] = f"{params['hires_strength']:g}"
        settings["Hires upscale"] = f"{params['hires_scale']:g}"
        settings["Hires steps"] = params["hires_steps"]
        settings["Hires upscaler"] = HIRES_UPSCALER
    if lora and lora != NONE and params.get("lora_hash"):
        settings["Lora hashes"] = f"{lora}: {params['lora_hash']}"
    settings.update(fields.png_settings(params))  # the table fields not at their default
    if params.get("control", NONE) != NONE:  # as AUTOMATIC1111's ControlNet extension writes a unit
        settings["ControlNet 0"] = control_unit(params)
    settings["RNG"] = "CPU"  # the noise comes from a CPU generator on every device (A1111's "RNG: CPU")
    lines.append(", ".join(f"{key}: {quote(str(value))}" for key, value in settings.items()))
    return "\n".join(lines)


def control_unit(params: dict[str, Any]) -> str:
    """AUTOMATIC1111's ControlNet unit text (its map is not in it)."""
    return (f"Module: {params.get('control_preprocess', 'none')}, Model: {params['control']}, "
            f"Weight: {params.get('control_scale', 1.0):g}, Guidance Start: {params.get('control_start', 0.0):g}, "
            f"Guidance End: {params.get('control_end', 1.0):g}")  # fmt: skip


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

    ``scheduler_class``: the sampler used, as a diffusers class or A1111 name (``sampler_used``).
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
) -> dict[str, Any]:
    """The info record a request's caller gets with its images (the API's second output).

    ``result`` says how it was batched: ``batching`` is "step" for a step-level loop (with
    ``joined_at_step``, the loop steps run before it joined) or "job".
    """
    params = request.parameters()
    return {
        "request_id": request.request_id,
        "model": p.model_id,  # the request's ``model`` (its field, among the parameters): the name it takes
        "model_id": p.model_id,
        "model_title": p.name,
        **params,
        "scheduler": sampler_used(request, p),
        **lora_fields(request, p),
        "lora_switch_ms": round(result.lora_switch_ms, 3),
        "model_loads": result.model_loads,
        "batch_size": result.batch_images or len(result.images),
        "batch_requests": result.batch_jobs or 1,
        "batching": result.batching,
        "joined_at_step": result.joined_at_step,
        "device": p.device,
        "dtype": p.dtype,
        "steps_done": result.steps_done,
        "step_cache": step_cache_record(request, result),
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


# -- PNG bytes, fast ----------------------------------------------------------------------------------
COMPRESS_LEVEL = 1  # zlib's (the fallback's and Pillow's); ISA-L runs at its own level 1
ISAL_LEVEL = 1  # ISA-L's levels are 0-3; 0 is Huffman-only over static tables (+75 % in size)
Z_RLE = 3  # zlib's run-length-only strategy
FILTER_UP = 2  # the PNG row filter type: raw - the byte above
SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {"RGB": (3, 2), "RGBA": (4, 6), "L": (1, 0)}  # mode -> bytes per pixel, PNG colour type


def encoder_name() -> str:
    return "isal" if isal_zlib is not None else "zlib"


def text_chunk(key: str, value: str) -> bytes:
    """A tEXt chunk if ``value`` is Latin-1, else an uncompressed iTXt chunk (UTF-8)."""
    try:
        kind, payload = b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1")
    except UnicodeEncodeError:
        # keyword, 0, compression flag 0, method 0, empty language tag, 0, empty translated keyword, 0, text
        kind, payload = b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8")
    return chunk(kind, payload)


def chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(payload, zlib.crc32(kind)))


def up_filtered(pixels: np.ndarray) -> np.ndarray:
    """Each row as PNG's UP filter writes it: the filter-type byte, then raw - up mod 256 per byte, where
    up is the byte above (0 on the first row). One subtraction over the picture."""
    height, width, channels = pixels.shape
    rows = pixels.reshape(height, width * channels)
    out = np.empty((height, width * channels + 1), np.uint8)
    out[:, 0] = FILTER_UP
    out[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=out[1:, 1:])
    return out


def deflate(data: bytes | memoryview) -> bytes:
    """A zlib stream (PNG's IDAT payload): ISA-L's level 1 when installed, else zlib's level 1 Z_RLE."""
    if isal_zlib is not None:
        return isal_zlib.compress(data, ISAL_LEVEL)
    packer = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, 9, Z_RLE)
    return packer.compress(data) + packer.flush()


def encode_png(image: Image.Image, texts: Sequence[tuple[str, str]] = ()) -> bytes:
    """The PNG file for ``image`` with ``texts`` as text chunks."""
    if image.mode in _CHANNELS:
        channels, colour_type = _CHANNELS[image.mode]
        pixels = np.asarray(image).reshape(image.height, image.width, channels)
        header = struct.pack(">IIBBBBB", image.width, image.height, 8, colour_type, 0, 0, 0)
        return b"".join(
            [
                SIGNATURE,
                chunk(b"IHDR", header),
                *(text_chunk(k, v) for k, v in texts),
                chunk(b"IDAT", deflate(up_filtered(pixels).data)),
                chunk(b"IEND", b""),
            ]
        )
    info = PngImagePlugin.PngInfo()
    for key, value in texts:
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info, compress_level=COMPRESS_LEVEL, compress_type=Z_RLE)
    return buffer.getvalue()
