"""Gradio's MCP server (``--mcp``): /generate is a tool with a description and typed parameters."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

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


async def test_the_tool_generates(url: str) -> None:
    args = {"prompt": "a red circle on a blue background", "negative_prompt": "", "seed": 3, "randomize_seed": False,
            "width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 4.0, "num_images": 1,
            "live_preview": False}
    result = await _session(url, lambda s: s.call_tool("generate", args))
    assert not result.isError, result.content
    texts = " ".join(getattr(c, "text", "") for c in result.content)
    kinds = {c.type for c in result.content}
    assert "image" in kinds or ".png" in texts, result.content
    assert '"seeds": [3]' in texts or "'seeds': [3]" in texts or json.dumps([3]) in texts, texts[:2000]
