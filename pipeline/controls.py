"""ControlNet as the app names it (issue 51), free of torch: ``--controlnet NAME=PATH_OR_HUB_ID``, the
request's control fields' cross-field rules, and the control map from an upload.

A request picks a ControlNet by name (``control``; "none": no control), sends its map
(``control_image``, through the same upload checks as image-to-image's picture), a weight
(``control_scale``, 0 to 2), the fraction of its steps it acts on (``control_start`` to
``control_end``) and how the upload becomes the map (``control_preprocess``): ``"none"`` (the image is
the map), ``"canny"`` (edges drawn from a picture: Canny's detector with AUTOMATIC1111's thresholds,
100 and 200), ``"invert"`` (a dark sketch on white becomes light on black). The model side gets one
map per image at the job's size (``InferenceJob.controls``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from PIL import Image, ImageOps

from .fields import CONTROL_PREPROCESSORS, NONE
from .uploads import MAX_UPLOAD_PIXELS, read_image

PREPROCESSORS = CONTROL_PREPROCESSORS
CANNY_LOW, CANNY_HIGH = 100, 200  # AUTOMATIC1111's ControlNet extension's defaults
SCALE_MAX = 2.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class ControlSpec:
    """One ``--controlnet`` value: the name requests use and where the weights are."""

    name: str
    source: str  # a local folder or a hub id

    @classmethod
    def parse(cls, text: str) -> ControlSpec:
        """``NAME=PATH_OR_HUB_ID``; raises ``ValueError`` naming what is wrong."""
        name, eq, source = (part.strip() for part in text.strip().partition("="))
        if not eq or not source:
            raise ValueError(f"--controlnet must be NAME=PATH_OR_HUB_ID; got {text!r}")
        if name.lower() == NONE or not _NAME.fullmatch(name):
            raise ValueError(f"--controlnet name {name!r} must be 1 to 64 letters, digits, '_', '.' or '-' "
                             f"(not starting with one of the last three), and not {NONE!r}")  # fmt: skip
        return cls(name, source)


def parse_all(texts: tuple[str, ...] | list[str]) -> tuple[ControlSpec, ...]:
    specs = tuple(ControlSpec.parse(t) for t in texts if t.strip())
    names = [s.name.lower() for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("--controlnet: each ControlNet needs its own name; one is given twice")
    return specs


def decoded_map(raw: Mapping[str, Any], options: tuple[tuple[str, Any], ...], size: tuple[int, int],
                pixels_left: int) -> Image.Image:  # fmt: skip
    """The request's map: ``control_image`` through the image upload's checks (its header held to the
    pixels the cost budget leaves), then ``control_map``. Off the event loop (``request.with_pictures``)."""
    budget = min(max(0, pixels_left), MAX_UPLOAD_PIXELS)
    note = "" if budget >= MAX_UPLOAD_PIXELS else "what the request's cost budget leaves for its uploads"
    picture = read_image(raw["control_image"], "control_image", max_pixels=budget, note=note)
    return control_map(picture, str(dict(options).get("control_preprocess", "none")), *size)


def map_preview(data: bytes, preprocess: str, width: int, height: int) -> Image.Image:
    """The map a request with this upload would give the model (the page's "Show the map"): the same
    upload checks and ``control_map``. Off the event loop, on the decode threads (``serving.decoding``)."""
    return control_map(read_image(data, "control_image"), preprocess, width, height)


def control_map(picture: Image.Image, preprocess: str, width: int, height: int) -> Image.Image:
    """The map the model reads: the upload resized to the job's size (Lanczos), then preprocessed."""
    image = picture.convert("RGB")
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    if preprocess == "invert":
        return ImageOps.invert(image)
    if preprocess == "canny":
        return Image.fromarray(canny(np.asarray(image))).convert("RGB")
    return image


def canny(rgb: np.ndarray, low: int = CANNY_LOW, high: int = CANNY_HIGH) -> np.ndarray:
    """Canny's edges of an RGB picture as OpenCV computes them by default (3x3 Sobel per channel, the
    channel with the largest L1 gradient, non-maximum suppression, hysteresis between ``low`` and
    ``high``): 255 on edges, 0 elsewhere."""
    a = rgb.astype(np.float32)
    padded = np.pad(a, ((1, 1), (1, 1), (0, 0)), mode="reflect")

    def at(dy: int, dx: int) -> np.ndarray:
        return padded[1 + dy : padded.shape[0] - 1 + dy, 1 + dx : padded.shape[1] - 1 + dx]

    gx = (at(-1, 1) + 2 * at(0, 1) + at(1, 1)) - (at(-1, -1) + 2 * at(0, -1) + at(1, -1))
    gy = (at(1, -1) + 2 * at(1, 0) + at(1, 1)) - (at(-1, -1) + 2 * at(-1, 0) + at(-1, 1))
    magnitude = np.abs(gx) + np.abs(gy)
    best = magnitude.argmax(axis=2)[..., None]
    gx, gy = np.take_along_axis(gx, best, 2)[..., 0], np.take_along_axis(gy, best, 2)[..., 0]
    m = np.take_along_axis(magnitude, best, 2)[..., 0]
    # Non-maximum suppression across the gradient's direction, in four sectors.
    angle = (np.rad2deg(np.arctan2(gy, gx)) + 180.0) % 180.0
    mp = np.pad(m, 1)
    h, w = m.shape

    def shifted(dy: int, dx: int) -> np.ndarray:
        return mp[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]

    sectors = [((angle < 22.5) | (angle >= 157.5), (0, 1)), ((angle >= 22.5) & (angle < 67.5), (1, 1)),
               ((angle >= 67.5) & (angle < 112.5), (1, 0)), ((angle >= 112.5) & (angle < 157.5), (1, -1))]  # fmt: skip
    keep = np.zeros_like(m, dtype=bool)
    for where, (dy, dx) in sectors:
        keep |= where & (m > shifted(dy, dx)) & (m >= shifted(-dy, -dx))
    strong, weak = keep & (m > high), keep & (m > low)
    return (_hysteresis(strong, weak) * 255).astype(np.uint8)


def _hysteresis(strong: np.ndarray, weak: np.ndarray) -> np.ndarray:
    """The weak pixels 8-connected to a strong one (strong pixels are weak too): one flood from every
    strong pixel, each pixel visited once, so its cost is linear in the picture's size."""
    h, w = weak.shape
    edges = np.zeros_like(weak)
    stack = [int(i) for i in np.flatnonzero(strong)]
    flat, seen = weak.ravel(), edges.ravel()
    for i in stack:
        seen[i] = True
    while stack:
        i = stack.pop()
        y, x = divmod(i, w)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                ny, nx = y + dy, x + dx
                if 0 <= ny < h and 0 <= nx < w:
                    j = ny * w + nx
                    if flat[j] and not seen[j]:
                        seen[j] = True
                        stack.append(j)
    return edges
