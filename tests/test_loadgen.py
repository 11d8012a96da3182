"""The light load generator (``bench.loadgen``): its reading of Gradio's queue protocol against
scripted streams, then against the real app on the null simulated device."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any, AsyncIterator, Iterator

import httpx
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


IMAGE = {"image": {"path": "/x/a-0.png", "url": "http://app/gradio_api/file=/x/a-0.png", "meta": {}}, "caption": ""}


def frames(*messages: dict[str, Any]) -> list[bytes]:
    return [f"data: {json.dumps(m)}\n\n".encode() for m in messages]


def scripted(stream: list[bytes], join_status: int = 200, join_body: Any = None) -> httpx.AsyncClient:
    """An AsyncClient whose server answers the join, then the session's stream, as given; each frame
    cut in two across chunks, as TCP may deliver it."""

    async def chunks() -> AsyncIterator[bytes]:
        for frame in stream:
            yield frame[: len(frame) // 2]
            yield frame[len(frame) // 2 :]

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/queue/join"):
            body = json.loads(request.content)
            assert set(body) == {"data", "event_data", "fn_index", "trigger_id", "session_hash"}
            return httpx.Response(join_status, json=join_body if join_body is not None else {"event_id": "e1"})
        assert request.url.path.endswith("/queue/data") and request.url.params["session_hash"] == "s1"
        return httpx.Response(200, content=chunks(), headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def outcome_of(stream: list[bytes], **kwargs: Any) -> loadgen.Outcome:
    async def go() -> loadgen.Outcome:
        async with scripted(stream, **kwargs) as http:
            return await loadgen.async_request(http, "http://app/", 2, 33, "s1", ["p"])

    return asyncio.run(go())


BEFORE = (
    {"msg": "estimation", "event_id": "e1", "rank": 0},
    {"msg": "process_starts", "event_id": "e1"},
    {"msg": "heartbeat"},
    {"msg": "progress", "event_id": "e1", "progress_data": []},
    {"msg": "process_generating", "event_id": "e1", "output": {"data": [[], {}]}, "success": True},
)
CLOSE = {"msg": "close_stream", "event_id": None}


def test_a_completed_event_with_an_image_is_a_success() -> None:
    done = {
        "msg": "process_completed",
        "event_id": "e1",
        "success": True,
        "output": {"data": [[IMAGE], {"status": "done"}]},
    }
    outcome = outcome_of(frames(*BEFORE, done, CLOSE))
    assert outcome.ok and outcome.image_urls == [IMAGE["image"]["url"]] and outcome.info == {"status": "done"}


@pytest.mark.parametrize(
    ("stream", "says"),
    [
        (
            frames(
                *BEFORE,
                {
                    "msg": "process_completed",
                    "event_id": "e1",
                    "success": False,
                    "output": {"error": "width must be a multiple of 8"},
                },
                CLOSE,
            ),
            "width must be",
        ),
        (
            frames(
                *BEFORE,
                {"msg": "process_completed", "event_id": "e1", "success": True, "output": {"data": [[], {}]}},
                CLOSE,
            ),
            "no image",
        ),
        (frames(*BEFORE, {"msg": "unexpected_error", "message": "Server stopped unexpectedly."}), "unexpected_error"),
        (frames(*BEFORE, CLOSE), "without process_completed"),
        (frames(*BEFORE), "without process_completed"),  # the stream simply ends
    ],
    ids=["server-error", "no-image", "unexpected-error", "closed-early", "cut-off"],
)
def test_anything_but_a_completed_event_with_an_image_is_an_error(stream: list[bytes], says: str) -> None:
    outcome = outcome_of(stream)
    assert not outcome.ok and says in str(outcome.error)


@pytest.mark.parametrize(
    ("status", "body", "says"),
    [
        (
            422,
            {
                "detail": [
                    {"__type__": "validate", "is_valid": True, "parameter_name": "prompt", "message": ""},
                    {"__type__": "validate", "is_valid": False, "parameter_name": "width", "message": "got 7"},
                ]
            },
            "join 422: width: got 7",
        ),
        (503, {"detail": "Queue is full"}, "join 503"),
    ],
)
def test_a_refused_join_is_an_error(status: int, body: Any, says: str) -> None:
    outcome = outcome_of([], join_status=status, join_body=body)
    assert not outcome.ok and says in str(outcome.error)


def mixed(k: int) -> list[Any]:
    """Every other request asks for a width validation rejects (7 px)."""
    return loadgen.generate_data(k, 7 if k % 2 else 128, 1)


@pytest.mark.server
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


@pytest.mark.server
@pytest.mark.parametrize("client", loadgen.CLIENTS)
def test_a_request_the_server_rejects_counts_as_an_error(url: str, client: str) -> None:
    """Refused at join (a validator's 422) or answered ``success: false``: an error either way."""
    result = loadgen.run(url, 2, client=client, n=6, size=128, steps=1, data=mixed)
    assert (result.count, result.errors) == (3, 3), result.error_messages
    assert all("width" in message for message in result.error_messages)
    assert result.latency_ms["n"] == 3  # latencies of the successes only
    assert result.images_per_second > 0


@pytest.mark.server
def test_a_duration_run_stops_and_the_summary_is_plain_data(url: str) -> None:
    result = loadgen.run(url, 2, client="async", seconds=0.5, size=128, steps=1)
    assert result.count >= 2 and result.errors == 0
    summary = result.summary()
    assert "outcomes" not in summary and json.loads(json.dumps(summary))["count"] == result.count
    with pytest.raises(ValueError, match="n or seconds"):
        loadgen.run(url, 1)


def test_a_window_stops_at_n_or_the_deadline_and_never_before_its_floor() -> None:
    assert loadgen.Window(2, None, None).more(1) and not loadgen.Window(2, None, None).more(2)
    assert loadgen.Window(2, None, 60).more(500)  # past n, inside the floor: still sending
    assert not loadgen.Window(2, None, 0).more(2)  # past n and past the floor
    assert not loadgen.Window(None, 0, 60).more(0)  # the deadline ends it, floor or not
    assert loadgen.Window(None, 60, None).more(10**6)
