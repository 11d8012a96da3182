"""A Ray Serve replica: one device, the model loaded once, the same ``LocalAdapter`` inside.

Each replica owns one device, loads the model on its own ``gpu-worker`` thread (the same
``ModelRunner`` and boundary stream as the one-GPU app) and runs a ``LocalAdapter`` around it: the
same validation, the same ``asyncio.Semaphore(1)`` gate around the inference only, the same
dynamic batching and PNG encoding. What it sends the front end is plain picklable records.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, AsyncGenerator, Sequence

from ..config import Settings
from ..protocol import ModelProfile, Output
from ..request import limits_for

log = logging.getLogger(__name__)


def started_by_replica(output: Output) -> bool:
    """Whether ``output`` is a replica's first: it took the request (``info`` names the replica)."""
    return output.kind == "waiting" and "replica" in output.info


# -- the replica ---------------------------------------------------------------------------------
class ModelReplica:
    """One replica: one device, the model loaded once, one inference at a time (its own gate).

    Wrapped by ``serve.deployment`` in ``deployment()``; kept a plain class so it imports without
    Ray and its logic is the ``LocalAdapter``'s.
    """

    def __init__(self, settings: Settings) -> None:
        from ..engine.hosting.runner import ModelRunner
        from ..engine.model.loading import load_model
        from ..serving.local import LocalAdapter

        self.name, self.actor_name = _replica_identity()
        out = Path(tempfile.mkdtemp(prefix="t2i-replica-"))
        self.runner = runner = ModelRunner(lambda: load_model(settings))
        profile = runner.start()
        self.adapter = LocalAdapter(
            runner,
            limits_for(settings, profile),
            out,
            job_timeout=settings.job_timeout,
            max_batch_size=settings.max_batch_size,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replica-io")
        log.info("replica %s ready: %s on %s", self.name, profile.name, profile.device)

    def profile(self) -> ModelProfile:
        return self.adapter.profile

    def check_health(self) -> None:
        """Ray Serve's health check, called every ``health_check_period_s`` (see ``cluster``).

        Raising marks this replica unhealthy: Serve stops routing to it and starts a replacement.
        A replica whose model thread has died (a BaseException raised on it, such as SystemExit)
        can never run a job again -- every job would get "engine dead" -- so it says so here.
        """
        if not self.runner.alive:
            raise RuntimeError(f"replica {self.name}: the model thread has died; this replica cannot serve")

    def health(self) -> dict[str, Any]:
        return {**self.adapter.health(), "replica": self.name, "pid": os.getpid()}

    def stats(self) -> dict[str, Any]:
        """This replica's counters (tests and operators: which replica ran what, and how a cancel ended)."""
        registry = self.adapter.metrics.registry

        def value(name: str, **labels: str) -> float:
            return float(registry.get_sample_value(name, labels) or 0.0)

        return {
            "replica": self.name,
            "pid": os.getpid(),
            "denoise_steps": value("denoise_steps_total"),
            "jobs": {o: value("jobs_total", outcome=o) for o in ("completed", "cancelled", "failed", "rejected")},
            "steps_after_stop_count": value("steps_after_stop_count"),
            "steps_after_stop_sum": value("steps_after_stop_sum"),
            "inference_in_progress": self.adapter.inference_in_progress,
        }

    async def generate(self, raw: dict[str, Any], request_id: str) -> AsyncGenerator[Output, None]:
        """Stream one request as ``Output``s: the first names this replica (``started_by_replica``), then
        its steps, then its end with the PNGs as ``files`` and ``first_pass_files`` (or raise a ``ServingError``).

        When the caller cancels, Ray cancels this task; closing ``adapter.run`` sets the job's stop
        event, and the model thread stops at the end of the step in progress.
        """
        who: dict[str, Any] = {"replica": self.name, "actor_name": self.actor_name, "pid": os.getpid()}
        model = _multiplexed_id()
        held = getattr(self, "held", None)  # Serve's multiplexed LRU (``cluster.deployment``), several models
        if model and held is not None:
            who["multiplexed_model_id"] = await held(model)
        yield Output(request_id, ahead=0, info=who)
        event_loop = asyncio.get_running_loop()
        async with contextlib.aclosing(self.adapter.run(raw, request_id=request_id)) as events:
            async for event in events:
                if event.kind == "step":
                    yield event
                elif event.kind == "done":
                    files = await event_loop.run_in_executor(self._pool, _take_files, event.paths)
                    first_pass = await event_loop.run_in_executor(self._pool, _take_files, event.first_pass)
                    info = {**event.info, "replica": self.name, **({"multiplexed_model_id": model} if model else {})}
                    yield Output(request_id, finish="done", info=info, files=files, first_pass_files=first_pass)
                # Waiting: the front end reports the line it can see (see RayAdapter).

    def shutdown(self) -> None:
        self.adapter.begin_shutdown()
        self.adapter.shutdown_model(timeout=5)
        self.adapter.close()


def _take_files(paths: Sequence[Path]) -> tuple[tuple[str, bytes], ...]:
    """Each file's name and bytes, the file removed (the front end writes it where it serves files)."""
    taken = []
    for path in paths:
        taken.append((path.name, path.read_bytes()))
        path.unlink(missing_ok=True)
    return tuple(taken)


def _multiplexed_id() -> str:
    """The request's ``multiplexed_model_id`` (several models: the model it runs on); "" outside Serve."""
    try:
        from ray import serve

        return str(serve.get_multiplexed_model_id() or "")
    except Exception:
        return ""


def _replica_identity() -> tuple[str, str]:
    try:
        from ray import get_runtime_context, serve

        replica_id = serve.get_replica_context().replica_id
        return str(getattr(replica_id, "unique_id", replica_id)), get_runtime_context().get_actor_name() or ""
    except Exception:
        return f"local-{os.getpid()}", ""
