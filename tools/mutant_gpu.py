"""The mutants of the first contact with a real GPU (issue 36): each defence against a device's failure, removed.

Merged into ``tools/mutant_patches.MUTANTS``; ``tools/mutants.py`` names the tests that catch each.
"""

from __future__ import annotations

import re

from tools.mutant_seams import Patch, attr

NEVER = re.compile(r"(?!)")

GPU: dict[str, list[Patch]] = {
    # A sticky device error taken for the request's own fault: the poisoned model side carries on.
    "sticky-error-carried-on": attr("pipeline.engine.device_faults", "POISON", NEVER)
    + attr("pipeline.engine.device_faults", "POISON_TYPES", ()),
    # cuBLAS / cuDNN allocation failures taken for the request's own fault (no retry, no smaller job).
    "allocation-failure-not-memory": attr("pipeline.engine.device_faults", "ALLOCATION", NEVER),
}
