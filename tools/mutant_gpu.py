"""The mutants of the first contact with a real GPU (issue 36): each defence against a device's failure, removed.

Merged into ``tools/mutant_patches.MUTANTS``; ``tools/mutants.py`` names the tests that catch each.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from tools.mutant_seams import Patch, attr

NEVER = re.compile(r"(?!)")


def _free_while_members_live(self: Any, request_id: str, fn: Callable[..., Any], *args: Any) -> Any:
    """The loop's guard of old: the cache emptied inside it, while the failed members still hold tensors."""
    import torch

    from pipeline.errors import OutOfMemory

    try:
        with torch.inference_mode():
            return fn(*args)
    except (torch.OutOfMemoryError, MemoryError):
        pass
    self.model.free_memory()
    raise OutOfMemory(request_id)


def _fit_in_model_dtype(vae: Any, count: int = 6, size: int = 128) -> Any:
    """The preview map fitted in the model's dtype, as before: an SDXL VAE in float16 overflows."""
    from pipeline.engine.model import previews

    return previews._fit(vae, count, size)


GPU: dict[str, list[Patch]] = {
    "joiner-ignores-device-memory": attr("pipeline.serving.scheduler", "MemoryRoom.fits", lambda self, *a: True),
    "offload-chain-left-to-itself": attr(
        "pipeline.engine.loop.loop_base", "MemberLoop._offload_all", lambda self: None
    ),
    "compiled-batch-static": attr("pipeline.engine.model.speedups", "dynamic_batch", lambda module, args, kwargs: None),
    "previews-fitted-in-half": attr("pipeline.engine.model.previews", "fit_from_vae", _fit_in_model_dtype),
    # A sticky device error taken for the request's own fault: the poisoned model side carries on.
    "sticky-error-carried-on": attr("pipeline.engine.device_faults", "POISON", NEVER)
    + attr("pipeline.engine.device_faults", "POISON_TYPES", ()),
    # cuBLAS / cuDNN allocation failures taken for the request's own fault (no retry, no smaller job).
    "allocation-failure-not-memory": attr("pipeline.engine.device_faults", "ALLOCATION", NEVER),
    "oom-freed-while-members-live": attr(
        "pipeline.engine.loop.loop_base", "MemberLoop._guarded", _free_while_members_live
    )
    + attr("pipeline.engine.loop.joining", "LoopDriver._release", lambda self: None),
}
