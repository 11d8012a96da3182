"""A fair share of the GPU for every user, through the launched app (the line's own rules, with a fake
model, are in ``tests/unit/test_fair_share.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeModel
from tests.helpers import raw_request, running_app, wait_for


def test_in_the_launched_app_two_forwarded_addresses_are_two_users(tmp_path: Any) -> None:
    """Through the real server and gradio_client: two clients behind a proxy (127.0.0.1, trusted by
    default) that forwards two addresses are two users, so one client's cap refuses its own third
    request at once and still lets the other client in, and the other client's request runs
    before the first client's second."""
    from gradio_client import Client

    model = FakeModel(hold=True)
    args = ("--max-waiting-per-user", "1", "--concurrency", "4", "--max-batch-size", "1")
    with running_app(tmp_path, *args, load=lambda: model) as (url, _demo, adapter):
        heavy = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.1"})
        light = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.2"})
        data = raw_request()
        h1 = heavy.submit(**{**data, "prompt": "h1"}, api_name="/generate")
        wait_for(lambda: model.active == 1, "h1 runs")
        h2 = heavy.submit(**{**data, "prompt": "h2"}, api_name="/generate")
        wait_for(lambda: adapter.gpu_queue_depth == 1, "h2 waits")
        with pytest.raises(Exception, match="You already have 1 request waiting"):
            heavy.submit(**{**data, "prompt": "h3"}, api_name="/generate").result(timeout=30)
        l1 = light.submit(**{**data, "prompt": "l1"}, api_name="/generate")
        wait_for(lambda: adapter.gpu_queue_depth == 2, "l1 waits beside h2")
        for _ in range(3):
            model.release.release()
        for job in (h1, h2, l1):
            job.result(timeout=30)
    assert [job.prompts[0] for job in model.calls] == ["h1", "l1", "h2"]
