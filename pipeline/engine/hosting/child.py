"""The model process's own side: ``python -m pipeline.engine.hosting.child FD`` (started by ``engine.hosting.process``).

It reads a pickled loader from the socket ``FD``, loads the model on a ``ModelRunner`` (the named
``gpu-worker`` thread that owns the model and the device), says ``ready`` with the profile, then
serves messages until ``shutdown`` or until the server goes away (its socket closes: the process
exits, so a killed server leaves no model process behind). See ``engine.hosting.process`` for the messages.

Threads: the main thread reads messages (jobs, stops, token counts, which it answers itself) and
submits each job to the runner; ``job-relay`` sends every job's events back as they come (several
jobs may be in flight: joinable ones share a step-level loop, ``engine.loop.joining``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import queue
import sys
import threading
from functools import partial
from multiprocessing.connection import Connection
from typing import Mapping

from ...errors import EngineDead
from ...protocol import InferenceResult, ModelEvent, StopSignal
from .wire import (
    EXIT_POISONED,
    CountTokens,
    JobEvent,
    LoadFailed,
    Ready,
    RunJob,
    Shutdown,
    StopJob,
    TokenCounts,
    ToModel,
    ToServer,
)

log = logging.getLogger(__name__)


def _post(out: queue.SimpleQueue[tuple[int, ModelEvent] | None], serial: int, event: ModelEvent) -> None:
    out.put((serial, event))


def main(fd: int) -> None:
    from ... import allocator
    from .runner import ModelRunner

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s [model-process %(process)d %(threadName)s] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    allocator.tune()  # before the first image: see pipeline/allocator.py
    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(message: ToServer) -> None:
        with send_lock:
            conn.send(message)

    load = pickle.loads(conn.recv_bytes())
    out: queue.SimpleQueue[tuple[int, ModelEvent] | None] = queue.SimpleQueue()
    relay = threading.Thread(target=lambda: relay_events(), name="job-relay", daemon=True)

    def poisoned(reason: str) -> None:  # on the model thread: the job's answer goes out, then the process ends
        out.put(None)
        relay.join(10)
        log.critical("exiting: the device is poisoned (%s); the server starts a new model process", reason)
        os._exit(EXIT_POISONED)

    runner = ModelRunner(load, on_poisoned=poisoned)
    try:
        profile = runner.start()
    except EngineDead as exc:
        send(LoadFailed(str(exc)))
        return
    send(Ready(profile))
    stops: dict[int, StopSignal] = {}

    def relay_events() -> None:  # "job-relay": every job's events back to the server, in order, as they come
        while (item := out.get()) is not None:
            serial, event = item
            try:
                stop = stops.get(serial)
                cancelled = isinstance(event, InferenceResult) and event.reason == "cancelled"
                if (
                    isinstance(event, InferenceResult)
                    and cancelled
                    and stop is not None
                    and stop.steps_at_set is not None
                ):
                    # the model's own count when the stop reached it (the server's lags by the steps in flight)
                    event = dataclasses.replace(event, steps_at_stop=stop.steps_at_set)
                send(JobEvent(serial, event))
            except OSError:
                return  # the server has gone
            if isinstance(event, InferenceResult):
                stops.pop(serial, None)

    relay.start()
    try:
        while True:
            message: ToModel = conn.recv()
            if isinstance(message, RunJob):
                stop = StopSignal()
                stops[message.serial] = stop
                runner.submit(message.job, stop, partial(_post, out, message.serial))
            elif isinstance(message, StopJob):
                if (flag := stops.get(message.serial)) is not None:
                    flag.set()
            elif isinstance(message, CountTokens):
                try:
                    counts: Mapping[str, int] | None = dict(runner.count_tokens(message.text, message.model))
                except Exception:
                    log.exception("count_tokens failed")
                    counts = None
                send(TokenCounts(message.key, counts))
            elif isinstance(message, Shutdown):
                break
    except (EOFError, OSError):
        log.info("the server has gone: the model process exits")
        for flag in list(stops.values()):
            flag.set()
        os._exit(0)
    runner.shutdown()  # after the jobs it holds; their events are on ``out`` by then
    out.put(None)
    relay.join()


if __name__ == "__main__":
    main(int(sys.argv[1]))
