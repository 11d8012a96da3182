"""Several models on one server (issue 52), through the launched app and its real clients: the embedded model
and a tiny SD 1.5 build (``tests/families``) under a device-memory budget that fits one of them at a time.

Each model's picture through ``/generate`` (``model``), ``/sdapi/v1/txt2img`` (``override_settings``) and
``/v1/images/generations`` (``model``) equals a server serving that model alone, pixel for pixel; the second
model's first request moves the first off the device, measured (``/health``, ``/metrics``); an identity's
options POST changes its own default only; several users alternating between the models all at once each get
their model's picture, with no more switches than the changes of model between the jobs that ran."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.families import built_family

pytestmark = pytest.mark.timeout(600)

TINY = "tiny"
EMBEDDED = "embedded-default"
BUDGET_MIB = "8"  # the embedded model's weights are 7.4 MiB, the tiny SD 1.5 build's 2.1: one fits at a time
SD = {"prompt": "a red circle on a blue background", "seed": 7, "width": 64, "height": 64, "steps": 4,
      "cfg_scale": 4.0, "sampler_name": "Euler"}  # fmt: skip


@pytest.fixture(scope="module")
def servers(launch: Any) -> dict[str, str]:
    from tests.loras import loras_of

    tiny = str(built_family("sd1"))
    ink = loras_of("default")["a"]  # a LoRA of the embedded model: it fits that one only
    both, _demo, _adapter = launch("--model", EMBEDDED, "--model", f"{TINY}={tiny}", "--lora", f"ink={ink}",
                                   "--device-memory-budget", BUDGET_MIB, name="both")  # fmt: skip
    embedded, _, _ = launch(name="embedded")
    alone, _, _ = launch("--model", tiny, name="tiny")
    return {"both": str(both), EMBEDDED: str(embedded), TINY: str(alone)}


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as png:
        return np.asarray(png.convert("RGB"))


def txt2img(url: str, body: dict[str, Any], who: str = "203.0.113.1") -> dict[str, Any]:
    answer = httpx.post(url + "sdapi/v1/txt2img", json=body, headers={"X-Forwarded-For": who}, timeout=120)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def first_picture(answer: dict[str, Any]) -> np.ndarray:
    return pixels(base64.b64decode(answer["images"][0]))


def test_each_model_draws_on_every_protocol_what_a_server_of_it_alone_draws(servers: dict[str, str]) -> None:
    from gradio_client import Client

    both = servers["both"]
    for name in (TINY, EMBEDDED, TINY):  # there and back: each switch moves the other off first
        alone = servers[name]
        ours = first_picture(txt2img(both, {**SD, "override_settings": {"sd_model_checkpoint": name}}))
        assert np.array_equal(ours, first_picture(txt2img(alone, SD))), name
        body = {"prompt": SD["prompt"], "size": "64x64", "seed": 7, "num_inference_steps": 4, "guidance_scale": 4.0}
        picked = httpx.post(both + "v1/images/generations", json={**body, "model": name}, timeout=120).json()
        plain = httpx.post(alone + "v1/images/generations", json=body, timeout=120).json()
        assert picked["model"] == name
        assert np.array_equal(*(pixels(base64.b64decode(a["data"][0]["b64_json"])) for a in (picked, plain))), name
    client, single = Client(both, verbose=False), Client(servers[TINY], verbose=False)
    request = {"prompt": SD["prompt"], "negative_prompt": "", "seed": 7, "randomize_seed": False, "width": 64,
               "height": 64, "num_inference_steps": 4, "guidance_scale": 4.0, "num_images": 1,
               "live_preview": False, "scheduler": "default"}  # fmt: skip
    gallery, info = client.predict(**request, model=TINY, api_name="/generate")
    alone_gallery, _ = single.predict(**request, api_name="/generate")
    assert info["model_id"] == info["model"] == TINY and info["model_title"].startswith(f"{TINY} (")
    with open(gallery[0]["image"], "rb") as a, open(alone_gallery[0]["image"], "rb") as b:
        ours, theirs = a.read(), b.read()
    assert np.array_equal(pixels(ours), pixels(theirs))
    with Image.open(io.BytesIO(ours)) as png:
        assert f"Model: {TINY}" in png.info["parameters"] and "Model hash: " in png.info["parameters"]


def test_health_lists_the_models_and_the_switch_is_measured(servers: dict[str, str]) -> None:
    both = servers["both"]
    txt2img(both, {**SD, "override_settings": {"sd_model_checkpoint": EMBEDDED}})
    health = httpx.get(both + "health", timeout=10).json()
    models = {m["name"]: m for m in health["models"]}
    assert list(models) == [EMBEDDED, TINY] and models[EMBEDDED]["default"]
    assert models[EMBEDDED]["controls"] == ["shapes"] and models[TINY]["controls"] == []  # its own ControlNet only
    assert models[EMBEDDED]["loras"] == ["ink"] and models[TINY]["loras"] == []  # --lora where its layers fit
    refused = httpx.post(
        both + "sdapi/v1/txt2img",
        timeout=30,
        json={**SD, "prompt": "a circle <lora:ink:1>", "override_settings": {"sd_model_checkpoint": TINY}},
    )
    assert refused.status_code == 422 and "ink" in refused.text  # not on that model: refused before any GPU work
    assert models[EMBEDDED]["state"] == "device" and models[TINY]["state"] == "memory"  # the budget fits one
    txt2img(both, {**SD, "override_settings": {"sd_model_checkpoint": TINY}})
    models = {m["name"]: m for m in httpx.get(both + "health", timeout=10).json()["models"]}
    assert models[TINY]["state"] == "device" and models[EMBEDDED]["state"] == "memory"
    assert models[TINY]["last_move_in_ms"] > 0 and models[EMBEDDED]["last_move_out_ms"] > 0
    metrics = httpx.get(both + "metrics", timeout=10).text
    assert _switches(both) >= 1 and 'model_on_device{model="tiny"} 1.0' in metrics
    refused = httpx.post(both + "sdapi/v1/txt2img", json={**SD, "override_settings": {"sd_model_checkpoint": "x"}},
                         timeout=30)  # fmt: skip
    assert refused.status_code == 422 and "sd_model_checkpoint" in refused.text and TINY in refused.text


def test_an_options_post_sets_the_callers_own_default_only(servers: dict[str, str]) -> None:
    both, a, b = servers["both"], "203.0.113.21", "203.0.113.22"
    options = httpx.get(both + "sdapi/v1/options", headers={"X-Forwarded-For": a}, timeout=10).json()
    assert options["sd_model_checkpoint"].startswith(EMBEDDED)
    titles = {m["model_name"]: m["title"] for m in httpx.get(both + "sdapi/v1/sd-models", timeout=10).json()}
    assert set(titles) == {EMBEDDED, TINY} and re.fullmatch(rf"{TINY} \[[0-9a-f]{{10}}\]", titles[TINY])
    options["sd_model_checkpoint"] = titles[TINY]  # Open WebUI: GET, change the checkpoint, POST the whole dict
    posted = httpx.post(both + "sdapi/v1/options", json=options, headers={"X-Forwarded-For": a}, timeout=10)
    assert posted.status_code == 200, posted.text
    mine, theirs = txt2img(both, SD, a), txt2img(both, SD, b)
    assert json.loads(mine["info"])["sd_model_name"] == TINY and json.loads(theirs["info"])["sd_model_name"] == EMBEDDED
    assert np.array_equal(first_picture(mine), first_picture(txt2img(servers[TINY], SD)))
    got = httpx.get(both + "sdapi/v1/options", headers={"X-Forwarded-For": b}, timeout=10).json()
    assert got["sd_model_checkpoint"].startswith(EMBEDDED)  # B's default is still the server's


def test_users_alternating_between_models_each_get_their_models_picture(servers: dict[str, str]) -> None:
    from gradio_client import Client

    both = servers["both"]
    request = {"prompt": SD["prompt"], "negative_prompt": "", "seed": 20, "randomize_seed": False, "width": 64,
               "height": 64, "num_inference_steps": 12, "guidance_scale": 4.0, "num_images": 1,
               "live_preview": False, "scheduler": "Euler"}  # fmt: skip
    expected = {}
    for name in (EMBEDDED, TINY):
        gallery, _ = Client(servers[name], verbose=False).predict(**request, api_name="/generate")
        with open(gallery[0]["image"], "rb") as f:
            expected[name] = pixels(f.read())
    apart = np.abs(expected[EMBEDDED].astype(float) - expected[TINY]).mean()
    assert apart > 10  # the two models draw different pictures: a request run on the other model would show
    users = [Client(both, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{40 + i}"}) for i in range(8)]
    before = _switches(both)
    answers: dict[int, tuple[Any, dict[str, Any]]] = {}

    def user(i: int) -> None:
        answers[i] = users[i].predict(**request, model=(EMBEDDED, TINY)[i % 2], api_name="/generate")

    threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(answers) == list(range(8))
    for i, (gallery, info) in answers.items():  # in a shared loop, as alone up to the batch's float noise
        assert info["model"] == (EMBEDDED, TINY)[i % 2]
        with open(gallery[0]["image"], "rb") as f:
            drawn = np.abs(pixels(f.read()).astype(float) - expected[info["model"]]).mean()
        assert drawn < 0.5, (i, info["model"], drawn)
    assert max(info["batch_requests"] for _, info in answers.values()) > 1  # they shared loops: the test can fail
    # A switch only where a batch's model differs from the loaded one: no more than the batches of each model.
    starts = sorted((info["timings"]["infer_start"], info["model"]) for _, info in answers.values())
    changes = sum(1 for (_, a), (_, b) in zip(starts, starts[1:]) if a != b)
    assert 1 <= _switches(both) - before <= changes + 1


def _switches(url: str) -> float:
    metrics = httpx.get(url + "metrics", timeout=10).text
    found = re.search(r"^model_switch_seconds_count (\S+)", metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_rare_models_request_waits_one_round_not_the_whole_backlog(servers: dict[str, str]) -> None:
    """Three users flood the default model; a fourth asks for the other one. Its request is overtaken by at most
    one request of each other user (the fair line's round: the head picks the model), never by the backlog."""
    from gradio_client import Client

    both = servers["both"]
    request = {"prompt": SD["prompt"], "negative_prompt": "", "seed": 1, "randomize_seed": False, "width": 64,
               "height": 64, "num_inference_steps": 16, "guidance_scale": 4.0, "num_images": 1,
               "live_preview": False, "scheduler": "Euler"}  # fmt: skip
    flooders = [Client(both, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{60 + u}"}) for u in range(3)]
    rare = Client(both, verbose=False, headers={"X-Forwarded-For": "203.0.113.70"})
    flood: list[dict[str, Any]] = []
    jobs = [flooders[u].submit(**request, model=EMBEDDED, api_name="/generate") for u in range(3) for _ in range(3)]
    wait_for_running(both)
    job = rare.submit(**request, model=TINY, api_name="/generate")
    _, mine = job.result(timeout=300)
    waits = [out[1] for out in job.outputs() if isinstance(out[1], dict) and out[1].get("status") == "waiting"]
    assert waits and all(w.get("model_switch") == TINY for w in waits if w["ahead"]), waits  # the wait says so
    flood = [job.result(timeout=300)[1] for job in jobs]
    assert mine["model"] == TINY and {i["model"] for i in flood} == {EMBEDDED}
    arrived, started = mine["timings"]["received"], mine["timings"]["infer_start"]
    overtook = [i for i in flood if arrived < i["timings"]["infer_start"] < started]
    assert len(overtook) <= 3, [i["timings"]["infer_start"] - arrived for i in overtook]  # one a user, at most
    assert any(i["timings"]["infer_start"] > started for i in flood)  # the backlog waited its turn behind it


def wait_for_running(url: str) -> None:
    from tests.helpers import wait_for

    wait_for(lambda: httpx.get(url + "health", timeout=5).json()["inference_in_progress"], "the flood running", 60)
