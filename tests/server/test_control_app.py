"""ControlNet through the launched app on the embedded model and its own ControlNet (issue 51), with the
real ``gradio_client``: a white disc on the left of the map, then on the right, and the shape the prompt
asks for is drawn where the disc is; ``/health`` lists the controls; a bad control is refused by name
before any GPU work; the map goes through the upload route as an image input does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from pipeline.default_model.control import centre_of
from tests.helpers import raw_request

pytestmark = pytest.mark.timeout(600)

SIZE = 64


@pytest.fixture(scope="module")
def url(launch: Any) -> str:
    return str(launch(name="control")[0])


def disc_file(tmp: Path, cx: float, name: str) -> Path:
    image = Image.new("RGB", (SIZE, SIZE), "black")
    x = cx * SIZE
    ImageDraw.Draw(image).ellipse([x - 11, 21, x + 11, 43], fill="white")
    path = tmp / name
    image.save(path)
    return path


def picture(gallery: Any) -> Image.Image:
    with Image.open(gallery[0]["image"]) as png:
        return png.convert("RGB")


def test_the_shape_is_drawn_where_the_disc_is(client: Any, url: str, tmp_path: Path) -> None:
    from gradio_client import handle_file

    health = httpx.get(url + "health", timeout=10).json()
    assert health["controls"] == ["none", "shapes"]
    seen = []
    for prompt, seed in (("a red circle on a blue background", 1), ("a yellow square on a purple background", 2)):
        for side, cx in (("left", 0.25), ("right", 0.75)):
            request = raw_request(prompt=prompt, seed=seed, width=SIZE, height=SIZE, num_inference_steps=16,
                                  guidance_scale=4.0, control="shapes",
                                  control_image=handle_file(str(disc_file(tmp_path, cx, f"{side}.png"))))  # fmt: skip
            gallery, info = client.predict(**request, api_name="/generate")
            assert info["status"] == "done" and info["control"] == "shapes" and info["control_scale"] == 1.0
            found = centre_of(picture(gallery))
            assert found is not None and abs(found[0] - cx) <= 0.25 and abs(found[1] - 0.5) <= 0.25, (prompt, side)
            seen.append(found[0])
    assert seen[0] < 0.5 < seen[1] and seen[2] < 0.5 < seen[3]  # left, then right, for both prompts


def test_a_bad_control_is_refused_by_name_and_none_draws_as_before(client: Any, tmp_path: Path) -> None:
    from gradio_client import handle_file
    from gradio_client.exceptions import ValidationError

    disc = handle_file(str(disc_file(tmp_path, 0.3, "disc.png")))
    with pytest.raises(ValidationError, match="control must be one of 'none', 'shapes'"):
        client.predict(**raw_request(control="depth", control_image=disc), api_name="/generate")
    with pytest.raises(ValidationError, match="control_scale must be a number between 0 and 2"):
        client.predict(**raw_request(control="shapes", control_image=disc, control_scale=3), api_name="/generate")
    with pytest.raises(ValidationError, match="control_image: control 'shapes' needs a map"):
        client.predict(**raw_request(control="shapes"), api_name="/generate")
    base = raw_request(prompt="a red circle on a blue background", seed=5, width=SIZE, height=SIZE,
                       num_inference_steps=8, guidance_scale=4.0)  # fmt: skip
    plain, info = client.predict(**base, api_name="/generate")
    zero, zero_info = client.predict(**{**base, "control": "shapes", "control_image": disc, "control_scale": 0.0},
                                     api_name="/generate")  # fmt: skip
    assert info["control"] == "none" and zero_info["control_scale"] == 0.0
    difference = np.abs(np.asarray(picture(plain), np.float32) - np.asarray(picture(zero), np.float32)).mean()
    assert difference <= 0.5, difference  # weight 0: as without the control


def test_webuiapis_controlnet_unit_equals_generate_pixel_for_pixel_and_its_lists_answer(
    client: Any, url: str, tmp_path: Path
) -> None:
    """issue 51 §4: AUTOMATIC1111's ControlNet extension API, through the real ``webuiapi``."""
    import webuiapi
    from gradio_client import handle_file

    port = int(url.rstrip("/").rsplit(":", 1)[1])
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port)
    assert api.controlnet_model_list() == ["shapes"] and api.controlnet_version() == 2
    assert api.controlnet_module_list() == ["none", "canny", "invert"]
    path = disc_file(tmp_path, 0.25, "unit.png")
    unit = webuiapi.ControlNetUnit(image=Image.open(path), module="none", model="shapes", weight=0.9,
                                   guidance_end=0.9, resize_mode="Just Resize")  # fmt: skip
    result = api.txt2img(prompt="a red circle on a blue background", seed=7, steps=8, cfg_scale=4, width=SIZE,
                         height=SIZE, sampler_name="Euler", controlnet_units=[unit])  # fmt: skip
    ours, _ = client.predict(**raw_request(prompt="a red circle on a blue background", seed=7, width=SIZE,
                                              height=SIZE, num_inference_steps=8, guidance_scale=4.0,
                                              scheduler="Euler", control="shapes", control_scale=0.9, control_end=0.9,
                                              control_image=handle_file(str(path))), api_name="/generate")  # fmt: skip
    assert np.array_equal(np.asarray(result.image.convert("RGB")), np.asarray(picture(ours)))
    unit_text = 'ControlNet 0: "Module: none, Model: shapes, Weight: 0.9, Guidance Start: 0, Guidance End: 0.9"'
    assert unit_text in result.image.info["parameters"]
    found = centre_of(result.image.convert("RGB"))
    assert found is not None and found[0] < 0.45  # on the left, where the disc is
    wrong = webuiapi.ControlNetUnit(image=Image.open(path), model="control_v11p_sd15_depth [cfd03158]")
    answer = httpx.post(url + "sdapi/v1/txt2img", timeout=60, json={
        "prompt": "a red circle", "steps": 4, "width": SIZE, "height": SIZE,
        "alwayson_scripts": {"controlnet": {"args": [wrong.to_dict()]}}})  # fmt: skip
    assert answer.status_code == 422 and "model must be one of shapes" in answer.text
    edges = api.controlnet_detect([Image.open(path)], module="canny").images  # the disc's outline
    lit = np.asarray(edges[0].convert("L")) > 0
    assert len(edges) == 1 and lit[32, 2:10].any() and not lit[32, 14:20].any() and not lit[:12].any()


