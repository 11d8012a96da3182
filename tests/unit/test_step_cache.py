"""Step caching kept per request inside shared loops (issue 50): each member decides from its own step
index and predicts from its own outputs, so a request's pictures do not depend on who shares its steps.
The schedules and predictions here; members in real loops in ``test_joining_families.py``."""

from __future__ import annotations

import pytest
import torch

from pipeline import fields
from pipeline.engine.loop.step_cache import METHODS, MemberCache, Schedule


def test_the_methods_the_app_names_are_the_methods_the_loop_runs() -> None:
    assert tuple(METHODS) == fields.STEP_CACHE_METHODS


def test_each_schedule_computes_its_warm_up_its_last_step_and_one_in_its_interval() -> None:
    taylor, reuse = METHODS["taylorseer"], METHODS["reuse"]
    assert [k for k in range(20) if taylor.computes(k, 20)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 19]
    assert taylor.evaluations(20) == 10  # 2.0x fewer denoiser evaluations at 20 steps
    assert reuse.evaluations(20) == 12 and reuse.computes(19, 20) and not reuse.computes(3, 20)
    assert all(taylor.computes(k, 4) for k in range(4))  # a short request: nothing to skip


def test_a_members_prediction_comes_from_its_own_last_two_outputs() -> None:
    cache = MemberCache("taylorseer", Schedule(warmup=2, interval=3, order=1), total=12)
    for k, value in ((0, 1.0), (1, 3.0)):
        assert cache.computes(k)
        cache.record(k, torch.tensor([value]))
    assert not cache.computes(3) and cache.computes(2)
    assert cache.predict(3).item() == pytest.approx(3.0 + 2.0 * 2)  # y2 + (y2 - y1)(k - k2)/(k2 - k1)
    reuse = MemberCache("reuse", Schedule(warmup=1, interval=2, order=0), total=8)
    reuse.record(0, torch.tensor([5.0]))
    assert reuse.predict(2).item() == 5.0
    assert dict(cache.report()) == {"method": "taylorseer", "computed": 2, "skipped": 1}
    assert MemberCache.of("off", 10) is None
