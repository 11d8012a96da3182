"""``pipeline.uploads.read_image``: every hostile file refused with the field named and nothing
decoded first; every awkward real image taken as plain 8-bit RGB without its metadata."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from pipeline.errors import InvalidRequest
from pipeline.uploads import MAX_UPLOAD_PIXELS, read_image, sniff
from tests import malformed


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The sizes of the pictures whose pixels were decoded (``ImageFile.load``), in order."""
    from PIL import ImageFile

    seen: list[tuple[int, int]] = []
    original = ImageFile.ImageFile.load

    def load(self: Any) -> Any:
        seen.append(self.size)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


@pytest.mark.parametrize("name", list(malformed.REFUSED))
def test_each_hostile_file_is_refused_naming_the_field(name: str, decodes: list[tuple[int, int]]) -> None:
    build, word = malformed.REFUSED[name]
    data = build()
    with pytest.raises(InvalidRequest) as refused:
        read_image(data, "init_image")
    assert refused.value.field == "init_image" and str(refused.value).startswith("init_image: "), refused.value
    assert word in str(refused.value), refused.value
    # nothing larger than the cap was ever decoded: the bombs are refused from their headers
    assert all(w * h <= MAX_UPLOAD_PIXELS for w, h in decodes), decodes


def test_the_bombs_are_refused_before_any_pixel_is_decoded(decodes: list[tuple[int, int]]) -> None:
    for build in (malformed.zip_bomb_png, malformed.huge_header_png, malformed.huge_header_jpeg):
        with pytest.raises(InvalidRequest, match="MP"):
            read_image(build(), "image")
    assert decodes == []


def test_the_byte_cap_comes_before_parsing(decodes: list[tuple[int, int]]) -> None:
    data = malformed.png_bytes(malformed.noisy(64, 64))
    with pytest.raises(InvalidRequest, match=r"mask: the file is .* MiB; at most 0 MiB"):
        read_image(data, "mask", max_bytes=100)
    assert decodes == []


@pytest.mark.parametrize("value", ["https://example.com/a.png", "/etc/passwd", {"path": "/etc/passwd"}, None])
def test_only_bytes_are_read_never_a_url_or_a_path(value: Any) -> None:
    with pytest.raises(InvalidRequest, match="image: send the image's bytes"):
        read_image(value, "image")


def test_the_format_is_sniffed_from_the_bytes_not_the_name() -> None:
    png = malformed.png_bytes(malformed.noisy())
    assert sniff(png) == "PNG" and sniff(malformed.cmyk_jpeg()) == "JPEG"
    assert sniff(malformed.animated_webp()) == "WEBP"
    assert sniff(malformed.svg_polyglot()) is None and sniff(malformed.html_polyglot()) is None
    assert sniff(b"\x00" + png) is None


def _plain(image: Image.Image) -> None:
    assert image.mode == "RGB"
    assert not image.info and not image.getexif(), (image.info, dict(image.getexif()))


def test_a_cmyk_jpeg_becomes_rgb() -> None:
    image = read_image(malformed.cmyk_jpeg(), "image")
    _plain(image)
    assert image.size == (40, 30)


def test_a_16_bit_png_keeps_its_tones_in_8_bits() -> None:
    image = read_image(malformed.sixteen_bit_png(), "image")
    _plain(image)
    row = np.asarray(image)[0, :, 0].astype(int)
    assert row[0] == 0 and row[-1] == 255 and np.all(np.diff(row) >= 0), row  # a ramp, not clipped white


def test_exif_orientation_is_applied_then_every_tag_dropped() -> None:
    image = read_image(malformed.rotated_jpeg(), "image")
    _plain(image)
    assert image.size == (20, 60)  # upright: rotated as the EXIF said


def test_transparency_is_composited_over_white() -> None:
    image = read_image(malformed.palette_png_with_transparency(), "image")
    _plain(image)
    assert image.getpixel((0, 0)) == (255, 255, 255)
    rgba = malformed.noisy(8, 8, "RGBA")
    rgba.putalpha(0)
    assert read_image(malformed.png_bytes(rgba), "image").getpixel((3, 3)) == (255, 255, 255)


def test_an_animation_gives_its_first_frame() -> None:
    image = read_image(malformed.animated_webp(), "image")
    _plain(image)
    assert image.getpixel((8, 8)) == (255, 0, 0)


@pytest.mark.parametrize(
    "build",
    [lambda: malformed.png_bytes(malformed.noisy()), lambda: malformed.jpeg_bytes(malformed.noisy(), quality=95)],
)
def test_a_plain_image_keeps_its_pixels(build: Callable[[], bytes]) -> None:
    import io

    data = build()
    with Image.open(io.BytesIO(data)) as original:
        expected = np.asarray(original.convert("RGB"))
    image = read_image(data, "image")
    _plain(image)
    assert np.array_equal(np.asarray(image), expected)
