"""A ``ModularPipeline`` served end to end (issue 52 §5): the launched app with ``--model`` the tiny FLUX.1-dev
build saved as a modular pipeline folder (``tests/families.built_modular``), answered by the real
``gradio_client``: served as FLUX.1's classic pipeline over its components (its family's loop), ``/generate``
returns its pictures and the record."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from PIL import Image

from tests.families import built_modular
from tests.helpers import raw_request

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def served(launch: Any) -> tuple[str, Any]:
    url, _demo, adapter = launch("--model", str(built_modular("flux-dev")), name="modular")
    return str(url), adapter


@pytest.fixture(scope="module")
def url(served: tuple[str, Any]) -> str:
    return served[0]


def test_a_modular_pipeline_is_served_end_to_end(client: Any, served: tuple[str, Any]) -> None:
    url, adapter = served
    assert adapter.profile.pipeline_class == "FluxPipeline" and adapter.step_joining
    assert httpx.get(url + "health", timeout=10).json()["status"] == "ok"
    gallery, info = client.predict(**raw_request(prompt="a red circle", seed=4, width=64, height=64,
                                                 num_inference_steps=3, guidance_scale=3.5, num_images=2),
                                   api_name="/generate")  # fmt: skip
    assert info["status"] == "done" and info["steps_done"] == 3 and len(gallery) == 2, info
    with Image.open(gallery[0]["image"]) as png:
        assert png.size == (64, 64) and "parameters" in png.info
