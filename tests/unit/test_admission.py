"""The front door's books: a token bucket per identity, session ownership and caps, requests in flight."""

from __future__ import annotations

from pipeline.web.admission import InFlight, SessionBook, TokenBucket


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
