"""Image modes on the model side (``engine.model.modes``): image-to-image and inpainting from the
loaded pipeline's own components, with the same pixels as a plain diffusers call of that pipeline."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import Settings
from pipeline.engine.model.loading import load_model
from pipeline.protocol import InferenceJob

SIZE = 64


@pytest.fixture(scope="module")
def model() -> Any:
    return load_model(Settings(), warmup=False)  # the embedded default model (Stable Diffusion's family)


def picture(seed: int = 3) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


def mask() -> Image.Image:
    pixels = np.zeros((SIZE, SIZE), dtype=np.uint8)
    pixels[16:48, 16:48] = 255  # repaint the middle
    return Image.fromarray(pixels)


def job(mode: str, strength: float = 0.6, steps: int = 10, **over: Any) -> InferenceJob:
    fields: dict[str, Any] = dict(
        request_id=f"{mode}-{strength}",
        prompts=("a red circle",),
        negative_prompts=("",),
        seeds=(7,),
        width=SIZE,
        height=SIZE,
        num_inference_steps=steps,
        guidance_scale=5.0,
        mode=mode,
        images=(picture(),) if mode != "text" else (),
        masks=(mask(),) if mode == "inpaint" else (),
        strength=strength,
    )
    return InferenceJob(**{**fields, **over})


def run(model: Any, j: InferenceJob) -> tuple[np.ndarray, list[tuple[int, int]]]:
    steps: list[tuple[int, int]] = []
    result = model.generate(j, threading.Event(), lambda step, total, previews: steps.append((step, total)))
    assert result.ok, result
    return np.asarray(result.images[0]).astype(int), steps


def plain(model: Any, mode: str, j: InferenceJob) -> np.ndarray:
    """The same request as a plain diffusers call of the family's mode pipeline (built on its own)."""
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting

    auto = AutoPipelineForImage2Image if mode == "image" else AutoPipelineForInpainting
    pipe = auto.from_pipe(model.pipe)
    pipe.set_progress_bar_config(disable=True)
    extra = {"mask_image": list(j.masks), "width": SIZE, "height": SIZE} if mode == "inpaint" else {}
    with torch.inference_mode():
        out = pipe(
            prompt=list(j.prompts),
            negative_prompt=list(j.negative_prompts),
            image=list(j.images),
            strength=j.strength,
            num_inference_steps=j.num_inference_steps,
            guidance_scale=j.guidance_scale,
            generator=[torch.Generator("cpu").manual_seed(s) for s in j.seeds],
            **extra,
        ).images
    return np.asarray(out[0]).astype(int)


def test_the_default_model_serves_every_mode_from_its_own_components(model: Any) -> None:
    assert model.profile.modes == ("text", "image", "inpaint"), model.profile.mode_notes
    for mode, pipe in model.modes.items():
        assert pipe.unet is model.pipe.unet and pipe.vae is model.pipe.vae, mode  # no second load


@pytest.mark.parametrize("mode", ["image", "inpaint"])
def test_a_mode_gives_the_pixels_of_a_plain_diffusers_call(model: Any, mode: str) -> None:
    j = job(mode)
    ours, steps = run(model, j)
    assert np.abs(ours - plain(model, mode, j)).max() <= 1
    assert steps == [(k, 6) for k in range(1, 7)], steps  # strength 0.6 of 10 steps: the last 6 run


def test_strength_decides_how_far_from_the_input(model: Any) -> None:
    source = np.asarray(picture()).astype(int)
    near, _ = run(model, job("image", strength=0.2))
    far, _ = run(model, job("image", strength=1.0))
    assert np.abs(near - source).mean() < np.abs(far - source).mean()


def test_inpainting_keeps_the_unmasked_pixels_near_the_input(model: Any) -> None:
    out, _ = run(model, job("inpaint", strength=1.0))
    source = np.asarray(picture()).astype(int)
    outside = np.ones((SIZE, SIZE), dtype=bool)
    outside[8:56, 8:56] = False  # away from the mask's edge (the VAE's round trip blurs across it)
    inside = ~outside
    inside[:] = False
    inside[20:44, 20:44] = True
    # outside: the VAE's round trip of the input; inside: repainted from noise
    assert np.abs(out[outside] - source[outside]).mean() < np.abs(out[inside] - source[inside]).mean()


