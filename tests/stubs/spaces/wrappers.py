"""The process boundary of spaces 0.51.0 (``zero/wrappers.py``, ``zero/gradio.py``, ``utils.py``), minus the
device API and torch: the names and the order of operations follow the real code so that what it does to an
app (pickling in the caller, a forked child, results through a pipe) happens here too.
See the package docstring for what differs."""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps
from multiprocessing.queues import SimpleQueue as _SimpleQueue
from pickle import PicklingError
from queue import Queue as ThreadQueue
from threading import Event as ThreadEvent
from threading import Thread
from typing import Any, Generic, NamedTuple, TypeVar

import gradio as gr
from gradio.context import LocalContext
from gradio.helpers import Progress, TrackedIterable
from gradio.queueing import Queue as GradioQueue
from typing_extensions import ParamSpec

from . import record

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

GENERATOR_GLOBAL_TIMEOUT = 20 * 60
DEFAULT_SCHEDULE_DURATION = 60
DURATION_FACTOR = 1.0  # configs.json's first (default) entry, "NVIDIA H200"; 1.5 on the RTX PRO 6000 nodes
QUEUE_RPC_METHODS = ["set_progress", "log_message"]

multiprocessing_ctx = multiprocessing.get_context("fork")
forked = False  # True in a worker: a decorated function called there runs inline

Duration = int | timedelta
DynamicDuration = Duration | Callable[..., Duration] | None


# --- zero/types.py -----------------------------------------------------------------------------------------
@dataclass
class OkResult(Generic[T]):
    value: T


@dataclass
class ExceptionResult:
    traceback: str
    error_cls: str
    gradio_error: gr.Error | None


@dataclass
class AbortedResult:
    pass


@dataclass
class EndResult:
    pass


@dataclass
class GradioQueueEvent:
    method_name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


# --- utils.py ----------------------------------------------------------------------------------------------
class SimpleQueue(_SimpleQueue):
    """utils.SimpleQueue: a pipe; ``put`` pickles in the caller and turns "...pickle..." errors into PicklingError."""

    def __init__(self) -> None:
        super().__init__(ctx=multiprocessing_ctx)

    def put(self, obj: Any) -> None:
        try:
            super().put(obj)
        except PicklingError:
            raise
        except Exception as e:  # https://bugs.python.org/issue29187
            message = str(e)
            if "pickle" not in message:
                raise
            raise PicklingError(message)  # noqa: B904 (as the real package raises it)

    def wlock_release(self) -> None:
        if (lock := getattr(self, "_wlock", None)) is None:
            return
        with contextlib.suppress(ValueError):
            lock.release()


def drop_params(fn: Callable[[], T]) -> Callable[..., T]:
    def drop(*args: Any) -> T:
        return fn()

    return drop


# --- zero/gradio.py ----------------------------------------------------------------------------------------
def tracked_iterable__reduce__(self: TrackedIterable) -> Any:
    res: tuple[Any, ...] = super(TrackedIterable, self).__reduce__()
    cls, base, state, *_ = res
    return cls, base, {**state, "iterable": None, "_tqdm": None}


class GradioPartialContext(NamedTuple):
    event_id: str | None
    in_event_listener: bool
    progress: Progress | None

    @staticmethod
    def get() -> GradioPartialContext:
        # As the real one: patch gradio's TrackedIterable so a Progress pickles, then send it as it is.
        TrackedIterable.__reduce__ = tracked_iterable__reduce__
        return GradioPartialContext(
            event_id=LocalContext.event_id.get(None),
            in_event_listener=LocalContext.in_event_listener.get(False),
            progress=LocalContext.progress.get(None),
        )

    @staticmethod
    def apply(context: GradioPartialContext) -> None:
        LocalContext.event_id.set(context.event_id)
        LocalContext.in_event_listener.set(context.in_event_listener)
        LocalContext.progress.set(context.progress)


