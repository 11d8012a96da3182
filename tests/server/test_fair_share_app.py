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


def _loop_app(tmp_path: Any, cap: int) -> Any:
    """The launched app at the default ``--concurrency`` with step-level joining on a fake loop of 50 ms
    steps, two images a loop (a loop of 8 steps, 0.4 s, outlasts a loaded machine's submit: 20 ms steps
    let a client's own send latency span two loops, which the count from the send then blamed on the line)."""
    model = FakeModel(joining=True, step_seconds=0.05)
    args = ("--max-waiting-per-user", str(cap), "--max-batch-size", "2")
    return model, running_app(tmp_path, *args, load=lambda: model)


def _submit_counted(model: FakeModel, client: Any, data: dict[str, Any]) -> tuple[Any, list[int]]:
    """Submit ``data``, noting how many jobs the model had started when it was sent: its wait is counted
    from the client's send, so a wait in Gradio's queue in front of the app's line counts too."""
    arrived = [len(model.calls)]
    return client.submit(**data, api_name="/generate"), arrived


def _started_between(model: FakeModel, arrived: list[int], prompt: str) -> list[str]:
    """The jobs the model started after ``prompt``'s request arrived and before it started."""
    order = [job.prompts[0] for job in model.calls]
    assert arrived, f"{prompt} never reached the scheduler"
    return order[arrived[0] : order.index(prompt)]


def test_a_request_that_cannot_join_waits_one_loop_behind_a_single_users_long_backlog(tmp_path: Any) -> None:
    """Issues 37 and 47, at the default ``--concurrency`` (8 handler slots once, so 12 of the backlog
    waited in Gradio's arrival-order queue): one user queues 20 requests that share a loop; another
    user's request of another size cannot join it, counted from its send. It waits only for the loop's members when it arrived and the joiners already
    sent a step early for their places (at most one per member: 2), never for the backlog behind
    them, however long it is (the bound allows one more, for a joiner sent as it arrived)."""
    from gradio_client import Client

    model, app = _loop_app(tmp_path, cap=30)
    with app as (url, _demo, _adapter):
        heavy = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.1"})
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.2"})
        data = {**raw_request(), "num_inference_steps": 8}
        backlog = [heavy.submit(**{**data, "prompt": f"h{i}"}, api_name="/generate") for i in range(20)]
        wait_for(lambda: len(model.calls) >= 3, "a loop runs, a backlog waits")
        alone, arrived = _submit_counted(model, other, {**data, "prompt": "o", "width": 128, "height": 128})
        alone.result(timeout=120)
        for job in backlog:
            job.result(timeout=120)
    overtook = _started_between(model, arrived, "o")
    assert len(overtook) <= 3, f"{len(overtook)} of the backlog ran first: {overtook}"
    assert len(model.calls) == 21


USERS = 6


def test_a_request_that_cannot_join_waits_one_loop_behind_users_who_keep_the_loop_full(tmp_path: Any) -> None:
    """Six users each keep their waiting cap (3) full of requests that share a loop, resubmitting as
    each ends (18 requests against the default ``--concurrency`` of 8, which Gradio's queue once held
    in arrival order); a fifth user's request of
    another size waits one loop's worth (a loop is two of their requests: at most 1.5 loops), not a
    round of theirs, counted from its send."""
    import threading

    from gradio_client import Client

    model, app = _loop_app(tmp_path, cap=3)
    with app as (url, _demo, adapter):
        data = {**raw_request(), "num_inference_steps": 8}
        done = threading.Event()
        count = [0] * USERS

        def keep_full(user: int) -> None:
            client = Client(url, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{10 + user}"})
            sent = [client.submit(**{**data, "prompt": f"u{user}-{i}"}, api_name="/generate") for i in range(3)]
            count[user] = len(sent)
            while not done.is_set():
                sent.pop(0).result(timeout=120)
                sent.append(client.submit(**{**data, "prompt": f"u{user}-{count[user]}"}, api_name="/generate"))
                count[user] += 1
            for job in sent:
                job.result(timeout=120)

        users = [threading.Thread(target=keep_full, args=(u,), name=f"user-{u}") for u in range(USERS)]
        for thread in users:
            thread.start()
        wait_for(lambda: len(model.calls) >= 8 and adapter.gpu_queue_depth >= 6, "the users keep the loop full")
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.99"})
        alone, arrived = _submit_counted(model, other, {**data, "prompt": "o", "width": 128, "height": 128})
        alone.result(timeout=120)
        done.set()
        for thread in users:
            thread.join(timeout=120)
    overtook = _started_between(model, arrived, "o")
    assert len(overtook) <= 3, f"{len(overtook)} of the others' requests ran first: {overtook}"
