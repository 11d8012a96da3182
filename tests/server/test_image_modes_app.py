"""The image modes through the launched app and the real ``gradio_client`` (``handle_file``): an upload
through the app's own route, the same pixels as a plain diffusers call, and the upload surface
closed to anyone else's file, a URL, a server path and a file that is not an image."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import raw_request
from tests.hostile import peer

SIZE = 64


@pytest.fixture(scope="module")
def app(launch: Any) -> Iterator[tuple[str, Any]]:
    url, _demo, adapter = launch()  # the embedded default model
    yield url, adapter


@pytest.fixture(scope="module")
def url(app: tuple[str, Any]) -> str:
    return app[0]


def picture_file(tmp: Path, name: str = "photo.jpg") -> Path:
    rng = np.random.default_rng(5)
    path = tmp / name
    Image.fromarray(rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)).save(path, quality=95)
    return path


def plain_image_to_image(source: Path, prompt: str, seed: int, strength: float, steps: int) -> np.ndarray:
    """The same request as a plain diffusers call of the embedded model's image-to-image pipeline."""
    from diffusers import AutoPipelineForImage2Image

    from pipeline.config import Settings
    from pipeline.engine.model.loading import load_model

    model = load_model(Settings(), warmup=False)  # the same embedded model, here: the app's is in its own process
    pipe = AutoPipelineForImage2Image.from_pipe(model.pipe)
    pipe.set_progress_bar_config(disable=True)
    with Image.open(source) as sent:
        resized = sent.convert("RGB").resize((SIZE, SIZE), Image.Resampling.LANCZOS)
    with torch.inference_mode():
        plain = pipe(prompt=[prompt], negative_prompt=[""], image=[resized], strength=strength,
                     num_inference_steps=steps, guidance_scale=5.0,
                     generator=[torch.Generator("cpu").manual_seed(seed)]).images  # fmt: skip
    return np.asarray(plain[0]).astype(int)


def written(gallery: Any) -> np.ndarray:
    with Image.open(gallery[0]["image"]) as png:
        return np.asarray(png.convert("RGB")).astype(int)


def image_request(source: Path, **over: Any) -> dict[str, Any]:
    from gradio_client import handle_file

    raw = raw_request(prompt="a red circle", seed=11, width=SIZE, height=SIZE, num_inference_steps=10,
                      guidance_scale=5.0, mode="image", image=handle_file(str(source)), strength=0.6)  # fmt: skip
    raw.pop("mask")
    return {**raw, **over}


def test_image_to_image_through_gradio_client_equals_the_plain_pipeline(
    client: Any, app: tuple[str, Any], tmp_path: Path
) -> None:
    source = picture_file(tmp_path)
    gallery, info = client.predict(**image_request(source), api_name="/generate")
    assert info["status"] == "done" and info["mode"] == "image" and info["strength"] == 0.6
    assert info["steps_done"] == 6  # int(10 × 0.6)
    assert np.abs(written(gallery) - plain_image_to_image(source, "a red circle", 11, 0.6, 10)).max() <= 1


def steps_counted(url: str) -> float:
    lines = httpx.get(url + "metrics", timeout=10).text.splitlines()
    return next(float(line.split()[1]) for line in lines if line.startswith("denoise_steps_total "))


def test_image_to_image_joins_a_running_text_loop_and_still_equals_the_plain_pipeline(
    client: Any, url: str, tmp_path: Path
) -> None:
    """A text request of 40 steps runs; an image-to-image request sent meanwhile enters its loop at its own
    first timestep (it does not wait for the text request to end) and gives the pixels it gives alone."""
    source = picture_file(tmp_path)
    long = client.submit(**raw_request(prompt="a blue square", seed=3, width=SIZE, height=SIZE,
                                       num_inference_steps=40), api_name="/generate")  # fmt: skip
    base, deadline = steps_counted(url), time.monotonic() + 60
    while steps_counted(url) - base < 3 and time.monotonic() < deadline:  # the text request is running
        time.sleep(0.01)
    gallery, info = client.predict(**image_request(source, seed=12, strength=0.5), api_name="/generate")
    _long_gallery, long_info = long.result(timeout=120)
    assert info["batching"] == "step" and info["joined_at_step"] >= 1, info  # it entered the running loop
    assert info["steps_done"] == 5 and long_info["steps_done"] == 40
    assert info["timings"]["infer_end"] < long_info["timings"]["infer_end"]  # and left it before the text request
    assert np.abs(written(gallery) - plain_image_to_image(source, "a red circle", 12, 0.5, 10)).max() <= 1


def test_inpainting_with_an_uploaded_mask_and_outpainting_grow_the_right_pictures(client: Any, tmp_path: Path) -> None:
    from gradio_client import handle_file

    source = picture_file(tmp_path)
    mask = tmp_path / "mask.png"
    pixels = np.zeros((SIZE, SIZE), dtype=np.uint8)
    pixels[16:48, 16:48] = 255
    Image.fromarray(pixels).save(mask)
    raw = raw_request(mode="inpaint", image=handle_file(str(source)), mask=handle_file(str(mask)), strength=1.0)
    _gallery, info = client.predict(**raw, api_name="/generate")
    assert info["mode"] == "inpaint" and info["mask_blur"] == 4
    raw = raw_request(mode="outpaint", image=handle_file(str(source)), outpaint_right=32, outpaint_top=16)
    raw.pop("mask")
    gallery, info = client.predict(**raw, api_name="/generate")
    assert info["mode"] == "outpaint" and (info["outpaint_right"], info["outpaint_top"]) == (32, 16)
    with Image.open(gallery[0]["image"]) as written:
        assert written.size == (SIZE + 32, SIZE + 16)


