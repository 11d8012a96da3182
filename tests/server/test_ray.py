"""The Ray Serve backend with 2 CPU replicas of the default model (issue 9).

One local Ray instance and one deployment for the whole module (starting them costs ~30 s on 2
cores). The replica-killing test runs last: it disturbs the deployment on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipeline.config import Settings
from pipeline.errors import Cancelled, GenerationFailed, InvalidRequest, QueueFull, ReplicaDead
from pipeline.protocol import Output
from tests.helpers import ray_backend

ray = pytest.importorskip("ray")

from pipeline.ray.adapter import RayAdapter  # noqa: E402

QUEUE = 6  # a burst is admitted up to this many calls (see the queue-full test)
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayAdapter]:
    tmp = tmp_path_factory.mktemp("ray")
    from tests.loras import loras_of

    with ray_backend(tmp, queue_size=QUEUE, max_pixel_steps=128 * 128 * 100,
                     loras=(f"ink={loras_of('default')['a']}",)) as adapter:  # fmt: skip
        yield adapter


def req(k: int, *, size: int = 64, steps: int = 20, **over: Any) -> dict[str, Any]:
    raw = {
        "prompt": "a red circle on a blue background",
        "negative_prompt": "",
        "seed": k,
        "randomize_seed": False,
        "width": size,
        "height": size,
        "num_inference_steps": steps,
        "guidance_scale": 4.0,
        "num_images": 1,
        "live_preview": False,
    }
    return {**raw, **over}


async def collect(adapter: RayAdapter, raw: dict[str, Any]) -> tuple[list[Any], Output]:
    events: list[Any] = []
    async with contextlib.aclosing(adapter.run(raw)) as stream:
        async for event in stream:
            events.append(event)
            if event.kind == "done":
                return events, event
    raise AssertionError(f"no result: {events}")


def stats_of(adapter: RayAdapter, replica: str, tries: int = 60) -> dict[str, Any]:
    """The named replica's counters (Serve routes each call to some replica: ask until it answers)."""
    for _ in range(tries):
        stats = adapter.cluster.handle.stats.remote().result(timeout_s=30)
        if stats["replica"] == replica:
            return stats
    raise AssertionError(f"replica {replica} never answered")


@pytest.mark.anyio
async def test_requests_spread_over_both_replicas_one_inference_each_at_a_time(side: RayAdapter) -> None:
    results = await asyncio.gather(*(collect(side, req(k)) for k in range(QUEUE)))
    infos = [done.info for _, done in results]
    by_replica: dict[str, set[tuple[float, float]]] = {}
    for info in infos:
        assert info["backend"] == "ray" and info["steps_done"] == 20
        t = info["timings"]
        # Members of one batch share their inference: one interval per inference.
        by_replica.setdefault(info["replica"], set()).add((t["infer_start"], t["infer_end"]))
    assert len(by_replica) == 2, f"all requests ran on {list(by_replica)}"
    for replica, intervals in by_replica.items():
        ordered = sorted(intervals)
        for (s1, e1), (s2, e2) in zip(ordered, ordered[1:]):
            assert s2 >= e1, f"replica {replica} ran two inferences at once: {(s1, e1)} and {(s2, e2)}"
    assert sum(len(v) for v in by_replica.values()) <= len(infos)


@pytest.mark.anyio
async def test_every_replica_loads_the_same_adapters_and_honours_the_jobs_choice(side: RayAdapter) -> None:
    import numpy as np
    from PIL import Image

    assert [i.name for i in side.profile.loras] == ["ink"]
    results = await asyncio.gather(*(collect(side, req(5, steps=4, lora="ink", lora_scale=1.0)) for _ in range(QUEUE)))
    _, plain = await collect(side, req(5, steps=4))
    by_replica = {done.info["replica"]: np.asarray(Image.open(done.paths[0]), np.float32) for _, done in results}
    assert len(by_replica) == 2, f"all requests ran on {list(by_replica)}"
    first, second = by_replica.values()
    none = np.asarray(Image.open(plain.paths[0]), np.float32)
    assert np.abs(first - second).mean() <= 0.05  # the same adapter on both replicas
    assert np.abs(first - none).mean() > 0.25  # and it applied
    assert {done.info["lora"] for _, done in results} == {"ink"} and plain.info["lora"] == "none"


