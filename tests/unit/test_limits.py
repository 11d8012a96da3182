"""Limits no single request may pass (issue 26 §5, §8): the cost budget, the default time limit, a full disk."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import InvalidRequest, JobTimedOut, StorageFull
from pipeline.protocol import InferenceJob
from pipeline.request import Limits, validate
from pipeline.serving.eta import Shape
from pipeline.serving.jobs import AUTO_LIMIT_FACTOR, AUTO_LIMIT_UNMEASURED_SECONDS
from pipeline.serving.owners import KEY_FILE
from pipeline.serving.postprocess import encode_pngs
from tests.fakes import FAKE_PROFILE, FakeModel
from tests.helpers import collect, raw_request

pytestmark = pytest.mark.anyio


async def test_the_cost_budget_admits_what_the_page_offers_and_a_request_over_it_is_refused_naming_it() -> None:
    small = dataclasses.replace(FAKE_PROFILE, max_size=128, max_steps=20)  # the default job: 64 x 64 px, 4 steps
    limits = Limits.for_model(small)
    assert (
        limits.max_pixel_steps == 8 * 64 * 64 * 4
    )  # the largest size at 4 steps, or 20 steps at 64 px: fewer than 8 jobs
    validate(raw_request(num_inference_steps=8, num_images=4), limits)  # 8 default jobs: at the budget
    with pytest.raises(InvalidRequest) as refused:
        validate(raw_request(width=128, height=128, num_inference_steps=8, num_images=2), limits)
    assert refused.value.field == "num_inference_steps"
    assert str(refused.value) == (
        "width × height × num_inference_steps × num_images must be at most 131072 "
        "pixel-steps (the cost budget, --max-pixel-steps); got 128×128×8×2 = 262144"
    )
    assert Limits.for_model(FAKE_PROFILE, max_pixel_steps=10**9).max_pixel_steps == 10**9
    # The page's defaults always fit: the largest size at the default steps, the default size at the most steps.
    limits = Limits.for_model(FAKE_PROFILE)  # 512 px at most, 50 steps at most
    validate(raw_request(width=512, height=512, num_inference_steps=4), limits)
    assert limits.max_pixel_steps == 512 * 512 * 4
    tall = dataclasses.replace(FAKE_PROFILE, max_size=64, max_steps=500)
    validate(raw_request(num_inference_steps=500), Limits.for_model(tall))


def _job(steps: int, images: int = 1) -> InferenceJob:
    return InferenceJob("r", ("p",) * images, ("",) * images, tuple(range(images)), 64, 64, steps, 7.5)


async def test_without_job_timeout_each_job_is_limited_by_the_measured_rate(make_adapter: Any) -> None:
    adapter, model = make_adapter(FakeModel(step_seconds=0.02), auto_limit_floor=0.3)
    assert adapter.jobs.time_limit(_job(4)) == AUTO_LIMIT_UNMEASURED_SECONDS  # nothing measured yet
    assert (await collect(adapter, raw_request(num_inference_steps=4)))[-1].kind == "done"
    expected = adapter.jobs.book.job_seconds(Shape(64 * 64, 50, 1))
    assert expected is not None
    assert adapter.jobs.time_limit(_job(50)) == round(0.3 + AUTO_LIMIT_FACTOR * expected, 1)
    # a step-level member is timed as if its loop were full
    assert adapter.jobs.time_limit(_job(50, 1), 4) > adapter.jobs.time_limit(_job(50))
    model.hold = True  # a job that never ends: stopped at its limit, well before forever
    with pytest.raises(JobTimedOut, match=r"ran past the \d+(\.\d+)? s time limit"):
        await collect(adapter, raw_request(num_inference_steps=4, seed=2))
    model.hold = False
    model.release.release()


async def test_a_full_disk_says_retry_later_and_leaves_no_partial_file(make_adapter: Any, tmp_path: Path) -> None:
    full = {"on": True}

    def encode(images: Any, out_dir: Path, request_id: str, *args: Any) -> list[Path]:
        return encode_pngs(images, out_dir, request_id, *args) if not full["on"] else _fill(out_dir, request_id)

    def _fill(out_dir: Path, request_id: str) -> list[Path]:
        from pipeline.serving.postprocess import output_folder, write_then_rename

        def half_then_full(tmp: Path) -> None:
            tmp.write_bytes(b"\x89PNG half a file")
            raise OSError(errno.ENOSPC, "No space left on device")

        return [write_then_rename(output_folder(out_dir, None) / f"{request_id}-0.png", half_then_full)]

    adapter, _model = make_adapter(encode=encode)
    with pytest.raises(StorageFull, match=r"^The server's storage is full; please retry later\.$"):
        await collect(adapter, raw_request())
    left = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file() and p.name != KEY_FILE]
    assert not left, "a partial file was left"
    full["on"] = False
    assert (await collect(adapter, raw_request(seed=3)))[-1].kind == "done"  # the next request is fine
