"""Live previews through the launched app: only to the caller who asked, sized for display, as JPEG.

Two callers share one job (lined up behind a held gate, so the batch is certain): one asks for live
previews, the other does not. The one who asked gets small JPEG previews (at most 256 px on the
longest side of a 512 px picture), a few a second at most; the other gets none, only its progress
records. Both get their final PNGs at full size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from pipeline.protocol import PREVIEW_MAX_SIDE
from tests.helpers import gate_held, raw_request, running_app, wait_for


def _previews(job: Any) -> list[Path]:
    return [Path(o[0][0]["image"]) for o in job.outputs() if o[1].get("status") == "running" and o[0]]


def test_previews_go_only_to_the_caller_who_asked_at_display_size_as_jpeg(tmp_path: Path) -> None:
    from gradio_client import Client

    with running_app(tmp_path, "--max-batch-size", "4", "--max-size", "512", "--max-pixel-steps", str(10**9)) as (
        url,
        _demo,
        adapter,
    ):
        client = Client(url, verbose=False, download_files=str(tmp_path / "dl"))
        common = dict(width=384, height=256, num_inference_steps=8, guidance_scale=4.0)
        client.predict(**raw_request(width=64, height=64, num_inference_steps=1), api_name="/generate")
        with gate_held(adapter):
            asked = client.submit(**raw_request(seed=1, live_preview=True, **common), api_name="/generate")
            silent = client.submit(**raw_request(seed=2, live_preview=False, **common), api_name="/generate")
            wait_for(lambda: adapter.gpu_queue_depth == 2, "both wait at the gate", timeout=60)
        (gallery, info), (other, other_info) = asked.result(timeout=300), silent.result(timeout=300)
        assert info["batch_requests"] == other_info["batch_requests"] == 2, (info, other_info)
        shown = _previews(asked)
        assert shown, "the caller who asked got no preview"
        for path in shown:
            with Image.open(path) as preview:
                assert preview.format == "JPEG" and max(preview.size) <= PREVIEW_MAX_SIDE, (
                    preview.format,
                    preview.size,
                )
                assert preview.size == (256, 171)  # the picture's aspect, at display size
        # The browser's GET of a preview is answered from memory by the front door (its own headers),
        # with the bytes gradio_client downloaded.
        import httpx

        from pipeline.web.door.routes import RECENT_PREVIEWS

        path = next(p for p in reversed(RECENT_PREVIEWS._by_path) if RECENT_PREVIEWS.get(p) == shown[-1].read_bytes())
        got = httpx.get(f"{url}gradio_api/file={path}")
        assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
        assert got.headers["cache-control"] == "private, max-age=3600" and got.content == shown[-1].read_bytes()
        assert _previews(silent) == [], "a caller who did not ask was sent previews"
        assert any(o[1].get("status") == "running" for o in silent.outputs())  # its progress still came
        for result in (gallery, other):
            with Image.open(result[0]["image"]) as final:
                assert final.format == "PNG" and final.size == (384, 256)


def test_an_sdxl_in_float16_whose_vae_overflows_shows_previews_through_the_app(tmp_path: Path) -> None:
    """Issue 36 §2, through the launched app: the SDXL VAE overflows float16 (``tests.half``); the
    preview map is fitted in float32, so the page's caller sees previews, and /health says they are on."""
    import shutil

    import httpx
    from gradio_client import Client

    from tests.half import hot_sdxl

    folder = hot_sdxl()
    try:
        with running_app(tmp_path, "--model", str(folder), "--dtype", "float16", "--device", "cpu") as (url, _d, a):
            assert a.profile.dtype == "float16" and httpx.get(url + "health", timeout=10).json()["previews"] == "on"
            client = Client(url, verbose=False, download_files=str(tmp_path / "dl"))
            job = client.submit(
                **raw_request(live_preview=True, num_inference_steps=8, width=64, height=64), api_name="/generate"
            )
            gallery, _info = job.result(timeout=300)
            shown = _previews(job)
            assert shown, "no preview in float16"
            with Image.open(shown[-1]) as preview, Image.open(gallery[0]["image"]) as final:
                assert preview.format == "JPEG" and final.size == (64, 64)
                assert preview.getextrema() != ((0, 0), (0, 0), (0, 0))  # not the black of a NaN map
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