def try_process_queue_event(method_name: str, *args: Any, **kwargs: Any) -> None:
    blocks = LocalContext.blocks.get(None)
    queue = None if blocks is None else blocks._queue
    if queue is None:
        import warnings

        warnings.warn("ZeroGPU: Cannot get Gradio app Queue instance", stacklevel=2)
        return
    method = getattr(queue, method_name, None)
    assert callable(method)
    method(*args, **kwargs)


def patch_gradio_queue(res_queue: SimpleQueue) -> None:
    """In the worker: progress and gr.Info/Warning calls become events sent to the caller's Gradio queue."""

    def rpc_method(method_name: str) -> Callable[..., None]:
        def method(*args: Any, **kwargs: Any) -> None:
            if args and isinstance(args[0], GradioQueue):
                args = args[1:]  # drop `self`
            res_queue.put(GradioQueueEvent(method_name, args, kwargs))

        return method

    for method_name in QUEUE_RPC_METHODS:
        if callable(getattr(GradioQueue, method_name, None)):
            setattr(GradioQueue, method_name, rpc_method(method_name))
    TrackedIterable.__reduce__ = tracked_iterable__reduce__


def error(title: str, message: str) -> gr.Error:
    params = inspect.signature(gr.Error).parameters
    kwargs: dict[str, Any] = {}
    if "title" in params:
        kwargs["title"] = title
    if "print_exception" in params:
        kwargs["print_exception"] = False
    return gr.Error(message, **kwargs)


def duration_warning() -> None:
    message = "GPU task is exceeding its requested duration and might be aborted"
    kwargs: dict[str, Any] = (
        {"title": "ZeroGPU duration"} if "title" in inspect.signature(gr.Warning).parameters else {}
    )
    gr.Warning(message, **kwargs)


# --- zero/wrappers.py --------------------------------------------------------------------------------------
class Worker:
    """A forked process with an argument pipe, a result pipe and a stop event; when the process ends, the
    sentinel thread reaps it and puts ``None`` on the result pipe (so a dead worker reads as "aborted")."""

    def __init__(self, target: Callable[[SimpleQueue, SimpleQueue, Any], None]) -> None:
        self._sentinel = Thread(target=self._close_on_exit, daemon=True)
        self.arg_queue = SimpleQueue()
        self.res_queue = SimpleQueue()
        self.stop_event = multiprocessing_ctx.Event()
        self.process = multiprocessing_ctx.Process(
            target=target, args=(self.arg_queue, self.res_queue, self.stop_event), daemon=True
        )
        self.process.start()
        self._sentinel.start()

    def _close_on_exit(self) -> None:
        self.process.join()
        self.arg_queue.close()
        self.res_queue.wlock_release()
        self.res_queue.put(None)

    def reap(self, timeout: float = 30.0) -> None:
        """Stand-in only (one worker per call): wait for the child to exit, kill it if it does not."""
        self._sentinel.join(timeout)
        if self._sentinel.is_alive():
            self.process.kill()
            self._sentinel.join(timeout)
        if not self._sentinel.is_alive():
            self.res_queue.close()


def process_duration(duration: Duration | None) -> timedelta | None:
    if duration is None or isinstance(duration, timedelta):
        return duration
    return timedelta(seconds=duration)


def static_duration(duration: DynamicDuration, *args: Any, **kwargs: Any) -> Duration | None:
    if not callable(duration):
        return duration
    return duration(*args, **kwargs)


def get_duration_seconds(duration: timedelta | None, gpu_size: str | None) -> float:
    duration_seconds: float = duration.seconds if duration is not None else DEFAULT_SCHEDULE_DURATION
    if gpu_size != "xlarge":
        duration_seconds *= DURATION_FACTOR
    return duration_seconds


def exception_result(exc: BaseException) -> ExceptionResult:
    formatted = traceback.format_exception(type(exc), exc, exc.__traceback__)
    gradio_error = None
    if isinstance(exc, gr.Error):
        gradio_error = exc
        gradio_error.print_exception = getattr(gradio_error, "print_exception", True)
    return ExceptionResult(traceback="".join(formatted), error_cls=exc.__class__.__name__, gradio_error=gradio_error)


