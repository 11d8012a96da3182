"""Hostile and awkward image files, built in memory: what the upload path must refuse or make plain.

Each builder returns the file's bytes. The bombs are small on disk and huge once inflated; the
awkward ones (CMYK, 16-bit, palette, EXIF-rotated, animated) are real images the app must take.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib

from PIL import Image


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bytes(image: Image.Image, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", **params)
    return out.getvalue()


def jpeg_bytes(image: Image.Image, **params: object) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **params)
    return out.getvalue()


def noisy(width: int = 64, height: int = 48, mode: str = "RGB", seed: int = 0) -> Image.Image:
    import numpy as np

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "CMYK": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def truncated_png() -> bytes:
    data = png_bytes(noisy(128, 128))
    return data[: len(data) // 2]


def corrupt_png() -> bytes:
    """A PNG whose compressed pixels are scrambled (its IDAT's CRC no longer matches)."""
    data = bytearray(png_bytes(noisy(128, 128)))
    at = data.index(b"IDAT") + 40
    data[at : at + 64] = bytes(64)
    return bytes(data)


def truncated_jpeg() -> bytes:
    data = jpeg_bytes(noisy(256, 256), quality=90)
    return data[: len(data) // 3]


def corrupt_jpeg() -> bytes:
    """A JPEG whose frame header (SOF0) is garbage: no decoder can size it."""
    data = bytearray(jpeg_bytes(noisy(64, 64)))
    at = data.index(b"\xff\xc0")
    data[at + 2 : at + 12] = b"\x00" * 10
    return bytes(data)


def huge_header_png(width: int = 50_000, height: int = 50_000) -> bytes:
    """A valid-looking PNG that claims ``width`` x ``height`` pixels (one tiny IDAT follows)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def huge_header_jpeg(width: int = 50_000, height: int = 50_000) -> bytes:
    """A real JPEG whose frame header is rewritten to claim ``width`` x ``height``."""
    data = bytearray(jpeg_bytes(noisy(16, 16)))
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@functools.cache
def zip_bomb_png(side: int = 8_000) -> bytes:
    """A real greyscale PNG of ``side`` x ``side`` zeros: ~60 KB that inflate to ``side``² bytes (64 MB,
    192 MB as RGB), under Pillow's own bomb threshold (89 MP): only the app's cap stops it."""
    packer = zlib.compressobj(9)
    row = b"\x00" * (side + 1)  # filter byte + one grey byte per pixel
    parts = [packer.compress(row * 1000) for _ in range(side // 1000)]
    parts.append(packer.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", b"".join(parts))
        + _png_chunk(b"IEND", b"")
    )


@functools.cache
def text_bomb_png() -> bytes:
    """A small, valid PNG with a zTXt chunk that inflates to 100 MB."""
    data = png_bytes(noisy(8, 8))
    body = b"Comment\x00\x00" + zlib.compress(b"\x00" * 100_000_000, 9)
    end = data.index(b"IEND") - 4
    return data[:end] + _png_chunk(b"zTXt", body) + data[end:]


def svg_polyglot() -> bytes:
    return b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>fetch("/")</script></svg>'


def html_polyglot() -> bytes:
    """A GIF header that is also an HTML page with a script."""
    return b"GIF89a/*<html><body><script>alert(document.cookie)</script></body></html>*/=0;"


def many_frame_gif(frames: int = 10_000) -> bytes:
    """A GIF of ``frames`` 1 x 1 frames, written byte by byte (Pillow would take minutes)."""
    head = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = (
        b"\x21\xf9\x04\x00\x01\x00\x00\x00" + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    )
    return head + frame * frames + b"\x3b"


def cmyk_jpeg() -> bytes:
    return jpeg_bytes(noisy(40, 30, "CMYK"))


def sixteen_bit_png() -> bytes:
    """A 16-bit greyscale PNG: a ramp from 0 to 65535 across its width."""
    import numpy as np

    ramp = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (16, 1))
    image = Image.fromarray(ramp)
    assert image.mode == "I;16", image.mode
    return png_bytes(image)


def rotated_jpeg() -> bytes:
    """A 60 x 20 JPEG whose EXIF says "rotate 90° clockwise to view" (orientation 6), with a description."""
    image = noisy(60, 20)
    exif = image.getexif()
    exif[0x0112] = 6
    exif[0x010E] = "taken at home, 51.5 N 0.1 W"  # ImageDescription: metadata that must not survive
    return jpeg_bytes(image, exif=exif.tobytes())


def palette_png_with_transparency() -> bytes:
    image = Image.new("P", (8, 8), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * (254 * 3))
    return png_bytes(image, transparency=1)


def animated_webp() -> bytes:
    red, blue = Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (16, 16), (0, 0, 255))
    out = io.BytesIO()
    red.save(out, "WEBP", save_all=True, append_images=[blue], lossless=True, duration=100)
    return out.getvalue()


def smooth_jpeg(side: int = 2048) -> bytes:
    """A ``side`` x ``side`` JPEG of gentle gradients: about 85 KB on the wire for 4 MP to decode."""
    import numpy as np

    y, x = np.mgrid[0:side, 0:side]
    pixels = np.stack([(x // 8) % 256, (y // 8) % 256, ((x + y) // 16) % 256], -1).astype(np.uint8)
    return jpeg_bytes(Image.fromarray(pixels), quality=90)


def animated_png(frames: int = 100_000, side: int = 256, text: str = "") -> bytes:
    """An APNG of ``frames`` frames, written chunk by chunk: a ``side`` x ``side`` first frame, then
    1 x 1 frames (a few bytes each, but composing one copies the whole canvas), and a ``tEXt``
    ``parameters`` chunk after them all (Pillow's ``text`` seeks to the last frame to find it)."""
    row = b"\x00" + b"\x80" * (side * 3)
    first = zlib.compress(row * side, 9)
    tiny = zlib.compress(b"\x00\x80\x80\x80")
    out = [b"\x89PNG\r\n\x1a\n", _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)),
           _png_chunk(b"acTL", struct.pack(">II", frames, 0)),
           _png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, side, side, 0, 0, 1, 100, 0, 0)),
           _png_chunk(b"IDAT", first)]  # fmt: skip
    sequence = 1
    for _ in range(frames - 1):
        out.append(_png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", sequence, 1, 1, 0, 0, 1, 100, 0, 0)))
        out.append(_png_chunk(b"fdAT", struct.pack(">I", sequence + 1) + tiny))
        sequence += 2
    if text:
        out.append(_png_chunk(b"tEXt", b"parameters\x00" + text.encode("latin-1")))
    out.append(_png_chunk(b"IEND", b""))
    return b"".join(out)


def many_scan_jpeg(scans: int = 100_000, side: int = 256) -> bytes:
    """A progressive JPEG with ``scans`` empty scans after its own: each is one SOS header repeated
    (libjpeg decodes every scan over every block of the picture: thousands are seconds, at 4096 px
    a few milliseconds each)."""
    data = jpeg_bytes(Image.new("RGB", (side, side), (120, 80, 200)), progressive=True, quality=90)
    sos = data.rfind(b"\xff\xda")
    header = data[sos : sos + 2 + struct.unpack(">H", data[sos + 2 : sos + 4])[0]]
    return data[:-2] + header * scans + b"\xff\xd9"


REFUSED = {  # name -> (bytes builder, a word the error must carry besides the field)
    "truncated PNG": (truncated_png, "truncated"),
    "corrupt PNG": (corrupt_png, "PNG"),
    "truncated JPEG": (truncated_jpeg, "truncated"),
    "corrupt JPEG": (corrupt_jpeg, "JPEG"),
    "50,000 x 50,000 PNG header": (huge_header_png, "MP"),
    "50,000 x 50,000 JPEG header": (huge_header_jpeg, "MP"),
    "zip-bomb PNG": (zip_bomb_png, "MP"),
    "zTXt-bomb PNG": (text_bomb_png, "metadata"),
    "SVG polyglot": (svg_polyglot, "PNG, JPEG or WebP"),
    "HTML polyglot": (html_polyglot, "PNG, JPEG or WebP"),
    "GIF of 10,000 frames": (many_frame_gif, "PNG, JPEG or WebP"),
    "APNG of 100,000 frames": (animated_png, "chunks"),
    "JPEG of 100,000 scans": (many_scan_jpeg, "scans"),
}