@pytest.mark.anyio
async def test_progress_and_images_cross_the_boundary(side: RayAdapter) -> None:
    events, done = await collect(side, req(7, steps=8, num_images=2, scheduler="UniPC"))
    steps = [e.step for e in events if e.kind == "step"]
    assert steps == list(range(1, 9))
    assert any(e.kind == "waiting" for e in events)
    assert len(done.paths) == 2 and all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in done.paths)
    assert done.info["seeds"] == [7, 8] and done.info["replica"]
    from PIL import Image

    with Image.open(done.paths[0]) as image:
        assert "Seed: 7" in image.text["parameters"] and "Sampler: UniPC," in image.text["parameters"]
    assert done.info["scheduler"] == "UniPC"  # the request's sampler reached the replica's model
    assert [e.eta_seconds is not None for e in events if e.kind == "step"][-1]  # the replica's estimate


@pytest.mark.anyio
async def test_a_hires_fixs_first_pass_crosses_the_boundary_beside_its_result(side: RayAdapter) -> None:
    from PIL import Image

    _, done = await collect(side, req(3, steps=4, hires_fix=True, hires_steps=2, hires_strength=0.5))
    (result,), (first,) = done.paths, done.first_pass
    assert Path(first).name.endswith("-first-0.png") and Path(first).parent == Path(result).parent
    with Image.open(result) as big, Image.open(first) as small:
        assert (big.size, small.size) == ((128, 128), (64, 64))
        assert "Hires upscale" in big.text["parameters"] and "Hires" not in small.text["parameters"]


@pytest.mark.anyio
async def test_bad_input_is_answered_by_the_front_end(side: RayAdapter) -> None:
    with pytest.raises(InvalidRequest) as err:
        await collect(side, req(0, size=65))
    assert err.value.field == "width" and "multiple of" in str(err.value)


@pytest.mark.anyio
async def test_cancel_stops_the_remote_job_at_the_next_step(side: RayAdapter) -> None:
    # Serve's blocking ``.result()`` refuses to run on an event loop: the stats helpers run on a thread.
    before = await asyncio.to_thread(
        lambda: {r: stats_of(side, r)["jobs"]["cancelled"] for r in {s["replica"] for s in _both(side)}}
    )
    stream = side.run(req(1, size=128, steps=100))
    seen = 0
    replica = ""
    async for event in stream:
        if event.kind == "step":
            seen = event.step
            replica = next(iter(side.started.values()))["replica"]
            if seen >= 3:
                break
    await stream.aclose()  # what Gradio does when its client cancels
    deadline = time.monotonic() + 30
    while True:
        stats = await asyncio.to_thread(stats_of, side, replica)
        if stats["jobs"]["cancelled"] > before[replica] and not stats["inference_in_progress"]:
            break
        assert time.monotonic() < deadline, f"the remote job was not stopped: {stats}"
        await asyncio.sleep(0.2)
    assert stats["steps_after_stop_count"] >= 1
    # The model checks the stop event after every step: at most one more step once it was set.
    assert stats["steps_after_stop_sum"] <= stats["steps_after_stop_count"]
    assert seen >= 3


def _both(side: RayAdapter) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(60):
        stats = side.cluster.handle.stats.remote().result(timeout_s=30)
        seen[stats["replica"]] = stats
        if len(seen) == 2:
            return list(seen.values())
    raise AssertionError(f"only {list(seen)} answered")


@pytest.mark.anyio
async def test_a_full_line_gets_a_clear_error_and_the_rest_finish(side: RayAdapter) -> None:
    outcomes = await asyncio.gather(*(collect(side, req(k)) for k in range(2 * 2 + QUEUE + 8)), return_exceptions=True)
    full = [o for o in outcomes if isinstance(o, QueueFull)]
    done = [o for o in outcomes if isinstance(o, tuple)]
    assert full, "nobody was told the queue is full"
    assert "queue is full" in str(full[0])
    assert len(full) + len(done) == len(outcomes), [o for o in outcomes if isinstance(o, BaseException)]
    # Ray counts every call not yet assigned to a replica as queued, so a burst is admitted up to
    # max_queued_requests (more as assignments drain the router's queue).
    assert len(done) >= QUEUE


def test_the_gradio_app_runs_unchanged_on_the_ray_backend(side: RayAdapter, tmp_path: Path) -> None:
    import httpx
    from gradio_client import Client

    import app
    from tests.helpers import free_port

    settings = Settings(backend="ray", port=free_port(), output_dir=side.output_dir)
    from pipeline.web.page.layout import build_demo

    demo = build_demo(side, settings)
    app.launch(demo, side, settings)
    try:
        client = Client(f"http://127.0.0.1:{settings.port}/", verbose=False, download_files=str(tmp_path))
        gallery, info = client.predict(
            "a blue square on a yellow background", "", 5, False, 64, 64, 10, 4.0, 1, False, api_name="/generate"
        )
        assert info["status"] == "done" and info["replica"] and info["backend"] == "ray"
        assert len(gallery) == 1
        health = httpx.get(f"http://127.0.0.1:{settings.port}/health").json()
        assert health["backend"] == "ray" and health["replicas"] == 2
        client.close()
    finally:
        demo.close()