def raise_exception_result(res: ExceptionResult) -> None:
    if res.gradio_error is not None:
        if res.gradio_error.print_exception:
            print(res.traceback)
            res.gradio_error.print_exception = False
        raise res.gradio_error
    print(res.traceback)
    raise error("ZeroGPU worker error", res.error_cls)


def child_main(
    body: Callable[[SimpleQueue, SimpleQueue, Any], None],
) -> Callable[[SimpleQueue, SimpleQueue, Any], None]:
    """The worker's target: ``body`` once, then ``os._exit`` (no parent atexit handler or finalizer runs here)."""

    def target(arg_queue: SimpleQueue, res_queue: SimpleQueue, stop_event: Any) -> None:
        global forked
        forked = True
        code = 0
        try:
            signal.signal(signal.SIGTERM, drop_params(arg_queue.close))
            body(arg_queue, res_queue, stop_event)
        except BaseException:
            traceback.print_exc()  # as multiprocessing would; the caller then sees "GPU task aborted"
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

    return target


def _begin(
    task: Callable[..., Any],
    duration: DynamicDuration,
    gpu_size: str | None,
    args: Any,
    kwargs: Any,
) -> dict[str, Any]:
    request = LocalContext.request.get(None)  # spaces.utils.gradio_request_var()
    duration_ = process_duration(static_duration(duration, *args, **kwargs))
    seconds = get_duration_seconds(duration_, gpu_size)
    # (the real one now schedules the call with the device API: request headers, quota, duration)
    return record.new_record(task.__qualname__, gpu_size, seconds, request)


def _send_args(worker: Worker, args: Any, kwargs: Any) -> None:
    try:
        worker.arg_queue.put(((args, kwargs), GradioPartialContext.get()))
    except PicklingError:
        worker.process.terminate()  # the real one leaves the worker waiting for arguments
        raise


def _warn_after(seconds: float, done: ThreadEvent) -> Callable[[], None]:
    def warn_duration() -> None:
        if not done.wait(seconds):
            duration_warning()

    return warn_duration


def regular_function_wrapper(
    task: Callable[P, R],
    duration: DynamicDuration,
    gpu_size: str | None,
) -> Callable[P, R]:

    @wraps(task)
    def gradio_handler(*args: P.args, **kwargs: P.kwargs) -> R:
        if forked:
            return task(*args, **kwargs)
        rec = _begin(task, duration, gpu_size, args, kwargs)
        worker = Worker(thread_wrapper)
        rec["pid_child"] = worker.process.pid
        try:
            _send_args(worker, args, kwargs)
            res_event = ThreadEvent()
            with ThreadPoolExecutor(1) as executor:
                executor.submit(copy_context().run, _warn_after(rec["duration"], res_event))
                try:
                    while True:
                        res = worker.res_queue.get()
                        if res is None:
                            rec["error"] = "AbortedResult"
                            raise error("ZeroGPU worker error", "GPU task aborted")
                        if isinstance(res, ExceptionResult):
                            rec["error"] = res.error_cls
                            raise_exception_result(res)
                        if isinstance(res, OkResult):
                            return res.value
                        if isinstance(res, GradioQueueEvent):
                            try_process_queue_event(res.method_name, *res.args, **res.kwargs)
                            continue
                        raise AssertionError(res)
                finally:
                    res_event.set()
        except BaseException as e:
            rec["error"] = rec["error"] or type(e).__name__
            raise
        finally:
            rec["stopped"] = worker.stop_event.is_set()
            worker.reap()
            record.write(rec)

    @child_main
    def thread_wrapper(arg_queue: SimpleQueue, res_queue: SimpleQueue, _stop_event: Any) -> None:
        try:
            (args, kwargs), gradio_context = arg_queue.get()
        except OSError:
            return
        patch_gradio_queue(res_queue)

        def run_task() -> None:
            res: OkResult[Any] | ExceptionResult
            try:
                res = OkResult(task(*args, **kwargs))
            except Exception as e:
                res = exception_result(e)
            try:
                res_queue.put(res)
            except PicklingError as e:
                res_queue.put(exception_result(e))

        GradioPartialContext.apply(gradio_context)
        context = copy_context()
        with ThreadPoolExecutor() as executor:
            future = executor.submit(context.run, run_task)
        future.result()

    if not hasattr(task, "__annotations__"):
        gradio_handler.__annotations__ = {}
    return gradio_handler


