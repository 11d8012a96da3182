"""The one scheduler on its own (issue 37): its decisions from its state, with no adapter, thread or
model. ``Scheduler.schedule`` opens a batch only with the gate free, lets the longest run from the
head of the fair order join a running loop (an entry that cannot join holds back those behind it),
sends a joiner a step early naming the entries it replaces, keeps each LoRA at one scale and the
loop within the device's measured memory; ``plan_until`` forms the same batches for the ETA."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.protocol import InferenceResult, StopSignal
from pipeline.request import Limits, validate
from pipeline.serving.scheduler import Entry, MemoryRoom, Scheduler, WaitLine, looping
from tests.fakes import FAKE_PROFILE
from tests.helpers import raw_request

LIMITS = Limits.for_model(dataclasses.replace(FAKE_PROFILE, loras=()), max_pixel_steps=10**9)


def _entry(rid: str, user: str, **raw: Any) -> Entry:
    return Entry(validate(raw_request(**raw), LIMITS, request_id=rid), StopSignal(), user=user)


def _scheduler(max_images: int = 2, joining: bool = True) -> Scheduler:
    return Scheduler(max_images, joining=joining, mixed_loras=False, line=WaitLine())


def _ids(entries: Any) -> list[str]:
    return [e.request.request_id for e in entries]


def test_a_batch_opens_only_with_the_gate_free_and_joiners_follow_the_fair_order() -> None:
    s = _scheduler(max_images=2)
    for rid, user in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")]:
        s.add(_entry(rid, user))
    opened, joins = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries) == ["a1", "b1"] and not joins  # round-robin: b before a2
    assert s.schedule(closing=False, gate_free=False) == (None, [])  # full: nobody joins
    a1 = opened.entries[0]
    a1.last_step = True  # its place may go to a joiner a step early
    _, joins = s.schedule(closing=False, gate_free=False)
    assert [(j.entry.request.request_id, j.enters_after) for j in joins] == [("a2", ("a1",))]
    opened.leave(a1)
    assert s.schedule(closing=False, gate_free=False) == (None, [])  # a2 already holds the place


def test_a_request_that_cannot_join_holds_back_every_compatible_one_behind_it() -> None:
    s = _scheduler(max_images=4)
    s.add(_entry("a1", "a"))
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None
    s.add(_entry("b1", "b", width=128, height=128))  # another size: cannot join a's loop
    for i in range(2, 6):
        s.add(_entry(f"a{i}", "a"))
    assert s.schedule(closing=False, gate_free=False) == (None, [])  # nobody overtakes b1
    s.ended(opened)
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries)[0] == "b1"


def test_one_scale_per_lora_and_the_memory_room_bound_the_joiners() -> None:
    limits = Limits.for_model(
        dataclasses.replace(FAKE_PROFILE, loras=(dataclasses.replace(_info(), name="ink"),)), max_pixel_steps=10**9
    )
    s = Scheduler(8, joining=True, mixed_loras=True, line=WaitLine())

    def entry(rid: str, **raw: Any) -> Entry:
        return Entry(validate(raw_request(**raw), limits, request_id=rid), StopSignal(), user=rid)

    s.add(entry("a", lora="ink", lora_scale=1.0))
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None
    s.add(entry("b", lora="ink", lora_scale=0.5))  # ink at another scale: not in this loop
    s.add(entry("c"))
    assert s.schedule(closing=False, gate_free=False) == (None, [])
    # The device: 100 bytes idle, 300 an image at 64 px measured; 1000 in all: a second image fits
    # (700 <= 900), a third would not.
    s.memory.learn(64, 64, 1, _result(peak=400, total=1000, idle=100))
    assert s.memory.fits(64, 64, 1, 1) and not s.memory.fits(64, 64, 2, 1)


def test_a_joiner_that_fits_in_memory_only_without_a_leaving_member_enters_after_it() -> None:
    """A loop of 2 images on a device with room for 2 (the batch would take 4): a joiner sent while
    they are on their last step fits only in their place, so it enters after them, never beside them
    (it was sent with no ``enters_after`` when only the batch count decided, and ran a step beside a
    loop already at the memory bound)."""
    s = _scheduler(max_images=4)
    s.memory.learn(64, 64, 1, _result(peak=400, total=1000, idle=100))
    s.add(_entry("a", "a", num_images=2))
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None
    s.add(_entry("b", "b"))
    assert s.schedule(closing=False, gate_free=False) == (None, [])  # no room beside a's 2
    opened.entries[0].last_step = True
    _, joins = s.schedule(closing=False, gate_free=False)
    assert [(j.entry.request.request_id, j.enters_after) for j in joins] == [("b", ("a",))]


def test_the_plan_for_the_eta_forms_the_batches_the_scheduler_will() -> None:
    s = _scheduler(max_images=2, joining=False)
    entries = [_entry("a1", "a"), _entry("a2", "a"), _entry("b1", "b", num_inference_steps=5), _entry("a3", "a")]
    for e in entries:
        s.add(e)
    plan = s.plan_until(entries[3])
    assert [_ids(batch) for batch in plan] == [["a1", "a2"], ["b1"], ["a3"]]
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries) == ["a1", "a2"]  # the plan's first batch
    assert s.schedule(closing=True, gate_free=True) == (None, [])  # closing: nothing opens


def _info() -> Any:
    from pipeline.protocol import LoraInfo

    return LoraInfo("ink")


def _result(peak: int, total: int, idle: int) -> InferenceResult:
    return InferenceResult((), 1, 0.0, 0.0, peak, device_total_bytes=total, idle_bytes=idle)


def test_with_the_gate_free_the_entries_the_next_batch_takes_are_not_counted_as_waiting() -> None:
    """The per-user waiting cap counts ``Scheduler.waiting``: two requests a user sends together
    while nothing runs are one on its way in and one waiting, whether or not the scheduler has
    run between them (it had not, when a cap of 1 refused the second: tests/server/test_load.py)."""
    s = _scheduler(max_images=1)
    s.add(_entry("b1", "b", width=128, height=128))
    s.add(_entry("a1", "a"))
    s.add(_entry("a2", "a"))
    assert s.waiting("a") == 2 and s.waiting("a", gate_free=False) == 2  # something runs: both wait
    assert s.waiting("b", gate_free=True) == 0  # b1 opens the next batch
    assert s.waiting("a", gate_free=True) == 2  # b1's batch takes neither of a's
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries) == ["b1"]
    s.ended(opened)
    assert s.waiting("a", gate_free=True) == 1  # a1 is on its way in; a2 waits


def test_sd3_loops_are_keyed_by_the_prompts_chunk_count_and_sd_loops_are_not() -> None:
    """SD3's joint attention takes no text mask (issue 49): a prompt of two CLIP chunks opens its own
    loop there; SD 1.x/2.x's loops mask the shorter prompts, so any count shares them."""
    from pipeline.serving.scheduler import loop_key

    one = validate(raw_request(), LIMITS, request_id="one")
    two = dataclasses.replace(one, prompt_chunks=2)
    assert loop_key(dataclasses.replace(one, family="sd"), False) == loop_key(
        dataclasses.replace(two, family="sd"), False
    )
    assert loop_key(dataclasses.replace(one, family="sd3"), False) != loop_key(
        dataclasses.replace(two, family="sd3"), False
    )


