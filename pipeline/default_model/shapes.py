"""The default model's world: coloured shapes on coloured backgrounds, drawn with Pillow and scored
without a model.

Used three ways: ``pipeline.default_model.train`` trains on ``render(spec)`` with ``caption(spec)``;
``pipeline.default_model.evaluate`` and the tests score generated images with ``score(image)`` (background
colour from the border pixels, foreground colour from the pixels that differ from it, shape by
matching the foreground's outline against the same shapes drawn here).

Some colour x shape x background combinations (``HELD_OUT``) never appear in training, so the
evaluation can tell learning the words apart from memorising the pictures.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Iterator

import numpy as np
from PIL import Image, ImageDraw

SIZE = 64  # the training resolution, in pixels
_SUPERSAMPLE = 4  # drawn at 4x and downsampled, for smooth edges

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "orange": (250, 128, 0),
    "yellow": (245, 225, 30),
    "green": (40, 170, 70),
    "blue": (40, 90, 220),
    "purple": (140, 60, 190),
    "white": (245, 245, 245),
    "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "star")
POSITIONS: dict[str, tuple[float, float]] = {  # centre, as a fraction of the image
    "center": (0.5, 0.5),
    "top left": (0.3, 0.3),
    "top right": (0.7, 0.3),
    "bottom left": (0.3, 0.7),
    "bottom right": (0.7, 0.7),
}
SIZES: dict[str, float] = {"small": 0.36, "large": 0.62}  # shape extent, as a fraction of the image
# The UI's example prompts, in this module's words, are constants in ``prompts.py``.


def _held_out() -> frozenset[tuple[str, str, str]]:
    """16 (foreground, shape, background) triples never drawn in training: every colour twice as a
    foreground and twice as a background, every shape four times."""
    names = list(COLOURS)
    out = set()
    for i in range(16):
        fg = names[i % 8]
        bg = names[(i % 8 + 3 + 2 * (i // 8)) % 8]
        out.add((fg, SHAPES[(i + i // 8) % 4], bg))
    return frozenset(out)


HELD_OUT = _held_out()


@dataclasses.dataclass(frozen=True)
class Spec:
    """One picture: what the caption says, plus the jitter it does not."""

    fg: str
    shape: str
    bg: str
    position: str = "center"
    size: str = "large"
    detailed: bool = False  # whether the caption names the size and position
    dx: float = 0.0  # jitter of the centre, as a fraction of the image
    dy: float = 0.0
    scale: float = 1.0  # jitter of the size

    @property
    def combo(self) -> tuple[str, str, str]:
        return (self.fg, self.shape, self.bg)


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def caption(spec: Spec) -> str:
    if spec.detailed:
        where = "in the center" if spec.position == "center" else f"in the {spec.position}"
        return f"a {spec.size} {spec.fg} {spec.shape} {where} on {_a(spec.bg)} background"
    return f"{_a(spec.fg)} {spec.shape} on {_a(spec.bg)} background"


def _outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The polygon of ``shape`` centred at (cx, cy) with half-extent ``r`` (circles are drawn as ellipses)."""
    if shape == "square":
        r *= 0.85  # a square of the same half-extent looks much bigger than the others
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    if shape == "star":
        points = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * 0.45
            angle = -math.pi / 2 + k * math.pi / 5
            points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle) + r * 0.1))
        return points
    raise ValueError(shape)


def render(spec: Spec, size: int = SIZE) -> Image.Image:
    big = size * _SUPERSAMPLE
    image = Image.new("RGB", (big, big), COLOURS[spec.bg])
    draw = ImageDraw.Draw(image)
    px, py = POSITIONS[spec.position]
    if spec.size == "large":  # large shapes off centre stay clear of the border
        px, py = 0.5 + (px - 0.5) * 0.7, 0.5 + (py - 0.5) * 0.7
    cx, cy = (px + spec.dx) * big, (py + spec.dy) * big
    r = SIZES[spec.size] * spec.scale * big / 2
    if spec.shape == "circle":
        r *= 0.95
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=COLOURS[spec.fg])
    else:
        draw.polygon(_outline(spec.shape, cx, cy, r), fill=COLOURS[spec.fg])
    return image.resize((size, size), Image.Resampling.LANCZOS)


def all_combos() -> list[tuple[str, str, str]]:
    return [(fg, shape, bg) for fg in COLOURS for shape in SHAPES for bg in COLOURS if bg != fg]


def training_combos() -> list[tuple[str, str, str]]:
    return [c for c in all_combos() if c not in HELD_OUT]


