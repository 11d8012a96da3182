"""Size presets (1:1, 4:3, ... 9:16) built from the model's default size, its size step and its limits.

Each ratio's preset keeps about the default size's pixel count (so a 16:9 image costs what a square
one does) at its nominal aspect ratio, on the model's size grid; then the larger squares the model's
range allows (twice and four times the default side, issue 48: the embedded model draws up to 256 px,
and its presets stopped at 64). Pure functions; the page shows them as a radio, in view, next to the
exact sliders.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...request import Limits

RATIOS: tuple[tuple[int, int], ...] = ((1, 1), (4, 3), (3, 4), (3, 2), (2, 3), (16, 9), (9, 16))
LARGER = (2, 4)  # the larger squares: these multiples of the default square's side, where the limits allow
ASPECT_TOLERANCE = 0.03  # a preset's aspect may be this far (relative) from its nominal one


@dataclass(frozen=True)
class SizePreset:
    ratio: str  # "16:9"
    width: int
    height: int

    @property
    def label(self) -> str:
        return f"{self.ratio} · {self.width}×{self.height}"

    @property
    def value(self) -> str:
        return f"{self.width}x{self.height}"


def size_presets(default_width: int, default_height: int, limits: Limits) -> list[SizePreset]:
    """One preset per ratio in ``RATIOS``, in that order (a ratio the limits cannot draw is left out).

    Every size is a multiple of ``limits.size_multiple`` within ``[min_size, max_size]`` and
    ``width × height <= max_pixels``. Among the sizes within ``ASPECT_TOLERANCE`` of the ratio,
    the one closest in pixel count to the default size (capped at ``max_pixels``) wins, and the
    closer aspect breaks ties; a ratio with no size that close is left out.
    """
    if limits.size_choices:  # the model draws only these: they are the presets
        return [SizePreset(_ratio(w, h), w, h) for w, h in limits.size_choices]
    step = limits.size_multiple
    lo = math.ceil(limits.min_size / step) * step
    hi = limits.max_size // step * step
    if lo > hi:
        return []
    target = min(default_width * default_height, limits.max_pixels)
    presets: list[SizePreset] = []
    for w_ratio, h_ratio in RATIOS:
        if w_ratio < h_ratio:  # a portrait preset is its landscape one turned: the limits are the same both ways
            best = _best_size(h_ratio / w_ratio, target, step, lo, hi, limits.max_pixels)
            best = best[::-1] if best else None
        else:
            best = _best_size(w_ratio / h_ratio, target, step, lo, hi, limits.max_pixels)
        if best is not None:
            presets.append(SizePreset(f"{w_ratio}:{h_ratio}", best[0], best[1]))
    if presets and presets[0].width == presets[0].height:
        side = presets[0].width
        for factor in LARGER:
            larger = side * factor
            if larger <= hi and larger * larger <= limits.max_pixels:
                presets.append(SizePreset("1:1", larger, larger))
    return presets


def _ratio(width: int, height: int) -> str:
    """The nominal ratio within ``ASPECT_TOLERANCE`` ("16:9"), else the exact reduced one."""
    for w_ratio, h_ratio in RATIOS:
        if abs(width / height / (w_ratio / h_ratio) - 1) <= ASPECT_TOLERANCE:
            return f"{w_ratio}:{h_ratio}"
    g = math.gcd(width, height)
    return f"{width // g}:{height // g}"


def _best_size(aspect: float, target: int, step: int, lo: int, hi: int, max_pixels: int) -> tuple[int, int] | None:
    best: tuple[float, tuple[int, int]] | None = None
    for height in range(lo, hi + 1, step):
        exact = height * aspect
        for width in {math.floor(exact / step) * step, math.ceil(exact / step) * step}:
            if not lo <= width <= hi or width * height > max_pixels:
                continue
            error = abs(width / height / aspect - 1)
            if error > ASPECT_TOLERANCE:
                continue
            cost = abs(math.log(width * height / target)) + error  # pixel count first, then aspect
            if best is None or cost < best[0]:
                best = (cost, (width, height))
    return best[1] if best else None


def preset_value(presets: list[SizePreset], width: object, height: object) -> str | None:
    """The preset value of this exact size, or None (the radio then shows no choice)."""
    for preset in presets:
        if (preset.width, preset.height) == (width, height):
            return preset.value
    return None


def parse_value(value: object) -> tuple[int, int] | None:
    """A preset value ("768x512") as (width, height); None for anything else."""
    if not isinstance(value, str):
        return None
    w, sep, h = value.partition("x")
    if not (sep and w.isdigit() and h.isdigit()):
        return None
    return int(w), int(h)
