"""PNG encoding cost per compress level and encoder, on pictures like the app's (issue 17).

    python -m bench.png [--size 512] [--repeat 10]

Encodes the simulated device's pictures (smooth colour fields with mild noise, as costly to
compress as generated images) with Pillow at each zlib level, then with the app's encoder
(``serving.postprocess``: the AVG row filter in numpy, then ISA-L's level 1 deflate when ``isal`` is
installed, else zlib level 1 with the Z_RLE strategy), and prints milliseconds and kilobytes per
image (median of the repeats), one thread.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from typing import Any

from PIL import Image

from pipeline.engine.model.simulated import picture


def measure(size: int, repeat: int, levels: range) -> list[tuple[int, float, float]]:
    images = [picture(size, seed) for seed in range(4)]
    rows = []
    for level in levels:
        times, sizes = [], []
        for _ in range(repeat):
            for image in images:
                buffer = io.BytesIO()
                t0 = time.perf_counter()
                image.save(buffer, format="PNG", compress_level=level)
                times.append((time.perf_counter() - t0) * 1000)
                sizes.append(buffer.tell() / 1024)
        rows.append((level, statistics.median(times), statistics.median(sizes)))
    return rows


def measure_app_encoder(size: int, repeat: int) -> list[tuple[str, float, float]]:
    from pipeline.serving import postprocess as png

    images = [picture(size, seed) for seed in range(4)]

    def pillow(image: Image.Image) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1, compress_type=png.Z_RLE)
        return buffer.getvalue()

    encoders: list[tuple[str, Any, Any]] = [("pillow, level 1, Z_RLE", pillow, png.isal_zlib)]
    if png.isal_zlib is not None:
        encoders.append(("app encoder, zlib level 1 Z_RLE (without isal)", png.encode_png, None))
    encoders.append((f"app encoder ({png.encoder_name()})", png.encode_png, png.isal_zlib))
    rows = []
    for name, encode, isal in encoders:
        saved, png.isal_zlib = png.isal_zlib, isal
        try:
            times, sizes = [], []
            for _ in range(repeat):
                for image in images:
                    t0 = time.perf_counter()
                    data = encode(image)
                    times.append((time.perf_counter() - t0) * 1000)
                    sizes.append(len(data) / 1024)
            rows.append((name, statistics.median(times), statistics.median(sizes)))
        finally:
            png.isal_zlib = saved
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"| compress_level | ms per {args.size} px image | KiB |")
    print("|---|---|---|")
    for level, ms, kib in measure(args.size, args.repeat, range(0, 10)):
        print(f"| {level} | {ms:.1f} | {kib:.0f} |")
    print(f"\n| encoder | ms per {args.size} px image | KiB |")
    print("|---|---|---|")
    for name, ms, kib in measure_app_encoder(args.size, args.repeat):
        print(f"| {name} | {ms:.1f} | {kib:.0f} |")


if __name__ == "__main__":
    main()
