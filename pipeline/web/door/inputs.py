"""What each event of the page may be sent, checked at the HTTP boundary before Gradio reads it.

Gradio trusts what a client sends an event: a ``Textbox(max_length)`` is checked only in the
browser; every input value is stored in the session's state; and any value shaped like a file
(``{"path": "https://...", "meta": {"_type": "gradio.FileData"}}``) makes Gradio download or copy
that file *before* the event's validator runs. So every join is checked here first, for every
event of the page, not only ``/generate``:

- the body's own fields (``fn_index`` names an event with a Python handler, ``data`` has one value
  per input, ``session_hash`` is a short token);
- no value anywhere is file-shaped (this app takes no files);
- each text is within its field's cap (a ``Textbox``'s ``max_length``; ``SMALL_TEXT`` elsewhere),
  and every other value is small;
- every text, wherever it is, is valid Unicode with no control character but newline and tab
  (``text.text_problem``): a lone surrogate would otherwise fail inside a tokenizer as a server fault;
- the event's data (``gr.SelectData``'s source) is cut down to its index: the handlers read only
  that, and a client's ``value`` could be anything.

A refusal is HTTP 422 in the format of Gradio's own validator answer, one entry per input with the
bad one's message: gradio_client raises ``ValidationError`` naming the parameter, and the page
paints the message on the field. Types and ranges are left to the events' own validators (for
``/generate``: ``request.validate``, which says what range each field takes). Pure functions.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from ...fields import text_problem

SMALL_TEXT = 256  # characters of any text that is not a Textbox's (a radio's choice, a slider's number)
SMALL_NODES = 64  # values inside one non-text input (a list of seeds, a small dict)
Owns = Callable[[str], bool]  # whether a path is a live upload of the caller's
SESSION_HASH = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BODY_KEYS = {"data", "fn_index", "session_hash", "event_data", "trigger_id", "event_id", "batched", "simple_format"}


class Refused(Exception):
    """A join that is not let in: ``status`` and the JSON ``detail`` to answer with."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(str(detail))
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Field:
    name: str  # the handler's parameter name (what gradio_client and the page report)
    label: str  # what a person reads: the component's label, else the parameter's name
    max_chars: int
    upload: bool = False  # an image input: it takes a file its caller uploaded (``upload_route``), or nothing


@dataclass(frozen=True)
class EventInputs:
    fn_index: int
    api_name: str | None
    fields: tuple[Field, ...]


class InputPolicy:
    """The fields of every event with a Python handler, read from the Blocks once it is built."""

    def __init__(self, demo: gr.Blocks) -> None:
        self.events: dict[int, EventInputs] = {}
        self.by_api_name: dict[str, EventInputs] = {}
        for index, fn in demo.fns.items():
            if fn.fn is None:
                continue  # a js-only event: the browser runs it, the server has nothing to run
            names = _parameter_names(fn)
            # An event with a validator (/generate) is the API's: its messages name the parameter,
            # as the validator's own do; the page's other events name the field a person sees.
            by_name = fn.validator is not None
            fields = tuple(
                _field(block, names[i] if i < len(names) else f"parameter_{i}", by_name)
                for i, block in enumerate(fn.inputs)
            )
            event = EventInputs(index, fn.api_name, fields)
            self.events[index] = event
            if fn.api_name:
                self.by_api_name[fn.api_name] = event

    def check_join(self, body: Any, owns: Owns = lambda path: False) -> tuple[EventInputs, dict[str, Any]]:
        """The event a ``/queue/join`` body is for and the body to hand on (event data cut down)."""
        if not isinstance(body, dict) or not set(body) <= _BODY_KEYS | {"oauth_token"}:
            raise Refused(400, "A join is a JSON object with data, fn_index and session_hash.")
        index = body.get("fn_index")
        event = self.events.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
        if event is None:
            raise Refused(404, "No such event.")
        session = body.get("session_hash")
        if not isinstance(session, str) or not SESSION_HASH.fullmatch(session):
            raise Refused(400, "session_hash must be 1 to 64 letters, digits, '-' or '_'.")
        for key in ("trigger_id",):
            if body.get(key) is not None and not isinstance(body[key], int):
                raise Refused(400, f"{key} must be a whole number.")
        self.check_data(event, body.get("data"), owns)
        cleaned = dict(body)
        if "event_data" in body:
            cleaned["event_data"] = select_data(body["event_data"])
        cleaned.pop("oauth_token", None)  # no event here takes a gr.OAuthToken
        return event, cleaned

    def check_data(self, event: EventInputs, data: Any, owns: Owns = lambda path: False) -> None:
        """Refuse ``data`` unless it has one value per input, none file-shaped but an upload input's
        own upload (``owns``: whether a path is one the caller uploaded), each within its cap."""
        if not isinstance(data, list) or len(data) != len(event.fields):
            raise Refused(400, f"data must be a list of {len(event.fields)} values, one per input.")
        for i, (field, value) in enumerate(zip(event.fields, data)):
            problem = _upload_problem(field, value, owns) if field.upload else _problem(field, value)
            if problem is not None:
                raise Refused(422, validation_detail(event, i, problem))


