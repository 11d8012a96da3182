"""Gradio's own floor for one request: the app's API shape with no model and no serving layer.

    python -m bench.floor --port P [--postprocess]

A Blocks app with ``/generate``'s eleven inputs and two outputs (a gallery and a JSON record), the
queue set up as the app sets it (``concurrency_limit`` 64, ``max_size`` 256) and Gradio's analytics
off as ``app.py`` turns them off. Its handler encodes one 512 px simulated picture with the app's
own PNG writer (``pipeline.serving.postprocess.encode_png``) into Gradio's cache on a two-thread pool, and yields it
once, postprocessed as the app's handler postprocesses (``outputs.Postprocess``: the event has
``postprocess=False``; ``--postprocess`` leaves it to Gradio). What a request costs here is what
Gradio and the PNG cost; what the app costs over it is its serving layer and its model side
(``bench.cpu``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncGenerator

import gradio as gr

import app  # noqa: F401  (its Gradio settings, set before Gradio builds a queue)
from bench.servers import serve_forever
from pipeline import allocator
from pipeline.engine.model.simulated import picture
from pipeline.serving.postprocess import encode_png
from pipeline.web.page.outputs import Postprocess

KEEP = 512  # files kept: a few seconds of requests, long past each one's answer


def build(out_dir: Path, postprocess: bool) -> gr.Blocks:
    image = picture(512, 1)
    texts = (("parameters", "a red circle\nSteps: 1, Seed: 1"), ("generation", '{"seed": 1}'))
    pool = ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="floor-encode")
    out_dir.mkdir(parents=True, exist_ok=True)

    written: collections.deque[Path] = collections.deque()
    lock = threading.Lock()

    def write() -> str:
        """A new file per request, as the app writes; the oldest beyond KEEP deleted (no sweeper here)."""
        path = out_dir / f"{uuid.uuid4().hex[:12]}-0.png"
        path.write_bytes(encode_png(image, texts))
        with lock:
            written.append(path)
            old = written.popleft() if len(written) > KEEP else None
        if old is not None:
            old.unlink(missing_ok=True)
        return str(path)

    with gr.Blocks() as demo:
        inputs = [
            gr.Textbox(),
            gr.Textbox(),
            gr.Number(),
            gr.Checkbox(),
            gr.Number(),
            gr.Number(),
            gr.Number(),
            gr.Number(),
            gr.Number(),
            gr.Checkbox(),
            gr.Textbox(),
        ]
        outputs = [gr.Gallery(), gr.JSON()]
        ours = Postprocess(outputs)

        async def generate(*values: Any) -> AsyncGenerator[tuple[Any, ...], None]:
            path = await asyncio.get_running_loop().run_in_executor(pool, write)
            out = ([(path, "seed 1")], {"status": "done", "seeds": [1], "prompt": values[0]})
            yield out if postprocess else await ours(out)

        gr.Button().click(
            generate,
            inputs,
            outputs,
            api_name="generate",
            concurrency_limit=64,
            preprocess=False,
            postprocess=postprocess,
        )
    demo.queue(max_size=256, default_concurrency_limit=64)
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--postprocess", action="store_true", help="Gradio's own postprocess step")
    args = parser.parse_args(argv)
    allocator.tune()
    cache = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(os.environ.get("TMPDIR", "/tmp")) / "gradio")
    demo = build(cache / "floor", args.postprocess)
    demo.launch(server_name="127.0.0.1", server_port=args.port, prevent_thread_lock=True, quiet=True, ssr_mode=False)
    serve_forever()


if __name__ == "__main__":
    main()
