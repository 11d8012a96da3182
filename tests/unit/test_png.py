"""PNG files as other tools read them: pixels exact, text chunks intact, every chunk's CRC right."""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from pipeline.engine.model.simulated import picture
from pipeline.serving import postprocess as png

TEXTS = (
    ("parameters", "a red circle, café\nSteps: 4, Sampler: Euler, CFG scale: 7.5, Seed: 1, Size: 64x64"),
    ("generation", json.dumps({"prompt": "猫 on a mat — ☂", "seed": 1}, ensure_ascii=False)),
)


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """Walk the file chunk by chunk, checking each CRC (what libpng and pngcheck do)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        out.append((kind, body))
        at += 12 + length
    return out


@pytest.fixture(params=["isal", "zlib"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "zlib":
        monkeypatch.setattr(png, "isal_zlib", None)
    assert png.encoder_name() == request.param
    return str(request.param)


# the app's own writer (RGB, RGBA, L), and Pillow's for the modes it leaves to Pillow
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "I;16"])
def test_pixels_and_text_chunks_survive_as_other_readers_see_them(encoder: str, mode: str) -> None:
    image = picture(96, seed=3).convert(mode if mode != "I;16" else "L")
    if mode == "I;16":
        image = Image.fromarray(np.asarray(image).astype(np.uint16) * 257)
    if mode == "RGBA":  # an alpha that varies, so the filter's 4-byte pixels are exercised
        image.putalpha(Image.fromarray(np.asarray(picture(96, seed=5))[:, :, 1]))
    data = png.encode_png(image, TEXTS)
    kinds = [kind for kind, _ in chunks(data)]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    # text before the pixels, where a reader that stops at the first IDAT still finds it
    assert max(kinds.index(b"tEXt"), kinds.index(b"iTXt")) < kinds.index(b"IDAT")
    with Image.open(io.BytesIO(data)) as read:
        read.load()
        assert read.mode == image.mode and read.size == (96, 96)
        assert np.array_equal(np.asarray(read), np.asarray(image))
        assert dict(read.text) == dict(TEXTS)
    with Image.open(io.BytesIO(data)) as read:
        read.verify()  # Pillow's own structural check
    # libpng's decoder as well (imagecodecs, a test dependency), where the app wrote the file itself
    imagecodecs = pytest.importorskip("imagecodecs")
    if mode in ("RGB", "RGBA", "L"):
        assert np.array_equal(imagecodecs.png_decode(data), np.asarray(image))


def test_the_up_filter_is_the_one_png_defines() -> None:
    """Row by row, byte by byte, as the PNG specification writes it (up = the byte above, 0 on row 0)."""
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    rows = pixels.reshape(5, 12).astype(int)
    filtered = png.up_filtered(pixels)
    for y in range(5):
        assert filtered[y, 0] == 2
        for x in range(12):
            up = rows[y - 1, x] if y else 0
            assert filtered[y, x + 1] == (rows[y, x] - up) % 256


def test_latin1_text_is_tEXt_and_the_rest_is_iTXt() -> None:
    assert png.text_chunk("parameters", "café")[4:8] == b"tEXt"
    assert png.text_chunk("generation", "猫")[4:8] == b"iTXt"


def test_a_generated_picture_is_no_bigger_than_pillow_at_level_1(encoder: str) -> None:
    """The fast path must not trade away file size (what every user downloads)."""
    image = picture(256, seed=1)
    pillow = io.BytesIO()
    image.save(pillow, format="PNG", compress_level=1)
    assert len(png.encode_png(image)) <= pillow.tell()
