"""The scheduler owns every request's state (issue 47 §5): the job runner reports steps and endings
(``Scheduler.last_step``, ``Scheduler.left``); only ``pipeline/serving/scheduler.py`` changes an
``Entry``'s or a ``Batch``'s fields, and whether two requests share a loop is computed once
(``protocol.loop_key``), read by the scheduler on requests and by the model side on jobs."""

from __future__ import annotations

import ast
import dataclasses

from pipeline.engine.model.simulated import SimSpec, SimulatedModel
from pipeline.protocol import LoraUse, loop_key
from pipeline.request import Limits, validate
from pipeline.serving import scheduler
from tests.helpers import ROOT, raw_request

# The fields of Entry and Batch that change after the scheduler has taken a request.
OWNED = {"batch", "peers", "last_step", "ticket", "entries", "open"}


def _writes(path: str) -> list[str]:
    """``file:line field`` for each assignment to an owned field, or a batch's ``leave``/``add`` call."""
    tree = ast.parse((ROOT / path).read_text())
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr in OWNED
                and not (isinstance(target.value, ast.Name) and target.value.id == "self")
            ):
                found.append(f"{path}:{node.lineno} {target.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("leave", "add")
            and isinstance(node.func.value, ast.Name)
            and "batch" in node.func.value.id
        ):
            found.append(f"{path}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    return found


def test_only_the_scheduler_changes_entries_and_batches() -> None:
    others = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "pipeline").rglob("*.py")
        if p.name != "scheduler.py" or p.parent.name != "serving"
    )
    assert [w for path in others for w in _writes(path)] == []
    assert _writes("pipeline/serving/scheduler.py"), "the check reads the scheduler's own writes"


def test_whether_two_requests_share_a_loop_is_computed_once_for_both_sides() -> None:
    model = SimulatedModel(SimSpec(), "sim")
    limits = Limits.for_model(model.profile)
    for over in ({}, {"width": 128}, {"scheduler": "default", "num_inference_steps": 7, "seed": 3}):
        request = validate(raw_request(**over), limits)
        job = request.to_job()
        expected = loop_key(request.width, request.height, request.sampler, LoraUse(), per_lora=False, model="sim")
        assert scheduler.loop_key(request, mixed_loras=True) == expected == model.loop_key(job)
    lora = dataclasses.replace(validate(raw_request(), limits), lora="ink", lora_scale=0.5)
    assert scheduler.loop_key(lora, mixed_loras=False)[-2:] == (LoraUse("ink", 0.5), "sim")
