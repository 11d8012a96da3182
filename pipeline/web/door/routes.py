"""The app's own routes on Gradio's server: ``/health``, ``/metrics``, and the upload route.

Under ``--auth`` ``/health`` stays open (load balancers and Spaces probe it; it shows no user data)
and ``/metrics`` needs the same user and password (HTTP Basic, as Prometheus' ``basic_auth``) or
the ``--metrics-token`` as a bearer token (``login.Login``).
"""

from __future__ import annotations

import collections
import threading

import gradio as gr
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST

from ...serving.base import Adapter
from ..gradio_internals import queued
from .login import Login
from .upload_route import UPLOAD_PATH, UploadBook, upload_route


def service_routes(
    demo: gr.Blocks, adapter: Adapter, login: Login | None = None, uploads: UploadBook | None = None
) -> list[APIRoute]:
    """``/health`` (JSON) and ``/metrics`` (Prometheus text), served by the app's own server.

    The front door has already checked (and metered) the login of ``/metrics``; the route checks
    it again, so it stays closed whatever is in front of it.
    """
    login = login or Login(None)

    async def health() -> JSONResponse:
        body = adapter.health()
        body["queue_depth"] = body["gpu_queue_depth"] + queued(demo)
        return JSONResponse(body, status_code=503 if body["status"] in ("dead", "recovering") else 200)

    async def metrics(request: Request) -> Response:
        if not login.opens_metrics(request.headers.get("authorization") or ""):
            return Response("login required", status_code=401, headers={"WWW-Authenticate": 'Basic realm="metrics"'})
        return Response(adapter.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def no_uploads() -> JSONResponse:  # no book: nothing may be uploaded
        return JSONResponse({"detail": "This app accepts no uploads."}, status_code=403)

    # Gradio's own upload route would store anyone's file and echo its absolute server path; this
    # app's (``upload_route``) takes one image, kept as its sender's. Listed before Gradio's routes.
    upload = upload_route(uploads) if uploads is not None else no_uploads

    return [
        APIRoute("/health", health, methods=["GET"], include_in_schema=False),
        APIRoute("/metrics", metrics, methods=["GET"], include_in_schema=False),
        APIRoute(UPLOAD_PATH, upload, methods=["POST"], include_in_schema=False),
    ]


class RecentPreviews:
    """The latest previews' bytes by their file's path, so the front door answers the browser's GET
    of a preview from memory (``frontdoor``: no disk read on the event loop, none of Gradio's route
    stack); an older one, past ``keep``, is served from its file by Gradio as any file is.

    Owners: written by the postprocessing worker threads, read on the event loop (under the lock)."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._by_path: collections.OrderedDict[str, bytes] = collections.OrderedDict()

    def put(self, path: str, data: bytes) -> None:
        with self._lock:
            self._by_path[path] = data
            self._by_path.move_to_end(path)
            while len(self._by_path) > self.keep:
                self._by_path.popitem(last=False)

    def get(self, path: str) -> bytes | None:
        with self._lock:
            return self._by_path.get(path)


RECENT_PREVIEWS = RecentPreviews()
