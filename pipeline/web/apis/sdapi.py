"""AUTOMATIC1111's ``/sdapi/v1``: the calls its clients use, through the page's own line.

Forge and SD.Next serve the same API; it is what ``webuiapi``, Open WebUI's and SillyTavern's
"Automatic1111" engines, bots and editor plugins speak. Every generation enters ``Adapter.run``
as the caller (``peer_api``): nothing skips the line, and ``progress`` and ``interrupt`` act on the
caller's own jobs only, where A1111's act on its one global job.

- ``POST txt2img``, ``POST img2img`` (``init_images``, ``mask``, ``denoising_strength``,
  ``inpainting_fill``, ``inpainting_mask_invert``, ``mask_blur``; ``enable_hr`` / ``hr_scale`` /
  ``hr_second_pass_steps`` / ``denoising_strength`` in txt2img): the fields mapped to the app's
  (``sdapi_fields.a1111_raw``); a field asking for what this app does not do is refused by name (422), one at its
  default is ignored. The answer: base64 PNGs (the page's files, their ``parameters`` text included),
  the request echoed as ``parameters`` and A1111's ``info`` JSON string.
- ``GET progress`` (``current_image`` unless ``skip_current_image``), ``POST interrupt``.
- ``GET sd-models``, ``samplers``, ``schedulers``, ``loras``, ``options``, ``scripts``, ``upscalers``,
  ``latent-upscale-modes``, ``sd-vae``, ``embeddings`` (what front ends list before a call); ``POST
  options``'s ``sd_model_checkpoint`` sets the caller's own default model (several models), nothing else
  changes; ``POST png-info``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import io
import json
import time
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from PIL import Image

from ...errors import InvalidRequest, ServingError
from ...protocol import ModelProfile
from ...request import HIRES_UPSCALER
from ...serving.base import Adapter
from ...uploads import png_text, read_image, sniff, work_problem
from ..door import asgi
from ..door.upload_route import UploadBook
from . import a1111
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
from .sdapi_fields import (
    A1111_NAME,
    MODULE_LIST,
    MODULES,
    VERSION,
    a1111_info,
    a1111_raw,
    check_options,
    current_options,
    model_title,
    samplers_of,
)

SDAPI = "/sdapi/v1"
CHOSEN_MAX = 10_000  # identities whose own default model is kept (the most recently set)


def _error(exc: BaseException) -> JSONResponse:
    status, message, retry = http_error(exc)
    field = getattr(exc, "field", None)
    if field is not None and field in A1111_NAME and not message.startswith(A1111_NAME[field]):
        # the app's own name for the field becomes A1111's ("image: ..." -> "init_images: ...")
        message = f"{A1111_NAME[field]}: {message.removeprefix(f'{field}: ')}"
    return JSONResponse(
        {"error": type(exc).__name__, "detail": message, "body": "", "errors": ""},
        status_code=status,
        headers=retry_headers(retry),
    )


class SdApi:
    """The ``/sdapi/v1`` routes on the app's server."""

    def __init__(
        self, adapter: Adapter, jobs: PeerJobs, uploads: UploadBook | None = None, flags: dict[str, Any] | None = None
    ) -> None:
        self.adapter = adapter
        self.flags = flags or {}  # ``cmd-flags``: the app's own flags (``lifecycle.public_flags``)
        self.jobs = jobs
        self.uploads = uploads  # the upload route's book: its rate counts the pictures sent here too
        # Each identity's own default model (``POST options``' ``sd_model_checkpoint``; several models,
        # issue 52): never the server's, never another caller's. The most recently set ``CHOSEN_MAX`` kept.
        self.chosen: collections.OrderedDict[str, str] = collections.OrderedDict()

    @property
    def profile(self) -> ModelProfile:
        return self.adapter.profile

    def routes(self) -> list[APIRoute]:
        get, post = ["GET"], ["POST"]
        table = [
            ("txt2img", self.txt2img, post),
            ("img2img", self.img2img, post),
            ("progress", self.progress, get),
            ("interrupt", self.interrupt, post),
            ("sd-models", self.sd_models, get),
            ("samplers", self.samplers, get),
            ("schedulers", self.schedulers, get),
            ("loras", self.loras, get),
            ("options", self.options, get),
            ("options", self.set_options, post),
            ("scripts", self.scripts, get),
            ("upscalers", self.upscalers, get),
            ("latent-upscale-modes", self.none_listed, get),
            ("sd-vae", self.none_listed, get),
            ("hypernetworks", self.none_listed, get),
            ("face-restorers", self.none_listed, get),
            ("realesrgan-models", self.none_listed, get),
            ("prompt-styles", self.none_listed, get),
            ("cmd-flags", self.cmd_flags, get),
            ("embeddings", self.embeddings, get),
            ("png-info", self.png_info, post),
        ]
        controlnet = [
            ("version", self.controlnet_version, get),
            ("model_list", self.controlnet_models, get),
            ("module_list", self.controlnet_modules, get),
            ("detect", self.controlnet_detect, post),
        ]
        # the ControlNet extension's discovery routes, where clients probe them (issue 51)
        paths = [(f"{SDAPI}/{p}", fn, m) for p, fn, m in table]
        paths += [(f"/controlnet/{p}", fn, m) for p, fn, m in controlnet]
        return [APIRoute(path, fn, methods=m, include_in_schema=False) for path, fn, m in paths]  # type: ignore[arg-type]

    async def controlnet_version(self) -> JSONResponse:
        return JSONResponse({"version": 2})

    async def controlnet_models(self) -> JSONResponse:
        """The ControlNets loaded at start (``--controlnet``), as the extension lists its models."""
        return JSONResponse({"model_list": list(getattr(self.profile, "controls", ()))})

    async def controlnet_modules(self) -> JSONResponse:
        return JSONResponse({"module_list": MODULE_LIST, "module_detail": {m: {"model_free": True, "sliders": []}
                                                                           for m in MODULE_LIST}})  # fmt: skip

    async def controlnet_detect(self, request: Request) -> JSONResponse:
        """The extension's ``detect``: each picture through a module (a preprocessor), as the map a
        request would get, through the same upload checks; off the loop."""
        try:
            body = await json_body(request)
            module = MODULES.get(str(body.get("controlnet_module", "none")).lower())
            if module is None:
                raise InvalidRequest("controlnet_module", f"controlnet_module must be one of {', '.join(MODULE_LIST)}")
            images = body.get("controlnet_input_images") or body.get("controlnet_images") or []
            if not isinstance(images, list) or not 1 <= len(images) <= 4:
                raise InvalidRequest("controlnet_input_images", "controlnet_input_images: one to four base64 images")
            raw = {"image": b64_bytes(images[0], "controlnet_input_images")}
            charge_pictures(self.uploads, http_caller(request), raw, "controlnet_input_images")
            maps = await asyncio.to_thread(detected, images, module)
        except (ServingError, ValueError) as exc:
            return _error(exc)
        return JSONResponse({"images": maps, "info": "Success"})

    async def txt2img(self, request: Request) -> JSONResponse:
        return await self._generate(request, img2img=False)

    async def img2img(self, request: Request) -> JSONResponse:
        return await self._generate(request, img2img=True)

    async def _generate(self, request: Request, *, img2img: bool) -> JSONResponse:
        caller = http_caller(request)
        try:
            body = await json_body(request)
            args = (body, self.profile, self.adapter.limits)
            chosen = self.chosen.get(caller.key, "")
            # base64 pictures (img2img's, a ControlNet unit's: up to 27 MiB of text each): decoded off the loop
            raw, notes = (
                await asgi.off_loop(partial(a1111_raw, img2img=img2img, chosen=chosen), *args)
                if img2img or body.get("alwayson_scripts")
                else a1111_raw(*args, img2img=False, chosen=chosen)
            )
            charge_pictures(self.uploads, caller, raw, "init_images")
            ended = await run_request(self.adapter, raw, caller, self.jobs, request)
        except (ServingError, ValueError) as exc:
            return _error(exc)
        echo = {k: v for k, v in body.items() if k not in ("init_images", "mask", "alwayson_scripts")}
        if ended.done is None:  # interrupted by its own caller: no images, as A1111 says so in its info
            info = {"interrupted": True, "steps_done": ended.steps_done, "version": VERSION}
            return JSONResponse({"images": [], "parameters": echo, "info": json.dumps(info)})
        files = await asyncio.to_thread(read_pngs, ended.done.paths)
        texts = [_parameters_text(data) for data in files]
        info = a1111_info(body, ended.done.info, texts, self.profile, notes)
        images = [_b64(data) for data in files] if body.get("send_images", True) else []
        return JSONResponse({"images": images, "parameters": echo, "info": json.dumps(info, ensure_ascii=False)})

    async def progress(self, request: Request) -> JSONResponse:
        """The caller's own jobs (oldest first): A1111's ``progress`` shape."""
        jobs = self.jobs.of(http_caller(request).key)
        skip = request.query_params.get("skip_current_image", "false").lower() in ("1", "true", "yes")
        if not jobs:
            return JSONResponse(_progress_body(0.0, 0.0, 0, 0, 0, 0, None, ""))
        job = jobs[0]
        fraction = job.step / job.total if job.total else 0.0
        overall = fraction / len(jobs)
        image = _b64(job.preview) if job.preview is not None and not skip else None
        waiting = f"waiting: {job.ahead} ahead" if job.ahead else ""
        return JSONResponse(
            _progress_body(overall, job.eta_seconds or 0.0, len(jobs), job.step, job.total, job.started, image, waiting)
        )

    async def interrupt(self, request: Request) -> JSONResponse:
        stopped = self.jobs.interrupt(http_caller(request).key, self.adapter.abort)
        return JSONResponse({"interrupted": stopped})

    async def sd_models(self) -> JSONResponse:
        """Every served model (several models, issue 52), the default first, as A1111 lists checkpoints."""
        return JSONResponse([{"title": model_title(p), "model_name": p.model_id, "hash": p.hash or None,
                              "sha256": None, "filename": p.name, "config": None}
                             for p in self.profile.served])  # fmt: skip

    async def samplers(self) -> JSONResponse:
        names = samplers_of(self.profile, self.adapter.limits)
        return JSONResponse([{"name": n, "aliases": [], "options": {}} for n in names])

    async def schedulers(self) -> JSONResponse:
        names: list[tuple[str, str, float]] = [("automatic", "Automatic", -1.0)]
        if any(s.endswith("Karras") for s in self.adapter.limits.samplers):
            names.append(("karras", "Karras", 7.0))
        keys = ("name", "label", "default_rho")
        return JSONResponse([{**dict(zip(keys, n)), "aliases": None, "need_inner_model": False} for n in names])

    async def loras(self) -> JSONResponse:
        infos = self.profile.loras
        return JSONResponse([{"name": i.name, "alias": i.name, "path": i.name, "metadata": {}} for i in infos])

    async def options(self, request: Request) -> JSONResponse:
        chosen = self.chosen.get(http_caller(request).key, "")
        return JSONResponse(current_options(self.profile, self.adapter.limits, chosen))

    async def set_options(self, request: Request) -> JSONResponse:
        """Only the caller's own default model changes (``sd_model_checkpoint``); any other real change is refused."""
        key = http_caller(request).key
        try:
            body = await json_body(request)
            picked = check_options(body, self.profile, self.adapter.limits, self.chosen.get(key, ""))
            if picked is not None:
                self.chosen[key] = picked
                self.chosen.move_to_end(key)
                while len(self.chosen) > CHOSEN_MAX:
                    self.chosen.popitem(last=False)
        except ServingError as exc:
            status, message, _ = http_error(exc)
            return JSONResponse(
                {"error": "OptionsRefused", "detail": message, "body": "", "errors": ""}, status_code=status
            )
        return JSONResponse(None)

    async def scripts(self) -> JSONResponse:
        return JSONResponse({"txt2img": [], "img2img": []})

    async def upscalers(self) -> JSONResponse:
        """Hires fix's one upscaler (any ``hr_upscaler`` a client sends runs it, and the PNG says so)."""
        return JSONResponse([{"name": HIRES_UPSCALER, "model_name": None, "model_path": None, "model_url": None,
                              "scale": 2}])  # fmt: skip

    async def none_listed(self) -> JSONResponse:
        """Latent upscale modes, VAEs, hypernetworks, face restorers, Real-ESRGAN models, prompt styles:
        none to choose here (the lists clients read at start, before a call)."""
        return JSONResponse([])

    async def cmd_flags(self) -> JSONResponse:
        """This app's flags and their values (A1111 lists its own command line here; secrets: set or not)."""
        return JSONResponse(self.flags)

    async def embeddings(self) -> JSONResponse:
        return JSONResponse({"loaded": {}, "skipped": {}})

    async def png_info(self, request: Request) -> JSONResponse:
        """A picture's ``parameters`` text, read from its chunks (``uploads.png_text``: no frame decoded),
        after the picture rate, on the decode threads at the caller's turn. Errors name ``image``."""
        caller = http_caller(request)
        try:
            body = await json_body(request)
            data = await asgi.off_loop(b64_bytes, body.get("image"), "image")
            charge_pictures(self.uploads, caller, {"image": data}, "image")
            text = await self.adapter.decoder.run(caller.key, _picture_parameters, data)
        except ServingError as exc:
            status, message, retry = http_error(exc)
            return JSONResponse({"error": type(exc).__name__, "detail": message, "body": "", "errors": ""},
                                status_code=status, headers=retry_headers(retry))  # fmt: skip
        pasted = a1111.parse_parameters(text) if text else None
        items = {"parameters": text} if text else {}
        parameters: dict[str, Any] = {}
        if pasted is not None:
            parameters = {"Prompt": pasted.prompt, "Negative prompt": pasted.negative_prompt, **pasted.settings}
        return JSONResponse({"info": text, "items": items, "parameters": parameters})


