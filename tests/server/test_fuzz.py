"""Fuzz /generate through raw HTTP (NaN, inf, wrong types, huge text) and through gradio_client.

Every case is answered with images or with a validation error that names the field; nothing
opaque, the server keeps serving, and no invalid case reaches the model (its calls are counted).
Invalid cases are refused when they join the queue (Gradio's ``validator=``): HTTP 422 naming the
parameter over raw HTTP, ``ValidationError`` in gradio_client; never by the handler's backstop.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.request import FIELDS
from tests.fakes import FakeModel
from tests.helpers import api_fn_index, queue_call, raw_request

# gradio_client's ValidationError: one refused parameter, and our message, which starts with its name.
REFUSED = re.compile(r"1 parameter\(s\) failed validation:\n- (\w+): (.*)", re.S)

weird_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, -3, 0.5, 1e308, 2**64, 63.9999, 64.0, 8, 1.5, True]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
weird_values = st.one_of(
    weird_numbers,
    st.none(),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.booleans(),
)
weird_text = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            "",
            " ",
            "<script>alert(1)</script>",
            "<img src=x onerror=alert(1)>",
            "\u202e\u0000x",
            "ð\U0001f600" * 50,
            "a" * 1_000_000,
            "word " * 400,
        ]
    ),
    weird_values,
)


def case() -> st.SearchStrategy[dict[str, Any]]:
    """A request with one to three fields replaced by something odd."""
    base = raw_request(num_inference_steps=2, live_preview=False)
    field_values = {f: (weird_text if f in ("prompt", "negative_prompt") else weird_values) for f in FIELDS}
    return st.dictionaries(st.sampled_from(FIELDS), st.just(None), min_size=1, max_size=3).flatmap(
        lambda picked: st.fixed_dictionaries({f: field_values[f] for f in picked}).map(lambda odd: {**base, **odd})
    )


@pytest.fixture(scope="module")
def url(fake: FakeModel, launch: Any) -> str:
    # Hundreds of calls from one client: the per-address rate (tests/server/test_hostile.py's business) is lifted.
    return str(launch("--model-side", "thread", "--rate-limit", "1000", load=lambda: fake, name="fuzz")[0])


def _check(answer_ok: bool, refused: tuple[str, str] | None, calls_before: int, fake: FakeModel) -> None:
    """``refused``: (the parameter Gradio's validator marked, its message), for a rejected request."""
    if answer_ok:
        assert len(fake.calls) == calls_before + 1
    else:
        assert refused is not None, "a request failed without a validation error"
        field, error = refused
        assert field in FIELDS and re.match(rf"{field}\b", error), f"opaque error: {refused!r}"
        assert "Traceback" not in error
        assert len(fake.calls) == calls_before, "an invalid request reached the model"


def _refused_at_join(message: dict[str, Any]) -> tuple[str, str]:
    """The one refused parameter of a join that Gradio's validator answered with 422."""
    assert message.get("status_code") == 422, f"not refused by the validator: {message!r}"
    detail = json.loads(message["output"]["error"])["detail"]
    refused = [(d["parameter_name"], d["message"]) for d in detail if not d["is_valid"]]
    assert len(refused) == 1, detail
    return refused[0]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=case())
def test_raw_http_fuzz(url: str, fake: FakeModel, request: dict[str, Any]) -> None:
    before = len(fake.calls)
    message = queue_call(url, api_fn_index(url), [request[f] for f in FIELDS])
    if len(json.dumps([request[f] for f in FIELDS])) > 1024 * 1024:  # two megabyte prompts: over the body cap
        assert message.get("status_code") == 413 and len(fake.calls) == before, message
        return
    if message.get("success"):
        gallery, info = message["output"]["data"]
        assert info["status"] == "done" and len(gallery) == info["num_images"]
        _check(True, None, before, fake)
    else:
        _check(False, _refused_at_join(message), before, fake)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=case())
def test_gradio_client_fuzz(url: str, fake: FakeModel, client_cache: dict[str, Any], request: dict[str, Any]) -> None:
    from gradio_client.exceptions import ValidationError

    if any(isinstance(v, float) and not math.isfinite(v) for v in request.values()):
        request = {k: (0 if isinstance(v, float) and not math.isfinite(v) else v) for k, v in request.items()}
    client = client_cache.setdefault(url, _client(url))
    before = len(fake.calls)
    try:
        gallery, info = client.predict(**request, api_name="/generate")
    except ValidationError as exc:
        shown = REFUSED.fullmatch(str(exc))
        assert shown is not None, f"not one refused parameter: {exc}"
        _check(False, (shown.group(1), shown.group(2)), before, fake)
    else:
        assert info["status"] == "done" and len(gallery) == info["num_images"]
        _check(True, None, before, fake)


def test_the_server_still_serves_after_the_fuzz(url: str, fake: FakeModel) -> None:
    message = queue_call(url, api_fn_index(url), [raw_request()[f] if f != "live_preview" else False for f in FIELDS])
    assert message["success"] is True


@pytest.fixture(scope="module")
def client_cache() -> dict[str, Any]:
    return {}


def _client(url: str) -> Any:
    from gradio_client import Client

    return Client(url, verbose=False)
