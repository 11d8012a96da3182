"""OpenAI's images API, ``POST /v1/images/generations`` and ``POST /v1/images/edits``, through the page's line.

What every OpenAI SDK (and every app built on one) calls; vllm-omni, SGLang-Diffusion and
diffusers' own server example serve the same routes. Every request enters ``Adapter.run`` as its
caller (``peer_api``), so the fair share, the caps, the quota and the gate are the page's.

- Fields: ``prompt``, ``model`` (this server's model by id or name, OpenAI's own image model names, which
  draw with it, or omitted; any other: OpenAI's 404 ``model_not_found``), ``n``, ``size`` (``WxH`` the
  model can draw, or ``auto``: its default), ``response_format`` (``b64_json``, the default, or
  ``url``: the app's own file route), ``output_format`` (``png``, ``jpeg``, ``webp``),
  ``output_compression``, ``stream`` with ``partial_images`` (0-3: the job's live previews),
  ``user`` / ``safety_identifier`` (logged; who the caller is comes from the front door, never
  from the body). ``quality``, ``style``, ``moderation``, ``input_fidelity`` and ``background``
  ``auto``/``opaque`` are taken and have no effect; what this app cannot do (a transparent
  background, GIF or SVG output, animation frames) is refused by name.
- This app's own fields, for clients that send them (``extra_body``): ``seed``,
  ``negative_prompt``, ``num_inference_steps``, ``guidance_scale``, ``scheduler``, ``lora``,
  ``lora_scale``, and on edits ``strength``.
- Edits (multipart): ``image`` (one file) and ``mask`` (optional: inpainting where the mask is
  fully transparent, OpenAI's convention, or white on an opaque mask; without one, image-to-image
  at ``strength``, 0.75 by default); a ControlNet's ``control_image`` as a file part or a base64 field.
- ``GET /v1/models`` lists every served model, by its id (``ModelProfile.model_id``), the default first;
  ``model`` picks one by that id (issue 52), and OpenAI's own names draw with the default.
- Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, the field in
  ``param``; the front door's own refusals on these routes (401, 413, 429) take the same shape.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import re
import time
from functools import partial
from typing import Any, AsyncIterator, Mapping
from urllib.parse import quote

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from PIL import Image

from ... import fields
from ...errors import InvalidRequest, ServingError
from ...fields import number, show
from ...protocol import ModelProfile, Output
from ...request import DEFAULT_STRENGTH, Limits
from ...serving.base import Adapter
from ...uploads import MAX_UPLOAD_BYTES, MaskUpload
from ..door import asgi
from ..door.upload_route import UploadBook
from ..gradio_internals import served_name
from .peer_api import (
    PeerJobs,
    b64_bytes,
    charge_pictures,
    http_caller,
    http_error,
    json_body,
    read_pngs,
    retry_headers,
    run_request,
)
from .sdapi_fields import model_title

log = logging.getLogger(__name__)

OPENAI = "/v1/images"
MODELS = "/v1/models"
FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
MAX_PARTIAL_IMAGES = 3
_IGNORED = {"quality", "style", "moderation", "input_fidelity", "complexity", "user", "safety_identifier"}
_KNOWN = {"prompt", "model", "n", "size", "response_format", "output_format", "output_compression", "stream",
          "partial_images", "background", *_IGNORED}  # fmt: skip
_OWN = set(fields.passed_through("openai")) - {"strength"}  # the app's own fields, as extra body fields
_REFUSED = {"frame_count": "animation frames", "frame_duration_ms": "animation frames", "svg": "SVG output",
            "markup": "markup images"}  # fmt: skip


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# OpenAI's own image models, as clients send them by default (Open WebUI: dall-e-2 when its model is
# empty; scripts: dall-e-3, gpt-image-1): each draws with this server's model, and the answer names it.
OPENAI_MODELS = re.compile(r"dall-e-[23]|gpt-image-[\w.-]+|chatgpt-image-[\w.-]+|gpt-image")


class ModelNotFound(InvalidRequest):
    """A ``model`` that is neither this server's nor one of OpenAI's image models: OpenAI's 404."""

    def __init__(self, model: Any, served: str) -> None:
        super().__init__(
            "model",
            f"The model {show(model)} does not exist: this server serves {served!r} (OpenAI's dall-e-2, dall-e-3 "
            "and gpt-image-1 names draw with it too)",
        )


