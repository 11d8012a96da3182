"""AUTOMATIC1111's ``/sdapi/v1`` and OpenAI's ``/v1/images`` through the launched app, with their real
clients (``webuiapi``, ``openai``): the same pixels and ``parameters`` text as ``/generate``, the image
modes, progress and interrupt of the caller's own job only, the lists, errors naming the field, and
each route's body cap. Auth, quotas and fairness across protocols: ``test_peer_apis_line.py``."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import raw_request, running_app, wait_for
from tests.hostile import peer
from tests.loras import loras_of

pytestmark = pytest.mark.timeout(600)

COMMON = dict(prompt="a red circle", seed=7, width=64, height=64, num_inference_steps=4, guidance_scale=5.0)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    tmp = tmp_path_factory.mktemp("peer-apis")
    ink = loras_of("default")["a"]
    args = ("--lora", f"ink={ink}", "--max-batch-size", "1", "--max-pixel-steps", str(10**9), "--rate-limit", "50")
    with running_app(tmp, *args) as (url, _demo, _adapter):
        from gradio_client import Client

        yield url, Client(url, verbose=False, download_files=str(tmp / "dl"))


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def generate(client: Any, **over: Any) -> tuple[np.ndarray, str]:
    """``/generate`` through ``gradio_client``: the first picture's pixels and its PNG ``parameters``."""
    gallery, _info = client.predict(**raw_request(**{**COMMON, **over}), api_name="/generate")
    with Image.open(gallery[0]["image"]) as png:
        return np.asarray(png.convert("RGB")).astype(int), png.text["parameters"]


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(int)


def test_webuiapi_txt2img_equals_generate_with_the_pages_parameters(app: tuple[str, Any]) -> None:
    import webuiapi

    url, client = app
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port_of(url))
    result = api.txt2img(prompt="a red circle <lora:ink:0.8>", seed=7, steps=4, cfg_scale=5, width=64, height=64,
                         sampler_name="Euler", batch_size=2)  # fmt: skip
    ours, text = generate(client, lora="ink", lora_scale=0.8, scheduler="Euler", num_images=2)
    assert len(result.images) == 2 and result.info["all_seeds"] == [7, 8]
    assert np.array_equal(pixels(result.image), ours)
    assert result.image.info["parameters"] == text == result.info["infotexts"][0]  # the page's PNG, as it is
    assert "<lora:ink:0.8>" in text and "Sampler: Euler," in text
    title = api.get_options()["sd_model_checkpoint"]  # A1111's "NAME [hash]", its info's sd_model_name the NAME
    assert (
        title == f"{result.info['sd_model_name']} [{result.info['sd_model_hash']}]" == api.get_sd_models()[0]["title"]
    )
    assert result.parameters["prompt"] == "a red circle <lora:ink:0.8>"  # the request, echoed
    # issue 49: a weighted, long prompt (two CLIP chunks) and an A1111 negative, pixel for pixel, kept as typed
    long = "a (red:1.3) circle, " + ", ".join(f"[flat] shape {i}" for i in range(14)) + ", on a (blue:0.8) ground"
    negative = "(worst quality:2), ((monochrome))"
    weighted = api.txt2img(prompt=long, negative_prompt=negative, seed=7, steps=4, cfg_scale=5, width=64, height=64,
                           sampler_name="Euler")  # fmt: skip
    ours, text = generate(client, prompt=long, negative_prompt=negative, scheduler="Euler")
    assert np.array_equal(pixels(weighted.image), ours) and text.startswith(long + "\nNegative prompt: " + negative)
    plain_text, _ = generate(client, prompt=long, negative_prompt=negative, scheduler="Euler", emphasis="None")
    assert np.abs(plain_text - ours).mean() > 1.0  # read as written, the brackets are words


