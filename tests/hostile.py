"""What the hostile-client tests share: clients from their own loopback address, raw joins, noisy pictures."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import httpx
from PIL import Image

from tests.fakes import FakeModel
from tests.helpers import TEXT_MODE, raw_request


def peer(address: str, **kwargs: Any) -> httpx.Client:
    """A raw HTTP client whose connections come from ``address`` (a loopback alias)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), **{"timeout": 30, **kwargs})


def fn_index(demo: Any, api_name: str) -> int:
    return next(i for i, fn in demo.fns.items() if fn.api_name == api_name)


def join(
    http: httpx.Client, url: str, fn: int, data: list[Any], session: str | None = None, **extra: Any
) -> httpx.Response:
    body = {"data": data, "fn_index": fn, "session_hash": session or uuid.uuid4().hex[:11], **extra}
    return post_json(http, url + "gradio_api/queue/join", body)


def post_json(http: httpx.Client, url: str, body: Any) -> httpx.Response:
    """POST ``body`` as JSON with every non-ASCII character escaped, as a client may (a lone surrogate too)."""
    return http.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


def generate_data(**overrides: Any) -> list[Any]:
    raw = raw_request(**overrides)
    return [
        raw.get(k, v)
        for k, v in [
            ("prompt", ""),
            ("negative_prompt", ""),
            ("seed", 0),
            ("randomize_seed", False),
            ("width", 64),
            ("height", 64),
            ("num_inference_steps", 2),
            ("guidance_scale", 7.5),
            ("num_images", 1),
            ("live_preview", False),
            ("scheduler", "default"),
            ("lora", "none"),
            ("lora_scale", 1.0),
            *TEXT_MODE.items(),  # the picture fields: a text-to-image request's
        ]
    ]


class NoisyModel(FakeModel):
    """Pictures of noise: PNGs of their full size (about 200 KB at 256 px), so the disk budget bites."""

    def image(self, job: Any, seed: int) -> Image.Image:
        return Image.frombytes("RGB", (job.width, job.height), os.urandom(job.width * job.height * 3))
