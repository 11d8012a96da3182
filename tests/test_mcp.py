"""Gradio's MCP server (``--mcp``): /generate is a tool with a description and typed parameters."""

from __future__ import annotations

import base64
import contextlib
import io
import json
from typing import Any, Iterator

import pytest
from PIL import Image

from tests.helpers import running_app

pytest.importorskip("mcp")

pytestmark = [pytest.mark.anyio, pytest.mark.server]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_app(tmp_path_factory.mktemp("mcp"), "--mcp") as (url, _demo, _adapter):
        yield url


async def _session(url: str, work: Any) -> Any:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url + "gradio_api/mcp/") as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)


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


@pytest.mark.parametrize("with_progress", [False, True], ids=["plain-call", "with-progress-token"])
async def test_the_tool_returns_the_pictures_and_the_info_as_json(url: str, with_progress: bool) -> None:
    # Gradio answers a call with a progress token and one without on two different paths; both.
    args = {"prompt": "a red circle on a blue background", "negative_prompt": "", "seed": 3, "randomize_seed": False,
            "width": 64, "height": 96, "num_inference_steps": 4, "guidance_scale": 4.0, "num_images": 2,
            "live_preview": False}  # 64 x 96, not square: a swapped width and height fails

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
