"""Launch the server in the background, and shut it down in order."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from ..config import Settings
from ..serving.base import Adapter
from ..serving.owners import KEY_FILE
from ..uploads import MAX_UPLOAD_BYTES
from .apis.mcp_tool import call_back_as_internal
from .apis.openai_images import OPENAI, OpenAIImages
from .apis.peer_api import PeerJobs
from .apis.sdapi import SDAPI, SdApi
from .door.frontdoor import DoorConfig, DoorLimits, FrontDoor
from .door.httplimits import ConnectionLimits, limited_protocol
from .door.inputs import InputPolicy
from .door.login import Login
from .door.routes import service_routes
from .door.upload_route import UPLOAD_BODY_BYTES, UPLOAD_PATH, UploadBook
from .gradio_internals import queued, skip_matplotlib_probe, tune_queue, upload_folder, uvicorn_options
from .page.shown import PROGRESS_INTERVAL
from .page.site import site_of
from .page.style import PAGE_CSS


def own_gradio_cache(settings: Settings, environ: MutableMapping[str, str]) -> Path:
    """Gradio's cache folder for this app alone: the output folder itself, unless the user set
    ``GRADIO_TEMP_DIR``. The sweeper deletes old files there, and Gradio's shared default
    (``$TMPDIR/gradio``) holds other Gradio apps' files too; and a PNG already in Gradio's cache is
    served as written, where one outside it is hashed and copied into it first."""
    if not environ.get("GRADIO_TEMP_DIR"):
        environ["GRADIO_TEMP_DIR"] = str(settings.output_dir)
    return Path(environ["GRADIO_TEMP_DIR"])


# The HTTP APIs' bodies: an image in base64 is 4/3 of its bytes (A1111's img2img: a picture and a
# mask; png-info: one picture), a multipart edit its bytes (a picture and a mask) and the fields.
_B64 = MAX_UPLOAD_BYTES * 4 // 3
PEER_BODY_CAPS = {  # (txt2img and img2img: one more picture, a ControlNet unit's map)
    f"{SDAPI}/txt2img": _B64 + 2**20,
    f"{SDAPI}/img2img": 3 * _B64 + 2**20,
    "/controlnet/detect": _B64 + 64 * 1024,
    f"{OPENAI}/generations": _B64 + 256 * 1024,  # a ControlNet's map in its extra body
    f"{SDAPI}/png-info": _B64 + 64 * 1024,
    f"{OPENAI}/edits": 2 * MAX_UPLOAD_BYTES + _B64 + 256 * 1024,
}


def peer_routes(adapter: Adapter, uploads: UploadBook | None = None, settings: Settings | None = None) -> list[Any]:
    """AUTOMATIC1111's ``/sdapi/v1`` and OpenAI's ``/v1/images``, sharing one book of jobs (``peer_api``),
    their inline pictures counted in the upload route's book (``uploads``); ``settings``: the flags
    ``cmd-flags`` lists."""
    jobs = PeerJobs()
    flags = public_flags(settings) if settings is not None else {}
    return [*SdApi(adapter, jobs, uploads, flags).routes(), *OpenAIImages(adapter, jobs, uploads).routes()]


SECRET_FLAGS = ("auth", "metrics_token", "output_key")


def public_flags(settings: Settings) -> dict[str, Any]:
    """The app's flags and their values as AUTOMATIC1111's ``cmd-flags`` lists its own: every flag but
    the secrets (``SECRET_FLAGS``: set or not, never the value); a path by its last part (no place on
    the disk is named to clients); the rest as JSON takes it."""
    out: dict[str, Any] = {}
    for name, value in vars(settings).items():
        if name in SECRET_FLAGS:
            out[name] = value is not None
        elif isinstance(value, Path) or (isinstance(value, str) and value.startswith("/")):
            out[name] = Path(value).name
        elif isinstance(value, tuple):  # --lora NAME=PATH: the names
            out[name] = [str(item).split("=", 1)[0] for item in value]
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[name] = value
        else:
            out[name] = str(value)
    return out


def front_door(demo: gr.Blocks, settings: Settings) -> DoorConfig:
    """The front door's configuration for ``demo`` (its events' inputs, the settings' limits)."""
    site = site_of(demo)
    limits = DoorLimits(
        max_body_bytes=settings.max_body_kb * 1024,
        joins_per_second=settings.rate_limit,
        join_burst=max(10.0, 10 * settings.rate_limit),
        sessions_per_identity=settings.max_sessions_per_user,
        requests_per_identity=settings.max_connections_per_address,
    )
    login = Login(settings.auth_pair(), settings.metrics_token)
    uploads = UploadBook(upload_folder())  # Gradio's upload folder: it takes files only from there
    return DoorConfig(InputPolicy(demo), site.trusted, limits, login=login, calls=site.calls, uploads=uploads)


def launch(demo: gr.Blocks, adapter: Adapter, settings: Settings) -> DoorConfig:
    """Start serving in the background (the server runs on its own thread and event loop).

    Every request passes the front door (``frontdoor``) and, below it, uvicorn runs under the
    connection limits (``httplimits``); uvicorn's own ``X-Forwarded-For`` rewriting is off, as
    ``identity`` decides who a client is. Returns the front door's configuration (its books).
    """
    tune_queue(demo, PROGRESS_INTERVAL)
    skip_matplotlib_probe()
    door = front_door(demo, settings)
    if settings.mcp:
        call_back_as_internal(door.internal_secret)
    connections = ConnectionLimits(
        door.trusted,
        header_timeout=settings.request_timeout,
        body_timeout=3 * settings.request_timeout,
        max_body_bytes=door.max_body_bytes,
        body_caps={UPLOAD_PATH: UPLOAD_BODY_BYTES, **PEER_BODY_CAPS},
        connections_per_address=settings.max_connections_per_address,
    )
    app_kwargs = {
        "routes": [
            *service_routes(demo, adapter, door.login, door.uploads),
            *peer_routes(adapter, door.uploads, settings),
        ],
        "middleware": [Middleware(FrontDoor, door=door)],
    }
    with uvicorn_options(http=limited_protocol(connections), proxy_headers=False):
        demo.launch(
            server_name=settings.host,
            server_port=settings.port,
            share=settings.share,
            ssr_mode=False,
            css=PAGE_CSS,
            show_error=False,
            max_file_size=UPLOAD_BODY_BYTES,  # gradio_client checks it before it uploads
            prevent_thread_lock=True,
            app_kwargs=app_kwargs,
            auth=settings.auth_pair(),
            mcp_server=settings.mcp,
            enable_monitoring=False,
            blocked_paths=[str(settings.output_dir / KEY_FILE)],  # the owner folders' key (also refused at the door)
        )
    door.connections = connections
    return door


def shutdown(demo: gr.Blocks, adapter: Adapter, deadline: float = 8.0) -> None:
    """Stop admitting, answer the queued, stop the running job at its next step, then close.

    A plain ``demo.close()`` mid-job gives clients ``KeyError('unexpected_error')``; here every
    queued or running request is answered with "the server is shutting down, please retry" first.
    """
    end = time.monotonic() + deadline
    adapter.begin_shutdown()
    while time.monotonic() < end:
        if queued(demo) == 0 and adapter.in_flight == 0:
            break
        time.sleep(0.05)
    time.sleep(min(0.5, max(0.0, end - time.monotonic())))  # let the last error messages go out
    demo.close()
    adapter.shutdown_model(timeout=max(0.5, end - time.monotonic()))
    adapter.close()
