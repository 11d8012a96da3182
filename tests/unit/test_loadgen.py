"""The light load generator (``bench.loadgen``): its reading of Gradio's queue protocol against scripted
streams (its runs against the real app are in ``tests/server/test_loadgen_app.py``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import httpx
import pytest

from bench import loadgen

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


def test_a_window_stops_at_n_or_the_deadline_and_never_before_its_floor() -> None:
    assert loadgen.Window(2, None, None).more(1) and not loadgen.Window(2, None, None).more(2)
    assert loadgen.Window(2, None, 60).more(500)  # past n, inside the floor: still sending
    assert not loadgen.Window(2, None, 0).more(2)  # past n and past the floor
    assert not loadgen.Window(None, 0, 60).more(0)  # the deadline ends it, floor or not
    assert loadgen.Window(None, 60, None).more(10**6)
