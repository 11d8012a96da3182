"""The adapter between the I/O side (many concurrent requests) and the one model thread.

``LocalAdapter.run`` is an async generator that walks one request through four stages:

1. prepare   (concurrent) validate the raw values, resolve the seed, count prompt tokens
2. gate      ``async with asyncio.Semaphore(1)``: wait for the GPU, reporting how many are ahead
3. infer     (serial) hand the job to the model thread and stream its steps back
4. finalize  (concurrent) encode PNGs with their parameters, build the info record

Only stage 3 is inside the gate. Stages 1 and 4 run in the adapter's own small thread pool, so the
event loop never does more than bookkeeping. If the consumer stops (cancel, disconnect, close),
the model thread is told through a ``threading.Event`` and the gate is held until that thread has
really returned: never two inferences at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from .errors import GenerationFailed, ServingError
from .postprocess import encode_pngs, sampler_name
from .protocol import InferenceResult, ModelProfile
from .request import GenerateRequest, Limits, validate
from .worker import GpuWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Waiting:
    """Prepared and in line for the GPU; ``ahead`` jobs (the running one included) come first."""

    ahead: int


@dataclass(frozen=True)
class Step:
    step: int
    total: int


@dataclass(frozen=True)
class Done:
    paths: list[Path]
    info: dict[str, Any]


Event = Waiting | Step | Done


@dataclass
class _Line:
    """Who is waiting for the gate, in arrival order (asyncio.Semaphore wakes waiters FIFO)."""

    tickets: dict[int, None] = field(default_factory=dict)
    counter: itertools.count = field(default_factory=itertools.count)

    def join(self) -> int:
        ticket = next(self.counter)
        self.tickets[ticket] = None
        return ticket

    def leave(self, ticket: int) -> None:
        self.tickets.pop(ticket, None)

    def before(self, ticket: int) -> int:
        return sum(1 for t in self.tickets if t < ticket)


class LocalAdapter:
    """Runs requests against one ``GpuWorker``; the gate wraps only the inference."""

    def __init__(
        self,
        worker: GpuWorker,
        limits: Limits,
        output_dir: Path,
        *,
        pool_threads: int = 2,
        clock: Callable[[], float] = time.time,
        encode: Callable[..., list[Path]] = encode_pngs,
    ) -> None:
        self.worker = worker
        self.limits = limits
        self.output_dir = output_dir
        self._clock = clock
        self._encode_pngs = encode
        self._gate = asyncio.Semaphore(1)
        self._line = _Line()
        # Short CPU work (validation, token counting, PNG encoding) off the event loop, on threads
        # this adapter names and owns.
        self._pool = concurrent.futures.ThreadPoolExecutor(pool_threads, thread_name_prefix="prep-finalize")

    @property
    def profile(self) -> ModelProfile:
        return self.worker.model.profile

    @property
    def gpu_queue_depth(self) -> int:
        """Prepared requests waiting for the gate."""
        return len(self._line.tickets)

    @property
    def inference_in_progress(self) -> bool:
        return self._gate.locked()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the orchestrator --------------------------------------------------------------------
    async def run(self, raw: Mapping[str, Any], *, request_id: str | None = None) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        t: dict[str, float] = {"received": self._clock()}

        # 1. Prepare: concurrent, off the loop. A bad field fails here, before any GPU work.
        t["prepare_start"] = self._clock()
        request = await loop.run_in_executor(self._pool, self._prepare, raw, request_id)
        t["prepare_end"] = self._clock()

        # 2. Wait for the GPU.
        t["gpu_wait_start"] = self._clock()
        ticket = self._line.join()
        try:
            yield Waiting(self._line.before(ticket) + int(self._gate.locked()))
            async with self._gate:
                self._line.leave(ticket)
                # 3. Infer: serial, on the model thread.
                stop = threading.Event()
                events, future = self._submit(request, stop, loop)
                try:
                    while (event := await events.get()) is not None:
                        yield event
                except BaseException:
                    # Cancelled, disconnected or closed: stop at the next step boundary, and keep
                    # the gate until the model thread has really returned.
                    stop.set()
                    await _until_done(future)
                    raise
                result = self._outcome(request, future)
        finally:
            self._line.leave(ticket)
        t["infer_start"], t["infer_end"] = result.started, result.ended

        # 4. Finalize: concurrent, off the loop.
        t["finalize_start"] = self._clock()
        paths = await loop.run_in_executor(self._pool, self._encode, request, result)
        info = self._info(request, result, t)
        t["finalize_end"] = info["timings"]["finalize_end"] = self._clock()
        info["durations_ms"] = _durations(t)
        log.info(
            "request %s done: %d image(s) %dx%d, %d steps, wait %.0f ms, infer %.0f ms, total %.0f ms",
            request.request_id, request.num_images, request.width, request.height,
            request.num_inference_steps, info["durations_ms"]["gpu_wait"],
            info["durations_ms"]["inference"], info["durations_ms"]["total"],
        )
        yield Done(paths, info)

    # -- stages ------------------------------------------------------------------------------
    def _prepare(self, raw: Mapping[str, Any], request_id: str | None) -> GenerateRequest:
        return validate(raw, self.limits, self.worker.model.count_tokens, request_id=request_id)

    def _submit(
        self, request: GenerateRequest, stop: threading.Event, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Queue[Step | None], concurrent.futures.Future[InferenceResult]]:
        """Hand the job to the model thread; its steps, then ``None``, arrive on the returned queue."""
        events: asyncio.Queue[Step | None] = asyncio.Queue()

        def post(item: Step | None) -> None:  # called on the model thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        future = self.worker.submit(request.to_job(), stop, lambda s, n, _latents: post(Step(s, n)))
        future.add_done_callback(lambda _f: post(None))
        return events, future

    def _outcome(
        self, request: GenerateRequest, future: concurrent.futures.Future[InferenceResult]
    ) -> InferenceResult:
        try:
            return future.result()
        except ServingError:
            raise
        except Exception:
            log.exception("request %s failed in the pipeline", request.request_id)
            raise GenerationFailed(request.request_id) from None

    def _encode(self, request: GenerateRequest, result: InferenceResult) -> list[Path]:
        p = self.profile
        return self._encode_pngs(result.images, self.output_dir, request.request_id, request.parameters(), p.name, p.scheduler)

    def _info(self, request: GenerateRequest, result: InferenceResult, t: dict[str, float]) -> dict[str, Any]:
        p = self.profile
        params = request.parameters()
        return {
            "request_id": request.request_id,
            "model": p.name,
            **params,
            "scheduler": sampler_name(p.scheduler),
            "batch_size": 1,
            "device": p.device,
            "dtype": p.dtype,
            "steps_done": result.steps_done,
            "peak_memory_bytes": result.peak_memory_bytes,
            "warnings": list(request.warnings),
            "timings": dict(t),
            "reproduce": {
                "api_name": "/generate",
                "params": {**{k: v for k, v in params.items() if k != "seeds"}, "randomize_seed": False},
                "note": "The same parameters and seed give the same pixels on the same machine. "
                "Image i alone: seed = seeds[i], num_images = 1 (the same noise; batch "
                "arithmetic may differ by under 1/255 on average).",
            },
        }


async def _until_done(future: concurrent.futures.Future[Any]) -> None:
    """Wait for the model thread to finish ``future``, even if this task is cancelled again."""
    waiter = asyncio.wrap_future(future)
    while not waiter.done():
        try:
            await asyncio.shield(waiter)
        except asyncio.CancelledError:
            continue
        except BaseException:
            break
    if not waiter.cancelled():
        waiter.exception()  # mark it retrieved; the outcome was a cancel the caller asked for


def _durations(t: dict[str, float]) -> dict[str, float]:
    ms = lambda a, b: round((t[b] - t[a]) * 1000, 3)  # noqa: E731
    return {
        "prepare": ms("prepare_start", "prepare_end"),
        "gpu_wait": ms("gpu_wait_start", "infer_start"),
        "inference": ms("infer_start", "infer_end"),
        "finalize": ms("finalize_start", "finalize_end"),
        "total": ms("received", "finalize_end"),
    }
