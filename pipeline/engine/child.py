"""The model process's own side: ``python -m pipeline.engine.child FD`` (started by ``engine.process``).

It reads a pickled loader from the socket ``FD``, loads the model on a ``ModelRunner`` (the named
``gpu-worker`` thread that owns the model and the device), says ``ready`` with the profile, then
serves messages until ``shutdown`` or until the server goes away (its socket closes: the process
exits, so a killed server leaves no model process behind). See ``engine.process`` for the messages.

Threads: the main thread reads messages (jobs, stops, token counts, which it answers itself);
``job-relay`` streams one job at a time from the runner and sends each event back as it comes.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Mapping

from ..errors import EngineDead
from ..protocol import CountingStop, ErrorEvent, InferenceJob

log = logging.getLogger(__name__)


def main(fd: int) -> None:
    from .runner import ModelRunner

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s [model-process %(process)d %(threadName)s] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    load = pickle.loads(conn.recv_bytes())
    runner = ModelRunner(load)
    try:
        profile = runner.start()
    except EngineDead as exc:
        send(("failed", str(exc)))
        return
    send(("ready", profile))
    jobs: queue.SimpleQueue[tuple[int, InferenceJob] | None] = queue.SimpleQueue()
    stops: dict[int, CountingStop] = {}

    def drive() -> None:  # "job-relay": one job at a time, its events back to the server as they come
        while (item := jobs.get()) is not None:
            serial, job = item
            try:
                stop = stops[serial]
                for event in runner.stream(job, stop):
                    if isinstance(event, ErrorEvent) and event.kind == "cancelled" and stop.steps_at_set is not None:
                        # the model's own count when the stop reached it (the server's lags by the steps in flight)
                        send(("stopped_at", serial, stop.steps_at_set))
                    send(("event", serial, event))
            except OSError:
                return  # the server has gone
            finally:
                stops.pop(serial, None)

    relay = threading.Thread(target=drive, name="job-relay", daemon=True)
    relay.start()
    try:
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "job":
                stops[message[1]] = CountingStop()
                jobs.put((message[1], message[2]))
            elif kind == "stop":
                if (flag := stops.get(message[1])) is not None:
                    flag.set()
            elif kind == "count":
                try:
                    counts: Mapping[str, int] | None = dict(runner.count_tokens(message[2]))
                except Exception:
                    log.exception("count_tokens failed")
                    counts = None
                send(("count", message[1], counts))
            elif kind == "shutdown":
                break
    except (EOFError, OSError):
        log.info("the server has gone: the model process exits")
        for flag in list(stops.values()):
            flag.set()
        os._exit(0)
    jobs.put(None)
    relay.join()
    runner.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
