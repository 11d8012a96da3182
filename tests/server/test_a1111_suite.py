"""AUTOMATIC1111's own API tests, request for request, against the launched app (issue 49).

The requests of A1111's ``test/test_txt2img.py``, ``test_img2img.py``, ``test_utils.py`` and
``test_extras.py`` (upstream 82a973c0), written here from their payloads (their code stays theirs; the
payloads and each test's change are listed in ``docs/usage.md``'s A1111 section). A1111's tests assert
only ``200``. Here each request is either answered as A1111 answers it (200 and its pictures, checked
too) or refused by name for a documented reason: the answer names the field or route, with the reason.
Their test pictures are not in this repository: a 64×64 RGBA picture and a 64×64 RGB mask stand in,
sent as their data URLs (``data:image/png;base64,...``), as A1111's fixtures send theirs.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers import running_app

pytestmark = pytest.mark.timeout(600)

TXT2IMG = {
    "batch_size": 1, "cfg_scale": 7, "denoising_strength": 0, "enable_hr": False, "eta": 0, "firstphase_height": 0,
    "firstphase_width": 0, "height": 64, "n_iter": 1, "negative_prompt": "", "prompt": "example prompt",
    "restore_faces": False, "s_churn": 0, "s_noise": 1, "s_tmax": 0, "s_tmin": 0, "sampler_index": "Euler a",
    "seed": -1, "seed_resize_from_h": -1, "seed_resize_from_w": -1, "steps": 3, "styles": [], "subseed": -1,
    "subseed_strength": 0, "tiling": False, "width": 64,
}  # fmt: skip


def data_url(image: Image.Image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def picture() -> Image.Image:
    rng = np.random.default_rng(5)
    return Image.fromarray(rng.integers(0, 256, (64, 64, 4), dtype=np.uint8), "RGBA")


def mask() -> Image.Image:
    hole = np.zeros((64, 64, 3), np.uint8)
    hole[16:48, 16:48] = 255
    return Image.fromarray(hole)


IMG2IMG = {
    "batch_size": 1, "cfg_scale": 7, "denoising_strength": 0.75, "eta": 0, "height": 64, "include_init_images": False,
    "init_images": [data_url(picture())], "inpaint_full_res": False, "inpaint_full_res_padding": 0,
    "inpainting_fill": 0, "inpainting_mask_invert": False, "mask": None, "mask_blur": 4, "n_iter": 1,
    "negative_prompt": "", "override_settings": {}, "prompt": "example prompt", "resize_mode": 0,
    "restore_faces": False, "s_churn": 0, "s_noise": 1, "s_tmax": 0, "s_tmin": 0, "sampler_index": "Euler a",
    "seed": -1, "seed_resize_from_h": -1, "seed_resize_from_w": -1, "steps": 3, "styles": [], "subseed": -1,
    "subseed_strength": 0, "tiling": False, "width": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_app(tmp_path_factory.mktemp("a1111-suite"), "--rate-limit", "50") as (url, _demo, _adapter):
        yield url


def images_of(answer: httpx.Response) -> list[Image.Image]:
    assert answer.status_code == 200, answer.text
    return [Image.open(io.BytesIO(base64.b64decode(b64))) for b64 in answer.json()["images"]]


# test_txt2img.py: (its test, the change to the base payload, the pictures' (count, size) or the refusal's words)
TXT2IMG_CASES = [
    ("simple", {}, (1, (64, 64))),
    ("with_negative_prompt", {"negative_prompt": "example negative prompt"}, (1, (64, 64))),
    # A1111's prompt editing ([from:to:when], [a|b]) is not this app's: read as weighted text, drawn
    ("with_complex_prompt", {"prompt": "((emphasis)), (emphasis1:1.1), [to:1], [from::2], [from:to:0.3], [alt|alt1]"},
     (1, (64, 64))),
    ("not_square_image", {"height": 128}, (1, (64, 128))),
    ("with_hrfix", {"enable_hr": True}, (1, (128, 128))),  # denoising_strength 0: upscaled, not redrawn
    ("with_tiling", {"tiling": True}, "tiling is not supported by this app"),
    ("with_restore_faces", {"restore_faces": True}, "restore_faces is not supported by this app"),
    ("with_vanilla_sampler[PLMS]", {"sampler_index": "PLMS"}, "sampler_index must be one of"),  # not offered
    ("with_vanilla_sampler[DDIM]", {"sampler_index": "DDIM"}, (1, (64, 64))),
    ("with_vanilla_sampler[UniPC]", {"sampler_index": "UniPC"}, (1, (64, 64))),
    ("multiple_batches", {"n_iter": 2}, (2, (64, 64))),
    ("batch", {"batch_size": 2}, (2, (64, 64))),
]  # fmt: skip


@pytest.mark.parametrize(("name", "change", "expected"), TXT2IMG_CASES, ids=[c[0] for c in TXT2IMG_CASES])
def test_a1111s_txt2img_tests(url: str, name: str, change: dict[str, Any], expected: Any) -> None:
    answer = httpx.post(url + "sdapi/v1/txt2img", json={**TXT2IMG, **change}, timeout=120)
    check(answer, expected)


IMG2IMG_CASES = [
    ("img2img_simple", {}, (1, (64, 64))),
    ("inpainting_masked", {"mask": data_url(mask())}, (1, (64, 64))),
    ("inpainting_with_inverted_masked", {"mask": data_url(mask()), "inpainting_mask_invert": True}, (1, (64, 64))),
    ("img2img_sd_upscale", {"script_name": "sd upscale", "script_args": ["", 8, "Lanczos", 2.0]},
     "script_name is not supported by this app"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "change", "expected"), IMG2IMG_CASES, ids=[c[0] for c in IMG2IMG_CASES])
def test_a1111s_img2img_tests(url: str, name: str, change: dict[str, Any], expected: Any) -> None:
    answer = httpx.post(url + "sdapi/v1/img2img", json={**IMG2IMG, **change}, timeout=120)
    check(answer, expected)


def check(answer: httpx.Response, expected: Any) -> None:
    if isinstance(expected, str):  # refused by name, for the reason docs/usage.md gives
        assert answer.status_code == 422 and expected in answer.json()["detail"], answer.text
        return
    count, size = expected
    pictures = images_of(answer)
    assert len(pictures) == count and all(p.size == size for p in pictures), [p.size for p in pictures]


@pytest.mark.parametrize(
    "route",
    ["cmd-flags", "samplers", "upscalers", "sd-models", "hypernetworks", "face-restorers", "realesrgan-models",
     "prompt-styles", "embeddings"],
)  # fmt: skip
def test_a1111s_utils_list_routes_answer(url: str, route: str) -> None:
    answer = httpx.get(url + f"sdapi/v1/{route}", timeout=30)
    assert answer.status_code == 200 and isinstance(answer.json(), (list, dict)), answer.text


def test_a1111s_options_write_is_refused_by_name_and_what_get_said_is_taken(url: str) -> None:
    """``test_options_write`` flips ``send_seed``: a global setting one caller would change for every
    caller of a shared server. This app lists it and refuses the change by its name."""
    options = httpx.get(url + "sdapi/v1/options", timeout=30).json()
    flipped = httpx.post(url + "sdapi/v1/options", json={"send_seed": not options["send_seed"]}, timeout=30)
    assert flipped.status_code == 422 and flipped.json()["detail"].startswith("send_seed: "), flipped.text
    assert httpx.post(url + "sdapi/v1/options", json={"send_seed": options["send_seed"]}, timeout=30).status_code == 200


@pytest.mark.parametrize(
    "body", [{"upscaling_resize": 2, "upscaler_1": "Lanczos", "image": "x"}, {"image": "x"}, {"image": "x", "model": "clip"}]
)  # fmt: skip
def test_a1111s_extras_tests_get_a_refusal_that_names_the_route(url: str, body: dict[str, Any]) -> None:
    """``test_extras.py`` posts to ``extra-single-image`` (upscaling, face restoring): not this app's."""
    answer = httpx.post(url + "sdapi/v1/extra-single-image", json=body, timeout=30)
    assert answer.status_code == 404 and "/sdapi/v1/extra-single-image" in answer.json()["detail"], answer.text


def test_an_empty_prompt_is_a1111s_default_and_draws(url: str) -> None:
    """Not one of A1111's tests: its API's default prompt is "", which it draws unconditionally."""
    (drawn,) = images_of(httpx.post(url + "sdapi/v1/txt2img", json={**TXT2IMG, "prompt": ""}, timeout=120))
    assert drawn.size == (64, 64)
    (omitted,) = images_of(
        httpx.post(url + "sdapi/v1/txt2img", json={"steps": 3, "width": 64, "height": 64}, timeout=120)
    )
    assert omitted.size == (64, 64)