@pytest.mark.anyio
async def test_a_replica_killed_mid_job_fails_that_job_and_the_next_jobs_succeed(side: RayAdapter) -> None:
    async def doomed() -> tuple[BaseException | None, str]:
        killed = ""
        try:
            async with contextlib.aclosing(side.run(req(2, size=128, steps=100))) as stream:
                async for event in stream:
                    if event.kind == "step" and event.step >= 2 and not killed:
                        started = next(iter(side.started.values()))
                        killed = started["replica"]
                        os.kill(started["pid"], signal.SIGKILL)
        except Exception as exc:
            return exc, killed
        return None, killed

    error, killed = await asyncio.wait_for(doomed(), 120)
    assert killed, "the job never started"
    assert isinstance(error, ReplicaDead), repr(error)
    assert isinstance(error, GenerationFailed) and "stopped" in str(error)

    async def next_jobs() -> list[dict[str, Any]]:
        results = await asyncio.gather(*(collect(side, req(k)) for k in range(4)))
        return [done.info for _, done in results]

    infos = await asyncio.wait_for(next_jobs(), 120)
    assert all(i["steps_done"] == 20 for i in infos)
    assert killed not in {i["replica"] for i in infos}
    deadline = time.monotonic() + 120
    while side.health()["replicas_running"] != 2:  # Ray replaces the dead replica
        assert time.monotonic() < deadline, side.health()
        await asyncio.sleep(1)
    assert not isinstance(error, Cancelled)


# -- Ray's errors in our classes (no cluster needed) -----------------------------------------------
def test_rays_errors_become_ours() -> None:
    from ray import exceptions as rx
    from ray.serve import exceptions as sx

    from pipeline.errors import OutOfMemory
    from pipeline.ray import adapter as ray_adapter

    def classify(error: BaseException) -> BaseException:
        return ray_adapter.classify(error, "abc123", queue_size=32)

    full = classify(sx.BackPressureError(num_queued_requests=32, max_queued_requests=32))
    assert isinstance(full, QueueFull) and "queue is full (32 requests" in str(full)
    # A replica's own error arrives wrapped in RayTaskError: the caller gets it as itself.
    oom = OutOfMemory("abc123")
    assert classify(rx.RayTaskError("generate", "trace", oom)) is oom
    invalid = InvalidRequest("width", "width must be a multiple of 8")
    assert classify(rx.RayTaskError("generate", "trace", invalid)) is invalid
    # Ray's own memory monitor killing the worker is out of memory too; a crash is a generic failure.
    assert isinstance(classify(rx.OutOfMemoryError("killed by the memory monitor")), OutOfMemory)
    crash = classify(rx.RayTaskError("generate", "trace", ZeroDivisionError()))
    assert type(crash) is GenerationFailed and "abc123" in str(crash)
    for dead in (rx.ActorDiedError(), rx.ActorUnavailableError("gone", None)):
        error = classify(dead)
        assert isinstance(error, ReplicaDead) and "another replica" in str(error)
    assert isinstance(classify(asyncio.CancelledError()), Cancelled)


# -- the replica's Serve health check (no cluster needed: the replica is a plain class) ------------
class _ThreadKiller:
    """A job's stop flag whose first read raises a BaseException on the model thread: the thread dies
    the way a KeyboardInterrupt or a SystemExit raised inside the model would kill it."""

    class Death(BaseException):
        pass

    def is_set(self) -> bool:
        raise self.Death("the model thread is killed")


def test_check_health_fails_once_the_replicas_model_thread_has_died(tmp_path: Path) -> None:
    from pipeline.protocol import InferenceJob, InferenceResult
    from pipeline.ray.replica import ModelReplica

    settings = Settings(model="sim:cpu_ms=0,dev_ms=1,decode_ms=0,size=64,steps=2", output_dir=tmp_path)
    replica = ModelReplica(settings)  # what Serve builds inside each replica actor
    try:
        replica.check_health()  # alive: Serve keeps it
        job = InferenceJob("doomed", ("p",), ("",), (0,), 64, 64, 2, 0.0)
        events = list(replica.runner.stream(job, _ThreadKiller()))
        assert isinstance(events[-1], InferenceResult) and events[-1].reason == "engine_dead"
        deadline = time.monotonic() + 10
        while replica.runner.alive:  # the thread unwinds right after the job's error
            assert time.monotonic() < deadline, "the model thread outlived its BaseException"
            time.sleep(0.01)
        with pytest.raises(RuntimeError, match="model thread has died"):
            replica.check_health()  # Serve marks it unhealthy and starts a replacement
    finally:
        replica.shutdown()