def random_spec(rng: random.Random, combo: tuple[str, str, str]) -> Spec:
    fg, shape, bg = combo
    # Every caption pins the layout down (an undetailed one means large, in the centre): a caption
    # that allowed several layouts would teach the model their average, a blob.
    detailed = rng.random() < 0.5
    if detailed:
        position, size = rng.choice(list(POSITIONS)), rng.choice(list(SIZES))
    else:
        position, size = "center", "large"
    return Spec(
        fg,
        shape,
        bg,
        position,
        size,
        detailed,
        dx=rng.uniform(-0.04, 0.04),
        dy=rng.uniform(-0.04, 0.04),
        scale=rng.uniform(0.9, 1.1),
    )


def training_specs(n: int, seed: int) -> Iterator[Spec]:
    """``n`` training pictures, every training combination equally often, in a seeded order."""
    rng = random.Random(seed)
    combos = training_combos()
    for i in range(n):
        if i % len(combos) == 0:
            rng.shuffle(combos)
        yield random_spec(rng, combos[i % len(combos)])


def to_array(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


# ---- scoring: no model, only the pixels -------------------------------------------------------

_PALETTE = np.array(list(COLOURS.values()), dtype=np.float32)
_NAMES = list(COLOURS)


def nearest_colour(rgb: np.ndarray) -> str:
    return _NAMES[int(np.argmin(((_PALETTE - rgb) ** 2).sum(axis=1)))]


def _template(shape: str, n: int = 24) -> np.ndarray:
    """The shape's mask cropped to its bounding box and resized to n x n."""
    spec = Spec("white", shape, "black", size="large")
    return _bbox_mask(to_array(render(spec, 128)).mean(axis=2) > 127, n)


def _bbox_mask(mask: np.ndarray, n: int) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    crop = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    return (
        np.asarray(
            Image.fromarray(crop.astype(np.uint8) * 255).resize((n, n), Image.Resampling.BILINEAR), dtype=np.float32
        )
        / 255.0
    )


_TEMPLATES: dict[str, np.ndarray] = {}


@dataclasses.dataclass(frozen=True)
class Score:
    bg: str
    fg: str | None  # None: no foreground found
    shape: str | None


def _components(mask: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean mask, as index arrays (flood fill; 64x64 is small)."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    out = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, pixels = [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pixels.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        out.append(np.array(pixels))
    return out


def foreground(a: np.ndarray, bg_rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The foreground's mask and colour: the pixels nearer the foreground colour than the background's,
    largest connected piece only, holes filled. None when nothing differs from the background."""
    h, w, _ = a.shape
    far = np.sqrt(((a - bg_rgb) ** 2).sum(axis=2)) > 70
    if far.sum() < max(6, h * w // 400):
        return None
    fg_rgb = np.median(a[far], axis=0)
    near_fg = ((a - fg_rgb) ** 2).sum(axis=2) < ((a - bg_rgb) ** 2).sum(axis=2)
    pieces = _components(near_fg)
    if not pieces:
        return None
    largest = max(pieces, key=len)
    mask = np.zeros((h, w), dtype=bool)
    mask[largest[:, 0], largest[:, 1]] = True
    # Fill holes: whatever background cannot be reached from the border is inside the shape.
    outside = np.zeros((h, w), dtype=bool)
    border = [(y, x) for y in range(h) for x in (0, w - 1)] + [(y, x) for x in range(w) for y in (0, h - 1)]
    stack = [(y, x) for y, x in border if not mask[y, x]]
    for y, x in stack:
        outside[y, x] = True
    while stack:
        y, x = stack.pop()
        for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
            if 0 <= ny < h and 0 <= nx < w and not mask[ny, nx] and not outside[ny, nx]:
                outside[ny, nx] = True
                stack.append((ny, nx))
    return ~outside, fg_rgb


def score(image: Image.Image) -> Score:
    """Background colour (median of the 2-pixel border), foreground colour (median of the pixels far
    from it) and shape (the best overlap of the foreground's bounding-box mask with each shape's).

    The shape's mask is made robust to what generated pictures have and drawn ones do not: soft
    edges (a pixel belongs to the shape when it is nearer the shape's colour than the background's),
    stray specks and halos (only the largest connected piece counts) and lighter centres (holes are
    filled)."""
    a = to_array(image)
    border = np.concatenate(
        [a[:2].reshape(-1, 3), a[-2:].reshape(-1, 3), a[:, :2].reshape(-1, 3), a[:, -2:].reshape(-1, 3)]
    )
    bg_rgb = np.median(border, axis=0)
    bg = nearest_colour(bg_rgb)
    found = foreground(a, bg_rgb)
    if found is None:
        return Score(bg, None, None)
    mask, fg_rgb = found
    fg = nearest_colour(fg_rgb)
    if not _TEMPLATES:
        _TEMPLATES.update({s: _template(s) for s in SHAPES})
    cropped = _bbox_mask(mask, 24)
    overlap = {
        s: float((np.minimum(cropped, t)).sum() / max(1e-6, np.maximum(cropped, t).sum()))
        for s, t in _TEMPLATES.items()
    }
    return Score(bg, fg, max(overlap, key=lambda s: overlap[s]))
