"""An uploaded image, read so that it cannot hurt the server: the one way a picture comes in.

Uploads are how a hostile client reaches the server's decoder, so ``read_image`` checks everything
it can before the pixels are decoded, and answers anything else with an ``InvalidRequest`` that
names the field and the limit:

1. **Bytes only.** A value that is a URL or a server path is never fetched or opened (``web.guards``
   and ``web.inputs`` refuse those before this runs); here only bytes arrive.
2. **A byte cap** (``max_bytes``), before anything is parsed.
3. **The format, sniffed from the bytes** (never from the name): PNG, JPEG or WebP, and Pillow is
   told to try that decoder only, so an SVG, an HTML page, a GIF or a polyglot is refused by its
   first bytes.
4. **A pixel cap from the header** (``max_pixels``), read by ``Image.open``, which parses headers
   only: a 50,000 x 50,000 header or a zip-bomb PNG is refused before a single row is inflated.
   Pillow's own ``MAX_IMAGE_PIXELS`` is a process-wide warning threshold, not this request's limit.
   PNG text chunks are capped too (``PNG_TEXT_BYTES``), so a zTXt bomb never inflates.
5. **Decoded, then made plain:** the first frame of an animation; EXIF orientation applied; alpha
   composited over white; palette, CMYK, greyscale and 16-bit images converted to 8-bit RGB; a fresh
   image without metadata (EXIF, ICC, text) is what the rest of the app sees. A truncated or
   corrupt file fails its decode here, as a clear error.

Then the pictures an image mode makes from its uploads: ``read_mask`` (white, or painted on a clear
layer, where the picture is redrawn; feathered by the request's ``mask_blur``) and
``outpaint_canvas`` (the canvas grown on chosen sides, the border filled from the picture's edge,
and the mask that redraws it and the seam).

Free of torch and gradio: the serving side (``request``) calls it, off the event loop.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
from PIL import Image, ImageFile, ImageFilter, ImageOps, PngImagePlugin

from .errors import InvalidRequest

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # an upload's bytes: a 10 MB photo passes
MAX_UPLOAD_PIXELS = 4096 * 4096  # an upload's pixels, from its header: 16.8 MP, 64 MiB as RGBA
PNG_TEXT_BYTES = 64 * 1024  # a PNG text chunk, inflated (Pillow's default is 1 MiB per chunk)
FORMATS = ("PNG", "JPEG", "WEBP")

ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never a half-grey picture
PngImagePlugin.MAX_TEXT_CHUNK = PNG_TEXT_BYTES
PngImagePlugin.MAX_TEXT_MEMORY = 4 * PNG_TEXT_BYTES


def sniff(data: bytes) -> str | None:
    """The image format that ``data`` starts with (PNG, JPEG or WEBP), or None: the bytes decide."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def read_image(
    data: bytes, field: str, *, max_bytes: int = MAX_UPLOAD_BYTES, max_pixels: int = MAX_UPLOAD_PIXELS
) -> Image.Image:
    """``data`` as a plain 8-bit RGB picture without metadata, or an ``InvalidRequest`` naming ``field``."""
    return _read(data, field, max_bytes, max_pixels, keep_alpha=False)


def read_layer(
    data: bytes, field: str, *, max_bytes: int = MAX_UPLOAD_BYTES, max_pixels: int = MAX_UPLOAD_PIXELS
) -> Image.Image:
    """Like ``read_image``, but a picture with transparency stays RGBA (a painted mask layer)."""
    return _read(data, field, max_bytes, max_pixels, keep_alpha=True)


