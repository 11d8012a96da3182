"""The simulated fast device (``--model sim:...``): its arithmetic, pictures, progress and cancel."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.engine.model.loading import load_model
from pipeline.engine.model.simulated import SimSpec, SimulatedModel
from pipeline.errors import Cancelled
from pipeline.protocol import InferenceJob, Submission


def job(steps: int = 4, images: int = 1, size: int = 64) -> InferenceJob:
    return InferenceJob("s", ("p",) * images, ("",) * images, tuple(range(images)), size, size, steps, 0.0)


def test_the_spec_takes_any_subset_of_keys_and_names_a_bad_one() -> None:
    assert SimSpec.parse("sim:") == SimSpec()
    assert SimSpec.parse("sim:cpu_ms=8,dev_ms=4,decode_ms=4,steps=4") == SimSpec(8, 4, 4, 512, 4)
    assert SimSpec.parse("sim:size=1024").size == 1024
    with pytest.raises(ValueError, match="unknown key 'gpu_ms'"):
        SimSpec.parse("sim:gpu_ms=3")
    with pytest.raises(ValueError, match="size a multiple of 8"):
        SimSpec.parse("sim:size=100")
    assert SimSpec.parse("sim:batch_cost=0.05").batch_cost == 0.05 and SimSpec().batch_cost == 0.6
    with pytest.raises(ValueError, match="between 0"):
        SimSpec.parse("sim:batch_cost=1.5")


def test_a_batch_cost_other_than_0_6_is_charged() -> None:
    calls: list[tuple[str, float]] = []
    model = SimulatedModel(
        SimSpec(cpu_ms=0, dev_ms=10, decode_ms=0, size=64, steps=1, batch_cost=0.05),
        "sim",
        busy=lambda ms: calls.append(("gil", ms)),
        wait=lambda ms: calls.append(("device", ms)),
    )
    model.generate(job(steps=1, images=4), threading.Event(), lambda s, t, p: None)
    assert ("device", pytest.approx(10 * (1 + 0.05 * 3))) in calls


def test_per_step_cpu_then_device_time_and_batches_cost_0_6_per_extra_image() -> None:
    calls: list[tuple[str, float]] = []
    model = SimulatedModel(
        SimSpec(cpu_ms=5, dev_ms=10, decode_ms=8, size=64, steps=2),
        "sim",
        busy=lambda ms: calls.append(("gil", ms)),
        wait=lambda ms: calls.append(("device", ms)),
    )
    steps: list[int] = []
    result = model.generate(job(steps=2, images=3), threading.Event(), lambda s, t, p: steps.append(s))
    assert calls == [("gil", 5), ("device", 10 * (1 + 0.6 * 2))] * 2 + [("device", 24)]
    assert steps == [1, 2] and len(result.images) == 3


def test_its_loop_charges_each_step_for_the_images_in_the_loop_then() -> None:
    """Step-level joining on the simulated device: a joiner adds 0.6 of a step from the step it joins."""
    from pipeline.engine.loop.joining import LoopDriver

    calls: list[tuple[str, float]] = []
    model = SimulatedModel(
        SimSpec(cpu_ms=5, dev_ms=10, decode_ms=8, size=64, steps=2),
        "sim",
        busy=lambda ms: calls.append(("gil", ms)),
        wait=lambda ms: calls.append(("device", ms)),
    )
    a, b = job(steps=3, images=1), job(steps=1, images=2)
    assert model.profile.step_joining and model.loop_key(a) == model.loop_key(b)
    events: dict[str, list[Any]] = {"a": [], "b": []}

    def Task(name: str, job: InferenceJob) -> Submission:
        return Submission(job, threading.Event(), events[name].append)

    waiting = [Task("b", b)]
    LoopDriver(model.open_loop(a), lambda: waiting.pop() if waiting and calls else None).run(Task("a", a))
    assert calls == [
        ("gil", 5),
        ("device", 10),  # a alone
        ("gil", 5),
        ("device", 10 * (1 + 0.6 * 2)),
        ("device", 16),  # with b's two images; b decoded
        ("gil", 5),
        ("device", 10),
        ("device", 8),
    ]  # a alone; a decoded
    assert [len(e.images) for e in (events["a"][-1], events["b"][-1])] == [1, 2]
    assert events["b"][-1].joined_at_step == 1 and events["b"][-1].batch_images == 3


def test_pictures_are_real_looking_and_of_the_requested_size() -> None:
    model = SimulatedModel(SimSpec(0, 0, 0, 512, 1), "sim")
    result = model.generate(job(steps=1, images=2, size=512), threading.Event(), lambda *_: None)
    a, b = (np.asarray(im, dtype=np.float32) for im in result.images)
    assert a.shape == (512, 512, 3) and not np.array_equal(a, b)  # one picture per seed
    assert 0.005 < np.abs(np.diff(a, axis=1)).mean() / 255 < 0.1  # smooth, with mild noise: not flat, not noise
    assert model.generate(job(size=128), threading.Event(), lambda *_: None).images[0].size == (128, 128)


def test_cancel_stops_at_the_next_step() -> None:
    model = SimulatedModel(SimSpec(0, 0, 0, 64, 10), "sim")
    stop = threading.Event()

    def on_step(step: int, total: int, previews: Any) -> None:
        if step == 3:
            stop.set()

    with pytest.raises(Cancelled) as info:
        model.generate(job(steps=10), stop, on_step)
    assert info.value.steps_done == 3


def test_the_app_loads_it_by_name_only() -> None:
    model = load_model(Settings(model="sim:size=256,steps=1"))
    assert isinstance(model, SimulatedModel)
    p = model.profile
    assert (p.default_width, p.default_steps, p.default_guidance, p.device) == (256, 1, 0.0, "sim")
    assert not isinstance(load_model(Settings(), warmup=False), SimulatedModel)  # never the default


@pytest.mark.parametrize("size", [512, 1024])
def test_it_carries_real_shaped_latents_and_previews_that_announce_the_picture(size: int) -> None:
    """Per step: latents of an SD-like VAE's shape for the size (4 x size/8 x size/8, float32); on the
    job's preview steps only (never the last), display-sized previews that come to look like the final
    picture; in its loop the same for each member that asked."""
    from pipeline.engine.model.simulated import SimLatents
    from pipeline.protocol import display_size

    model = SimulatedModel(SimSpec(cpu_ms=0, dev_ms=0, decode_ms=0, size=size), "sim")
    watched = InferenceJob("w", ("p", "p"), ("", ""), (3, 4), size, size, 8, 0.0, preview_every=2, preview_images=(1,))
    latents = SimLatents(model, watched)
    assert latents.latents.shape == (2, 4, size // 8, size // 8) and latents.latents.dtype == np.float32
    shown: dict[int, Any] = {}
    result = model.generate(
        watched, threading.Event(), lambda step, total, previews: shown.update({step: previews} if previews else {})
    )
    assert sorted(shown) == [2, 4, 6] and all(set(p) == {1} for p in shown.values())
    assert all(p[1].size == display_size(size, size) == (256, 256) for p in shown.values())
    final = np.asarray(result.images[1].resize((256, 256)), dtype=np.float32) / 255
    diffs = [float(np.abs(np.asarray(shown[s][1], dtype=np.float32) / 255 - final).mean()) for s in (2, 6)]
    assert diffs[1] < diffs[0] and diffs[1] < 0.12, diffs
    quiet: dict[int, Any] = {}
    model.generate(
        job(steps=8, size=size),
        threading.Event(),
        lambda step, total, previews: quiet.update({step: previews} if previews else {}),
    )
    assert quiet == {}  # a job that asked for none gets none
    loop = model.open_loop(watched)
    slots = [loop.add(watched), loop.add(job(steps=8, size=size))]
    seen = [loop.step() for _ in range(8)]
    assert [sorted(s) for s in seen] == [[], [slots[0]], [], [slots[0]], [], [slots[0]], [], []]
