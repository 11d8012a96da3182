from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers import raw_request, running_app
from tests.fakes import FakeModel

pytestmark = pytest.mark.server


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
