"""An uploaded image, read so that it cannot hurt the server: the one way a picture comes in.

Uploads are how a hostile client reaches the server's decoder, so ``read_image`` checks everything
it can before the pixels are decoded, and answers anything else with an ``InvalidRequest`` that
names the field and the limit:

1. **Bytes only.** A value that is a URL or a server path is never fetched or opened (``web.door.guards``
   and ``web.door.inputs`` refuse those before this runs); here only bytes arrive.
2. **A byte cap** (``max_bytes``), before anything is parsed.
3. **The format, sniffed from the bytes** (never from the name): PNG, JPEG or WebP, and Pillow is
   told to try that decoder only, so an SVG, an HTML page, a GIF or a polyglot is refused by its
   first bytes.
4. **A cap on the decoder's work, from the bytes alone** (``work_problem``), before Pillow parses
   anything: a PNG of at most ``MAX_PNG_CHUNKS`` chunks (Pillow walks chunks one by one in Python),
   a progressive JPEG of at most ``MAX_JPEG_SCANS`` scans (libjpeg decodes every scan over every
   block: 100,000 empty scans are minutes), a WebP of at most ``MAX_WEBP_FRAMES`` frames.
5. **A pixel cap from the header** (``max_pixels``), read by ``Image.open``, which parses headers
   only: a 50,000 x 50,000 header or a zip-bomb PNG is refused before a single row is inflated.
   Pillow's own ``MAX_IMAGE_PIXELS`` is a process-wide warning threshold, not this request's limit.
   PNG text chunks are capped too (``PNG_TEXT_BYTES``), so a zTXt bomb never inflates. An animation
   is read to its first frame only and never seeked (Pillow's ``text`` of an animated PNG seeks to
   its last frame, copying the canvas per frame: ``png_text`` reads text from the chunks instead).
6. **Decoded, then made plain:** the first frame of an animation; EXIF orientation applied; alpha
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
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from PIL import Image, ImageFile, ImageFilter, ImageOps, PngImagePlugin

from .errors import InvalidRequest

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # an upload's bytes: a 10 MB photo passes
MAX_UPLOAD_PIXELS = 4096 * 4096  # an upload's pixels, from its header: 16.8 MP, 64 MiB as RGBA
MAX_PNG_CHUNKS = 16_384  # a 20 MiB PNG in 8 KiB IDAT chunks has 2,560
MAX_JPEG_SCANS = 100  # a progressive JPEG has about 10 (libjpeg's default script), mozjpeg's up to ~20
MAX_WEBP_FRAMES = 4_096
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
    data: bytes, field: str, *, max_bytes: int = MAX_UPLOAD_BYTES, max_pixels: int = MAX_UPLOAD_PIXELS, note: str = ""
) -> Image.Image:
    """``data`` as a plain 8-bit RGB picture without metadata, or an ``InvalidRequest`` naming ``field``
    (``note``: why ``max_pixels`` is what it is, added to a refusal for too many pixels)."""
    return _read(data, field, max_bytes, max_pixels, keep_alpha=False, note=note)


def read_layer(
    data: bytes, field: str, *, max_bytes: int = MAX_UPLOAD_BYTES, max_pixels: int = MAX_UPLOAD_PIXELS, note: str = ""
) -> Image.Image:
    """Like ``read_image``, but a picture with transparency stays RGBA (a painted mask layer)."""
    return _read(data, field, max_bytes, max_pixels, keep_alpha=True, note=note)


def _read(data: bytes, field: str, max_bytes: int, max_pixels: int, *, keep_alpha: bool, note: str = "") -> Image.Image:
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
    if (problem := work_problem(data, kind)) is not None:
        raise InvalidRequest(field, f"{field}: {problem}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            picture = Image.open(io.BytesIO(data), formats=(kind,))  # headers only: nothing decoded yet
            with picture:
                if (problem := pixel_problem(*picture.size, max_pixels)) is not None:
                    raise InvalidRequest(field, f"{field}: {problem}{note}")
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


def work_problem(data: bytes, kind: str) -> str | None:
    """Why decoding ``data`` (sniffed as ``kind``) would cost more than its pixels say (None: it would not).
    Linear in the bytes, and C-speed but for the PNG chunk walk, which stops at its cap."""
    if kind == "JPEG":
        # Every scan starts with an SOS marker (FF DA); entropy-coded data never holds one (an FF
        # there is stuffed as FF 00), so the count bounds the scans from above.
        if (scans := data.count(b"\xff\xda")) > MAX_JPEG_SCANS:
            return f"the JPEG file has {scans} scans; at most {MAX_JPEG_SCANS} are decoded"
        return None
    if kind == "WEBP":
        if (frames := data.count(b"ANMF")) > MAX_WEBP_FRAMES:
            return f"the WebP file has {frames} frames; at most {MAX_WEBP_FRAMES}"
        return None
    try:
        for _ in png_chunks(data):
            pass
    except ValueError as exc:
        return str(exc)
    return None


def png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """Each chunk of a PNG file: (type, start, end) of its data, read from the chunk stream alone
    (nothing inflated, no frame composed); ``ValueError`` past ``MAX_PNG_CHUNKS`` chunks."""
    at, count = 8, 0
    while at + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        count += 1
        if count > MAX_PNG_CHUNKS:
            raise ValueError(f"the PNG file has more than {MAX_PNG_CHUNKS} chunks (frames of an animation count)")
        start = at + 8
        yield kind, start, min(start + length, len(data))
        if kind == b"IEND":
            return
        at = start + length + 4  # the data, then its CRC


def png_text(data: bytes) -> dict[str, str]:
    """A PNG's text chunks (tEXt, zTXt, iTXt), read from the chunk stream: no frame is decoded or
    composed (an animated PNG's text after its frames costs no more than its bytes), each
    inflated text capped at ``PNG_TEXT_BYTES``. ``ValueError`` past ``MAX_PNG_CHUNKS`` chunks."""
    texts: dict[str, str] = {}
    for kind, start, end in png_chunks(data):
        if kind not in (b"tEXt", b"zTXt", b"iTXt"):
            continue
        key, _, rest = data[start:end].partition(b"\0")
        if kind == b"zTXt":
            rest = _inflated(rest[1:])
        elif kind == b"iTXt":
            compressed, _method, rest = rest[0:1], rest[1:2], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, rest = rest.partition(b"\0")
            rest = _inflated(rest) if compressed == b"\x01" else rest
        name = key.decode("latin-1")
        if name not in texts and len(texts) < 64:
            texts[name] = rest[:PNG_TEXT_BYTES].decode("utf-8" if kind == b"iTXt" else "latin-1", "replace")
    return texts


def _inflated(data: bytes) -> bytes:
    try:
        return zlib.decompressobj().decompress(data, PNG_TEXT_BYTES)
    except zlib.error:
        return b""


def pixel_problem(width: int, height: int, max_pixels: int) -> str | None:
    """Why a picture of this header size is refused (None: it is not)."""
    if width >= 1 and height >= 1 and width * height <= max_pixels:
        return None
    side = int(max(0, max_pixels) ** 0.5)
    if max_pixels < 10**6:  # a cap the cost budget set: in pixels, as the budget counts them
        return f"{width} x {height} is {width * height} pixels; at most {max(0, max_pixels)} (e.g. {side} x {side})"
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
@dataclass(frozen=True)
class MaskUpload:
    """A mask's bytes and the convention its sender drew it in (the HTTP APIs'), read by ``read_mask``
    when its request's pictures are decoded (after the request's gates: never before)."""

    data: bytes = field(repr=False)
    transparent_edits: bool = False  # OpenAI's: a mask with transparency redraws where it is fully transparent
    invert: bool = False  # A1111's inpainting_mask_invert: the marked area is kept and the rest redrawn


def read_mask(
    data: bytes | MaskUpload, size: tuple[int, int], blur: int, *, max_pixels: int = MAX_UPLOAD_PIXELS, note: str = ""
) -> Image.Image:
    """An uploaded or painted mask as L at ``size``, 255 where the picture is redrawn, feathered by ``blur``.

    A picture with transparency (a painted layer: strokes on a clear background) redraws where it
    is painted; an opaque one where it is light (white redraws, black keeps). A ``MaskUpload`` says
    which other convention its bytes follow."""
    upload = data if isinstance(data, MaskUpload) else MaskUpload(data)
    layer = read_layer(upload.data, "mask", max_pixels=max_pixels, note=note)
    alpha = np.asarray(layer.getchannel("A")) if layer.mode == "RGBA" else None
    if alpha is not None and upload.transparent_edits:
        marked = alpha == 0
    elif alpha is not None and alpha.min() < 255:  # strokes on a clear layer
        marked = alpha > 0
    else:
        marked = np.asarray(layer.convert("L")) >= 128
    if upload.invert:
        marked = ~marked
    mask = Image.fromarray(marked.view(np.uint8) * np.uint8(255))  # one byte a pixel throughout: no int64 copy
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