def test_hires_fix_is_one_job_in_two_passes_with_the_pixels_of_the_plain_calls(model: Any) -> None:
    from diffusers import AutoPipelineForImage2Image

    j = job("text", strength=1.0, steps=6, images=(), hires_width=2 * SIZE, hires_height=2 * SIZE,
            hires_steps=4, hires_strength=0.5)  # fmt: skip
    steps: list[tuple[int, int]] = []
    result = model.generate(j, threading.Event(), lambda step, total, previews: steps.append((step, total)))
    assert result.ok, result
    ours = np.asarray(result.images[0]).astype(int)
    assert ours.shape == (2 * SIZE, 2 * SIZE, 3)
    assert steps == [(k, 8) for k in range(1, 9)], steps  # 6 text steps, then 2 of 4 at strength 0.5: one count
    seeds = lambda: [torch.Generator("cpu").manual_seed(s) for s in j.seeds]  # noqa: E731
    common = dict(prompt=list(j.prompts), negative_prompt=list(j.negative_prompts), guidance_scale=j.guidance_scale)
    with torch.inference_mode():
        first = model.pipe(**common, width=SIZE, height=SIZE, num_inference_steps=6, generator=seeds()).images
        upscaled = [image.resize((2 * SIZE, 2 * SIZE), Image.Resampling.LANCZOS) for image in first]
        second = AutoPipelineForImage2Image.from_pipe(model.pipe)
        second.set_progress_bar_config(disable=True)
        plain_out = second(**common, image=upscaled, strength=0.5, num_inference_steps=4, generator=seeds()).images
    assert np.abs(ours - np.asarray(plain_out[0]).astype(int)).max() <= 1
    # the first pass comes back beside it (the page's slider shows it): the text pass's own pixels
    (drawn,) = result.first_pass
    assert drawn.size == (SIZE, SIZE)
    assert np.abs(np.asarray(drawn).astype(int) - np.asarray(first[0]).astype(int)).max() <= 1


@pytest.mark.anyio
async def test_through_the_adapter_a_hires_fix_keeps_its_first_pass_with_the_parameters_that_draw_it(
    model: Any, make_adapter: Any
) -> None:
    import json

    from tests.helpers import collect, raw_request

    adapter, _ = make_adapter(model)
    common = dict(prompt="a red circle", num_inference_steps=6, guidance_scale=5.0, seed=7, num_images=2)
    hires = (await collect(adapter, raw_request(**common, hires_fix=True, hires_steps=4, hires_strength=0.5)))[-1]
    plain_text = (await collect(adapter, raw_request(**common)))[-1]
    assert len(hires.paths) == len(hires.first_pass) == 2 and not plain_text.first_pass
    for i, (first, again) in enumerate(zip(hires.first_pass, plain_text.paths)):
        assert first.name.endswith(f"-first-{i}.png")
        with Image.open(first) as a, Image.open(again) as b:
            assert a.size == (SIZE, SIZE)
            assert (
                np.abs(np.asarray(a.convert("RGB")).astype(int) - np.asarray(b.convert("RGB")).astype(int)).max() <= 1
            )
            text = a.text["parameters"]
            assert "Hires" not in text and "Denoising strength" not in text, text
            drawn, plain_record = json.loads(a.text["generation"]), json.loads(b.text["generation"])
            assert "hires_fix" not in drawn and (drawn["seed"], drawn["width"]) == (plain_record["seed"], SIZE)


def test_a_stop_in_the_second_pass_counts_the_steps_of_both(model: Any) -> None:
    from pipeline.errors import Cancelled

    stop = threading.Event()
    j = job("text", strength=1.0, steps=4, images=(), hires_width=2 * SIZE, hires_height=2 * SIZE,
            hires_steps=4, hires_strength=1.0)  # fmt: skip

    def on_step(step: int, total: int, previews: Any) -> None:
        if step == 5:  # the second pass's first step
            stop.set()

    with pytest.raises(Cancelled) as stopped:
        model.generate(j, stop, on_step)
    assert stopped.value.steps_done == 5


@pytest.mark.anyio
async def test_through_the_adapter_an_upload_gives_the_plain_pipelines_pixels_in_its_png(
    model: Any, make_adapter: Any
) -> None:
    """The whole serving path: PNG bytes in, validated and resized off the loop, the line, the gate,
    the model thread, the PNG out; its pixels are a plain diffusers call's on the same picture."""
    import io

    from tests.helpers import collect, raw_request

    adapter, _ = make_adapter(model)
    upload = io.BytesIO()
    picture().resize((96, 80)).save(upload, "JPEG", quality=95)  # another size and format: resized to 64
    raw = raw_request(mode="image", image=upload.getvalue(), strength=0.6, num_inference_steps=10,
                      guidance_scale=5.0, seed=7, prompt="a red circle")  # fmt: skip
    events = await collect(adapter, raw)
    done = events[-1]
    assert done.kind == "done" and done.info["mode"] == "image" and done.info["steps_done"] == 6
    with Image.open(done.paths[0]) as written:
        ours = np.asarray(written.convert("RGB")).astype(int)
    with Image.open(io.BytesIO(upload.getvalue())) as sent:
        resized = sent.convert("RGB").resize((SIZE, SIZE), Image.Resampling.LANCZOS)
    expected = plain(model, "image", job("image", images=(resized,)))
    assert np.abs(ours - expected).max() <= 1
