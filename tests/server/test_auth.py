from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.fakes import FakeModel
from tests.helpers import raw_request, running_app


def test_auth_protects_the_app_and_the_api(tmp_path: Path) -> None:
    from gradio_client import Client

    model = FakeModel()
    with running_app(tmp_path, "--auth", "alice:s3cret", load=lambda: model) as (url, _demo, _adapter):
        assert httpx.get(url + "config", timeout=10).status_code == 401
        with pytest.raises(Exception):  # noqa: B017 - gradio_client raises a plain ValueError here
            Client(url, verbose=False)
        with pytest.raises(Exception):  # noqa: B017
            Client(url, verbose=False, auth=("alice", "wrong"))
        _, info = Client(url, verbose=False, auth=("alice", "s3cret")).predict(**raw_request(), api_name="/generate")
        assert info["status"] == "done" and len(model.calls) == 1
        # A program may send the login on every request instead (the front door turns it into Gradio's).
        bearer = Client(url, verbose=False, headers={"Authorization": "Bearer alice:s3cret"})
        assert bearer.predict(**raw_request(seed=2), api_name="/generate")[1]["status"] == "done"
        with pytest.raises(Exception):  # noqa: B017
            Client(url, verbose=False, headers={"Authorization": "Bearer alice:wrong"})


def test_under_auth_health_stays_open_and_metrics_needs_the_login_or_the_token(tmp_path: Path) -> None:
    with running_app(tmp_path, "--auth", "alice:s3cret", "--metrics-token", "scrape-me", load=FakeModel) as (
        url,
        _demo,
        _adapter,
    ):
        assert httpx.get(url + "health", timeout=10).json()["status"] == "ok"
        assert httpx.get(url + "metrics", timeout=10).status_code == 401
        assert httpx.get(url + "metrics", auth=("alice", "wrong"), timeout=10).status_code == 401
        assert "jobs_total" in httpx.get(url + "metrics", auth=("alice", "s3cret"), timeout=10).text
        bearer = {"Authorization": "Bearer scrape-me"}
        assert httpx.get(url + "metrics", headers=bearer, timeout=10).status_code == 200
        assert httpx.get(url + "metrics", headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401


def test_the_app_keeps_its_own_gradio_cache_unless_one_is_set(tmp_path: Path) -> None:
    """The sweeper deletes old files in Gradio's cache: never in the shared $TMPDIR/gradio of other apps."""
    from pipeline.config import Settings
    from pipeline.web.lifecycle import own_gradio_cache

    environ: dict[str, str] = {}
    path = own_gradio_cache(Settings(output_dir=tmp_path / "out"), environ)
    assert path == tmp_path / "out" and environ["GRADIO_TEMP_DIR"] == str(path)
    chosen = {"GRADIO_TEMP_DIR": "/srv/cache"}
    assert own_gradio_cache(Settings(output_dir=tmp_path / "out"), chosen) == Path("/srv/cache")


def test_a_png_written_in_gradios_cache_is_served_as_written(tmp_path: Path) -> None:
    """Encode once: with the output folder as Gradio's cache (the default), Gradio serves our file
    instead of hashing and copying it; with separate folders it makes a copy."""
    import os

    from tests.helpers import api_fn_index, queue_call

    raw = raw_request()
    from pipeline.request import FIELDS

    data = [raw.get(f, False) for f in FIELDS]  # the API's order (live_preview off)
    cache = os.environ["GRADIO_TEMP_DIR"]
    for output_dir, copied in ((cache, False), (str(tmp_path / "elsewhere"), True)):
        with running_app(tmp_path, "--output-dir", output_dir, load=FakeModel) as (url, _demo, _adapter):
            message = queue_call(url, api_fn_index(url), data)
            path = Path(message["output"]["data"][0][0]["image"]["path"])
            assert path.is_relative_to(cache)
            assert path.is_relative_to(output_dir) != copied, (path, output_dir)