def test_openai_images_generate_b64_and_url_equal_generate(app: tuple[str, Any]) -> None:
    import openai

    url, client = app
    ours, _text = generate(client, scheduler="Euler")
    api = openai.OpenAI(base_url=url + "v1", api_key="unused")
    own = {"seed": 7, "num_inference_steps": 4, "guidance_scale": 5.0, "scheduler": "Euler"}
    b64 = api.images.generate(prompt="a red circle", size="64x64", extra_body=own)
    assert b64.size == "64x64" and b64.output_format == "png"
    assert np.array_equal(pixels(Image.open(io.BytesIO(base64.b64decode(b64.data[0].b64_json)))), ours)
    linked = api.images.generate(prompt="a red circle", size="64x64", response_format="url", extra_body=own)
    fetched = httpx.get(linked.data[0].url, timeout=30)
    assert fetched.status_code == 200 and np.array_equal(pixels(Image.open(io.BytesIO(fetched.content))), ours)
    name = linked.data[0].url.split("file=", 1)[1]  # relative to the file route: no place on the disk in it
    assert not name.startswith(("/", "%2F")) and "tmp" not in name.lower(), name
    assert httpx.get(url + "gradio_api/file=../" + name, timeout=30).status_code in (403, 404)
    name = httpx.get(url + "sdapi/v1/options", timeout=30).json()["sd_model_checkpoint"]
    assert [m.id for m in api.models.list()] == ["embedded-default"]  # an id a client can type
    # the served model by its id or its full name, and OpenAI's own image model names (Open WebUI sends
    # dall-e-2 when its model is empty), all draw with it; the answer names the model that drew
    for model in ("embedded-default", name, "dall-e-2", "dall-e-3", "gpt-image-1", "gpt-image-1-mini"):
        named = api.images.generate(model=model, prompt="a red circle", size="64x64", extra_body=own)
        assert np.array_equal(pixels(Image.open(io.BytesIO(base64.b64decode(named.data[0].b64_json)))), ours)
        assert named.model_extra and named.model_extra["model"] == "embedded-default"
    with pytest.raises(openai.NotFoundError) as unknown:
        api.images.generate(model="sdxl-turbo", prompt="a red circle", size="64x64")
    assert unknown.value.body["code"] == "model_not_found" and "sdxl-turbo" in unknown.value.body["message"]
    jpeg = api.images.generate(prompt="a red circle", size="64x64", output_format="jpeg", extra_body=own)
    assert base64.b64decode(jpeg.data[0].b64_json)[:3] == b"\xff\xd8\xff"


def source_and_hole(tmp: Path) -> tuple[Image.Image, Image.Image, Path, Path]:
    rng = np.random.default_rng(11)
    source = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    hole = np.zeros((64, 64), dtype=np.uint8)
    hole[16:48, 16:48] = 255
    mask = Image.fromarray(hole)
    source.save(tmp / "source.png")
    mask.save(tmp / "mask.png")
    return source, mask, tmp / "source.png", tmp / "mask.png"


def test_img2img_with_a_mask_and_an_openai_edit_equal_the_pages_inpainting(
    app: tuple[str, Any], tmp_path: Path
) -> None:
    import openai
    import webuiapi
    from gradio_client import handle_file

    url, client = app
    source, mask, source_file, mask_file = source_and_hole(tmp_path)
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port_of(url))
    result = api.img2img(images=[source], mask_image=mask, prompt="a red circle", denoising_strength=0.6, seed=5, steps=4,
                         cfg_scale=5,
                         width=64, height=64, sampler_name="Euler")  # fmt: skip
    page = dict(seed=5, scheduler="Euler", mode="inpaint", image=handle_file(str(source_file)),
                mask=handle_file(str(mask_file)), strength=0.6)  # fmt: skip
    ours, text = generate(client, **page)
    assert np.array_equal(pixels(result.image), ours) and result.info["denoising_strength"] == 0.6
    assert "Denoising strength: 0.6" in text and "Mask blur: 4" in result.image.info["parameters"]
    assert not np.array_equal(ours, generate(client, **{**page, "mode": "image", "mask": None})[0])
    # OpenAI's mask: edit where it is fully transparent
    rgba = np.zeros((64, 64, 4), dtype=np.uint8)
    rgba[..., 3] = 255 - np.asarray(mask)
    clear = io.BytesIO()
    Image.fromarray(rgba).save(clear, format="PNG")
    edited = openai.OpenAI(base_url=url + "v1", api_key="unused").images.edit(
        image=("source.png", source_file.read_bytes(), "image/png"),
        mask=("mask.png", clear.getvalue(), "image/png"),
        prompt="a red circle",
        size="64x64",
        extra_body={"seed": 5, "num_inference_steps": 4, "guidance_scale": 5.0, "scheduler": "Euler", "strength": 0.6},
    )
    theirs = pixels(Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json))))
    assert np.array_equal(theirs, generate(client, **{**page, "mask_blur": 0})[0])