def generator_function_wrapper(
    task: Callable[P, Generator[R, None, None]], duration: DynamicDuration, gpu_size: str | None
) -> Callable[P, Generator[R, None, None]]:

    @wraps(task)
    def gradio_handler(*args: P.args, **kwargs: P.kwargs) -> Generator[R, None, None]:
        if forked:
            yield from task(*args, **kwargs)
            return
        rec = _begin(task, duration, gpu_size, args, kwargs)
        worker = Worker(thread_wrapper)
        rec["pid_child"] = worker.process.pid
        try:
            _send_args(worker, args, kwargs)
            res_event = ThreadEvent()
            yield_queue: ThreadQueue[Any] = ThreadQueue()

            def fill_yield_queue(worker: Worker) -> None:
                while True:
                    res = worker.res_queue.get()
                    if res is None:
                        yield_queue.put(AbortedResult())
                        return
                    if isinstance(res, ExceptionResult):
                        yield_queue.put(res)
                        return
                    if isinstance(res, EndResult):
                        yield_queue.put(EndResult())
                        return
                    if isinstance(res, OkResult):
                        rec["yields"] += 1
                        yield_queue.put(OkResult(res.value))
                        continue
                    if isinstance(res, GradioQueueEvent):
                        try_process_queue_event(res.method_name, *res.args, **res.kwargs)
                        continue
                    raise AssertionError(res)

            # Leaving this block (end, error, or the consumer's close) waits for fill_yield_queue, i.e. for
            # the child's end marker: a closed generator returns once the child has stopped.
            with ThreadPoolExecutor(2) as e:
                e.submit(copy_context().run, _warn_after(rec["duration"], res_event))
                f = e.submit(copy_context().run, fill_yield_queue, worker)
                f.add_done_callback(lambda _: res_event.set())
                while True:
                    res = yield_queue.get(timeout=GENERATOR_GLOBAL_TIMEOUT)  # queue.Empty: raised, as there
                    if isinstance(res, AbortedResult):
                        rec["error"] = "AbortedResult"
                        raise error("ZeroGPU worker error", "GPU task aborted")
                    if isinstance(res, ExceptionResult):
                        rec["error"] = res.error_cls
                        raise_exception_result(res)
                    if isinstance(res, EndResult):
                        break
                    if isinstance(res, OkResult):
                        try:
                            yield res.value
                        except GeneratorExit:
                            worker.stop_event.set()
                            raise
                        continue
                    raise AssertionError(res)
        except GeneratorExit:
            raise
        except BaseException as exc:
            rec["error"] = rec["error"] or type(exc).__name__
            raise
        finally:
            rec["stopped"] = worker.stop_event.is_set()
            worker.reap()
            record.write(rec)

    @child_main
    def thread_wrapper(arg_queue: SimpleQueue, res_queue: SimpleQueue, stop_event: Any) -> None:
        try:
            (args, kwargs), gradio_context = arg_queue.get()
        except OSError:
            return
        stop_event.clear()
        patch_gradio_queue(res_queue)

        def iterate() -> None:
            gen = task(*args, **kwargs)
            while True:
                try:
                    res = next(gen)
                except StopIteration:
                    break
                except Exception as e:
                    res_queue.put(exception_result(e))
                    break
                if stop_event.is_set():
                    gen.close()
                    break
                try:
                    res_queue.put(OkResult(res))
                except PicklingError as e:
                    res_queue.put(exception_result(e))
                    break

        GradioPartialContext.apply(gradio_context)
        with ThreadPoolExecutor() as executor:
            executor.submit(copy_context().run, iterate)
        res_queue.put(EndResult())

    if not hasattr(task, "__annotations__"):
        gradio_handler.__annotations__ = {}
    return gradio_handler
