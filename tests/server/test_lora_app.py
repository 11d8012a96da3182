"""Per-request LoRAs through the launched app (the embedded model in its model process, two tiny
peft LoRAs loaded with ``--lora``), answered by the real ``gradio_client``:

- a LoRA changes the image and equals a plain diffusers call with that adapter at that scale; "none"
  equals no LoRA;
- two concurrent users with different adapters share one step-level loop, each with its own pixels;
- a switch never loads the model again (the model side's load counter stays at 1, no restart);
- cancel, progress and previews work with an adapter; an unknown name is refused at join time with
  the list of choices; the PNG carries ``<lora:NAME:SCALE>`` and ``Lora hashes``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from pipeline.protocol import InferenceJob
from tests.helpers import gate_held, raw_request, running_app, wait_for
from tests.loras import BOUND, loras_of, mad, plain_diffusers

pytestmark = pytest.mark.timeout(600)

COMMON = dict(prompt="a red circle", seed=3, width=64, height=64, num_inference_steps=3, guidance_scale=3.0)


def job_of(lora: str = "", scale: float = 1.0) -> InferenceJob:
    """The in-process job the app's request above runs as."""
    return InferenceJob(
        "j", ("a red circle",), ("",), (3,), 64, 64, 3, 3.0, lora=lora, lora_scale=scale if lora else 0.0
    )


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    tmp = tmp_path_factory.mktemp("lora-app")
    loras = loras_of("default")
    args = (
        "--lora",
        f"ink={loras['a']}",
        "--lora",
        f"glow={loras['b']}:0.6",
        "--max-batch-size",
        "4",
        "--max-pixel-steps",
        str(10**9),
        "--lora-batching",
        "mixed",
    )  # auto keeps a loop per adapter on the CPU: this checks the mixed path
    with running_app(tmp, *args) as (url, _demo, adapter):
        from gradio_client import Client

        yield url, adapter, Client(url, verbose=False, download_files=str(tmp / "dl"))


def generate(client: Any, **over: Any) -> tuple[Image.Image, dict[str, Any]]:
    gallery, info = client.predict(**raw_request(**{**COMMON, **over}), api_name="/generate")
    with Image.open(gallery[0]["image"]) as picture:
        return picture.convert("RGB"), info


def test_a_lora_changes_the_image_and_equals_plain_diffusers_and_none_equals_no_lora(app: Any) -> None:
    _url, _adapter, client = app
    ink, ink_info = generate(client, lora="ink", lora_scale=1.0)
    glow, glow_info = generate(client, lora="glow", lora_scale=0.6)
    none, none_info = generate(client, lora="none")
    assert mad((ink,), (none,)) > 5 * BOUND and mad((glow,), (none,)) > 5 * BOUND  # well past rounding
    assert mad((ink,), plain_diffusers("default", job_of("a", 1.0), "a")[:1]) <= BOUND
    assert mad((glow,), plain_diffusers("default", job_of("b", 0.6), "b")[:1]) <= BOUND
    assert mad((none,), plain_diffusers("default", job_of(), None)[:1]) <= BOUND
    assert (ink_info["lora"], ink_info["lora_scale"], len(ink_info["lora_hash"])) == ("ink", 1.0, 12)
    assert (glow_info["lora"], glow_info["lora_scale"]) == ("glow", 0.6)
    assert none_info["lora"] == "none" and "lora_hash" not in none_info
    assert {i["model_loads"] for i in (ink_info, glow_info, none_info)} == {1}  # never loaded again
    assert glow_info["lora_switch_ms"] > 0 and none_info["lora_switch_ms"] > 0


def test_two_users_with_different_adapters_share_a_loop_each_with_their_own_pixels(app: Any) -> None:
    _url, adapter, client = app
    alone = {name: generate(client, lora=name, seed=seed)[0] for name, seed in (("ink", 11), ("glow", 12))}
    with gate_held(adapter):
        jobs = {name: client.submit(**raw_request(**{**COMMON, "seed": seed, "lora": name, "lora_scale": 1.0}),
                                    api_name="/generate") for name, seed in (("ink", 11), ("glow", 12))}  # fmt: skip
        wait_for(lambda: adapter.gpu_queue_depth == 2, "both wait at the gate", timeout=60)
    for name, job in jobs.items():
        gallery, info = job.result(timeout=300)
        assert info["batching"] == "step" and info["batch_requests"] == 2, info
        with Image.open(gallery[0]["image"]) as picture:
            assert mad((picture.convert("RGB"),), (alone[name],)) <= BOUND, name
        assert info["model_loads"] == 1
    health = adapter.health()
    assert health["model_restarts"] == 0 and health["loras"] == ["ink", "glow"]


def test_cancel_progress_and_previews_with_an_adapter(app: Any) -> None:
    _url, adapter, client = app
    previewed = client.submit(**raw_request(**{**COMMON, "lora": "ink", "num_inference_steps": 16,
                                               "live_preview": True}), api_name="/generate")  # fmt: skip
    _gallery, info = previewed.result(timeout=300)
    running = [o[1] for o in previewed.outputs() if o[1].get("status") == "running"]
    assert running and all(r["total"] == 16 for r in running) and running[-1]["step"] <= 16
    assert any(o[0] for o in previewed.outputs() if o[1].get("status") == "running"), "no preview came"
    assert info["lora"] == "ink" and info["steps_done"] == 16

    cancelled = adapter.metrics.jobs.labels("cancelled")._value.get()
    long = client.submit(**raw_request(**{**COMMON, "lora": "glow", "num_inference_steps": 100, "width": 256,
                                          "height": 256}), api_name="/generate")  # fmt: skip
    wait_for(lambda: any(o[1].get("status") == "running" for o in long.outputs()), "it runs", timeout=120)
    canceller = threading.Thread(target=long.cancel)
    canceller.start()
    wait_for(lambda: adapter.metrics.jobs.labels("cancelled")._value.get() > cancelled, "the cancel is counted",
             timeout=120)  # fmt: skip
    canceller.join(60)
    steps = [o[1]["step"] for o in long.outputs() if o[1].get("status") == "running"]
    assert steps and max(steps) < 100
    # The adapters are as they were: the next request with one is its picture alone.
    again, _ = generate(client, lora="ink", lora_scale=1.0)
    assert mad((again,), plain_diffusers("default", job_of("a", 1.0), "a")[:1]) <= BOUND


def test_an_unknown_adapter_is_refused_at_join_with_the_choices(app: Any) -> None:
    from gradio_client.exceptions import AppError

    _url, _adapter, client = app
    with pytest.raises((AppError, ValueError)) as caught:
        client.predict(**raw_request(**{**COMMON, "lora": "sketch"}), api_name="/generate")
    assert "lora must be one of: none, ink, glow" in str(caught.value)
    with pytest.raises((AppError, ValueError), match="lora_scale must be a number between -2 and 2"):
        client.predict(**raw_request(**{**COMMON, "lora": "ink", "lora_scale": 5}), api_name="/generate")


def test_the_png_names_the_adapter_the_a1111_way(app: Any) -> None:
    _url, _adapter, client = app
    gallery, info = client.predict(**raw_request(**{**COMMON, "lora": "glow", "lora_scale": 0.6}), api_name="/generate")
    with Image.open(Path(gallery[0]["image"])) as png:
        assert png.format == "PNG" and np.asarray(png).shape == (64, 64, 3)
        text = png.info["parameters"]
    first, *_rest, last = text.splitlines()
    assert first == "a red circle <lora:glow:0.6>"
    assert f'Lora hashes: "glow: {info["lora_hash"]}"' in last
