"""Rejection before the queue: Gradio's ``validator=`` answers a bad request at join time (through the
launched app: ``tests/server/test_validator_app.py``).

Without it a request that validation rejects waits for a handler slot (``--concurrency``) behind
the running jobs. The handler keeps its own validation as a backstop, with the same messages.
"""

from __future__ import annotations

import pytest

from pipeline.errors import InvalidRequest
from pipeline.request import FIELDS, Limits, validate
from pipeline.serving.metrics import Metrics
from pipeline.web.page.handler import make_validator
from tests.fakes import FAKE_PROFILE, FAKE_WIDTH_ERROR
from tests.helpers import raw_request


class _Adapter:
    """What the validator reads of an adapter: its limits and its metrics."""

    def __init__(self) -> None:
        self.limits = Limits.for_model(FAKE_PROFILE)
        self.metrics = Metrics(lambda: 0.0, lambda: 0.0)


def _rejected(adapter: _Adapter) -> float:
    value = adapter.metrics.registry.get_sample_value("jobs_total", {"outcome": "rejected"})
    assert value is not None
    return value


@pytest.mark.anyio
async def test_the_validator_gives_the_handlers_message_at_the_bad_field_only() -> None:
    adapter = _Adapter()
    check = make_validator(adapter)
    bad = {**raw_request(width=7), "live_preview": False}
    results = await check(*(bad[f] for f in FIELDS))
    with pytest.raises(InvalidRequest) as handler_error:
        validate(bad, adapter.limits)
    assert str(handler_error.value) == FAKE_WIDTH_ERROR
    assert [(r["is_valid"], r["message"]) for r in results] == [
        (f != "width", FAKE_WIDTH_ERROR if f == "width" else "") for f in FIELDS
    ]
    assert all(r["__type__"] == "validate" for r in results)
    assert _rejected(adapter) == 1

    good = {**raw_request(), "live_preview": False}
    assert all(r["is_valid"] for r in await check(*(good[f] for f in FIELDS)))
    assert _rejected(adapter) == 1


@pytest.mark.anyio
async def test_the_pages_validator_says_it_under_the_prompt_and_a_held_inputs_message_at_its_control() -> None:
    """The page's refusals are said under the prompt too (a control in a folded panel shows nothing), and
    a message about an input Generate's first step holds (hidden) at the control a person sees beside it."""
    from dataclasses import replace

    adapter = _Adapter()
    adapter.limits = replace(adapter.limits, controls=("shapes",), control_modes=("text",))
    check = make_validator(adapter, ui=True)
    bad = {**raw_request(width=7), "live_preview": False}
    said = {f: r["message"] for f, r in zip(FIELDS, await check(*(bad[f] for f in FIELDS))) if not r["is_valid"]}
    assert said == {"width": FAKE_WIDTH_ERROR, "prompt": FAKE_WIDTH_ERROR}
    no_map = {**raw_request(control="shapes"), "live_preview": False}
    said = {f: r["message"] for f, r in zip(FIELDS, await check(*(no_map[f] for f in FIELDS))) if not r["is_valid"]}
    assert set(said) == {"control", "prompt"} and "control 'shapes' needs a map" in said["control"], said
