"""Step caching kept per request inside shared loops (issue 50): each member decides from its own step
index and predicts from its own outputs, so a request's pictures do not depend on who shares its steps.
The schedules and predictions here; members in real loops in ``test_joining_families.py``."""

from __future__ import annotations

import pytest
import torch

from pipeline import fields
from pipeline.engine.loop.step_cache import METHODS, ROW_METHODS, MemberCache, RowCache, Schedule


def test_the_methods_the_app_names_are_the_methods_the_loop_runs() -> None:
    assert (*METHODS, *ROW_METHODS) == fields.STEP_CACHE_METHODS


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


def test_a_row_cache_decides_each_row_from_its_own_last_computed_residual() -> None:
    """First-Block Cache per row: a row hits when its first-block residual moved less than the threshold
    from its own at its last computed step (which a hit does not replace); a hit adds its own cached
    residual of the remaining blocks, a miss keeps its new one."""
    cache = RowCache("fbcache", 0.1, rows=2)
    first = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert not cache.hits(first).any()  # nothing cached yet: both compute
    rest = torch.tensor([[5.0, 5.0], [7.0, 7.0]])
    assert torch.equal(cache.keep(torch.tensor([False, False]), first, rest), rest)
    moved = torch.tensor([[1.05, 1.05], [2.0, 2.0]])  # row 0 moved 5 %, row 1 100 %
    hits = cache.hits(moved)
    assert hits.tolist() == [True, False]
    new_rest = torch.tensor([[0.0, 0.0], [9.0, 9.0]])
    assert cache.keep(hits, moved, new_rest).tolist() == [[5.0, 5.0], [9.0, 9.0]]  # row 0: its cached rest
    assert cache.hits(torch.tensor([[1.12, 1.12], [2.1, 2.1]])).tolist() == [False, True]  # row 0 vs its step 0
    assert dict(cache.report()) == {"method": "fbcache", "computed": 3, "skipped": 1}


def test_a_row_cache_serves_its_first_rows_when_its_guidance_rows_leave_the_call() -> None:
    """Z-Image truncates a member's CFG part-way: its negative rows (the last ones) leave the call. The
    cache then decides its first rows against their own residuals and keeps the others' for nothing."""
    cache = RowCache("fbcache", 0.1, rows=2)
    cache.keep(torch.tensor([False, False]), torch.ones(2, 2), torch.tensor([[5.0, 5.0], [7.0, 7.0]]))
    one = torch.tensor([[1.05, 1.05]])  # only the positive row now, 5 % moved: it hits, with its own rest
    hits = cache.hits(one)
    assert hits.tolist() == [True]
    assert cache.keep(hits, one, torch.zeros(1, 2)).tolist() == [[5.0, 5.0]]
    far = torch.tensor([[3.0, 3.0]])  # moved 200 %: it misses and keeps its new residuals in row 0 only
    hits = cache.hits(far)
    assert hits.tolist() == [False]
    assert cache.keep(hits, far, torch.full((1, 2), 4.0)).tolist() == [[4.0, 4.0]]
    assert cache.hits(torch.tensor([[3.1, 3.1], [1.0, 1.0]])).tolist() == [True, True]  # row 1 kept its own
    assert dict(cache.report()) == {"method": "fbcache", "computed": 3, "skipped": 1}


def test_first_block_cache_is_offered_where_a_family_runs_its_rows_forward_and_not_beside_loras() -> None:
    from pipeline.engine.model.loading import step_caches

    for kind in ("flux", "chroma", "qwen-image", "z-image"):
        assert step_caches(kind, None) == ("taylorseer", "reuse", "fbcache"), kind
        assert step_caches(kind, object()) == ("taylorseer", "reuse"), kind  # with --lora: rows shrink under peft
    assert step_caches("sd", None) == step_caches("sd3", None) == ("taylorseer", "reuse")
    assert step_caches(None, None) == ()  # no step-level loop: nothing to cache per member
