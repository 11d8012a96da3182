"""Hostile clients, round three (issue 46), in process: each defence on its own.

Every check a client's text meets is linear and bounded at the body cap; every decoder is bounded
by its work before it runs; client pictures are decoded after the request's gates, on threads of
their own, one request at a time per identity; the quota counts work; an API success is a success.
The same attacks through the launched app: ``tests/server/test_hostile_round_three.py``.

The time bounds below are generous (a second or less at a megabyte) where the quadratic versions
they replace take minutes to hours at the same size: they can fail only on a pattern that is not
linear, not on a slow machine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import threading
import time
import tracemalloc
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from pipeline.errors import InvalidRequest, QuotaExceeded, TooManyWaiting
from pipeline.loras import strip_tags
from pipeline.request import Limits
from pipeline.serving.decoding import Decoder
from pipeline.serving.quota import ImageQuota
from pipeline.uploads import MaskUpload, png_text, read_image, read_mask
from pipeline.web.apis import a1111
from pipeline.web.apis.openai_images import openai_raw
from pipeline.web.apis.sdapi_fields import a1111_raw
from pipeline.web.door import asgi
from pipeline.web.door.identity import Caller
from tests import malformed
from tests.fakes import FAKE_PROFILE, FakeModel
from tests.helpers import collect, raw_request, wait_until

BODY_CAP = 2**20  # the front door's JSON body cap (--max-body-kb 1024)
LIMITS = Limits.for_model(FAKE_PROFILE, max_pixel_steps=10**9)


def seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- 1. nothing on the event loop grows faster than its input --------------------------------------
def at_sizes(build: Callable[[int], Any], check: Callable[[Any], Any]) -> None:
    """``check`` is fast on ``build(n)`` at 32 KiB, then at the body cap: a quadratic check fails at the
    first size in seconds rather than running for hours at the second."""
    for n in (32 * 1024, BODY_CAP):
        value = build(n)
        took = seconds(lambda: check(value))
        assert took < 0.5, f"{took:.2f} s at {n} bytes"


@pytest.mark.parametrize(
    "build",
    [
        lambda n: b"[" * 65 + b'"' + b'\\"' * (n // 2),  # the attack: brackets, then an unclosed string of \"
        lambda n: b"[" * 65 + b'"' + b'\\"' * (n // 2 - 1) + b"\\",  # ... ending in a lone backslash
        lambda n: b"[" * (n // 2) + b"]" * (n // 2),  # nesting to the cap
        lambda n: b'[""' + b',""' * (n // 3) + b"]" + b"[" * 70,  # a megabyte of strings
        lambda n: b"[" * 65 + b"\\" * n,  # backslashes outside any string
    ],
    ids=["unclosed-escapes", "unclosed-escapes-backslash", "deep", "many-strings", "backslashes"],
)
def test_the_json_depth_check_is_linear_at_the_body_cap(build: Callable[[int], bytes]) -> None:
    at_sizes(build, asgi.too_deep)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:\n', max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=4), inner),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=6))
def test_the_depth_check_reads_json_as_a_parser_does(value: Any, limit: int) -> None:
    """Strings full of brackets, quotes and escapes do not count; real nesting does, exactly."""
    body = json.dumps(value).encode()
    assert asgi.too_deep(body, limit) == (_depth(value) > limit)


@pytest.mark.parametrize(
    "build",
    [
        lambda n: "<lora:a:" + "0" * n,  # the attack: a digit run with no end to the tag
        lambda n: "<lora:a:" + "0" * n + ">",
        lambda n: "<lora:" + "a" * n,  # a name with no colon
        lambda n: "<lora:" * (n // 6),
        lambda n: "a" + " " * n + ",",  # the comma tidy over a run of spaces
        lambda n: ", " * (n // 2),
    ],
    ids=["digits", "digits-closed", "name", "openers", "spaces", "commas"],
)
def test_the_lora_tag_and_the_comma_tidy_are_linear_at_the_body_cap(build: Callable[[int], str]) -> None:
    at_sizes(build, strip_tags)


def test_the_tag_still_reads_every_scale_a1111_writes() -> None:
    assert strip_tags("a cat, <lora:ink:0.8>, b")[1] == [("ink", 0.8)]
    assert strip_tags("<LORA:ink:.5> <lora:x:-1> <lora:y>")[1] == [("ink", 0.5), ("x", -1.0), ("y", 1.0)]
    assert strip_tags("<lora:a:1.>")[1] == []  # not A1111's number: left as text, as before


def test_the_prompt_length_is_checked_before_any_pattern_reads_it() -> None:
    body = {"prompt": "<lora:a:" + "0" * BODY_CAP}
    start = time.perf_counter()
    with pytest.raises(InvalidRequest, match=r"^prompt must be text of at most 2000 characters") as refused:
        a1111_raw(body, FAKE_PROFILE, LIMITS, img2img=False)
    assert time.perf_counter() - start < 0.1 and refused.value.field == "prompt"


def test_the_paste_box_reads_its_cap_of_tags_and_spaces_at_once() -> None:
    text = ("<lora:a:" + "0" * 2000 + " " * 2000 + ",") * 2 + "\nSteps: 20, Sampler: Euler, CFG scale: 7, Seed: 1"
    assert seconds(lambda: a1111.fill_from(a1111.parse_parameters(text), LIMITS)) < 0.5


@pytest.mark.parametrize(
    ("size", "words"),
    [
        ("1" * 5000 + "x64", "size must be"),
        ("１２８x１２８", "size must be"),
        ("６4x64", "size must be"),
        ("²x64", "size must be"),
    ],
    ids=["5000-digits", "full-width", "mixed", "superscript"],
)
def test_openai_sizes_are_ascii_digits_and_refused_by_name(size: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as refused:
        openai_raw({"prompt": "a cat", "size": size}, FAKE_PROFILE, LIMITS, edit=False)
    assert refused.value.field == "size"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "a", "width": 0, "enable_hr": True, "hr_resize_x": 128}, "width"),
        ({"prompt": "a", "height": 0, "enable_hr": True, "hr_resize_y": 128}, "height"),
        ({"prompt": "a", "init_images": ["aGk="], "mask": "aGk=", "inpainting_fill": []}, "inpainting_fill"),
        ({"prompt": "a", "init_images": ["aGk="], "mask": "aGk=", "inpainting_fill": {}}, "inpainting_fill"),
        (
            {"prompt": "a", "init_images": ["aGk="], "mask": "aGk=", "inpainting_mask_invert": []},
            "inpainting_mask_invert",
        ),
    ],
)
def test_what_was_a_500_is_a_refusal_naming_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        a1111_raw(body, FAKE_PROFILE, LIMITS, img2img="init_images" in body)
    assert refused.value.field == field, refused.value


# -- 2. every decoder bounded by its work ------------------------------------------------------------
@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads on which Pillow decoded pixels (``ImageFile.load``), in order."""
    from PIL import ImageFile

    seen: list[str] = []
    original = ImageFile.ImageFile.load

    def load(self: Any) -> Any:
        seen.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


