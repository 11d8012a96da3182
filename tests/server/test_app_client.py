"""The real app (embedded tiny model on the CPU), launched on a free port, answered by gradio_client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from pipeline.request import IMAGE_FIELDS

INFO_KEYS = {
    "request_id",
    "model",
    "prompt",
    "negative_prompt",
    "seed",
    "seeds",
    "width",
    "height",
    "num_inference_steps",
    "guidance_scale",
    "num_images",
    "batch_size",
    "timings",
    "reproduce",
}
TIMING_ORDER = [
    "received",
    "prepare_start",
    "prepare_end",
    "gpu_wait_start",
    "infer_start",
    "infer_end",
    "finalize_start",
    "finalize_end",
]


@pytest.fixture(scope="module")
def url(launch: Any) -> str:
    return str(launch(name="server")[0])


def _generate(client: Any, **params: Any) -> tuple[list[Path], dict[str, Any]]:
    gallery, info = client.predict(api_name="/generate", **params)
    return [Path(item["image"]) for item in gallery], info


def test_generates_images_of_the_requested_size_with_a_complete_info_record(client: Any) -> None:
    paths, info = _generate(
        client,
        prompt="a red circle",
        seed=7,
        randomize_seed=False,
        width=64,
        height=96,
        num_inference_steps=4,
        guidance_scale=5.0,
        num_images=2,
    )
    assert len(paths) == 2
    for path in paths:
        with Image.open(path) as image:
            assert image.size == (64, 96)
            params = image.text["parameters"]
            assert params.startswith("a red circle\n") and "Steps: 4" in params and "Size: 64x96" in params
            assert json.loads(image.text["generation"])["prompt"] == "a red circle"
    assert set(info) >= INFO_KEYS
    assert info["seed"] == 7 and info["seeds"] == [7, 8]
    assert (info["width"], info["height"], info["num_inference_steps"], info["num_images"]) == (64, 96, 4, 2)
    assert info["guidance_scale"] == 5.0 and info["batch_size"] == 2 and info["batch_requests"] == 1
    assert [info["timings"][k] for k in TIMING_ORDER] == sorted(info["timings"][k] for k in TIMING_ORDER)
    assert info["reproduce"]["params"]["randomize_seed"] is False


def test_same_seed_same_pixels_and_other_seed_other_pixels(client: Any) -> None:
    params = dict(
        prompt="a blue square",
        seed=1234,
        randomize_seed=False,
        width=64,
        height=64,
        num_inference_steps=3,
        guidance_scale=7.5,
        num_images=1,
    )
    (a,), _ = _generate(client, **params)
    (b,), _ = _generate(client, **params)
    (c,), _ = _generate(client, **{**params, "seed": 1235})
    pixels = [np.asarray(Image.open(p).convert("RGB")) for p in (a, b, c)]
    assert np.array_equal(pixels[0], pixels[1])
    assert not np.array_equal(pixels[0], pixels[2])


def test_per_image_seed_reproduces_one_image_of_a_set(client: Any) -> None:
    common = dict(prompt="a cat", randomize_seed=False, width=64, height=64, num_inference_steps=3, guidance_scale=7.5)
    paths, info = _generate(client, seed=50, num_images=2, **common)
    (alone,), _ = _generate(client, seed=info["seeds"][1], num_images=1, **common)
    # Same noise; the batch's arithmetic may round differently, so within 1/255 on average.
    a, b = (np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) for p in (paths[1], alone))
    assert np.abs(a - b).mean() <= 1.0
    (other,), _ = _generate(client, seed=info["seeds"][0], num_images=1, **common)
    assert np.abs(a - np.asarray(Image.open(other).convert("RGB"), dtype=np.float64)).mean() > 5.0


def test_randomized_seed_is_reported(client: Any) -> None:
    _, info = _generate(client, prompt="a dog", randomize_seed=True, width=64, height=64, num_inference_steps=2)
    assert isinstance(info["seed"], int) and 0 <= info["seed"] < 2**32
    assert info["reproduce"]["params"]["seed"] == info["seed"]


def test_only_generate_is_in_the_api_and_the_rest_shortcut_is_closed(client: Any, url: str) -> None:
    api = client.view_api(print_info=False, return_format="dict")
    assert set(api["named_endpoints"]) == {"/generate"}
    names = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert names == [
        "prompt",
        "negative_prompt",
        "seed",
        "randomize_seed",
        "width",
        "height",
        "num_inference_steps",
        "guidance_scale",
        "num_images",
        "live_preview",
        "scheduler",
        "lora",
        "lora_scale",
        *IMAGE_FIELDS,  # every one with a default: a text-to-image call names none of them
        "step_cache",  # a table field (pipeline.fields): at its default unless named
        "emphasis",  # issue 49: how AUTOMATIC1111's prompt syntax reads
        "control",  # issue 51: a ControlNet and its map, weight, window and preprocessor
        "control_image",
        "control_scale",
        "control_start",
        "control_end",
        "control_preprocess",
        "model",  # issue 52: the served model to draw with, by name ("default": the server's first)
    ]
    params = api["named_endpoints"]["/generate"]["parameters"]
    assert all(p["parameter_has_default"] for p in params[13:]), params[13:]
    assert [(p["parameter_name"], p["parameter_default"]) for p in params[13:16]] == [
        ("mode", "text"),
        ("image", None),
        ("mask", None),
    ]
    live, scheduler, lora, lora_scale = params[9:13]
    assert lora["parameter_has_default"] and lora["parameter_default"] == "none"
    assert lora_scale["parameter_has_default"] and lora_scale["parameter_default"] == 1.0
    assert live["parameter_has_default"] and live["parameter_default"] is False  # off for API callers
    assert scheduler["parameter_has_default"] and scheduler["parameter_default"] == "default"  # the model's own
    body = {"data": ["x", "", 1, False, 64, 64, 2, 7.5, 1, False, "default", "none", 1.0]}
    response = httpx.post(url + "gradio_api/run/generate", json=body, timeout=30)
    assert response.status_code >= 400, response.text


def test_invalid_input_gets_a_clear_error_naming_the_field(client: Any) -> None:
    from gradio_client.exceptions import ValidationError

    # Refused when the request joins the queue (Gradio's validator=), so gradio_client raises its
    # ValidationError (not AppError): "<n> parameter(s) failed validation:" and "- <field>: <message>".
    first_line = r"^1 parameter\(s\) failed validation:\n"
    width = r"- width: width must be a multiple of 4 between 64 and 256; got 102$"
    with pytest.raises(ValidationError, match=first_line + width):
        _generate(client, prompt="x", width=102, height=64)
    steps = r"- num_inference_steps: num_inference_steps must be a whole number between 1 and \d+; got 0$"
    with pytest.raises(ValidationError, match=first_line + steps):
        _generate(client, prompt="x", num_inference_steps=0)


def test_the_chosen_sampler_reaches_the_png_metadata_and_the_info_record(client: Any) -> None:
    common = dict(prompt="a red circle", seed=5, randomize_seed=False, width=64, height=64, num_inference_steps=4)
    (path,), info = _generate(client, scheduler="DDIM", **common)
    assert info["scheduler"] == "DDIM" and info["reproduce"]["params"]["scheduler"] == "DDIM"
    with Image.open(path) as image:
        assert "Steps: 4, Sampler: DDIM, CFG scale:" in image.text["parameters"]
        assert json.loads(image.text["generation"])["scheduler"] == "DDIM"
    (path,), info = _generate(client, **common)  # "default": the model's own scheduler, named as used
    assert info["scheduler"] == "Euler" and info["reproduce"]["params"]["scheduler"] == "default"
    with Image.open(path) as image:
        assert "Sampler: Euler," in image.text["parameters"]
        assert json.loads(image.text["generation"])["scheduler"] == "Euler"
        euler = np.asarray(image.convert("RGB"), dtype=np.float64)
    # (DDIM and Euler are the same ODE step on this model's schedule: their pixels agree.) An ancestral
    # sampler adds fresh noise at every step: other pixels from the same seed.
    (path,), info = _generate(client, scheduler="Euler a", **common)
    with Image.open(path) as image:
        assert "Sampler: Euler a," in image.text["parameters"] and info["scheduler"] == "Euler a"
        assert np.abs(np.asarray(image.convert("RGB"), dtype=np.float64) - euler).mean() > 1.0


def test_an_unknown_sampler_is_a_validation_error_that_lists_the_choices(client: Any) -> None:
    from gradio_client.exceptions import ValidationError

    choices = r"default, Euler, Euler a, DPM\+\+ 2M Karras, DDIM, UniPC"
    with pytest.raises(
        ValidationError, match=rf"\n- scheduler: scheduler must be one of: {choices}; got &#x27;Heun&#x27;$"
    ):
        _generate(client, prompt="x", scheduler="Heun")


def test_progress_records_carry_eta_seconds(client: Any) -> None:
    _generate(client, prompt="a red circle", num_inference_steps=20)  # measured: the app is warm
    # Two at once (different step counts, so they never share a job): one waits while the other runs.
    jobs = [client.submit(prompt="a red circle", num_inference_steps=steps, api_name="/generate") for steps in (40, 41)]
    records = [out[1] for job in jobs for out in (job.result(timeout=120), *job.outputs())]
    waiting = [r for r in records if r.get("status") == "waiting" and r["ahead"] > 0]
    running = [r for r in records if r.get("status") == "running"]
    assert waiting and running, records
    assert all(isinstance(r["eta_seconds"], float) and r["eta_seconds"] > 0 for r in waiting), waiting
    assert all(isinstance(r["eta_seconds"], float) and r["eta_seconds"] >= 0 for r in running), running


def test_public_link_settings_only_image_uploads_no_ssr_no_tracebacks(url: str) -> None:
    upload = httpx.post(url + "gradio_api/upload", files={"files": ("x.bin", b"x" * 5 * 2**20)}, timeout=30)
    assert upload.status_code == 415 and "/tmp" not in upload.text  # not an image: nothing written
    small = httpx.post(url + "gradio_api/upload", files={"files": ("x.txt", b"hi")}, timeout=30)
    assert small.status_code == 415
    config = httpx.get(url + "config", timeout=10).json()
    assert config.get("show_error") is False
    assert not config.get("is_ssr", False)


def test_prompts_are_read_as_automatic1111_reads_them_through_the_launched_app(client: Any) -> None:
    """Issue 49, from outside: weights are weights (``(red:1.0)`` is the plain word; ``(blue:1.6)`` changes
    the picture, ``(blue:1.0)`` does not), ``\\(red\\)`` is text, a prompt is read past token 100, and a
    fifth chunk is refused by name before any GPU work."""
    base = dict(seed=3, randomize_seed=False, width=64, height=64, num_inference_steps=12, guidance_scale=7.5)

    def drawn(prompt: str) -> np.ndarray:
        (path,), _ = _generate(client, prompt=prompt, **base)
        return np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)

    def d(a: np.ndarray, b: np.ndarray) -> float:
        print(f"MAD {float(np.abs(a - b).mean()):.3f}")
        return float(np.abs(a - b).mean())

    red = drawn("a red circle on a white background")
    assert d(red, drawn("a (red:1.0) circle on a white background")) <= 0.5
    assert d(red, drawn(r"a \(red\) circle on a white background")) > 5  # the brackets are text
    blue = drawn("a red circle on a blue background")
    assert d(blue, drawn("a red circle on a (blue:1.0) background")) <= 0.5
    assert d(blue, drawn("a red circle on a (blue:1.6) background")) > 0.5
    long = "a red circle on a white background, " + ", ".join(f"simple shape {i}" for i in range(30))
    assert d(drawn(long + ", green"), drawn(long + ", yellow star")) > 0  # past token 100: read, not cut
    with pytest.raises(Exception, match=r"prompt must be at most 4 chunks of 75 CLIP tokens .*got 5 chunks"):
        _generate(client, prompt=" BREAK ".join(["a red circle"] * 5), **base)
