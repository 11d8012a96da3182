"""The front door as an ASGI middleware over a stand-in app: what it answers itself, and what it logs."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr
import pytest

from pipeline.web.door.frontdoor import DoorConfig, DoorLimits, FrontDoor
from pipeline.web.door.identity import TrustedProxies
from pipeline.web.door.inputs import InputPolicy


def door(app: Any) -> FrontDoor:
    with gr.Blocks() as demo:
        text = gr.Textbox()
        gr.Button().click(fn=lambda t: t, inputs=[text], outputs=[text])
    return FrontDoor(app, DoorConfig(InputPolicy(demo), TrustedProxies.parse("none"), DoorLimits()))


async def call(app: Any, method: str, path: str, body: bytes = b"") -> list[dict[str, Any]]:
    scope = {"type": "http", "method": method, "path": path, "headers": [], "client": ("198.51.100.9", 5000)}
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


@pytest.mark.anyio
async def test_a_fault_below_the_door_is_a_500_and_one_log_line_without_the_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    caplog.set_level(logging.INFO, logger="pipeline.web.door.frontdoor")
    sent = await call(door(broken), "GET", "/gradio_api/info")
    assert sent[0]["status"] == 500 and b"Internal error." in sent[1]["body"]
    lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1 and lines[0].exc_info is None and "RecursionError" in lines[0].getMessage()


@pytest.mark.anyio
async def test_deep_json_is_refused_before_any_parser_and_never_reaches_the_app() -> None:
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    for path in ("/gradio_api/queue/join", "/gradio_api/cancel", "/gradio_api/call/generate"):
        sent = await call(door(app), "POST", path, b"[" * 200_000)
        assert sent[0]["status"] == 400 and b"deeper than 64" in sent[1]["body"], path
    assert reached == []