def test_webuiapis_unit_on_img2img_equals_generates_image_to_image_with_the_control(
    client: Any, url: str, tmp_path: Path
) -> None:
    """issue 51 §4 on ``/sdapi/v1/img2img``: a ``ControlNetUnit`` beside the init image is image to image with
    the control (``StableDiffusionControlNetImg2ImgPipeline``), pixel for pixel as ``/generate``'s."""
    import webuiapi
    from gradio_client import handle_file

    port = int(url.rstrip("/").rsplit(":", 1)[1])
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port)
    path, start = disc_file(tmp_path, 0.75, "img2img-map.png"), tmp_path / "img2img-start.png"
    Image.new("RGB", (SIZE, SIZE), (40, 60, 200)).save(start)
    unit = webuiapi.ControlNetUnit(image=Image.open(path), module="none", model="shapes", weight=1.0)
    result = api.img2img(images=[Image.open(start)], prompt="a red circle on a blue background", seed=5, steps=8,
                         cfg_scale=4, width=SIZE, height=SIZE, sampler_name="Euler", denoising_strength=0.75,
                         controlnet_units=[unit])  # fmt: skip
    ours, info = client.predict(**raw_request(prompt="a red circle on a blue background", seed=5, width=SIZE,
                                              height=SIZE, num_inference_steps=8, guidance_scale=4.0,
                                              scheduler="Euler", mode="image", image=handle_file(str(start)),
                                              strength=0.75, control="shapes",
                                              control_image=handle_file(str(path))), api_name="/generate")  # fmt: skip
    assert info["mode"] == "image" and info["control"] == "shapes"
    assert np.array_equal(np.asarray(result.image.convert("RGB")), np.asarray(picture(ours)))


