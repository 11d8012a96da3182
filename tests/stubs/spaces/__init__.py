"""A stand-in for Hugging Face's ``spaces`` package (ZeroGPU) that mirrors spaces 0.51.0's ``@spaces.GPU``.

Put ``tests/stubs`` on ``sys.path`` (or ``PYTHONPATH``) and ``import spaces`` finds this. Set
``SPACES_ZERO_GPU=1|t|true`` before importing it to get the ZeroGPU behaviour; otherwise ``spaces.GPU`` returns
the function unchanged, as the real one does off ZeroGPU.

Reproduced from the real ``zero/decorator.py``, ``zero/wrappers.py``, ``zero/gradio.py``, ``utils.py`` and
``config.py`` (same names, same order of operations):

* ``spaces.GPU`` as ``@spaces.GPU``, ``@spaces.GPU(duration=..., size=...)``, ``@spaces.GPU(45)``,
  ``@spaces.GPU('xlarge')``; ``duration`` an int, a ``timedelta`` or a callable given the call's arguments;
  ``decorated_cache`` (decorating twice, or decorating the wrapper, gives the same wrapper); coroutine
  functions raise ``NotImplementedError``; the wrapper carries a ``zerogpu`` attribute.
* Each call, in the caller: the Gradio request is read from ``gradio.context.LocalContext.request``; the
  duration is computed (``timedelta.seconds``, default 60 s, the H200 config's factor 1.0 unless ``xlarge``);
  a worker is **forked**; ``((args, kwargs), GradioPartialContext)`` is pickled into a pipe. An unpicklable
  argument (a lock, an Event, a closure, a bound method of an object holding one) therefore fails *in the
  caller*, at the first ``next()`` of a generator function, as ``pickle.PicklingError`` with the pickler's
  message (``"cannot pickle '_thread.lock' object"``; the ``TypeError`` is its ``__context__``).
  As in the real one, ``GradioPartialContext.get`` patches gradio's ``TrackedIterable.__reduce__`` and sends
  ``LocalContext.progress`` as it is (no picklability check: an unpicklable one fails the call there too).
* In the worker: ``forked`` is set (a decorated function called there runs inline), gradio's
  ``Queue.set_progress``/``log_message`` are forwarded to the caller's queue, the function runs in a
  ``ThreadPoolExecutor`` thread under ``copy_context().run`` (so thread-locals such as torch's grad mode do
  not carry over), each yield is pickled back (an unpicklable yield becomes an error), ``stop_event`` is
  checked after every ``next()`` (set: ``gen.close()``, stop), then an end marker is sent.
* In the caller, results are read by a thread and yielded as they arrive; closing the caller's generator at
  a yield sets ``stop_event`` and returns only after the worker's end marker (the real ``with
  ThreadPoolExecutor`` block). A worker exception is re-raised as ``gr.Error(<class name>, title="ZeroGPU
  worker error")`` after printing its traceback, a ``gr.Error`` raised by the function as itself; a worker
  that dies gives ``gr.Error("GPU task aborted")``; a duration overrun gives the ``gr.Warning``.

Not reproduced: the device API (scheduling, quotas, request headers and tokens, release), torch/CUDA
patching and the tensor packing/moving at worker start, the kill of a task that runs past its duration,
closing the Gradio server's sockets and tqdm's lock in the worker, ``gradio_auto_wrap`` and ``aoti_*``, and
``config.py``'s assertion that ``SPACES_ZERO_DEVICE_API_URL`` is set. The real one keeps an idle worker per
GPU and reuses it while idle, so its worker is a snapshot of the process (module state, and the context
variables of the call that forked it) taken at an earlier call; this one forks a worker per call, which exits with ``os._exit`` when done (no atexit handler of the caller runs in it) and
is reaped before the call returns; after an argument pickling failure it is terminated (the real one leaves
it waiting).

For tests: ``spaces.calls`` gets one dict per call that reached the worker stage, and if ``SPACES_STUB_LOG``
names a file the same dict is appended to it as a JSON line: ``function`` (``__qualname__``), ``size``,
``duration`` (seconds), ``saw_request``, ``session_hash``, ``pid_parent``, ``pid_child``, ``yields`` (results
the worker sent back), ``stopped`` (``stop_event`` was set), ``error`` (the worker exception's class name,
``"AbortedResult"`` for a dead worker, or the class of what the caller raised, e.g. ``"PicklingError"``;
``None`` on success or on a close).
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any, Literal, TypeVar, overload

# As the real __init__: gradio imports spaces while gradio itself is half imported (blocks.py,
# block_function.py, ``try: import spaces except Exception``); refuse before importing anything, so no
# half-initialised submodule is left behind for the app's own ``import spaces`` later.
if (_gr := sys.modules.get("gradio")) is not None:
    try:
        _gr.Blocks  # noqa: B018 (the real package touches it the same way)
    except AttributeError:
        raise ImportError from None

from .config import Config
from .record import calls

R = TypeVar("R")
GPUSize = Literal["large", "xlarge"]
Duration = int | timedelta
DynamicDuration = Duration | Callable[..., Duration] | None

decorated_cache: dict[Callable[..., Any], Callable[..., Any]] = {}


@overload
def GPU(
    task: None = None,
    *,
    duration: DynamicDuration = None,
    size: GPUSize | None = None,
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...
@overload
def GPU(
    task: Callable[..., R],
    *,
    duration: DynamicDuration = None,
    size: GPUSize | None = None,
) -> Callable[..., R]: ...
def GPU(task: Any = None, *, duration: DynamicDuration = None, size: GPUSize | None = None, **kwargs: Any) -> Any:
    """ZeroGPU decorator (see the module docstring)."""
    if "enable_queue" in kwargs:
        warnings.warn("`enable_queue` parameter is now ignored and always set to `True`", stacklevel=2)
    if not callable(task):
        if isinstance(task, str):
            size = task
        elif task is not None:
            duration = task
        return partial(_GPU, duration=duration, size=size)
    return _GPU(task, duration, size)


def _GPU(task: Callable[..., R], duration: DynamicDuration, size: GPUSize | None) -> Callable[..., R]:
    if not Config.zero_gpu:
        return task

    from .wrappers import generator_function_wrapper, regular_function_wrapper

    if task in decorated_cache:
        return decorated_cache[task]

    if inspect.iscoroutinefunction(task):
        raise NotImplementedError

    decorated: Callable[..., Any]
    if inspect.isgeneratorfunction(task):
        decorated = generator_function_wrapper(task, duration, size)
    else:
        decorated = regular_function_wrapper(task, duration, size)

    setattr(decorated, "zerogpu", None)  # noqa: B010
    decorated_cache.update({task: decorated, decorated: decorated})
    return decorated  # type: ignore[return-value]


if Config.zero_gpu:  # the real package imports its ZeroGPU machinery (and gradio) at import there
    from . import wrappers as _wrappers  # noqa: F401

__all__ = ["GPU", "calls", "decorated_cache"]
