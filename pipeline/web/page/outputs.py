"""What Gradio does on every call of the generate events, done once or by the handler.

``Postprocess``: the events' outputs, postprocessed by the handler itself (the events have
``postprocess=False``). ``introspected_once``: the handlers' signatures and type hints, resolved
when they are built.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import typing
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from PIL import Image

from ...protocol import EncodedPreview
from ..door.routes import RECENT_PREVIEWS


class Postprocess:
    """The event's outputs postprocessed by the handler itself: register the event with ``postprocess=False``.

    Gradio 6.31 postprocesses each output of each yield in a worker thread (``anyio.to_thread``)
    and then walks the value twice for files (once for the session's copy of the component's
    value, once for the message), each time resolving every file path against its static paths.
    For a request that yields once, that was two thread hops and four file walks. Here each
    component's own ``postprocess`` runs on the loop when the values hold no picture to encode
    (paths, records, text: tens of microseconds), and in a worker thread when they do (a live
    preview: its JPEG bytes, encoded by the model side, are written into Gradio's cache as they
    are, ``cached_preview``; a picture would be saved as a PNG); Gradio then walks each value once.
    ``tests/server/test_postprocess_outputs.py`` checks that callers get the messages Gradio's own step sends.
    """

    def __init__(self, components: Sequence[Any]) -> None:
        self.components = tuple(components)

    def now(self, values: Sequence[Any]) -> tuple[Any, ...]:
        # Gradio's data models as they are, as its own step hands them on (its diff of two
        # messages replaces a model whole, where it would diff two dicts key by key)
        # an update (``gr.skip()``: this output stays as it is) goes as it is; Gradio applies it
        return tuple(
            v if _is_update(v) else c.postprocess(_files_of(v, c.GRADIO_CACHE))
            for c, v in zip(self.components, values, strict=True)
        )

    async def __call__(self, values: Sequence[Any]) -> tuple[Any, ...]:
        if any(_holds_picture(v) for v in values):
            return await asyncio.to_thread(self.now, values)
        return self.now(values)


def cached_preview(preview: EncodedPreview, cache_dir: str) -> str:
    """The preview's JPEG bytes written as they are into Gradio's cache, where Gradio keeps a
    file it is handed (``Block.move_resource_to_block_cache``: no copy, no re-encode), in a folder
    named by their hash as Gradio names its own copies; and kept in ``RECENT_PREVIEWS``. Returns the path."""
    folder = Path(cache_dir) / hashlib.sha256(preview.data).hexdigest()[:40]
    path = folder / "preview.jpg"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / f".preview.{uuid.uuid4().hex}.jpg"
        staging.write_bytes(preview.data)
        os.replace(staging, path)  # never a partly written file under the served name
    from gradio.utils import abspath

    RECENT_PREVIEWS.put(str(abspath(path)), preview.data)  # the path Gradio's URL names (file=...)
    return str(path)


def _is_update(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def _files_of(value: Any, cache_dir: str) -> Any:
    """``value`` with each encoded preview as its file in the cache (a gallery's list of them)."""
    if isinstance(value, EncodedPreview):
        return cached_preview(value, cache_dir)
    if isinstance(value, list) and any(isinstance(v, EncodedPreview) for v in value):
        return [_files_of(v, cache_dir) for v in value]
    return value


def _holds_picture(value: Any) -> bool:
    return isinstance(value, (Image.Image, EncodedPreview)) or (
        isinstance(value, (list, tuple)) and any(_holds_picture(v) for v in value)
    )


F = TypeVar("F", bound=Callable[..., Any])


def introspected_once(fn: F) -> F:
    """``fn`` with its signature and resolved annotations attached, as Python's own hooks allow.

    Gradio reads a handler's signature and type hints on every call (``helpers.special_args``:
    ``inspect.signature``, then ``typing.get_type_hints``, which evaluates each string annotation
    of a ``from __future__ import annotations`` module anew): about 0.1 ms of the event loop per
    request. ``inspect.signature`` returns a function's ``__signature__`` when it has one, and
    ``get_type_hints`` has nothing left to evaluate once the annotations are the objects they name.
    """
    fn.__annotations__ = typing.get_type_hints(fn)
    fn.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return fn