def test_openai_callers_send_the_map_in_the_extra_body(client: Any, url: str, tmp_path: Path) -> None:
    import base64
    import io

    import openai
    from gradio_client import handle_file

    path = disc_file(tmp_path, 0.75, "openai.png")
    api = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
    extra = {"seed": 3, "num_inference_steps": 8, "guidance_scale": 4.0, "control": "shapes", "control_end": 0.8,
             "control_image": base64.b64encode(path.read_bytes()).decode()}  # fmt: skip
    answer = api.images.generate(model="dall-e-2", prompt="a green star on a black background", size="64x64",
                                 response_format="b64_json", extra_body=extra)  # fmt: skip
    theirs = Image.open(io.BytesIO(base64.b64decode(answer.data[0].b64_json or ""))).convert("RGB")
    ours, _ = client.predict(**raw_request(prompt="a green star on a black background", seed=3, width=SIZE,
                                           height=SIZE, num_inference_steps=8, guidance_scale=4.0, control="shapes",
                                           control_end=0.8, control_image=handle_file(str(path))),
                             api_name="/generate")  # fmt: skip
    assert np.array_equal(np.asarray(theirs), np.asarray(picture(ours)))
    with pytest.raises(openai.BadRequestError) as refused:
        api.images.generate(model="dall-e-2", prompt="a star", size="64x64", extra_body={"control": "shapes"})
    assert refused.value.body["param"] == "control_image"


def test_openai_edits_take_the_map_as_a_file_part_or_a_base64_field(client: Any, url: str, tmp_path: Path) -> None:
    """``/v1/images/edits`` (multipart): the map as a ``control_image`` file part (curl's ``-F``) or as a
    base64 text field (the openai SDK's ``extra_body``); both equal ``/generate``'s image to image with the
    same control, pixel for pixel."""
    import base64
    import io

    import openai
    from gradio_client import handle_file

    path, start = disc_file(tmp_path, 0.25, "edit-map.png"), tmp_path / "start.png"
    Image.new("RGB", (SIZE, SIZE), (40, 60, 200)).save(start)
    fields = {"prompt": "a red circle on a blue background", "size": "64x64", "response_format": "b64_json",
              "seed": "3", "num_inference_steps": "8", "guidance_scale": "4", "control": "shapes"}  # fmt: skip
    files = {"image": ("start.png", start.read_bytes(), "image/png"),
             "control_image": ("map.png", path.read_bytes(), "image/png")}  # fmt: skip
    answer = httpx.post(url + "v1/images/edits", data=fields, files=files, timeout=120)
    assert answer.status_code == 200, answer.text
    as_file = Image.open(io.BytesIO(base64.b64decode(answer.json()["data"][0]["b64_json"]))).convert("RGB")
    api = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
    extra = {"seed": 3, "num_inference_steps": 8, "guidance_scale": 4.0, "control": "shapes",
             "control_image": base64.b64encode(path.read_bytes()).decode()}  # fmt: skip
    with start.open("rb") as image:
        sdk = api.images.edit(image=image, prompt=fields["prompt"], size="64x64", response_format="b64_json",
                              extra_body=extra)  # fmt: skip
    as_field = Image.open(io.BytesIO(base64.b64decode(sdk.data[0].b64_json or ""))).convert("RGB")
    ours, info = client.predict(**raw_request(prompt=fields["prompt"], seed=3, width=SIZE, height=SIZE,
                                              num_inference_steps=8, guidance_scale=4.0, mode="image",
                                              image=handle_file(str(start)), strength=0.75, control="shapes",
                                              control_image=handle_file(str(path))), api_name="/generate")  # fmt: skip
    assert info["mode"] == "image" and info["control"] == "shapes"
    assert np.array_equal(np.asarray(as_file), np.asarray(picture(ours)))
    assert np.array_equal(np.asarray(as_field), np.asarray(picture(ours)))