def test_a_streamed_generation_sends_partial_images_then_the_picture(app: tuple[str, Any]) -> None:
    import openai

    url, client = app
    api = openai.OpenAI(base_url=url + "v1", api_key="unused")
    events = list(api.images.generate(prompt="a red circle", size="64x64", stream=True, partial_images=2,
                                      extra_body={"seed": 7, "num_inference_steps": 12, "guidance_scale": 5.0}))  # fmt: skip
    kinds = [e.type for e in events]
    # OpenAI's contract: up to partial_images partials ("the final image may be sent before the full number
    # of partial images are generated"); a loaded machine once sent one of the two before the picture
    partials = len(events) - 1
    assert 1 <= partials <= 2 and kinds == ["image_generation.partial_image"] * partials + [
        "image_generation.completed"
    ]
    assert [e.partial_image_index for e in events[:partials]] == list(range(partials))
    assert Image.open(io.BytesIO(base64.b64decode(events[0].b64_json))).format == "PNG"  # the answer's format
    final = pixels(Image.open(io.BytesIO(base64.b64decode(events[-1].b64_json))))
    assert np.array_equal(final, generate(client, num_inference_steps=12)[0])
    picture = io.BytesIO()
    Image.fromarray(final.astype(np.uint8)).save(picture, format="PNG")
    edits = list(api.images.edit(image=("in.png", picture.getvalue(), "image/png"), prompt="a blue square",
                                 size="64x64", stream=True, partial_images=1, output_format="jpeg",
                                 extra_body={"num_inference_steps": 12}))  # fmt: skip
    assert [e.type for e in edits] == ["image_edit.partial_image", "image_edit.completed"]
    assert base64.b64decode(edits[-1].b64_json)[:3] == b"\xff\xd8\xff"
    # Open WebUI's default model name, streamed: the served model draws it
    named = list(api.images.generate(model="dall-e-2", prompt="a red circle", size="64x64", stream=True,
                                     extra_body={"seed": 7, "num_inference_steps": 12, "guidance_scale": 5.0}))  # fmt: skip
    assert named[-1].type == "image_generation.completed"
    assert np.array_equal(pixels(Image.open(io.BytesIO(base64.b64decode(named[-1].b64_json)))), final)


def test_progress_and_interrupt_act_on_the_callers_own_job_only(app: tuple[str, Any]) -> None:
    import webuiapi

    url, _client = app
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port_of(url))  # from 127.0.0.1
    ended: dict[str, Any] = {}

    def long_job() -> None:
        ended["result"] = api.txt2img(prompt="a red circle", seed=1, steps=100, width=256, height=256, cfg_scale=5)

    runner = threading.Thread(target=long_job)
    runner.start()
    with peer("127.0.0.2") as other:
        seen: dict[str, Any] = {}

        def running() -> bool:
            seen.update(api.get_progress())
            return seen["state"]["sampling_step"] >= 2 and seen["current_image"] is not None

        wait_for(running, "the job runs with a live preview", timeout=120)
        assert seen["state"]["job_count"] == 1 and seen["state"]["sampling_steps"] == 100 and 0 < seen["progress"] < 1
        assert Image.open(io.BytesIO(base64.b64decode(seen["current_image"]))).size[0] > 0
        assert httpx.get(url + "sdapi/v1/progress?skip_current_image=true").json()["current_image"] is None
        theirs = other.get(url + "sdapi/v1/progress").json()
        assert theirs["state"]["job_count"] == 0 and theirs["current_image"] is None  # nothing of someone else's
        assert other.post(url + "sdapi/v1/interrupt").json() == {"interrupted": 0}
        step = api.get_progress()["state"]["sampling_step"]
        wait_for(lambda: api.get_progress()["state"]["sampling_step"] > step + 1,
                 "the job goes on after someone else's interrupt", timeout=60)  # fmt: skip
        assert runner.is_alive()
        assert api.interrupt() == {"interrupted": 1}
    runner.join(60)
    assert not runner.is_alive()
    result = ended["result"]
    assert result.images == [] and result.info["interrupted"] is True
    # Issue 47: the interrupt called the one stop verb (counted by its reason), and the model stopped
    # within one step of it.
    assert stopped_by(url, "interrupt") == 1 and all_within_one_step(url)


