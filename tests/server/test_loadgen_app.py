"""The light load generator (``bench.loadgen``) against the real app on the null simulated device (its
reading of Gradio's queue protocol, against scripted streams, is in ``tests/unit/test_loadgen.py``)."""

from __future__ import annotations

import io
import json
from typing import Any, Iterator

import pytest

from bench import loadgen
from tests.helpers import app_process

NULL_128 = "sim:cpu_ms=0,dev_ms=0,decode_ms=0,size=128,steps=1"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The load generator stands in for many users from one address: the per-address limits are lifted.
    lifted = ("--rate-limit", "1000", "--max-sessions-per-user", "1000", "--max-connections-per-address", "1000")
    with app_process(tmp_path_factory.mktemp("loadgen"), "--model", NULL_128, "--max-batch-size", "1", *lifted) as (
        url,
        _,
        _,
    ):
        yield url


def mixed(k: int) -> list[Any]:
    """Every other request asks for a width validation rejects (7 px)."""
    return loadgen.generate_data(k, 7 if k % 2 else 128, 1)


def test_four_async_callers_get_a_real_png_for_every_request(url: str) -> None:
    from PIL import Image

    result = loadgen.run(url, 4, client="async", n=12, size=128, steps=1, fetch=True, keep_images=True)
    assert (result.count, result.errors) == (12, 0), result.error_messages
    assert len(result.outcomes) == 12 and result.images_per_second > 0
    assert result.latency_ms["p50"] <= result.latency_ms["p99"]
    assert result.client_cpu_seconds > 0 and result.client_cpu_ms_per_request > 0
    for outcome in result.outcomes:
        assert outcome.ok and len(outcome.image_urls) == 1 and len(outcome.images) == 1
        assert outcome.info is not None and outcome.info["status"] == "done"
        image = Image.open(io.BytesIO(outcome.images[0]))
        image.load()
        assert (image.format, image.size) == ("PNG", (128, 128))
    assert len({o.info["request_id"] for o in result.outcomes}) == 12  # twelve requests, not one repeated


@pytest.mark.parametrize("client", loadgen.CLIENTS)
def test_a_request_the_server_rejects_counts_as_an_error(url: str, client: str) -> None:
    """Refused at join (a validator's 422) or answered ``success: false``: an error either way."""
    result = loadgen.run(url, 2, client=client, n=6, size=128, steps=1, data=mixed)
    assert (result.count, result.errors) == (3, 3), result.error_messages
    assert all("width" in message for message in result.error_messages)
    assert result.latency_ms["n"] == 3  # latencies of the successes only
    assert result.images_per_second > 0


def test_a_duration_run_stops_and_the_summary_is_plain_data(url: str) -> None:
    result = loadgen.run(url, 2, client="async", seconds=0.5, size=128, steps=1)
    assert result.count >= 2 and result.errors == 0
    summary = result.summary()
    assert "outcomes" not in summary and json.loads(json.dumps(summary))["count"] == result.count
    with pytest.raises(ValueError, match="n or seconds"):
        loadgen.run(url, 1)
