"""The page's ControlNet panel, its logic in process (the page itself: ``tests/browser/test_control_page.py``):
the pad's map is its composite, the page sends the pad only with a control picked and in a mode a
ControlNet acts in, and "Show the map" draws the map a request would give the model."""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipeline.controls import map_preview
from pipeline.errors import InvalidRequest
from pipeline.web.gradio_internals import upload_folder
from pipeline.web.page.handler import with_upload_bytes
from pipeline.web.page.mode_panel import page_values
from tests.helpers import raw_request


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def uploaded(image: Image.Image, name: str) -> dict[str, Any]:
    """A file value as Gradio hands one on: a copy in its upload folder."""
    folder = upload_folder() / uuid.uuid4().hex
    folder.mkdir(parents=True)
    path = folder / name
    image.save(path)
    return {"path": str(path), "meta": {"_type": "gradio.FileData"}}


def test_the_pads_map_is_its_composite_the_picture_and_the_strokes() -> None:
    black = Image.new("RGB", (64, 64))
    stroke = Image.new("RGBA", (64, 64))
    ImageDraw.Draw(stroke).ellipse([10, 20, 30, 40], fill="white")
    composite = black.copy()
    composite.paste(stroke, mask=stroke)
    pad = {"background": uploaded(black, "background.png"), "layers": [uploaded(stroke, "layer_0.png")],
           "composite": uploaded(composite, "composite.png"), "id": None}  # fmt: skip
    raw, copies = with_upload_bytes({"control_image": pad})
    assert raw["control_image"] == png(composite) and len(copies) == 1  # Gradio's copy read, then deleted
    assert not Path(pad["composite"]["path"]).exists()
    # A picture only (uploaded, or sent from a result): the background is the map.
    raw, _ = with_upload_bytes({"control_image": {"background": uploaded(black, "b.png"), "layers": [],
                                                  "composite": None, "id": None}})  # fmt: skip
    assert raw["control_image"] == png(black)


def test_the_page_sends_the_pad_only_with_a_control_and_in_a_mode_it_acts_in() -> None:
    pad = {"background": {"path": "x"}, "layers": [], "composite": None}
    assert page_values({**raw_request(control="shapes"), "control_image": pad})["control_image"] == pad
    off = page_values({**raw_request(), "control_image": pad})
    assert off["control"] == "none" and off["control_image"] is None
    outpaint = page_values({**raw_request(mode="outpaint", control="shapes"), "control_image": pad})
    assert outpaint["control"] == "none" and outpaint["control_image"] is None  # the panel is hidden there


def test_show_the_map_draws_what_a_request_would_give_the_model() -> None:
    picture = Image.new("RGB", (128, 128), "white")
    ImageDraw.Draw(picture).rectangle([32, 32, 96, 96], fill="black")
    same = np.asarray(map_preview(png(picture), "none", 64, 64))
    assert same.shape == (64, 64, 3) and same[32, 32].max() < 40 and same[2, 2].min() > 215  # resized, as is
    inverted = np.asarray(map_preview(png(picture), "invert", 64, 64))
    assert inverted[32, 32].min() > 215 and inverted[2, 2].max() < 40  # a dark drawing on white, made light on black
    edges = np.asarray(map_preview(png(picture), "canny", 64, 64)).mean(axis=2) > 127
    assert edges[16, 16:48].any() and not edges[32, 32] and not edges[2, 2]  # the square's outline only
    with pytest.raises(InvalidRequest, match="control_image"):
        map_preview(b"not a picture", "none", 64, 64)