def stopped_by(url: str, reason: str) -> float:
    """``stops_total`` for ``reason`` in the app's /metrics (``Adapter.abort``'s count)."""
    found = re.search(rf'^stops_total{{reason="{reason}"}} (\S+)$', httpx.get(url + "metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def all_within_one_step(url: str) -> bool:
    """Every stopped job on the model ran at most one step after its stop was set."""
    text = httpx.get(url + "metrics").text
    count = re.search(r"^steps_after_stop_count (\S+)$", text, re.M)
    within = re.search(r'^steps_after_stop_bucket{le="1.0"} (\S+)$', text, re.M)
    return bool(count and within and float(count.group(1)) >= 1 and within.group(1) == count.group(1))


def test_a_dropped_openai_stream_stops_its_job_through_abort(app: tuple[str, Any]) -> None:
    """Issue 47: an OpenAI client that drops its stream (the SDK's own iterator closed early) stops
    its job: the disconnect calls ``abort`` at once, and the model stops within one step."""
    url, _client = app
    before = stopped_by(url, "disconnect")
    body = {"prompt": "a red circle", "size": "256x256", "stream": True, "partial_images": 3,
            "num_inference_steps": 100}  # fmt: skip
    with httpx.Client(timeout=120) as http, http.stream("POST", url + "v1/images/generations", json=body) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if "partial_image" in line:  # the job runs on the model: drop the stream here
                break
    wait_for(lambda: stopped_by(url, "disconnect") == before + 1, "the disconnect is counted", timeout=60)
    wait_for(lambda: httpx.get(url + "health").json()["requests_in_flight"] == 0, "the job has ended", timeout=60)
    assert all_within_one_step(url)


def test_the_lists_options_and_png_info(app: tuple[str, Any]) -> None:
    import webuiapi

    url, client = app
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port_of(url))
    model = api.util_get_model_names()
    assert model == [api.get_options()["sd_model_checkpoint"]] and "embedded-default" in model[0]
    assert {"Euler", "Euler a", "DPM++ 2M Karras"} <= set(api.util_get_sampler_names())
    assert api.util_get_scheduler_names() == ["automatic", "karras"]
    assert [lora["name"] for lora in api.get_loras()] == ["ink"]
    assert [u["name"] for u in api.get_upscalers()] == ["Lanczos"] and api.get_sd_vae() == []
    assert api.get_embeddings() == {"loaded": {}, "skipped": {}}
    # the lists clients read at start: empty where the app has none, not a bare 404 (issue 49)
    assert api.get_hypernetworks() == api.get_face_restorers() == api.get_realesrgan_models() == []
    assert api.get_prompt_styles() == []
    flags = api.get_cmd_flags()
    assert flags["prompt_syntax"] == "a1111" and flags["auth"] is False and "output_key" in flags
    with httpx.Client(timeout=30) as http:
        missing = http.get(url + "sdapi/v1/extensions")  # a route the app lacks: named in the refusal
        assert missing.status_code == 404 and "/sdapi/v1/extensions" in missing.json()["detail"]
        assert http.post(url + "sdapi/v1/options", json={"sd_model_checkpoint": model[0]}).status_code == 200
        other = http.post(url + "sdapi/v1/options", json={"sd_model_checkpoint": "sdxl.safetensors"})
        assert other.status_code == 422 and "must be a served model" in other.json()["detail"]
        # what GET returned, posted back whole (Open WebUI's model switch), and A1111's "no change" values
        options = http.get(url + "sdapi/v1/options").json()
        assert options["emphasis"] == "Original" and options["samples_format"] == "png"
        for same in (
            options,
            {"samples_format": "png"},
            {"sd_vae": "Automatic"},
            {"sd_model_checkpoint": "embedded-default"},
        ):
            assert http.post(url + "sdapi/v1/options", json=same).status_code == 200, same
        for change, why in (({"emphasis": "No norm"}, "per-request"), ({"samples_format": "jpg"}, "runs with 'png'"),
                            ({"sd_hypernetwork": "x"}, "no such option")):  # fmt: skip
            refused = http.post(url + "sdapi/v1/options", json=change)
            detail = refused.json()["detail"]
            assert refused.status_code == 422 and detail.startswith(next(iter(change))) and why in detail, detail
            assert "override_settings:" not in detail  # the options route's own words
        _pixels, text = generate(client)
        png = io.BytesIO()
        Image.new("RGB", (8, 8)).save(png, format="PNG", pnginfo=_text_chunk(text))
        info = http.post(url + "sdapi/v1/png-info", json={"image": base64.b64encode(png.getvalue()).decode()}).json()
        assert (
            info["info"] == text
            and info["parameters"]["Steps"] == "4"
            and info["parameters"]["Prompt"] == "a red circle"
        )
        bad = http.post(url + "sdapi/v1/png-info", json={"image": base64.b64encode(b"<svg/>").decode()})
        assert bad.status_code == 422 and bad.json()["detail"].startswith("image: ")  # its own field's name


def _text_chunk(text: str) -> Any:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", text)
    return info


def test_bad_fields_are_refused_by_their_own_names(app: tuple[str, Any]) -> None:
    import openai

    url, _client = app
    with httpx.Client(timeout=30) as http:
        for body, named in (
            ({"prompt": "x", "cfg_scale": 99}, "cfg_scale"),
            ({"prompt": "x", "sampler_name": "Heun++"}, "sampler_name must be one of"),
            ({"prompt": "x", "restore_faces": True}, "restore_faces"),
            ({"prompt": "x", "batch_size": 3, "n_iter": 3}, "batch_size × n_iter must be at most 4"),
            ({"prompt": "x <lora:nope:1>"}, "LoRA 'nope' is not loaded"),
            ({"prompt": "x", "enable_hr": True, "hr_scale": 3}, "hr_scale"),
        ):
            answer = http.post(url + "sdapi/v1/txt2img", json=body)
            assert answer.status_code == 422 and named in answer.json()["detail"], (body, answer.text)
        refused = http.post(
            url + "sdapi/v1/img2img", json={"prompt": "x", "init_images": ["https://example.com/a.png"]}
        )
        assert refused.status_code == 422 and "not a URL" in refused.json()["detail"]
    api = openai.OpenAI(base_url=url + "v1", api_key="unused")
    for kwargs, param in (({"n": 9}, "n"), ({"size": "1024x1024"}, "size"),
                          ({"background": "transparent"}, "background")):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as refused_error:
            api.images.generate(prompt="a red circle", **kwargs)
        assert refused_error.value.body["param"] == param and param in refused_error.value.body["message"]


def test_each_route_has_its_own_body_cap(app: tuple[str, Any]) -> None:
    """A multipart edit with a 10 MB image passes; a 100 MB body is 413, from its headers, in OpenAI's shape."""
    url, _client = app
    rng = np.random.default_rng(2)
    big = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (1900, 1900, 3), dtype=np.uint8)).save(big, format="PNG", compress_level=1)
    assert big.tell() > 10 * 10**6
    fields = {"prompt": "a red circle", "size": "64x64", "num_inference_steps": "2"}
    answer = httpx.post(url + "v1/images/edits", data=fields, files={"image": ("big.png", big.getvalue(), "image/png")},
                        timeout=120)  # fmt: skip
    assert answer.status_code == 200 and answer.json()["data"][0]["b64_json"], answer.text[:300]
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    for path in ("/v1/images/edits", "/sdapi/v1/img2img", "/v1/images/generations"):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n".encode())
            head = raw.recv(65536)
        assert head.startswith(b"HTTP/1.1 413"), (path, head[:100])
        if path.startswith("/v1/"):
            assert b'"error"' in head and b'"message"' in head


