"""PNG bytes with text chunks, as fast as the machine allows: the server's biggest cost per image.

``encode_png(image, texts)`` compresses with zlib level 1 and the Z_RLE strategy over the AVG row
filter. On generated pictures (smooth fields with fine noise) LZ77's string matching finds almost
nothing to match and costs most of the time, so run-length matching alone gives files as small as
level 1's and smaller; on flat pictures (the embedded model's shapes) runs are all there is to find.
Measured (``python -m bench.png``, one 512 px picture, 2-core CPU; docs/performance-notes.md):

    Pillow, level 1, default strategy          23.5 ms   537 KiB   (the encoder before this one)
    Pillow, level 1, Z_RLE                     17.2 ms   486 KiB   (the fallback below)
    imagecodecs (libpng), level 1, Z_RLE, AVG   5.2 ms   459 KiB   (this one; the GIL is released)

``imagecodecs`` (BSD-3-Clause, Christoph Gohlke's, released several times a year, wheels for
Linux, macOS and Windows) encodes the pixels; the text chunks are written here (tEXt for Latin-1,
iTXt for the rest, as Pillow's ``PngInfo.add_text`` decides), right after IHDR where every
reader looks for them. Without ``imagecodecs``, or for a mode it does not take, Pillow writes the
same chunks with the same level and strategy.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Sequence

from PIL import Image, PngImagePlugin

try:
    import imagecodecs
    import numpy as np
except ImportError:  # pragma: no cover - imagecodecs is in requirements.txt
    imagecodecs = None  # type: ignore[assignment]

COMPRESS_LEVEL = 1
Z_RLE = 3  # zlib's run-length-only strategy
FILTER_AVG = 64  # libpng's PNG_FILTER_AVG
_SIGNATURE_AND_IHDR = 8 + 4 + 4 + 13 + 4  # the signature, then IHDR: length, type, 13 bytes, CRC
_FAST_MODES = {"RGB", "RGBA", "L"}


def encoder_name() -> str:
    return "imagecodecs" if imagecodecs is not None else "pillow"


def text_chunk(key: str, value: str) -> bytes:
    """A tEXt chunk if ``value`` is Latin-1, else an uncompressed iTXt chunk (UTF-8)."""
    try:
        kind, payload = b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1")
    except UnicodeEncodeError:
        # keyword, 0, compression flag 0, method 0, empty language tag, 0, empty translated keyword, 0, text
        kind, payload = b"iTXt", key.encode("latin-1") + b"\0\0\0\0\0" + value.encode("utf-8")
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def encode_png(image: Image.Image, texts: Sequence[tuple[str, str]] = ()) -> bytes:
    """The PNG file for ``image`` with ``texts`` as text chunks."""
    if imagecodecs is not None and image.mode in _FAST_MODES:
        pixels = imagecodecs.png_encode(np.asarray(image), level=COMPRESS_LEVEL, strategy=Z_RLE, filter=FILTER_AVG)
        head = bytes(pixels[:_SIGNATURE_AND_IHDR])
        assert head[12:16] == b"IHDR", "libpng always writes IHDR first"
        return head + b"".join(text_chunk(k, v) for k, v in texts) + bytes(pixels[_SIGNATURE_AND_IHDR:])
    info = PngImagePlugin.PngInfo()
    for key, value in texts:
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info, compress_level=COMPRESS_LEVEL, compress_type=Z_RLE)
    return buffer.getvalue()
