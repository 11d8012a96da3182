"""The front door's books: a token bucket per identity, session ownership and caps, requests in flight,
failed logins, events' owners; the login's checks and the JSON depth limit."""

from __future__ import annotations

import base64

import pytest

from pipeline.web.door.admission import EventBook, InFlight, LoginMeter, SessionBook, TokenBucket
from pipeline.web.door.asgi import MAX_JSON_DEPTH, too_deep
from pipeline.web.door.login import Login, presents_credential


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_lets_a_burst_through_then_one_per_refill_and_each_identity_has_its_own() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2, burst=3, clock=clock)
    assert [bucket.take("a") for _ in range(3)] == [0, 0, 0]
    assert bucket.take("a") == 0.5  # the seconds until the next token
    assert bucket.take("b") == 0  # another identity is untouched
    clock.now = 0.5
    assert bucket.take("a") == 0 and bucket.take("a") > 0
    clock.now = 100
    assert [bucket.take("a") for _ in range(4)][-1] > 0  # saved up to the burst, never more


def test_a_session_belongs_to_its_first_identity_and_each_identity_keeps_a_few_open() -> None:
    clock = Clock()
    book = SessionBook(per_identity=2, idle=60, clock=clock)
    assert book.claim("a", "s1") is None and book.claim("a", "s1") is None
    assert book.claim("b", "s1") == "foreign"
    assert book.claim("a", "s2") is None
    assert book.claim("a", "s3") == "too many"
    assert book.claim("b", "s3") is None  # another identity's sessions do not count
    clock.now = 61  # every session went unseen for the idle time: none is open any more
    assert book.open_sessions("a") == 0 and book.claim("a", "s4") is None and book.claim("a", "s3") is None
    book2 = SessionBook(per_identity=1, idle=60, clock=clock)
    assert book2.claim("a", "x") is None
    clock.now += 61
    assert book2.claim("b", "x") is None  # an idle session may be taken over
    assert book2.owner("x") == "b" and book2.open_sessions("a") == 0


def test_a_released_session_no_longer_counts() -> None:
    book = SessionBook(per_identity=1)
    assert book.claim("a", "s1") is None and book.claim("a", "s2") == "too many"
    book.release("a", "s1")
    assert book.claim("a", "s2") is None and book.owner("s1") is None
    book.release("b", "s2")  # not b's: nothing happens
    assert book.owner("s2") == "a"


def test_requests_in_flight_are_capped_per_identity() -> None:
    flight = InFlight(per_identity=2)
    assert flight.enter("a") and flight.enter("a") and not flight.enter("a")
    assert flight.enter("b")
    flight.leave("a")
    assert flight.enter("a") and flight.open == {"a": 2, "b": 1}
    for _ in range(2):
        flight.leave("a")
    assert "a" not in flight.open


def test_failed_logins_have_a_budget_then_a_growing_backoff_and_one_line_when_it_starts() -> None:
    clock = Clock()
    entered: list[tuple[str, float]] = []
    meter = LoginMeter(budget=3, refill=0.5, cap=30, clock=clock, on_backoff=lambda k, s: entered.append((k, s)))
    for _ in range(2):
        assert meter.wait("a") == 0
        meter.failed("a")
    assert meter.wait("a") == 0 and entered == []
    meter.failed("a")  # the budget is spent: back off until a try has refilled
    assert meter.wait("a") == 2.0 and entered == [("a", 2.0)]
    assert meter.wait("b") == 0  # another identity is untouched
    waits = []
    for _ in range(6):  # failing on at each end of backoff: the backoff doubles, up to the cap
        clock.now += meter.wait("a")
        meter.failed("a")
        waits.append(meter.wait("a"))
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0] and len(entered) == 1  # one line per episode
    clock.now += 1000  # quiet long enough to refill the whole budget: a new episode
    meter.failed("a")
    assert meter.wait("a") == 0


def test_the_login_checks_basic_and_bearer_and_the_metrics_token_only_opens_metrics() -> None:
    login = Login(("ann", "s3cret"), metrics_token="scrape")
    basic = "Basic " + base64.b64encode(b"ann:s3cret").decode()
    assert login.user_of(basic) == "ann" and login.user_of("Bearer ann:s3cret") == "ann"
    for wrong in ("Basic " + base64.b64encode(b"ann:nope").decode(), "Bearer ann:nope", "Basic !!", "Bearer scrape"):
        assert login.user_of(wrong) is None and presents_credential(wrong)
    assert login.opens_metrics("Bearer scrape") and login.opens_metrics(basic) and not login.opens_metrics("Bearer x")
    assert not presents_credential("") and not presents_credential("Negotiate abc")
    assert Login(None).user_of(basic) is None and Login(None).opens_metrics("")


def test_an_event_answers_only_the_identity_that_created_it() -> None:
    book = EventBook()
    book.add("e1", "addr:198.51.100.1")
    assert book.owned_by("e1", "addr:198.51.100.1") and book.known("e1")
    assert not book.owned_by("e1", "addr:198.51.100.2") and not book.owned_by("e2", "addr:198.51.100.1")


@pytest.mark.parametrize(
    ("body", "deep"),
    [
        (b"[" * 200_000, True),
        (b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, False),
        (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), True),
        (b'{"a":' * 65 + b"1" + b"}" * 65, True),
        (b'{"data": ["' + b"[" * 10_000 + b'"], "fn_index": 1}', False),  # brackets in a string are text
        (b'{"data": ["\\"[[[[' + b"[" * 100 + b'"]}', False),  # an escaped quote does not end the string
        (b"[]" * 100_000, False),
    ],
)
def test_json_nested_past_the_limit_is_found_without_a_parser(body: bytes, deep: bool) -> None:
    assert too_deep(body) is deep