def _read(data: bytes, field: str, max_bytes: int, max_pixels: int, *, keep_alpha: bool) -> Image.Image:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidRequest(field, f"{field}: send the image's bytes (an upload), not a {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise InvalidRequest(field, f"{field}: the file is empty")
    if len(data) > max_bytes:
        raise InvalidRequest(
            field, f"{field}: the file is {len(data) / 2**20:.1f} MiB; at most {max_bytes / 2**20:.0f} MiB"
        )
    kind = sniff(data)
    if kind is None:
        raise InvalidRequest(field, f"{field}: not a PNG, JPEG or WebP image (only those are taken)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(data), formats=(kind,))  # headers only: nothing decoded yet
            with picture:
                if (problem := pixel_problem(*picture.size, max_pixels)) is not None:
                    raise InvalidRequest(field, f"{field}: {problem}")
                picture.seek(0)  # an animation: its first frame only
                picture.load()
                return _plain(picture, keep_alpha)
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest(field, f"{field}: too many pixels; at most {max_pixels / 1e6:.1f} MP") from None
    except ValueError as exc:
        if "too large" in str(exc):  # a text-chunk bomb: Pillow stops inflating at MAX_TEXT_CHUNK
            raise InvalidRequest(
                field, f"{field}: the {kind} file's text metadata is over {PNG_TEXT_BYTES // 1024} KiB inflated"
            ) from None
        raise InvalidRequest(field, f"{field}: the {kind} file is damaged and cannot be read") from None
    except (OSError, SyntaxError, EOFError, Image.UnidentifiedImageError) as exc:
        reason = "truncated" if "truncated" in str(exc) else "damaged"
        raise InvalidRequest(field, f"{field}: the {kind} file is {reason} and cannot be read") from None


def pixel_problem(width: int, height: int, max_pixels: int) -> str | None:
    """Why a picture of this header size is refused (None: it is not)."""
    if width >= 1 and height >= 1 and width * height <= max_pixels:
        return None
    side = int(max_pixels**0.5)
    return (
        f"{width} x {height} is {width * height / 1e6:.1f} MP; at most {max_pixels / 1e6:.1f} MP (e.g. {side} x {side})"
    )


def _plain(picture: Image.Image, keep_alpha: bool = False) -> Image.Image:
    """Upright, 8-bit RGB, alpha over white (``keep_alpha``: RGBA kept), and a new image: no EXIF,
    ICC profile or text survives."""
    upright = ImageOps.exif_transpose(picture) or picture
    mode = upright.mode
    if mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit (and deeper) greyscale: the top 8 bits
        values = np.asarray(upright, dtype=np.float64)
        top = 65535.0 if mode != "F" or values.max(initial=0) > 255 else 255.0
        grey = np.clip(np.rint(values * (255.0 / top)), 0, 255).astype(np.uint8)
        upright = Image.fromarray(grey)  # uint8, 2-D: mode L
    elif mode in ("P", "LA", "La", "PA", "RGBa"):  # a palette (maybe transparent), alpha of any kind
        upright = upright.convert("RGBA")
    if upright.mode == "RGBA" and keep_alpha:
        clear = Image.new("RGBA", upright.size)
        clear.paste(upright)
        return clear
    if upright.mode == "RGBA":
        white = Image.new("RGBA", upright.size, (255, 255, 255, 255))
        upright = Image.alpha_composite(white, upright)
    rgb = upright.convert("RGB")  # CMYK, YCbCr, L and 1 included
    clean = Image.new("RGB", rgb.size)
    clean.paste(rgb)
    return clean


# -- the pictures made from uploads: a mask, an outpainting canvas ------------------------------------
def read_mask(data: Any, size: tuple[int, int], blur: int) -> Image.Image:
    """An uploaded or painted mask as L at ``size``, 255 where the picture is redrawn, feathered by ``blur``.

    A picture with transparency (a painted layer: strokes on a clear background) redraws where it
    is painted; an opaque one where it is light (white redraws, black keeps)."""
    layer = read_layer(data, "mask")
    alpha = np.asarray(layer)[..., 3] if layer.mode == "RGBA" else None
    painted = alpha is not None and alpha.min() < 255  # strokes on a clear layer
    marked = alpha > 0 if painted and alpha is not None else np.asarray(layer.convert("L")) >= 128
    mask = Image.fromarray((marked * 255).astype(np.uint8))
    if mask.size != size:
        mask = mask.resize(size, Image.Resampling.NEAREST)
    return feathered(mask, blur)


def feathered(mask: Image.Image, blur: int) -> Image.Image:
    """``mask`` softened by a Gaussian of ``blur`` pixels (AUTOMATIC1111's "Mask blur")."""
    return mask.filter(ImageFilter.GaussianBlur(blur)) if blur else mask


def outpaint_canvas(
    picture: Image.Image, pads: tuple[int, int, int, int], blur: int
) -> tuple[Image.Image, Image.Image]:
    """The grown canvas (the border filled by repeating the picture's edge, then smoothed) and its
    mask: the border, reaching ``blur`` pixels (at least 8) into the picture, so the seam is redrawn."""
    left, top, right, bottom = pads
    pixels = np.asarray(picture)
    grown = np.pad(pixels, ((top, bottom), (left, right), (0, 0)), mode="edge")
    canvas = Image.fromarray(grown)
    smooth = canvas.filter(ImageFilter.GaussianBlur(max(8, max(pads) // 4)))
    inner = np.zeros(grown.shape[:2], dtype=bool)
    inner[top : top + pixels.shape[0], left : left + pixels.shape[1]] = True
    filled = np.where(inner[..., None], grown, np.asarray(smooth))
    reach = max(8, blur)
    keep = np.zeros_like(inner)
    h, w = pixels.shape[:2]
    keep[top + (reach if top else 0) : top + h - (reach if bottom else 0),
         left + (reach if left else 0) : left + w - (reach if right else 0)] = True  # fmt: skip
    mask = Image.fromarray(np.where(keep, 0, 255).astype(np.uint8))
    return Image.fromarray(filled.astype(np.uint8)), feathered(mask, blur)


def remask(data: bytes, field: str, *, edit_transparent: bool = False, invert: bool = False) -> bytes:
    """A mask from another API's convention as this app's (an opaque PNG, white where redrawn).

    ``edit_transparent``: OpenAI's, where a mask with transparency is edited where it is fully
    transparent (alpha 0); one without is read as this app's. ``invert``: A1111's
    ``inpainting_mask_invert``, the marked area kept and the rest redrawn. Decoded with the caps."""
    layer = read_layer(data, field)
    alpha = np.asarray(layer)[..., 3] if layer.mode == "RGBA" else None
    if alpha is not None and edit_transparent:
        marked = alpha == 0
    elif alpha is not None and alpha.min() < 255:
        marked = alpha > 0
    else:
        marked = np.asarray(layer.convert("L")) >= 128
    if invert:
        marked = ~marked
    out = io.BytesIO()
    Image.fromarray((marked * 255).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()