def test_a_client_that_goes_away_stops_its_job(app: tuple[str, Any]) -> None:
    url, _client = app
    with pytest.raises(httpx.ReadTimeout):
        body = {"prompt": "a red circle", "seed": 1, "steps": 100, "width": 256, "height": 256}
        httpx.post(url + "sdapi/v1/txt2img", json=body, timeout=3)  # it gives up after 3 s
    with httpx.Client(timeout=30) as http:
        wait_for(lambda: http.get(url + "sdapi/v1/progress").json()["state"]["job_count"] == 0,
                 "the abandoned job left", timeout=30)  # fmt: skip
        t0 = time.monotonic()
        quick = http.post(url + "sdapi/v1/txt2img", json={"prompt": "x", "steps": 2, "width": 64, "height": 64})
        assert quick.status_code == 200 and time.monotonic() - t0 < 20  # not behind the rest of the 100 steps


def test_txt2img_hires_fix_equals_the_pages_hires_fix(app: tuple[str, Any]) -> None:
    url, client = app
    body = {**{k: v for k, v in COMMON.items() if k not in ("num_inference_steps", "guidance_scale")}, "steps": 4,
            "cfg_scale": 5, "sampler_name": "Euler", "enable_hr": True, "hr_scale": 2, "hr_second_pass_steps": 4,
            "denoising_strength": 0.5}  # fmt: skip
    answer = httpx.post(url + "sdapi/v1/txt2img", json=body, timeout=120).json()
    picture = Image.open(io.BytesIO(base64.b64decode(answer["images"][0])))
    ours, text = generate(client, scheduler="Euler", hires_fix=True, hires_scale=2.0, hires_steps=4, hires_strength=0.5)
    assert picture.size == (128, 128) and np.array_equal(pixels(picture), ours)
    assert "Hires upscale: 2" in text and picture.info["parameters"] == text
    # denoising_strength 0, as A1111's own API tests send it: upscaled, not redrawn (as A1111 does)
    kept = httpx.post(url + "sdapi/v1/txt2img", json={**body, "denoising_strength": 0}, timeout=120)
    assert kept.status_code == 200, kept.text
    upscaled = Image.open(io.BytesIO(base64.b64decode(kept.json()["images"][0])))
    first, _ = generate(client, scheduler="Euler")
    lanczos = pixels(Image.fromarray(first.astype(np.uint8)).resize((128, 128), Image.Resampling.LANCZOS))
    assert upscaled.size == (128, 128) and np.array_equal(pixels(upscaled), lanczos)


