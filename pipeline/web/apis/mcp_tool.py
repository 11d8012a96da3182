"""The MCP tool's result (``--mcp``): the pictures as image content, the info record as JSON text.

Gradio 6.31's MCP server turns an event's outputs into MCP content in
``GradioMCPServer.postprocess_output_data`` (``gradio/mcp.py``), one top-level output at a time: an
image file (a FileData dict) becomes an ``ImageContent`` (base64, re-encoded by PIL, ``image/png``
for a PNG) followed by an "Image URL: ..." text; anything else becomes ``TextContent(str(value))``.
For ``/generate`` (outputs: gallery, info) that gives no picture at all:

- a gallery is a list of ``{"image": FileData, "caption": ...}``, not a file: its Python repr;
- the info dict: its Python repr, not JSON;
- and a call without a progress token (the ``mcp`` client's default) goes through
  ``_execute_tool_without_progress``, which returns ``[job.result()]``: for an event with two
  outputs that is one tuple, so both outputs end up in one text block. (With a progress token it
  returns the outputs as a list.) Any multi-output event is hit, so a separate MCP-only event with
  ``gr.Image`` outputs would not help either.

So, for the Blocks that opt in, the data is reshaped before Gradio's own conversion runs: the
tuple unpacked, each gallery image as a top-level file, the info dict as a JSON string. Gradio then
makes each image an image block (plus its URL, for clients that cannot show images) and passes the
JSON through as text. The ``/generate`` event, its two outputs and the queue (its concurrency limit,
``max_size``, cancel on disconnect) are untouched; only the MCP server's rendering of the result
changes. ``tests/server/test_mcp.py`` checks the result through the real MCP client, on both paths.
"""

from __future__ import annotations

import inspect
import json
import weakref
from typing import Any, Callable

import gradio as gr

_opted_in: weakref.WeakSet[gr.Blocks] = weakref.WeakSet()
_WRAPPED = "_t2i_mcp_images"  # marks our wrapper, so installing twice wraps once


def is_gallery(value: Any) -> bool:
    """A gallery's value as Gradio's client returns it: a list of ``{"image": FileData, ...}``."""
    from gradio_client.utils import is_file_obj_with_meta

    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(item, dict) and is_file_obj_with_meta(item.get("image")) for item in value)
    )


def mcp_outputs(data: list[Any]) -> list[Any]:
    """The outputs reshaped for Gradio's per-output conversion: one file per image, dicts as JSON."""
    from gradio_client.utils import is_file_obj_with_meta

    if len(data) == 1 and isinstance(data[0], tuple):  # [job.result()] of a multi-output event
        data = list(data[0])
    outputs: list[Any] = []
    for value in data:
        if is_gallery(value):
            outputs.extend(item["image"] for item in value)
        elif isinstance(value, dict) and not is_file_obj_with_meta(value):
            outputs.append(json.dumps(value))
        else:
            outputs.append(value)
    return outputs


def serve_images(demo: gr.Blocks) -> None:
    """Make the MCP tools of ``demo`` answer with image content and JSON text (see the module doc).

    Wraps ``GradioMCPServer.postprocess_output_data`` once per process; the wrapper reshapes only
    for the Blocks passed here and calls Gradio's own conversion for every Blocks. Raises at build
    time, not at the first call, if the installed Gradio no longer has that method.
    """
    from gradio.mcp import GradioMCPServer

    original: Callable[..., Any] | None = GradioMCPServer.__dict__.get("postprocess_output_data")
    if original is None or list(inspect.signature(original).parameters) != ["self", "data", "root_url"]:
        raise RuntimeError("gradio.mcp.GradioMCPServer.postprocess_output_data(self, data, root_url) not found")
    if not getattr(original, _WRAPPED, False):
        gradio_postprocess = original

        def postprocess_output_data(self: Any, data: Any, root_url: str) -> Any:
            if self.blocks in _opted_in and isinstance(data, list):
                data = mcp_outputs(data)
            return gradio_postprocess(self, data, root_url)

        setattr(postprocess_output_data, _WRAPPED, True)
        server_class: Any = GradioMCPServer  # Any: mypy forbids assigning to a method
        server_class.postprocess_output_data = postprocess_output_data
    _opted_in.add(demo)


def call_back_as_internal(secret: str) -> None:
    """Make Gradio's MCP server call the app back as the front door's internal client.

    A tool call runs through a ``gradio_client.Client`` that Gradio's MCP server makes for the app's
    own URL (``gradio.mcp.Client``, loopback); it sends the MCP caller's headers with the join, but
    its own requests (the config, the result stream) carry no login, so under ``--auth`` every call
    failed. With ``frontdoor.INTERNAL_HEADER`` (a secret of this process) on all its requests, the
    front door lets that client in as itself; the join still carries the caller's login and the
    front door's seal of who the caller is. Installed once per process; the latest secret wins.
    """
    import gradio.mcp

    from ..door.frontdoor import INTERNAL_HEADER

    current = gradio.mcp.Client
    original = getattr(current, "_t2i_original", current)

    def client(*args: Any, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        return original(*args, headers={**(headers or {}), INTERNAL_HEADER: secret}, **kwargs)

    client._t2i_original = original  # type: ignore[attr-defined]
    gradio.mcp.Client = client