def test_png_text_comes_from_the_chunks_without_composing_a_frame(decodes: list[str]) -> None:
    apng = malformed.animated_png(frames=5_000, text="a cat\nSteps: 20, Seed: 1")
    assert seconds(lambda: png_text(apng)) < 0.5
    assert png_text(apng) == {"parameters": "a cat\nSteps: 20, Seed: 1"} and decodes == []
    with pytest.raises(ValueError, match="more than 16384 chunks"):
        png_text(malformed.animated_png(frames=100_000, text="x"))
    assert seconds(lambda: read_image(apng, "image")) < 0.5  # an image input: its first frame only


@pytest.mark.parametrize("name", ["APNG of 100,000 frames", "JPEG of 100,000 scans"])
def test_the_work_bombs_are_refused_from_their_bytes_before_any_pixel(name: str, decodes: list[str]) -> None:
    build, word = malformed.REFUSED[name]
    data = build()
    for field in ("image", "mask"):
        start = time.perf_counter()
        with pytest.raises(InvalidRequest, match=word) as refused:
            read_mask(data, (64, 64), 0) if field == "mask" else read_image(data, field)
        assert refused.value.field == field and time.perf_counter() - start < 0.5
    assert decodes == []


def test_a_real_progressive_jpeg_and_an_animation_are_still_read() -> None:
    out = io.BytesIO()
    malformed.noisy(96, 64).save(out, "JPEG", progressive=True, quality=90)
    assert read_image(out.getvalue(), "image").size == (96, 64)
    assert read_image(malformed.animated_png(frames=20), "image").size == (256, 256)