@pytest.mark.parametrize("mode", ["image", "inpaint"])  # the loop's path and the whole call's
def test_an_image_mode_shows_progress_and_previews_and_stops_within_a_step(
    client: Any, app: tuple[str, Any], tmp_path: Path, mode: str
) -> None:
    from gradio_client import handle_file

    from tests.helpers import wait_for

    _url, adapter = app
    source, mask = picture_file(tmp_path), tmp_path / "mask.png"
    Image.new("L", (SIZE, SIZE), 255).save(mask)
    extra = {"mask": handle_file(str(mask))} if mode == "inpaint" else {}
    shown = client.submit(**image_request(source, mode=mode, num_inference_steps=16, strength=0.5,
                                          live_preview=True, **extra), api_name="/generate")  # fmt: skip
    _gallery, info = shown.result(timeout=120)
    running = [o for o in shown.outputs() if o[1].get("status") == "running"]
    assert info["status"] == "done" and info["mode"] == mode and info["steps_done"] == 8, info
    assert running and {o[1]["total"] for o in running} == {8}, running[-1][1]  # the steps that run: 16 × 0.5
    assert any(o[0] for o in running), "no live preview in an image mode"
    registry = adapter.metrics.registry
    stopped_before = registry.get_sample_value("steps_after_stop_count") or 0
    job = client.submit(**image_request(source, mode=mode, num_inference_steps=100, strength=1.0, **extra),
                        api_name="/generate")  # fmt: skip
    wait_for(lambda: any(o[1].get("status") == "running" and o[1].get("step", 0) >= 1 for o in job.outputs()),
             "a step reported", timeout=60)  # fmt: skip
    job.cancel()
    wait_for(lambda: (registry.get_sample_value("steps_after_stop_count") or 0) > stopped_before, "the stop seen", 60)
    wait_for(lambda: not adapter.inference_in_progress, "the cancelled job left the model", timeout=60)
    after = registry.get_sample_value("steps_after_stop_sum") / registry.get_sample_value("steps_after_stop_count")
    assert after <= 1, f"{after} steps ran after the stop (mean over the app's stops)"


def test_the_upload_route_takes_one_image_and_refuses_anything_else(url: str, tmp_path: Path) -> None:
    from tests import malformed

    png = malformed.png_bytes(malformed.noisy())
    assert httpx.get(url + "health", timeout=10).json()["modes"] == ["text", "image", "inpaint"]
    with httpx.Client(timeout=30) as http:
        ok = http.post(url + "gradio_api/upload", files={"files": ("a.png", png, "image/png")})
        assert ok.status_code == 200 and Path(ok.json()[0]).is_file()
        for name, body in [("x.svg", malformed.svg_polyglot()), ("x.gif", malformed.many_frame_gif(50)),
                           ("x.png", b"\x00" + png)]:  # fmt: skip
            refused = http.post(url + "gradio_api/upload", files={"files": (name, body, "image/png")})
            assert refused.status_code == 415 and "PNG, JPEG or WebP" in refused.json()["detail"], refused.text
    # a 100 MB body is answered 413 from its headers, before a byte of it is read (issue 39's bound)
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
        assert raw.recv(65536).startswith(b"HTTP/1.1 413")


def test_an_event_may_name_only_its_callers_own_upload(url: str, tmp_path: Path) -> None:
    """Another address's upload, a server path, a URL and an upload another session named first are
    refused at the join by name (422)."""
    from tests import malformed
    from tests.helpers import api_fn_index

    png = malformed.png_bytes(malformed.noisy())
    with peer("127.0.0.2") as owner, peer("127.0.0.3") as other:
        path = owner.post(url + "gradio_api/upload", files={"files": ("a.png", png, "image/png")}).json()[0]
        index = api_fn_index(url)
        for value in (
            {"path": path, "meta": {"_type": "gradio.FileData"}},  # the owner's, named by someone else
            {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},
            {"path": "https://example.com/a.png", "meta": {"_type": "gradio.FileData"}},
            {"path": path, "url": "https://example.com/a.png", "meta": {"_type": "gradio.FileData"}},
        ):
            for field, data in (
                ("image", _data(mode="image", image=value)),
                ("control_image", _data(control="shapes", control_image=value)),
            ):  # issue 51
                joined = other.post(
                    url + "gradio_api/queue/join", json={"data": data, "fn_index": index, "session_hash": "s1"}
                )
                assert joined.status_code == 422, (field, value, joined.text)
                assert f"{field} must be an image you uploaded" in joined.text, joined.text
        data = _data(mode="image", image={"path": path, "meta": {"_type": "gradio.FileData"}})
        mine = owner.post(url + "gradio_api/queue/join", json={"data": data, "fn_index": index, "session_hash": "s2"})
        assert mine.status_code == 200, mine.text
        # The upload now belongs to the session that named it first: another session (another tab or
        # client of the same address) is refused; the same bytes uploaded again are a new path of its own.
        tab = owner.post(url + "gradio_api/queue/join", json={"data": data, "fn_index": index, "session_hash": "s3"})
        assert tab.status_code == 422 and "another session's upload" in tab.text, tab.text
        again = owner.post(url + "gradio_api/upload", files={"files": ("a.png", png, "image/png")}).json()[0]
        assert again != path and Path(again).read_bytes() == png
        data = _data(mode="image", image={"path": again, "meta": {"_type": "gradio.FileData"}})
        tab = owner.post(url + "gradio_api/queue/join", json={"data": data, "fn_index": index, "session_hash": "s3"})
        assert tab.status_code == 200, tab.text


def _data(**fields: Any) -> list[Any]:
    """A join's data in the API's order (live previews off)."""
    from pipeline.request import FIELDS

    raw = raw_request(**fields)
    return [raw.get(f, False) for f in FIELDS]
