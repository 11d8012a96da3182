"""The generate events are registered with ``postprocess=False`` and the handler postprocesses its own
yields (``outputs.Postprocess``): callers must get exactly what Gradio's own postprocess step sends.

A launched Gradio app with two events over the same output components, one with Gradio's step and
one with ours, each yielding the handler's three kinds of output (waiting, a live preview, the
images); every message of each is read from the queue's event stream and compared.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, AsyncGenerator, Iterator

import gradio as gr
import httpx
from PIL import Image

import app  # noqa: F401  (its Gradio settings: no analytics summary after each event)
from bench.loadgen import sse_messages
from pipeline.web.page.outputs import Postprocess
from pipeline.web.page.shown import gallery_items, status_html
from tests.helpers import free_port


def script(picture: Path) -> list[tuple[Any, ...]]:
    info = {"status": "done", "seeds": [7, 8], "durations_ms": {"total": 40.0}, "warnings": []}
    return [
        (None, {"status": "waiting", "ahead": 2, "eta_seconds": None}, status_html("waiting for the GPU: 2 ahead")),
        (
            [Image.new("RGB", (16, 16), (200, 30, 30))],
            {"status": "running", "step": 2, "total": 4},
            status_html("step 2/4", 2, 4),
        ),
        (gallery_items([picture, picture], info), info, status_html("done in 0.04 s")),
    ]


@contextlib.contextmanager
def two_events(tmp: Path) -> Iterator[tuple[str, dict[str, int]]]:
    picture = tmp / "picture.png"
    Image.new("RGB", (32, 32), (10, 120, 200)).save(picture)
    with gr.Blocks() as demo:
        gallery, info, status = gr.Gallery(), gr.JSON(), gr.HTML()
        outputs = [gallery, info, status]
        ours = Postprocess(outputs)

        async def gradios() -> AsyncGenerator[tuple[Any, ...], None]:
            for out in script(picture):
                yield out

        async def handlers() -> AsyncGenerator[tuple[Any, ...], None]:
            for out in script(picture):
                yield await ours(out)

        gr.Button().click(gradios, None, outputs, api_name="gradios")
        gr.Button().click(handlers, None, outputs, api_name="handlers", postprocess=False)
    port = free_port()
    demo.queue().launch(
        server_port=port, prevent_thread_lock=True, quiet=True, ssr_mode=False, allowed_paths=[str(tmp)]
    )
    try:
        config = httpx.get(f"http://127.0.0.1:{port}/config").json()
        ids = {d["api_name"]: int(d["id"]) for d in config["dependencies"] if d.get("api_name")}
        yield f"http://127.0.0.1:{port}/", ids
    finally:
        demo.close()


async def outputs_of(url: str, fn_index: int, session: str) -> list[Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        body = {"data": [], "event_data": None, "fn_index": fn_index, "trigger_id": None, "session_hash": session}
        joined = await http.post(url + "gradio_api/queue/join", json=body)
        assert joined.status_code == 200, joined.text
        out = []
        async with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}) as stream:
            async for message in sse_messages(stream):
                if message.get("msg") in ("process_generating", "process_completed"):
                    assert message.get("success", True), message
                    out.append(message["output"]["data"])
                if message.get("msg") == "close_stream":
                    break
    return out


def test_the_handlers_postprocess_sends_what_gradios_step_sends(tmp_path: Path) -> None:
    with two_events(tmp_path) as (url, ids):
        gradios = asyncio.run(outputs_of(url, ids["gradios"], "s1"))
        handlers = asyncio.run(outputs_of(url, ids["handlers"], "s2"))
    assert len(gradios) == 4  # three yields and the completion
    assert handlers == gradios
    done = handlers[-1]
    assert [item["caption"] for item in done[0]] == ["seed 7 · 0.02 s", "seed 8 · 0.02 s"]
    assert all(item["image"]["url"].endswith("picture.png") for item in done[0])
    op, where, preview = handlers[1][0][0]  # a diff against the waiting output: the preview added
    assert (op, where) == ("add", [0]) and preview["image"]["url"].endswith(".webp")  # saved as Gradio saves it


def test_a_picture_is_postprocessed_off_the_loop_and_the_rest_on_it() -> None:
    """Saving a preview is a PNG encode: never on the event loop. Paths and records are microseconds."""
    import threading

    seen: list[str] = []

    class Recording(gr.JSON):
        def postprocess(self, value: Any) -> Any:
            seen.append(threading.current_thread().name)
            return super().postprocess(value)

    with gr.Blocks():
        ours = Postprocess([gr.Gallery(), Recording()])
    seen.clear()  # the component postprocesses its initial value when it is built

    async def both() -> None:
        await ours((None, {"a": 1}))
        await ours(([Image.new("RGB", (4, 4))], {"a": 2}))

    asyncio.run(both())
    assert len(seen) == 2 and seen[0] == threading.main_thread().name != seen[1], seen
