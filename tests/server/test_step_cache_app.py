"""Step caching through the launched app on the embedded model (issue 50): a request with a cache that
joins a running loop mid-way, beside one with the cache off and one with another method, draws what it
draws alone; the record, the PNG text, ``/health`` and every protocol say and take the method."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import raw_request

pytestmark = pytest.mark.timeout(600)

SIZE = 64


@pytest.fixture(scope="module")
def url(launch: Any) -> str:
    return str(launch(name="step-cache")[0])


def written(gallery: Any) -> np.ndarray:
    with Image.open(gallery[0]["image"]) as png:
        return np.asarray(png.convert("RGB"), dtype=np.float32)


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def steps_counted(url: str) -> float:
    lines = httpx.get(url + "metrics", timeout=10).text.splitlines()
    return next(float(line.split()[1]) for line in lines if line.startswith("denoise_steps_total "))


def request(**over: Any) -> dict[str, Any]:
    base = dict(prompt="a red circle on a blue background", seed=9, width=SIZE, height=SIZE, num_inference_steps=20,
                guidance_scale=5.0)  # fmt: skip
    return raw_request(**{**base, **over})


def test_a_cached_request_that_joins_a_running_loop_draws_what_it_draws_alone(client: Any, url: str) -> None:
    health = httpx.get(url + "health", timeout=10).json()
    assert health["step_cache"] == {"methods": ["taylorseer", "reuse"], "auto": "taylorseer", "default": "off"}
    long = client.submit(**request(prompt="a yellow star", seed=3, num_inference_steps=60), api_name="/generate")
    base, deadline = steps_counted(url), time.monotonic() + 60
    while steps_counted(url) - base < 3 and time.monotonic() < deadline:  # the uncached request is running
        time.sleep(0.01)
    reuse = client.submit(**request(prompt="a green triangle", seed=4, step_cache="reuse"), api_name="/generate")
    gallery, info = client.predict(**request(step_cache="auto"), api_name="/generate")
    (_, reuse_info), (_, long_info) = reuse.result(timeout=120), long.result(timeout=120)
    assert info["batching"] == "step" and info["joined_at_step"] >= 1, info  # it entered the running loop
    assert info["step_cache"] == {"method": "taylorseer", "computed": 10, "skipped": 10}
    assert reuse_info["step_cache"] == {"method": "reuse", "computed": 12, "skipped": 8}
    assert long_info["step_cache"] == {"method": "off", "computed": 60, "skipped": 0}
    alone, alone_info = client.predict(**request(step_cache="taylorseer"), api_name="/generate")
    assert alone_info["joined_at_step"] == 0
    difference = float(np.abs(written(gallery) - written(alone)).mean())
    assert difference <= 1.0, difference  # within 1/255 (measured: 0.00 on the CPU)
    uncached, _ = client.predict(**request(step_cache="off"), api_name="/generate")
    assert float(np.abs(written(gallery) - written(uncached)).mean()) > 0.0  # steps were predicted
    with Image.open(gallery[0]["image"]) as png:
        assert "Step cache: taylorseer" in png.text["parameters"]
    with Image.open(uncached[0]["image"]) as png:
        assert "Step cache" not in png.text["parameters"]  # "off": not written


def test_every_protocol_takes_a_method_and_refuses_one_that_cannot_run(client: Any, url: str) -> None:
    import openai
    from gradio_client.exceptions import ValidationError

    with httpx.Client(timeout=120) as http:
        body = {"prompt": "a red circle", "steps": 8, "width": SIZE, "height": SIZE, "seed": 5,
                "override_settings": {"step_cache": "auto"}}  # fmt: skip
        answer = http.post(url + "sdapi/v1/txt2img", json=body)
        assert answer.status_code == 200, answer.text
        assert "Step cache: taylorseer" in answer.json()["info"]
        png = Image.open(io.BytesIO(base64.b64decode(answer.json()["images"][0])))
        assert "Step cache: taylorseer" in png.text["parameters"]
        hires = {**body, "enable_hr": True, "hr_scale": 2, "override_settings": {"step_cache": "reuse"}}
        answer = http.post(url + "sdapi/v1/txt2img", json=hires)  # each pass a loop member of its own
        assert answer.status_code == 200 and "Step cache: reuse" in answer.json()["info"], answer.text
        picture = base64.b64encode(png_bytes(Image.new("RGB", (SIZE, SIZE), "gray"))).decode()
        mask = base64.b64encode(png_bytes(Image.new("L", (SIZE, SIZE), 255))).decode()
        inpaint = {**body, "init_images": [picture], "mask": mask, "override_settings": {"step_cache": "reuse"}}
        refused = http.post(url + "sdapi/v1/img2img", json=inpaint)
        assert refused.status_code == 422 and "step_cache 'reuse' runs in step-level loops" in refused.text
    api = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0)
    small = dict(model="dall-e-2", prompt="a red circle", size="64x64", response_format="b64_json")
    assert api.images.generate(**small, extra_body={"num_inference_steps": 8, "step_cache": "reuse"}).data
    with pytest.raises(openai.BadRequestError) as refused_error:
        api.images.generate(**small, extra_body={"step_cache": "fbcache"})  # FLUX.1 only
    assert refused_error.value.body["param"] == "step_cache"
    with pytest.raises(ValidationError, match="step_cache must be one of 'off', 'auto', 'taylorseer', 'reuse'"):
        client.predict(**request(step_cache="fbcache"), api_name="/generate")
