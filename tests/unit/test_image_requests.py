"""The picture fields (``request.image_fields``) and image-mode requests through the adapter: every
bad value refused by name before any GPU work, the cost budget counting the steps that run and the
uploads' pixels, and the modes served through the same line and gate as text."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import threading
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pipeline.errors import InvalidRequest
from pipeline.request import Limits, validate
from tests import malformed
from tests.fakes import FAKE_PROFILE, WAIT, FakeModel
from tests.helpers import collect, raw_request, wait_until

LIMITS = Limits.for_model(FAKE_PROFILE, max_pixel_steps=10**9)


def png(width: int = 80, height: int = 48, mode: str = "RGB", colour: Any = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), colour).save(out, "PNG")
    return out.getvalue()


def mask_png(size: int = 64) -> bytes:
    pixels = np.zeros((size, size), dtype=np.uint8)
    pixels[16:48, 16:48] = 255
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def painted_layer(size: int = 64) -> bytes:
    """A painted mask as the page's editor sends it: strokes on a clear layer."""
    layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    layer.paste((255, 255, 255, 255), (0, 0, 16, 16))
    out = io.BytesIO()
    layer.save(out, "PNG")
    return out.getvalue()


def image_raw(mode: str = "image", **over: Any) -> dict[str, Any]:
    raw = raw_request(mode=mode, image=png(), strength=0.5, num_inference_steps=4)
    if mode == "inpaint":
        raw["mask"] = mask_png()
    return {**raw, **over}


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        (raw_request(mode="sketch"), "mode", "mode must be one of: text, image, inpaint, outpaint"),
        (raw_request(mode="image"), "image", "image: image-to-image needs an image"),
        (image_raw(strength=0), "strength", "strength must be a number above 0 and at most 1"),
        (image_raw(strength=1.5), "strength", "at most 1"),
        (image_raw(strength=float("nan")), "strength", "strength must be"),
        (image_raw(strength=0.2), "strength", "strength must be at least 0.25 with num_inference_steps 4"),
        (image_raw(image="https://example.com/a.png"), "image", "send the image's bytes"),
        (image_raw(image={"path": "/etc/passwd"}), "image", "send the image's bytes"),
        (image_raw(image=malformed.svg_polyglot()), "image", "not a PNG, JPEG or WebP"),
        (image_raw(image=malformed.zip_bomb_png()), "image", "MP"),
        (raw_request(image=png()), "image", "image: only the image, inpaint and outpaint modes take it"),
        (image_raw("inpaint", mask=None), "mask", "mask: inpainting needs a mask"),
        (image_raw("inpaint", mask=png(64, 64, "L", 0)), "mask", "it marks nothing to redraw"),
        (image_raw("outpaint"), "outpaint_left", "outpainting needs at least one side"),
        (image_raw("outpaint", outpaint_left=12), "outpaint_left", "multiple of 8"),
        (image_raw("outpaint", outpaint_right=480), "outpaint_right", "at most 512 a side"),
        (image_raw(mask_blur=65), "mask_blur", "between 0 and 64"),
        (raw_request(hires_fix=True, hires_scale=3), "hires_scale", "hires_scale must be 1.5 or 2"),
        (raw_request(hires_fix=True, width=512, height=512), "hires_scale", "makes 1024×1024"),
        (image_raw(hires_fix=True), "hires_fix", "only text mode takes it"),
        (raw_request(hires_fix="yes"), "hires_fix", "hires_fix must be true or false"),
        (raw_request(hires_fix=True, hires_strength=0.01), "hires_strength", "must be 0 (upscale only) or at least"),
    ],
)
def test_each_bad_picture_field_is_refused_by_name(raw: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate(raw, LIMITS)
    assert refused.value.field == field and words in str(refused.value), (refused.value.field, str(refused.value))


def test_a_mode_the_model_lacks_is_refused_naming_the_family_and_why() -> None:
    why = "FluxKontextPipeline's image-to-image class takes no strength: it edits by reference"
    limits = dataclasses.replace(LIMITS, modes=("text",), mode_notes=(("image", why),))
    with pytest.raises(InvalidRequest, match="mode: this model does not serve image-to-image: FluxKontext"):
        validate(image_raw(), limits)
    with pytest.raises(InvalidRequest, match="hires_fix: this model does not serve hires fix"):
        validate(raw_request(hires_fix=True), limits)


def test_the_picture_is_resized_to_the_request_and_outpainting_grows_the_canvas() -> None:
    request = validate(image_raw(width=64, height=96), LIMITS)
    job = request.to_job()
    assert job.mode == "image" and job.images[0].size == (64, 96) and job.strength == 0.5
    outpaint = validate(image_raw("outpaint", outpaint_left=16, outpaint_bottom=32), LIMITS)
    job = outpaint.to_job()
    assert job.mode == "inpaint" and (job.width, job.height) == (80, 96) and job.images[0].size == (80, 96)
    mask = np.asarray(job.masks[0])
    assert mask[:, :8].min() == 255 and mask[-16:, :].min() == 255  # the new border is redrawn
    assert mask[20:40, 40:60].max() == 0  # the picture's middle is kept
    assert outpaint.parameters()["outpaint_left"] == 16 and outpaint.parameters()["mode"] == "outpaint"


def test_a_mask_is_read_from_light_pixels_or_from_a_painted_layer() -> None:
    plain = validate(image_raw("inpaint", mask_blur=0), LIMITS).to_job().masks[0]
    assert np.asarray(plain)[32, 32] == 255 and np.asarray(plain)[2, 2] == 0
    painted = validate(image_raw("inpaint", mask=painted_layer(), mask_blur=0), LIMITS).to_job().masks[0]
    assert np.asarray(painted)[4, 4] == 255 and np.asarray(painted)[40, 40] == 0


def test_the_cost_budget_counts_the_steps_that_run_both_passes_and_the_uploads() -> None:
    one_image = 64 * 64 * 8  # a text request of 8 steps at 64 px
    tight = dataclasses.replace(LIMITS, max_pixel_steps=one_image)
    validate(raw_request(num_inference_steps=8), tight)  # exactly the budget
    half = image_raw(num_inference_steps=8, strength=0.5, image=png(8, 8))  # 4 steps + 64 upload pixels
    validate(half, dataclasses.replace(LIMITS, max_pixel_steps=64 * 64 * 4 + 64))
    # the picture's header is held to what the budget leaves, before its rows are decoded
    with pytest.raises(InvalidRequest, match=r"^image: 8 x 8 is 64 pixels; at most 63 .*the cost budget") as refused:
        validate(half, dataclasses.replace(LIMITS, max_pixel_steps=64 * 64 * 4 + 63))
    assert refused.value.field == "image"
    hires = raw_request(num_inference_steps=8, hires_fix=True, hires_scale=2, hires_strength=0.5)
    with pytest.raises(InvalidRequest, match=r"128×128×4×1 \(hires fix\)"):
        validate(hires, tight)


@pytest.mark.anyio
async def test_image_modes_run_their_steps_through_the_same_line_and_join_text_loops_only_where_the_model_can(
    make_adapter: Any,
) -> None:
    # A model whose loops take text only (FLUX's, SD3's...): image requests share whole calls among themselves.
    # The text loop holds at its first step (a gate, not a sleep) until both image requests wait in line:
    # their pictures are decoded first, on the decode threads at a lower priority, which a loaded machine
    # may take longer than a loop (or a step permit's usual wait).
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(joining=True, step_gate=steps, permit_wait=4 * WAIT), step_joining=True,
                                  max_batch_size=4)  # fmt: skip
    running = asyncio.gather(
        collect(adapter, raw_request(num_inference_steps=8), request_id="text"),
        collect(adapter, image_raw(num_inference_steps=8, strength=0.5), request_id="image-a"),
        collect(adapter, image_raw(num_inference_steps=8, strength=0.5, seed=9), request_id="image-b"),
    )
    await wait_until(
        lambda: adapter.gpu_queue_depth == 2, "both image requests wait beside the text loop", timeout=3 * WAIT
    )
    steps.release(100)
    results = await running
    done = {r[-1].info["request_id"]: r[-1].info for r in results}
    assert all(r[-1].kind == "done" for r in results)
    steps = {rid: [e.step for e in r if e.kind == "step"] for rid, r in zip(("text", "image-a", "image-b"), results)}
    assert steps["image-a"][-1] == 4 and done["image-a"]["steps_done"] == 4  # strength 0.5 of 8 steps
    assert done["image-a"]["mode"] == "image" and done["image-a"]["strength"] == 0.5
    # the two image requests shared one call; the text request ran alone (its own loop)
    calls = [job.request_id for job in model.calls]
    assert "image-a,image-b" in calls or "image-b,image-a" in calls, calls
    assert "text" in calls and done["text"]["batching"] == "step" and done["image-a"]["batching"] == "job"

    # A model whose loops start members from pictures (the SD loop): image-to-image requests at other
    # strengths enter the running text loop, each for its own steps; inpainting still runs as a call.
    profile = dataclasses.replace(FAKE_PROFILE, loop_modes=("text", "image"))
    steps = threading.Semaphore(0)
    adapter, model = make_adapter(FakeModel(profile, joining=True, step_gate=steps, permit_wait=4 * WAIT),
                                  step_joining=True, max_batch_size=4)  # fmt: skip
    joining = asyncio.gather(
        collect(adapter, raw_request(num_inference_steps=8), request_id="text"),
        collect(adapter, image_raw(num_inference_steps=8, strength=0.5), request_id="image-a"),
        collect(adapter, image_raw(num_inference_steps=6, strength=1.0, seed=9), request_id="image-b"),
    )
    loop = lambda: adapter.scheduler.running  # noqa: E731
    await wait_until(
        lambda: loop() is not None and len(loop().entries) == 3, "three in the text loop", timeout=3 * WAIT
    )
    # The inpainting comes after them: in line before them it would hold their joins back (the fair
    # line's rule), and the pictures' decode order under load would decide which.
    inpaint = asyncio.ensure_future(
        collect(adapter, image_raw(mode="inpaint", num_inference_steps=8, strength=0.5), request_id="inpaint")
    )
    await wait_until(lambda: adapter.gpu_queue_depth == 1, "the inpainting waits", timeout=3 * WAIT)
    steps.release(100)
    results = [*await joining, await inpaint]
    done = {r[-1].info["request_id"]: r[-1].info for r in results}
    assert all(r[-1].kind == "done" for r in results), [r[-1] for r in results]
    assert {rid: done[rid]["batching"] for rid in done} == {
        "text": "step", "image-a": "step", "image-b": "step", "inpaint": "job"}  # fmt: skip
    assert done["image-a"]["steps_done"] == 4 and done["image-b"]["steps_done"] == 6
    together = [dict(step) for step in model.loop_steps if {"text", "image-a", "image-b"} <= dict(step).keys()]
    assert together, model.loop_steps  # one denoiser call held all three
    assert "inpaint" in [job.request_id for job in model.calls]  # a call of its own


def test_hires_strength_0_upscales_without_redrawing_as_a1111s_denoising_strength_0() -> None:
    request = validate(raw_request(hires_fix=True, hires_strength=0), LIMITS)
    assert request.pictures.hires is not None and request.pictures.hires_steps_run() == 0
    assert request.to_job().hires_strength == 0.0 and request.to_job().hires_width == 128