def error_response(exc: BaseException) -> JSONResponse:
    if isinstance(exc, ModelNotFound):
        return JSONResponse(error_body(str(exc), "model", code="model_not_found"), status_code=404)
    status, message, retry = http_error(exc)
    if status == 422:
        status = 400  # OpenAI answers a bad field with 400
    kind = {429: "rate_limit_exceeded", 503: "server_error", 500: "server_error", 504: "server_error"}.get(
        status, "invalid_request_error"
    )
    param = getattr(exc, "field", None)
    param = _OPENAI_NAME.get(param, param) if isinstance(param, str) else param
    return JSONResponse(error_body(message, param, kind), status_code=status, headers=retry_headers(retry))


# The app's field names that OpenAI's requests call otherwise (an error's ``param``)
_OPENAI_NAME = {"num_images": "n", "width": "size", "height": "size"}


def openai_raw(
    body: Mapping[str, Any], profile: ModelProfile, limits: Limits, *, edit: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the app's raw request, the answer's settings: format, compression, response format, stream, partials).

    Raises ``InvalidRequest`` naming the OpenAI field."""
    own = _OWN | ({"strength"} if edit else set())
    for name in body:
        if name in _REFUSED and body[name] not in (None, "", 0, False):
            raise InvalidRequest(name, f"{name}: {_REFUSED[name]} are not supported by this app")
        if name not in _KNOWN and name not in own and name not in _REFUSED and name not in ("image", "image[]", "mask"):
            raise InvalidRequest(name, f"Unrecognized request argument supplied: {name}")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt", "prompt is required: the text of the picture to make")
    model = body.get("model")
    # several models (issue 52): by its id, its full name or its A1111 title (what /sdapi/v1/options names)
    picked = next((p for p in profile.served if model in (p.name, p.model_id, model_title(p))), None)
    if picked is None and model not in (None, "") and not (isinstance(model, str) and OPENAI_MODELS.fullmatch(model)):
        raise ModelNotFound(model, ", ".join(p.model_id for p in profile.served))
    if picked is not None:  # the request is checked against that model's sizes, steps and guidance
        profile, limits = picked, limits.pick(picked.model_id)
    n = _integer(body, "n", 1)
    if not 1 <= n <= limits.max_images:
        raise InvalidRequest("n", f"n must be from 1 to {limits.max_images}; got {n}")
    width, height = _size(body.get("size"), profile, limits)
    output_format = str(body.get("output_format") or "png").lower()
    if output_format not in FORMATS:
        raise InvalidRequest("output_format", f"output_format must be png, jpeg or webp; got {output_format!r}")
    compression = _integer(body, "output_compression", 100)
    if not 0 <= compression <= 100:
        raise InvalidRequest("output_compression", f"output_compression must be from 0 to 100; got {compression}")
    response_format = body.get("response_format") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise InvalidRequest("response_format", f"response_format must be b64_json or url; got {response_format!r}")
    if body.get("background") not in (None, "", "auto", "opaque"):
        raise InvalidRequest("background", "background must be auto or opaque: this app draws no transparency")
    stream = _flag(body, "stream")
    partials = _integer(body, "partial_images", 0)
    if not 0 <= partials <= MAX_PARTIAL_IMAGES:
        raise InvalidRequest("partial_images", f"partial_images must be from 0 to {MAX_PARTIAL_IMAGES}; got {partials}")
    seed = body.get("seed")
    raw: dict[str, Any] = {
        "prompt": prompt,
        "negative_prompt": body.get("negative_prompt") or "",
        "seed": _integer(body, "seed", 0) if seed is not None else 0,
        "randomize_seed": seed is None,
        "width": width,
        "height": height,
        "num_images": n,
        "num_inference_steps": profile.default_steps,
        "guidance_scale": profile.default_guidance,
        "live_preview": stream and partials > 0,
        "mode": "text",
    }
    if picked is not None and limits.model:
        raw["model"] = limits.model
    for name in sorted(_OWN - {"seed", "negative_prompt", "control_image"}, key=fields.NAMES.index):
        if body.get(name) not in (None, ""):
            raw[name] = _number(body, name) if fields.BY_NAME[name].type is float else body[name]
    if body.get("control_image") not in (None, ""):  # a ControlNet's map, base64 (off the loop: ``generations``)
        raw["control_image"] = b64_bytes(body["control_image"], "control_image")
    if edit:
        raw["strength"] = _number(body, "strength") if body.get("strength") not in (None, "") else DEFAULT_STRENGTH
    answer = {"format": output_format, "compression": compression, "response_format": response_format,
              "stream": stream, "partials": partials, "size": f"{width}x{height}"}  # fmt: skip
    return raw, answer


def _size(value: Any, profile: ModelProfile, limits: Limits) -> tuple[int, int]:
    if value in (None, "", "auto"):
        return profile.default_width, profile.default_height
    rule = (
        f"WIDTHxHEIGHT in multiples of {limits.size_multiple} from {limits.min_size} to {limits.max_size}, "
        f"at most {limits.max_pixels} pixels, or auto ({profile.default_width}x{profile.default_height})"
    )
    parts = str(value)[:32].lower().split("x")  # ASCII digits only, a few of them: int() reads no 5,000 digits
    if len(str(value)) > 32 or len(parts) != 2 or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise InvalidRequest("size", f"size must be {rule}; got {value!r}")
    width, height = int(parts[0]), int(parts[1])
    fits = all(limits.min_size <= s <= limits.max_size and s % limits.size_multiple == 0 for s in (width, height))
    if limits.size_choices:
        fits = (width, height) in limits.size_choices
        rule = "one of " + ", ".join(f"{w}x{h}" for w, h in limits.size_choices)
    if not fits or width * height > limits.max_pixels:
        raise InvalidRequest("size", f"size must be {rule}; this model cannot draw {value}")
    return width, height


def _integer(body: Mapping[str, Any], name: str, default: int) -> int:
    value = body.get(name, default)
    return default if value in (None, "") else int(number(name, value, whole=True, text=True))


def _number(body: Mapping[str, Any], name: str) -> float:
    return float(number(name, body.get(name), text=True))  # a form field is text


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if isinstance(value, str):  # multipart fields are text
        if value.lower() not in ("true", "false", "1", "0", ""):
            raise InvalidRequest(name, f"{name} must be true or false; got {value!r}")
        return value.lower() in ("true", "1")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(name, f"{name} must be true or false; got {value!r}")
    return value


def converted(png: bytes, output_format: str, compression: int) -> bytes:
    """The PNG as ``output_format`` (JPEG and WebP at quality ``compression``): run off the loop."""
    if output_format == "png":
        return png
    with Image.open(io.BytesIO(png)) as image:
        out = io.BytesIO()
        image.convert("RGB").save(out, format=FORMATS[output_format], quality=max(1, compression))
        return out.getvalue()


class OpenAIImages:
    """The ``/v1/images`` routes on the app's server."""

    def __init__(self, adapter: Adapter, jobs: PeerJobs, uploads: UploadBook | None = None) -> None:
        self.adapter = adapter
        self.jobs = jobs
        self.uploads = uploads  # the upload route's book: its rate counts the pictures sent here too

    def routes(self) -> list[APIRoute]:
        return [
            APIRoute(f"{OPENAI}/generations", self.generations, methods=["POST"], include_in_schema=False),
            APIRoute(f"{OPENAI}/edits", self.edits, methods=["POST"], include_in_schema=False),
            APIRoute(MODELS, self.models, methods=["GET"], include_in_schema=False),
        ]

    async def models(self) -> JSONResponse:
        """``GET /v1/models``: every served model, the default first, by the name ``model`` takes."""
        data = [{"id": p.model_id, "object": "model", "created": 0, "owned_by": "this server"}
                for p in self.adapter.profile.served]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def generations(self, request: Request) -> Response:
        try:
            body = await json_body(request)
            args = (body, self.adapter.profile, self.adapter.limits)
            raw, answer = (await asgi.off_loop(partial(openai_raw, edit=False), *args) if body.get("control_image")
                           else openai_raw(*args, edit=False))  # fmt: skip
            charge_pictures(self.uploads, http_caller(request), raw, "control_image")
        except ServingError as exc:
            return error_response(exc)
        return await self._answer(request, raw, answer, "image_generation", body)

    async def edits(self, request: Request) -> Response:
        try:
            body, image, mask, control = await self._form(request)
            raw, answer = openai_raw(body, self.adapter.profile, self.adapter.limits, edit=True)
            raw["image"] = image
            if control is not None:  # a ControlNet's map as a file part (issue 51)
                raw["control_image"] = control
            charge_pictures(self.uploads, http_caller(request), {**raw, "mask": mask}, "image")  # the map counted too
            if mask is not None:
                raw["mask"] = MaskUpload(mask, transparent_edits=True)  # decoded with the request, after its gates
                raw["mode"], raw["mask_blur"] = "inpaint", 0
            else:
                raw["mode"] = "image"
        except ServingError as exc:
            return error_response(exc)
        return await self._answer(request, raw, answer, "image_edit", body)

    async def _form(self, request: Request) -> tuple[dict[str, Any], bytes, bytes | None, bytes | None]:
        """The multipart edit: its text fields, the image's bytes, the mask's and a ControlNet map's
        (``control_image``, issue 51), each capped."""
        try:
            form = await request.form(max_files=3, max_fields=40, max_part_size=64 * 1024)
        except Exception as exc:  # a malformed body, too many parts, a field over the part size
            raise InvalidRequest("body", f"send the edit as multipart/form-data with one image ({exc})") from None
        try:
            body: dict[str, Any] = {}
            files: dict[str, list[Any]] = {}
            for key, value in form.multi_items():
                if hasattr(value, "read"):
                    files.setdefault(key.removesuffix("[]"), []).append(value)
                else:
                    body[key] = value
            images = files.get("image", [])
            if len(images) != 1:
                raise InvalidRequest("image", "image must be one PNG, JPEG or WebP file (this app edits one image)")
            image = await images[0].read(MAX_UPLOAD_BYTES + 1)
            optional: dict[str, bytes | None] = {}
            for name in ("mask", "control_image"):
                parts = files.get(name, [])
                if len(parts) > 1:
                    raise InvalidRequest(name, f"{name} must be one file")
                optional[name] = await parts[0].read(MAX_UPLOAD_BYTES + 1) if parts else None
            for name, data in (("image", image), *optional.items()):
                if data is not None and len(data) > MAX_UPLOAD_BYTES:
                    raise InvalidRequest(name, f"{name}: the file is over {MAX_UPLOAD_BYTES // 2**20} MiB")
            return body, image, optional["mask"], optional["control_image"]
        finally:
            await form.close()

    async def _answer(
        self, request: Request, raw: dict[str, Any], answer: dict[str, Any], event: str, body: Mapping[str, Any]
    ) -> Response:
        caller = http_caller(request)
        label = body.get("safety_identifier") or body.get("user")
        if label:
            log.info("openai images request from %s, user %.64r", caller.key, str(label))
        if answer["stream"]:
            return StreamingResponse(self._stream(request, raw, answer, event, caller), media_type="text/event-stream")
        try:
            ended = await run_request(self.adapter, raw, caller, self.jobs, request)
            if ended.done is None:
                return error_response(InvalidRequest("interrupted", "the job was interrupted by its caller"))
            data = await self._images(request, ended.done, answer)
        except ServingError as exc:
            return error_response(exc)
        model = raw.get("model") or self.adapter.profile.model_id
        answered = {"created": int(time.time()), "model": model, "data": data, "output_format": answer["format"]}
        answered.update(size=answer["size"], background="opaque", quality="auto", usage=_usage(raw))
        return JSONResponse(answered)

    async def _images(self, request: Request, done: Output, answer: dict[str, Any]) -> list[dict[str, Any]]:
        if answer["response_format"] == "url":
            if answer["format"] != "png":
                raise InvalidRequest(
                    "response_format", "response_format url serves the PNG files: use output_format png"
                )
            base = str(request.base_url).rstrip("/")
            served = [await asyncio.to_thread(served_name, path) for path in done.paths]
            return [{"url": f"{base}/gradio_api/file={quote(name)}"} for name in served]
        files = await asyncio.to_thread(read_pngs, done.paths)
        out = [await asyncio.to_thread(converted, png, answer["format"], answer["compression"]) for png in files]
        return [{"b64_json": base64.b64encode(data).decode("ascii")} for data in out]

    async def _stream(
        self, request: Request, raw: dict[str, Any], answer: dict[str, Any], event: str, caller: Any
    ) -> AsyncIterator[bytes]:
        """Server-sent events: up to ``partial_images`` previews (``<event>.partial_image``), then one
        ``<event>.completed`` per image; an error is one ``error`` event. A client that disconnects
        ends the stream (Starlette cancels it) and so its job."""
        partials: list[bytes] = []
        wanted = answer["partials"]
        meta = {"background": "opaque", "output_format": answer["format"], "quality": "auto", "size": answer["size"]}

        async def on_step(step: Output) -> None:
            due = step.total and len(partials) < wanted and step.step >= (len(partials) + 1) * step.total / (wanted + 1)
            if step.preview is not None and due:
                data = step.preview.data
                if answer["format"] != "jpeg":  # previews are JPEGs: the answer's format
                    data = await asyncio.to_thread(_recode, data, answer["format"])
                partials.append(data)
                await queue.put(_sse(f"{event}.partial_image", {
                    "type": f"{event}.partial_image", "b64_json": base64.b64encode(data).decode("ascii"),
                    "partial_image_index": len(partials) - 1, "created_at": int(time.time()), **meta}))  # fmt: skip

        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def produce() -> None:
            try:
                # gone while it waits: it leaves the line (``run_request`` watches the disconnect)
                ended = await run_request(self.adapter, raw, caller, self.jobs, request, on_step)
                if ended.done is None:
                    raise InvalidRequest("interrupted", "the job was interrupted by its caller")
                for item in await self._images(request, ended.done, answer):
                    payload = {"type": f"{event}.completed", **item, "created_at": int(time.time()), **meta,
                               "usage": _usage(raw)}  # fmt: skip
                    await queue.put(_sse(f"{event}.completed", payload))
            except ServingError as exc:
                _status, message, _ = http_error(exc)
                field = getattr(exc, "field", None)
                await queue.put(_sse("error", error_body(message, _OPENAI_NAME.get(field, field) if field else None)))
            finally:
                await queue.put(None)

        task = asyncio.get_running_loop().create_task(produce(), name="openai-stream")
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            task.cancel()  # the client went away (or the stream ended): the job leaves with it
            await asyncio.gather(task, return_exceptions=True)


def _recode(jpeg: bytes, output_format: str) -> bytes:
    with Image.open(io.BytesIO(jpeg)) as image:
        out = io.BytesIO()
        image.convert("RGB").save(out, format=FORMATS[output_format])
        return out.getvalue()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _usage(raw: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's usage record (its SDK's completed event requires one): this app counts no tokens."""
    return {"input_tokens": 0, "input_tokens_details": {"image_tokens": 0, "text_tokens": 0}, "output_tokens": 0,
            "total_tokens": 0}  # fmt: skip