def _progress_body(
    progress: float, eta: float, count: int, step: int, steps: int, started: float, image: str | None, text: str
) -> dict[str, Any]:
    return {
        "progress": round(progress, 4),
        "eta_relative": round(eta, 2),
        "state": {
            "skipped": False,
            "interrupted": False,
            "stopping_generation": False,
            "job": f"job({count})" if count else "",
            "job_count": count,
            "job_timestamp": time.strftime("%Y%m%d%H%M%S", time.gmtime(started)) if started else "0",
            "job_no": 0,
            "sampling_step": step,
            "sampling_steps": steps,
        },
        "current_image": image,
        "textinfo": text or None,
    }


def detected(images: list[Any], module: str) -> list[str]:
    """Each base64 picture as its map (``controls.control_map`` at its own size), base64 PNG."""
    from ...controls import control_map

    out = []
    for image in images:
        picture = read_image(b64_bytes(image, "controlnet_input_images"), "controlnet_input_images")
        buffer = io.BytesIO()
        control_map(picture, module, *picture.size).save(buffer, format="PNG")
        out.append(_b64(buffer.getvalue()))
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _parameters_text(png: bytes) -> str:
    """The ``parameters`` text of a PNG this app wrote."""
    return png_text(png).get("parameters", "")


def _picture_parameters(data: bytes) -> str:
    """A client's picture's A1111 ``parameters`` text: sniffed and held to the decoders' work caps
    (``uploads.work_problem``), then a PNG's text from its chunk stream (an animated PNG's frames are
    never composed), or a JPEG's or WebP's from its header (Pillow parses no scan at ``open``)."""
    kind = sniff(data)
    if kind is None:
        raise InvalidRequest("image", "image: not a PNG, JPEG or WebP image (only those are taken)")
    try:
        if (problem := work_problem(data, kind)) is not None:
            raise InvalidRequest("image", f"image: {problem}")
        if kind == "PNG":
            return png_text(data).get("parameters", "")
        with Image.open(io.BytesIO(data), formats=(kind,)) as image:
            return str(image.info.get("parameters", ""))
    except (ValueError, OSError, SyntaxError, EOFError) as exc:
        raise InvalidRequest("image", f"image: the {kind} file is damaged and cannot be read") from exc
