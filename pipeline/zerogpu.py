"""Hugging Face ZeroGPU: the GPU function wears ``@spaces.GPU`` there, and nothing changes elsewhere.

On a ZeroGPU Space the ``spaces`` package is installed and ``spaces.config.Config.zero_gpu`` is true.
A function decorated with ``spaces.GPU(duration=...)`` then runs, each call, in a separate process
that holds a GPU slice for at most ``duration`` seconds; the Space's visitors are queued for GPU time
by that duration, so it should be what the call needs, not a flat maximum. Everywhere else
(``spaces`` missing, or present on other hardware) ``on_zero_gpu`` returns the function unchanged.

Our GPU function is ``DiffusersModel.generate``, called only by the one model thread, under the
adapter's gate: so there is still at most one GPU call in flight, and ZeroGPU's own process is
just where that one call runs.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# A conservative speed for SD-class models on a ZeroGPU slice (an H200 half): pixel-steps per
# second per image (SD 1.5 at 512x512 runs ~20 steps/s, i.e. ~5M pixel-steps/s: half of that here).
PIXEL_STEPS_PER_SECOND = 2.5e6
BASE_SECONDS = 5  # moving the pipeline onto the slice, the VAE decode, the text encoders
MIN_SECONDS, MAX_SECONDS = 10, 300


def gpu_seconds(job: Any, *_: Any, **__: Any) -> int:
    """The duration to ask for: steps x pixels x images at a conservative speed, plus a base."""
    work = job.num_inference_steps * job.width * job.height * len(job.seeds)
    return int(min(MAX_SECONDS, max(MIN_SECONDS, math.ceil(BASE_SECONDS + work / PIXEL_STEPS_PER_SECOND))))


def zero_gpu_active() -> bool:
    try:
        import spaces  # noqa: F401
        import spaces.config
    except ImportError:
        return False
    return bool(getattr(spaces.config.Config, "zero_gpu", False))


def on_zero_gpu(fn: F) -> F:
    """``spaces.GPU(duration=gpu_seconds)(fn)`` on ZeroGPU hardware; ``fn`` itself anywhere else."""
    if not zero_gpu_active():
        return fn
    import spaces

    log.info("ZeroGPU: %s runs under @spaces.GPU with a duration from steps x pixels x images",
             getattr(fn, "__qualname__", fn))
    return spaces.GPU(duration=gpu_seconds)(fn)