SDAPI_FIELDS = ["prompt", "negative_prompt", "seed", "steps", "cfg_scale", "width", "height", "sampler_name",
                "scheduler", "batch_size", "n_iter", "enable_hr", "hr_scale", "hr_resize_x",
                "hr_second_pass_steps", "denoising_strength", "override_settings", "styles", "restore_faces",
                "init_images", "mask", "inpainting_fill", "inpainting_mask_invert", "mask_blur"]  # fmt: skip
OPENAI_FIELDS = ["prompt", "model", "n", "size", "response_format", "output_format", "output_compression",
                 "stream", "partial_images", "background", "seed", "num_inference_steps", "guidance_scale",
                 "scheduler", "lora", "lora_scale", "user", "quality"]  # fmt: skip


def hostile_bodies(fields: list[str]) -> Any:
    """JSON objects over the API's own field names (and a stray one), with any JSON value in each."""
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                        st.text(max_size=40), st.sampled_from(["64x64", "auto", "Euler", "https://x/a.png", "-1"]))  # fmt: skip
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)  # fmt: skip
    keys = st.sampled_from([*fields, "stray"])
    return st.dictionaries(keys, values, max_size=6).map(lambda body: {"prompt": "a red circle", "steps": 2,
                                                                      "num_inference_steps": 2, **body})  # fmt: skip


