"""Gradio's MCP server (``--mcp``): /generate is a tool with a description and typed parameters."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
from typing import Any

import pytest
from PIL import Image

from tests.fakes import FakeModel
from tests.helpers import MCP_TOOL_ARGS, mcp_session, running_app

pytest.importorskip("mcp")

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def url(launch: Any) -> str:
    return str(launch("--mcp", name="mcp")[0])


async def _session(url: str, work: Any) -> Any:
    return await mcp_session(url, work)


def _summary(content: list[Any]) -> list[str]:
    """The blocks of a tool result for an assertion message: images by type and size, texts cut short."""
    return [
        f"image {c.mimeType}, {len(c.data)} base64 chars" if c.type == "image" else f"text: {c.text[:300]}"
        for c in content
    ]


async def test_generate_is_listed_as_a_described_typed_tool(url: str) -> None:
    tools = (await _session(url, lambda s: s.list_tools())).tools
    by_name = {t.name: t for t in tools}
    assert [n for n in by_name if "generate" in n] == ["generate"], list(by_name)  # the UI's event stays private
    tool = by_name["generate"]
    assert "Generate images from a text prompt" in (tool.description or "")
    props = tool.inputSchema["properties"]
    assert props["prompt"]["type"] == "string" and "What to draw" in props["prompt"].get("description", "")
    assert props["num_inference_steps"]["type"] in ("number", "integer")
    assert props["randomize_seed"]["type"] == "boolean"
    # issue 52: the model to draw with, by name (several models; "default": the server's first)
    assert props["model"]["type"] == "string" and "/health" in props["model"].get("description", "")


@pytest.mark.parametrize("with_progress", [False, True], ids=["plain-call", "with-progress-token"])
async def test_the_tool_returns_the_pictures_and_the_info_as_json(url: str, with_progress: bool) -> None:
    # Gradio answers a call with a progress token and one without on two different paths; both.
    args = {
        "prompt": "a red circle on a blue background",
        "negative_prompt": "",
        "seed": 3,
        "randomize_seed": False,
        "width": 64,
        "height": 96,
        "num_inference_steps": 4,
        "guidance_scale": 4.0,
        "num_images": 2,
        "live_preview": False,
    }  # 64 x 96, not square: a swapped width and height fails

    async def progress(*_: Any) -> None:
        pass

    result = await _session(
        url, lambda s: s.call_tool("generate", args, progress_callback=progress if with_progress else None)
    )
    shown = _summary(result.content)
    assert not result.isError, shown
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 2, shown
    for block in images:
        assert block.mimeType == "image/png"
        picture = Image.open(io.BytesIO(base64.b64decode(block.data)))
        assert picture.format == "PNG" and picture.size == (64, 96)
    records = []
    for block in result.content:
        if block.type == "text":
            with contextlib.suppress(ValueError):
                records.append(json.loads(block.text))
    assert len(records) == 1, shown  # the info record, as JSON (not a Python repr)
    info = records[0]
    assert info["status"] == "done" and info["seeds"] == [3, 4], info
    assert (info["width"], info["height"], info["num_images"]) == (64, 96, 2), info


async def test_an_image_mode_takes_its_picture_as_data_and_refuses_a_url(url: str) -> None:
    """The tool's image is passed as data (a ``data:`` URI: Gradio keeps it as a file and its client uploads
    it through the app's upload route as the caller's own); a URL value is refused by name, never fetched."""
    picture = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(picture, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode()
    args = {"prompt": "a red circle", "seed": 2, "randomize_seed": False, "width": 64, "height": 64,
            "num_inference_steps": 4, "guidance_scale": 4.0, "num_images": 1, "live_preview": False,
            "mode": "image", "image": uri, "strength": 0.5}  # fmt: skip
    result = await _session(url, lambda s: s.call_tool("generate", args))
    shown = _summary(result.content)
    assert not result.isError, shown
    assert [c.type for c in result.content].count("image") == 1, shown
    info = next(json.loads(c.text) for c in result.content if c.type == "text" and c.text.startswith("{"))
    assert info["mode"] == "image" and info["steps_done"] == 2, info
    result = await _session(url, lambda s: s.call_tool("generate", {**args, "image": "https://198.51.100.9/x.png"}))
    shown = _summary(result.content)
    assert result.isError and "image" in " ".join(shown), shown


async def test_a_control_map_goes_as_data_and_the_shape_is_drawn_where_it_says(url: str) -> None:
    """Issue 51 through MCP: ``control`` and ``control_image`` (a ``data:`` URI, as the tool's image is) are
    tool arguments; the embedded model draws the circle on the side its disc is."""
    from PIL import ImageDraw

    from pipeline.default_model.control import centre_of

    seen = []
    for cx in (0.25, 0.75):
        disc = Image.new("RGB", (64, 64), "black")
        ImageDraw.Draw(disc).ellipse([cx * 64 - 11, 21, cx * 64 + 11, 43], fill="white")
        data = io.BytesIO()
        disc.save(data, format="PNG")
        args = {"prompt": "a red circle on a blue background", "seed": 1, "randomize_seed": False, "width": 64,
                "height": 64, "num_inference_steps": 16, "guidance_scale": 4.0, "num_images": 1,
                "live_preview": False, "control": "shapes",
                "control_image": "data:image/png;base64," + base64.b64encode(data.getvalue()).decode()}  # fmt: skip
        result = await _session(url, lambda s, a=args: s.call_tool("generate", a))
        shown = _summary(result.content)
        assert not result.isError, shown
        info = next(json.loads(c.text) for c in result.content if c.type == "text" and c.text.startswith("{"))
        assert info["control"] == "shapes", info
        block = next(c for c in result.content if c.type == "image")
        found = centre_of(Image.open(io.BytesIO(base64.b64decode(block.data))).convert("RGB"))
        assert found is not None, shown
        seen.append(found[0])
    assert seen[0] < 0.5 < seen[1], seen


# -- under --auth, with forged headers, and a caller that goes away (issue 26) ---------------------------------


def _client(address: str = "127.0.0.1", **headers: str) -> Any:
    import httpx

    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address), headers=headers, timeout=60)


async def _session_with(url: str, http: Any, work: Any) -> Any:
    return await mcp_session(url, work, http)


TOOL_ARGS = MCP_TOOL_ARGS


async def test_under_auth_mcp_needs_the_login_and_works_with_basic_or_bearer(tmp_path: Any) -> None:
    import httpx

    with running_app(tmp_path, "--mcp", "--auth", "u:p", load=lambda: FakeModel()) as (url, _demo, _adapter):
        async with httpx.AsyncClient() as anonymous:
            listed = await anonymous.post(
                url + "gradio_api/mcp/",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"accept": "application/json, text/event-stream"},
            )
        assert listed.status_code == 401 and "Basic" in listed.headers["www-authenticate"]
        basic = "Basic " + base64.b64encode(b"u:p").decode()
        tools = await _session_with(url, _client(authorization=basic), lambda s: s.list_tools())
        assert "generate" in [t.name for t in tools.tools]
        result = await _session_with(
            url, _client(authorization="Bearer u:p"), lambda s: s.call_tool("generate", TOOL_ARGS)
        )
        assert not result.isError, _summary(result.content)
        assert [c.type for c in result.content].count("image") == 1
        wrong = _client(authorization="Bearer u:wrong")
        with pytest.raises(Exception):  # noqa: B017 -- the mcp client's own error for a 401
            await _session_with(url, wrong, lambda s: s.list_tools())


async def test_an_mcp_caller_is_who_it_connects_from_not_what_its_headers_say(tmp_path: Any) -> None:
    from tests.helpers import wait_for

    model = FakeModel(hold=True)
    args = ("--mcp", "--max-waiting-per-user", "1", "--concurrency", "6", "--max-batch-size", "1")
    with running_app(tmp_path, *args, load=lambda: model) as (url, _demo, adapter):
        running = asyncio.create_task(
            _session_with(url, _client("127.0.0.2"), lambda s: s.call_tool("generate", TOOL_ARGS))
        )
        await asyncio.to_thread(wait_for, lambda: model.active == 1, "the first call runs")
        waiting = asyncio.create_task(
            _session_with(url, _client("127.0.0.2"), lambda s: s.call_tool("generate", TOOL_ARGS))
        )
        await asyncio.to_thread(wait_for, lambda: adapter.gpu_queue_depth == 1, "the second call waits")
        forged = _client("127.0.0.2", **{"x-forwarded-for": "198.51.100.1", "x-t2i-caller": "198.51.100.2|x|y"})
        refused = await _session_with(url, forged, lambda s: s.call_tool("generate", TOOL_ARGS))
        assert refused.isError and "You already have 1 request waiting" in str(_summary(refused.content))
        for _ in range(4):
            model.release.release()
        assert not (await running).isError and not (await waiting).isError


async def test_an_mcp_caller_that_disconnects_stops_its_job(tmp_path: Any) -> None:
    import threading

    from tests.helpers import wait_for

    steps = threading.Semaphore(0)
    model = FakeModel(step_gate=steps)
    with running_app(tmp_path, "--mcp", load=lambda: model) as (url, _demo, adapter):
        call = asyncio.create_task(
            _session_with(url, _client(), lambda s: s.call_tool("generate", {**TOOL_ARGS, "num_inference_steps": 40}))
        )
        steps.release(2)
        await asyncio.to_thread(wait_for, lambda: sum(model.steps_run.values()) >= 2, "two steps ran")
        call.cancel()  # the caller goes away: its connection closes
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.to_thread(
            wait_for, lambda: any(stop.is_set() for stop in model.stops.values()), "the model is told to stop", 20
        )
        steps.release(40)
        await asyncio.to_thread(wait_for, lambda: adapter.in_flight == 0, "the job ended")
        assert sum(model.steps_run.values()) <= 4, model.steps_run  # stopped within a step or two, not all 40
