"""Driving a step-level loop in process the way ``joining.LoopDriver`` does, and the bound a joined job's
pictures keep from the same job alone (``tests/unit/test_joining_families.py``,
``tests/unit/test_control_loops.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.protocol import InferenceJob

# The bound the issue sets: a mean |difference| of at most 1/255 (GPU batches may round differently). On the
# CPU the batched denoiser is nearly batch-invariant (measured: at most 0.0003), and the tiny random-weight
# FLUX barely depends on its timestep (a wrong member's timestep moved B by 0.67): the tighter CPU bound is
# what catches such a mistake there.
BOUND, CPU_BOUND = 1.0, 0.05


def mad(a: tuple[Image.Image, ...], b: tuple[Image.Image, ...]) -> float:
    """The largest, over the images, mean |a - b| on uint8 pixels (1.0 = 1/255)."""
    assert len(a) == len(b)
    return max(float(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32)).mean()) for x, y in zip(a, b))


def assert_same(label: str, got: tuple[Image.Image, ...], expected: tuple[Image.Image, ...]) -> float:
    value = mad(got, expected)
    print(f"MAD {label}: {value:.4f}")
    assert value <= BOUND, f"{label}: mean |difference| {value:.3f} > 1/255"
    assert value <= CPU_BOUND, f"{label}: mean |difference| {value:.3f} (1/255 units) > the CPU bound {CPU_BOUND}"
    return value


@dataclass
class Run:
    """What a directly driven loop gave: images, (steps_done, total) after every step, decodes, previews."""

    images: dict[str, tuple[Image.Image, ...]] = field(default_factory=dict)
    progress: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    decoded: list[tuple[int, list[str]]] = field(default_factory=list)  # (loop step, request ids)
    previews: dict[str, dict[int, dict[int, Image.Image]]] = field(default_factory=dict)  # id -> step -> index


def drive(model: DiffusersModel, plan: list[tuple[int, InferenceJob]], remove_at: dict[str, int] | None = None) -> Run:
    """Run one loop the way ``joining.LoopDriver`` does: ``plan`` is (loop step it joins before, job)."""
    remove_at = remove_at or {}
    run, slots, step = Run(), {}, 0
    loop = model.open_loop(plan[0][1])
    while True:
        for at, job in plan:
            if at == step:
                slots[job.request_id] = loop.add(job)
                run.progress[job.request_id] = []
        for rid, at in remove_at.items():
            if at == step and rid in slots:
                loop.remove(slots.pop(rid))
        if not slots:
            assert all(at <= step for at, _ in plan)
            assert loop.images == 0
            return run
        assert loop.images == sum(len(j.prompts) for _, j in plan if j.request_id in slots)
        previews = loop.step()
        step += 1
        by_slot = {slot: rid for rid, slot in slots.items()}
        for slot, shown in previews.items():
            run.previews.setdefault(by_slot[slot], {})[loop.steps_done(slot)] = dict(shown)
        for rid, slot in slots.items():
            run.progress[rid].append((loop.steps_done(slot), loop.total_steps(slot)))
        finished = [rid for rid, slot in slots.items() if loop.steps_done(slot) >= loop.total_steps(slot)]
        if finished:
            leaving = [slots.pop(rid) for rid in finished]
            decoded = loop.decode(leaving)
            run.images.update({rid: decoded[slot] for rid, slot in zip(finished, leaving)})
            run.decoded.append((step, finished))
