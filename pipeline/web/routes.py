"""The app's own routes on Gradio's server: ``/health``, ``/metrics``, and no uploads."""

from __future__ import annotations

import gradio as gr
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST

from ..serving.base import Adapter
from .gradio_internals import queued


def service_routes(demo: gr.Blocks, adapter: Adapter) -> list[APIRoute]:
    """``/health`` (JSON) and ``/metrics`` (Prometheus text), served by the app's own server."""

    async def health() -> JSONResponse:
        body = adapter.health()
        body["queue_depth"] = body["gpu_queue_depth"] + queued(demo)
        return JSONResponse(body, status_code=503 if body["status"] == "dead" else 200)

    async def metrics() -> Response:
        return Response(adapter.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def no_uploads() -> JSONResponse:
        # A text-only app takes no files; Gradio's upload route would store anyone's file and
        # echo its absolute server path. Listed before Gradio's own routes, so it wins.
        return JSONResponse({"detail": "This app accepts no uploads."}, status_code=403)

    return [
        APIRoute("/health", health, methods=["GET"], include_in_schema=False),
        APIRoute("/metrics", metrics, methods=["GET"], include_in_schema=False),
        APIRoute("/gradio_api/upload", no_uploads, methods=["POST"], include_in_schema=False),
    ]