def test_a_mask_is_made_without_an_eight_byte_copy_per_pixel() -> None:
    """A 4096 x 4096 mask (the pixel cap) through every convention: at most a few one-byte copies
    (the int64 intermediate of ``marked * 255`` alone was 134 MB)."""
    side = 4096
    layer = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    layer.paste((255, 255, 255, 255), (0, 0, side // 2, side // 2))
    out = io.BytesIO()
    layer.save(out, "PNG", compress_level=1)
    data = out.getvalue()
    # the painted corner: redrawn as painted; kept under OpenAI's rule (its transparent rest is
    # redrawn) and under A1111's invert
    conventions = [
        (data, True),
        (MaskUpload(data, transparent_edits=True), False),
        (MaskUpload(data, invert=True), False),
    ]
    for upload, corner_redrawn in conventions:
        tracemalloc.start()
        try:
            mask = read_mask(upload, (side, side), 0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 80 * 2**20, f"{peak / 2**20:.0f} MiB"
        pixels = np.asarray(mask)
        assert (pixels[0, 0] == 255) == corner_redrawn and (pixels[-1, -1] == 255) != corner_redrawn


# -- 3. gates before work, and the decode threads ---------------------------------------------------
@pytest.mark.anyio
async def test_each_identity_decodes_one_request_at_a_time_on_threads_of_their_own() -> None:
    decoder = Decoder(threads=2)
    hold, entered = threading.Event(), threading.Semaphore(0)
    names: list[str] = []

    def slow(tag: str) -> str:
        names.append(threading.current_thread().name)
        entered.release()
        assert hold.wait(10)
        return tag

    try:
        first = asyncio.create_task(decoder.run("mallory", slow, "m1"))
        second = asyncio.create_task(decoder.run("mallory", slow, "m2"))
        third = asyncio.create_task(decoder.run("alice", slow, "a1"))
        await wait_until(lambda: decoder.active == 2, "two decodes run")
        assert len(names) == 2 and not second.done()  # mallory's second waits for its turn; alice's runs
        await asyncio.to_thread(entered.acquire)
        await asyncio.to_thread(entered.acquire)
        # a cancelled decode keeps its identity's turn until its thread is done
        first.cancel()
        await asyncio.sleep(0.05)
        assert decoder.active == 2 and len(names) == 2
        hold.set()
        assert await second == "m2" and await third == "a1"
        assert all(name.startswith("decode") for name in names)
    finally:
        hold.set()
        decoder.close()


@pytest.mark.anyio
async def test_the_quota_and_the_waiting_cap_answer_before_any_picture_is_decoded(
    make_adapter: Any, decodes: list[str]
) -> None:
    adapter, model = make_adapter(FakeModel(step_gate=threading.Semaphore(0)), max_batch_size=1,
                                  max_waiting_per_user=2)  # fmt: skip
    picture = malformed.png_bytes(malformed.noisy(64, 64))
    bad = raw_request(mode="image", image=malformed.corrupt_png(), strength=0.5)  # decoded: "damaged"
    adapter.quota = ImageQuota(2)
    with pytest.raises(InvalidRequest, match="damaged"):
        await collect(adapter, bad, user="mallory")  # decoded (the quota had room): refused, given back
    assert adapter.quota.used("mallory") == 0
    adapter.quota.take("mallory", 2)
    with pytest.raises(QuotaExceeded):
        await collect(adapter, bad, user="mallory")  # past the quota: nothing decoded
    adapter.quota = None
    decoded = len(decodes)
    running = [asyncio.create_task(collect(adapter, raw_request(), user="mallory")) for _ in range(3)]
    await wait_until(lambda: model.active == 1 and adapter.gpu_queue_depth == 2, "one runs, two wait")
    with pytest.raises(TooManyWaiting):
        await collect(adapter, bad, user="mallory")  # at the cap: nothing decoded
    assert len(decodes) == decoded
    good = asyncio.create_task(collect(adapter, raw_request(mode="image", image=picture, strength=0.5), user="alice"))
    await wait_until(lambda: adapter.gpu_queue_depth == 3, "alice's picture decoded and in line")
    assert decodes[-1].startswith("decode")  # on a decode thread: not the pool that encodes results
    for _ in range(64):
        model.step_gate.release()
    await asyncio.gather(*running, good)
    assert good.result()[-1].kind == "done"


def test_a_pictures_header_is_held_to_what_the_cost_budget_leaves(decodes: list[str]) -> None:
    from pipeline.request import validate

    tight = dataclasses.replace(LIMITS, max_pixel_steps=64 * 64 * 2 + 100)
    raw = raw_request(mode="image", image=malformed.png_bytes(malformed.noisy(64, 64)), strength=0.5,
                      num_inference_steps=4)  # fmt: skip
    with pytest.raises(InvalidRequest, match=r"^image: 64 x 64 is 4096 pixels; at most 100 .*cost budget"):
        validate(raw, tight)
    assert decodes == []


@pytest.mark.anyio
async def test_large_bodies_take_turns_one_per_identity_and_two_in_all() -> None:
    from pipeline.web.door.admission import LargeBodies

    bodies = LargeBodies(at_once=2)
    first = await bodies.take("mallory")
    second = asyncio.create_task(bodies.take("mallory"))  # mallory's next waits for her first
    alice = await asyncio.wait_for(bodies.take("alice"), 1)  # another identity is not held by her
    bob = asyncio.create_task(bodies.take("bob"))  # two in all are being read: bob waits
    await asyncio.sleep(0.01)
    assert not second.done() and not bob.done()
    first()
    first()  # giving back twice gives back once
    await asyncio.sleep(0.01)
    assert not second.done() and bob.done()  # the free one went to bob, first in line for it
    alice()
    (await asyncio.wait_for(second, 1))()
    bob.result()()
    assert not bodies.turns  # nothing kept of anyone once their bodies are read
    x, y = await bodies.take("x"), await bodies.take("y")
    waiting = asyncio.create_task(bodies.take("carol"))
    await asyncio.sleep(0.01)
    waiting.cancel()  # a client gone while waiting leaves no trace
    with pytest.raises(asyncio.CancelledError):
        await waiting
    x()
    y()
    assert not bodies.turns
    (await asyncio.wait_for(bodies.take("carol"), 1))()  # and its slot was not lost


def test_a_body_is_large_by_its_length_or_when_chunked_and_a_bodiless_post_never_waits() -> None:
    from pipeline.web.door.frontdoor import LARGE_BODY, declared_length

    assert declared_length([("content-length", str(2 * LARGE_BODY))]) > LARGE_BODY
    assert declared_length([("content-length", "12")]) == 12
    assert declared_length([("transfer-encoding", "chunked")]) > LARGE_BODY  # any size up to the route's cap
    assert (
        declared_length([]) == 0 and declared_length([("content-length", "1e9")]) == 0
    )  # an interrupt waits for no turn


# -- 4. a quota of work, counted under the account -------------------------------------------------
def test_a_login_is_one_account_wherever_it_connects_from_and_ipv6_is_charged_by_its_56() -> None:
    logins = {Caller(f"127.0.0.{k}", login="ann") for k in range(2, 8)}
    assert len({c.key for c in logins}) == 6 and {c.account for c in logins} == {"user:ann"}
    one, other = Caller("2001:db8:0:ff01::1"), Caller("2001:db8:0:ff7e::9")  # two /64s of one /56
    assert one.key != other.key and one.account == other.account == "addr:2001:db8:0:ff00::/56"
    assert Caller("2001:db8:0:1ff::1").account != one.account  # another /56
    assert Caller("203.0.113.9").account == "addr:203.0.113.9"


@pytest.mark.anyio
async def test_an_api_caller_that_returns_at_its_images_is_counted_completed(make_adapter: Any) -> None:
    """The HTTP APIs read to the done output and return (``peer_api.run_request``): a success, which
    resets /health's count of failures in a row; only a leave before the images is a cancel."""
    adapter, _model = make_adapter(FakeModel())
    adapter.consecutive_failures = 5
    events = adapter.run(raw_request(), user="api")
    async for event in events:
        if event.kind == "done":
            break
    await events.aclose()
    assert adapter.metrics.jobs.labels("completed")._value.get() == 1
    assert adapter.metrics.jobs.labels("cancelled")._value.get() == 0
    assert adapter.consecutive_failures == 0 and adapter.health()["status"] == "ok"