def validation_detail(event: EventInputs, bad: int, message: str) -> list[dict[str, Any]]:
    """Gradio's validator answer: one ``validate`` entry per input, ``bad`` invalid with ``message``."""
    return [
        {"__type__": "validate", "is_valid": i != bad, "message": message if i == bad else "", "parameter_name": f.name}
        for i, f in enumerate(event.fields)
    ]


def select_data(value: Any) -> dict[str, Any] | None:
    """The part of a select event's data the handlers read: its index (a number or a [row, column] pair)."""
    if not isinstance(value, dict):
        return None
    index = value.get("index")
    if isinstance(index, list) and len(index) == 2 and all(_small_int(v) for v in index):
        pass
    elif not _small_int(index):
        index = None
    return {"index": index, "value": None, "selected": value.get("selected") is not False}


def file_shaped(value: Any) -> bool:
    """Whether ``value`` holds anything Gradio would treat as a file to fetch or copy."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > 100_000:
            return True  # nothing this app takes is that large: refuse rather than walk on
        if isinstance(item, dict):
            meta = item.get("meta")
            if "path" in item or "url" in item or (isinstance(meta, dict) and "_type" in meta):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _upload_problem(field: Field, value: Any, owns: Owns) -> str | None:
    """An image input's value: nothing, or Gradio's file value naming a file the caller uploaded
    (the page's image editor: its background and layers, each such a file)."""
    if value is None:
        return None
    if isinstance(value, dict) and "layers" in value:  # gr.ImageEditor's value
        files = [value.get("background"), value.get("composite"), *(value.get("layers") or [])]
        extra = set(value) - {"background", "layers", "composite", "id"}
        if extra or len(files) > 8:
            return f"{field.label} must be an image editor's value (background, layers, composite)"
        return next(filter(None, (_upload_problem(field, f, owns) for f in files)), None)
    path = value.get("path") if isinstance(value, dict) else None
    url = value.get("url") if isinstance(value, dict) else None
    keys_ok = isinstance(value, dict) and set(value) <= _FILE_KEYS
    url_ok = url is None or (isinstance(url, str) and isinstance(path, str) and url.endswith("file=" + path))
    if not (keys_ok and url_ok and isinstance(path, str) and owns(path)):
        return (
            f"{field.label} must be an image you uploaded in this session (PNG, JPEG or WebP), "
            "not a URL, a server path or another session's upload"
        )
    return None


_FILE_KEYS = {"path", "url", "size", "orig_name", "mime_type", "is_stream", "meta"}


def _problem(field: Field, value: Any) -> str | None:
    if value is None or isinstance(value, (bool, int, float)):
        return None  # a plain value: the event's own validator checks its type and range
    if file_shaped(value):
        return f"{field.label} must not be a file: this app takes no files"
    if isinstance(value, str):
        if len(value) > field.max_chars:
            return f"{field.label} must be text of at most {field.max_chars} characters; got {len(value)} characters"
        problem = text_problem(value)
        return None if problem is None else f"{field.label} {problem}"
    texts = _small_texts(value)
    if texts is None:
        return f"{field.label} must be a single value (text of at most {field.max_chars} characters, or a number)"
    problem = next(filter(None, map(text_problem, texts)), None)
    return None if problem is None else f"{field.label} {problem}"


def _small_texts(value: Any) -> list[str] | None:
    """The texts inside ``value`` (its keys included) if it is small: at most SMALL_NODES values
    inside, each text among them at most SMALL_TEXT characters; else None."""
    stack, nodes, texts = [value], 0, []
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > SMALL_NODES or (isinstance(item, str) and len(item) > SMALL_TEXT):
            return None
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return texts


def _small_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1_000_000


def _field(block: Any, name: str, by_name: bool) -> Field:
    label = name if by_name else str(getattr(block, "label", None) or name)
    if isinstance(block, (gr.Image, gr.ImageEditor)):
        return Field(name, label, SMALL_TEXT, upload=True)
    if isinstance(block, gr.Textbox):
        return Field(name, label, int(block.max_length or SMALL_TEXT))
    return Field(name, label, SMALL_TEXT)


def _parameter_names(fn: Any) -> list[str]:
    """The handler's input parameter names, the way Gradio names them in its validator answer."""
    if getattr(fn, "input_parameter_names", None):
        return list(fn.input_parameter_names)
    try:
        params = inspect.signature(fn.fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