def test_a_controlnets_activations_are_measured_apart_before_a_controlled_joiner_shares_a_loop() -> None:
    """Issue 51: a ControlNet's weights sit in the idle footprint; its activations are learned from jobs with
    a control. Until one has been measured a controlled joiner waits for a batch of its own; then a loop with
    a ControlNet in it is held to the larger per-pixel figure."""
    room = MemoryRoom()
    room.learn(64, 64, 1, _result(peak=300, total=1000, idle=100))  # plain: 200 an image
    assert room.fits(64, 64, 2, 1) and not room.fits(64, 64, 2, 1, control=True)  # unmeasured: not beside others
    room.learn(64, 64, 1, _result(peak=400, total=1000, idle=100), control=True)  # controlled: 300 an image
    assert room.fits(64, 64, 1, 1, control=True) and not room.fits(64, 64, 2, 1, control=True)  # 700 / 1000
    assert room.fits(64, 64, 3, 1) and not room.fits(64, 64, 3, 1, control=True)  # 900 plain; 1300 with a ControlNet


def test_with_two_models_a_batch_takes_its_models_requests_past_the_others_and_the_other_stops_the_joining() -> None:
    """Several models (issue 52): users alternating A, B, A, B. The head (A) opens a loop with every waiting A
    request that fits, past the B ones (they wait for a switch anyway); while it runs, B at the head of the line
    stops the joining, so a later A request waits behind B: one loop of other work, then B's batch."""
    other = dataclasses.replace(FAKE_PROFILE, name="other", loras=())
    limits = dataclasses.replace(LIMITS, models=(Limits.for_model(other, max_pixel_steps=10**9),))
    s = Scheduler(4, joining=True, mixed_loras=False, line=WaitLine(), models={"other": looping(other, True)})

    def entry(rid: str, model: str) -> Entry:
        return Entry(validate(raw_request(model=model), limits, request_id=rid), StopSignal(), user=rid)

    for rid, model in [("a1", "default"), ("b1", "other"), ("a2", "default"), ("b2", "other"), ("a3", "default")]:
        s.add(entry(rid, model))
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries) == ["a1", "a2", "a3"]  # one switch for the three
    s.add(entry("a4", "default"))
    assert s.schedule(closing=False, gate_free=False) == (None, [])  # b1 heads the line: a4 does not join
    for e in list(opened.entries):
        opened.leave(e)
    s.ended(opened)
    opened, _ = s.schedule(closing=False, gate_free=True)
    assert opened is not None and _ids(opened.entries) == ["b1", "b2"]  # then the other model's, together
