"""What Stop waits on: ``pipeline.web.page.handler.PageJobs`` counts each session's running jobs."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.anyio
async def test_page_jobs_tells_stop_when_the_sessions_job_has_ended() -> None:
    """Stop waits on this (see ``pipeline.web.page.handler.PageJobs``); the browser test drives it through the page."""
    import asyncio

    from pipeline.web.page.handler import PageJobs

    jobs = PageJobs()
    seen: list[Any] = [await jobs.wait_ended("a", 0.01)]  # nothing running: at once
    release = asyncio.Event()

    async def job(session: str) -> None:
        with jobs.running(session):
            await release.wait()

    tasks = [asyncio.create_task(job("a")), asyncio.create_task(job("a")), asyncio.create_task(job("b"))]
    await asyncio.sleep(0)
    seen += [jobs.count("a"), jobs.count("b"), await jobs.wait_ended("a", 0.05)]  # still running
    waiter = asyncio.create_task(jobs.wait_ended("a", 5))
    await asyncio.sleep(0.01)
    seen.append(waiter.done())
    release.set()
    seen += [await waiter, jobs.count("a"), jobs.count("b")]
    await asyncio.gather(*tasks)
    with pytest.raises(RuntimeError):  # a failing handler is still counted as ended
        with jobs.running("c"):
            raise RuntimeError("boom")
    seen.append(jobs.count("c"))
    assert seen == [True, 2, 1, False, False, True, 0, 0, 0]
