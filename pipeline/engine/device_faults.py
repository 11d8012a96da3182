"""What a fault raised by the model's device means: the request's, memory, or a poisoned device.

A GPU reports three kinds of failure, and each needs its own answer:

- **memory** (``out_of_memory``): ``torch.OutOfMemoryError``, and the allocation failures that
  cuBLAS and cuDNN report as plain ``RuntimeError`` (``CUBLAS_STATUS_ALLOC_FAILED``,
  ``CUDNN_STATUS_ALLOC_FAILED``, "CUDA error: out of memory"). The job can be retried smaller.
- **a poisoned device** (``device_lost``): an illegal memory access, a device-side assert, an
  ECC or Xid error, a launch failure, and every other ``CUDA error`` / ``CUBLAS_STATUS_*`` /
  cuDNN execution failure. It poisons the process's CUDA context: every later kernel fails. The
  only cure is a new process, so the model side that sees one ends itself (``ModelRunner``'s
  ``on_poisoned``): the model process exits and is restarted; a model thread is marked dead.
- **the request's own** (``failed``): anything else (a shape mismatch, a bad prompt): that job
  fails alone and the model carries on.

Pure: messages and exception types only, no torch import (the loops and the fakes share it).
"""

from __future__ import annotations

import re
import traceback

from ..errors import OutOfMemory
from ..protocol import InferenceResult

ALLOCATION = re.compile(
    r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
    r"|CUDNN_STATUS_NOT_ENOUGH_WORKSPACE|failed to allocate",
    re.IGNORECASE,
)
POISON = re.compile(
    r"CUDA error|CUDA kernel errors|illegal memory access|illegal (instruction|address)|misaligned address"
    r"|device-side assert|unspecified launch failure|launch timed out|uncorrectable ECC|ECC error|\bXid\b"
    r"|CUBLAS_STATUS_\w+|CUDNN_STATUS_(EXECUTION_FAILED|INTERNAL_ERROR|MAPPING_ERROR|LICENSE_ERROR)"
    r"|cudaError\w+|NCCL error|HIP error",
    re.IGNORECASE,
)
MEMORY_TYPES = ("OutOfMemoryError", "MemoryError")
POISON_TYPES = ("AcceleratorError",)  # torch >= 2.8 raises CUDA errors as torch.AcceleratorError


def kind_of(exc: BaseException) -> str:
    """``out_of_memory``, ``device_lost`` or ``failed`` for an exception a job raised."""
    if isinstance(exc, (OutOfMemory, MemoryError)) or type(exc).__name__ in MEMORY_TYPES:
        return "out_of_memory"
    text = f"{type(exc).__name__}: {exc}"
    if ALLOCATION.search(text):
        return "out_of_memory"
    if type(exc).__name__ in POISON_TYPES or POISON.search(text):
        return "device_lost"
    return "failed"


def fault_event(exc: BaseException) -> InferenceResult:
    """The error value a job that raised ``exc`` ends with."""
    kind = kind_of(exc)
    if kind == "out_of_memory":
        return InferenceResult.ended_by("out_of_memory", str(exc))
    message = f"{type(exc).__name__}: {exc}"
    if kind == "device_lost":
        return InferenceResult.ended_by("device_lost", message.splitlines()[0][:300], detail=traceback.format_exc())
    return InferenceResult.ended_by("failed", message, detail=traceback.format_exc())