def test_hostile_bodies_get_a_field_named_refusal_or_pictures_never_a_500(app: tuple[str, Any]) -> None:
    """Any JSON value in any field of either API: a 4xx that names a field of the request, or a picture;
    never a server error, and the server answers on."""
    from hypothesis import HealthCheck, given, settings

    url, _client = app
    http = httpx.Client(timeout=120)

    def check(path: str, fields: list[str], body: dict[str, Any]) -> None:
        sent = json.dumps(body)  # Python's JSON: Infinity is sent as it is (not JSON: refused as the body)
        answer = http.post(url + path, content=sent, headers={"content-type": "application/json"})
        assert answer.status_code in (200, 400, 422, 429), (body, answer.status_code, answer.text[:300])
        if answer.status_code != 200:
            text = answer.text
            assert any(name in text for name in [*fields, "stray", "body", "image", "guidance_scale"]), (body, text)

    many = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    many(given(body=hostile_bodies(SDAPI_FIELDS))(lambda body: check("sdapi/v1/txt2img", SDAPI_FIELDS, body)))()
    many(given(body=hostile_bodies(SDAPI_FIELDS))(lambda body: check("sdapi/v1/img2img", SDAPI_FIELDS, body)))()
    many(given(body=hostile_bodies(OPENAI_FIELDS))(lambda body: check("v1/images/generations", OPENAI_FIELDS, body)))()
    assert http.get(url + "health").json()["status"] == "ok"
    http.close()


def test_a_table_field_is_taken_and_refused_by_its_name_on_every_protocol(app: tuple[str, Any]) -> None:
    """Issue 47: a field added to the table (``step_cache``, only "off" for now) reaches every protocol:
    ``gradio_client``'s ``/generate``, A1111's ``override_settings`` and OpenAI's extra body field each
    take its default and refuse a bad value naming the field, before any GPU work."""
    import openai
    from gradio_client.exceptions import ValidationError

    url, client = app
    _gallery, info = client.predict(**raw_request(**COMMON, step_cache="off"), api_name="/generate")
    assert info["step_cache"] == {"method": "off", "computed": info["steps_done"], "skipped": 0}
    with pytest.raises(ValidationError, match="step_cache: step_cache must be one of 'off'"):  # at join
        client.predict(**raw_request(**COMMON, step_cache="fast"), api_name="/generate")
    body = {"prompt": "x", "steps": 2, "width": 64, "height": 64}
    with httpx.Client(timeout=120) as http:
        taken = http.post(url + "sdapi/v1/txt2img", json={**body, "override_settings": {"step_cache": "off"}})
        assert taken.status_code == 200, taken.text
        refused = http.post(url + "sdapi/v1/txt2img", json={**body, "override_settings": {"step_cache": "fast"}})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith("override_settings.step_cache: step_cache must be one of 'off'")
    api = openai.OpenAI(base_url=url + "v1", api_key="unused")
    small = {"prompt": "a red circle", "size": "64x64", "extra_body": {"num_inference_steps": 2}}
    assert api.images.generate(**{**small, "extra_body": {"num_inference_steps": 2, "step_cache": "off"}}).data
    with pytest.raises(openai.BadRequestError) as refused_error:
        api.images.generate(**{**small, "extra_body": {"num_inference_steps": 2, "step_cache": "fast"}})
    assert refused_error.value.body["param"] == "step_cache"
    assert "step_cache must be one of 'off'" in refused_error.value.body["message"]
