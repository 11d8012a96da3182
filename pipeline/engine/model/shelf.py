"""Several models under one model thread (issue 52): ``ModelShelf``, and the residency rule it keeps.

The shelf is one ``Model`` to its host (the ``gpu-worker`` thread, a model process, a Ray replica): a
job names its model in its ``model`` option (``fields.TABLE``; absent: the default, the first loaded),
and the shelf runs it on that model. One thread, one gate: one inference at a time across every model.

**Residency.** Models stay on the device while their weights fit the device-memory budget
(``--device-memory-budget`` in MiB; default: the device's total less a margin for the loops'
activations, the larger of 15 % and the largest a job has measured); the rest wait in CPU memory. Before
a job of a model that is off the device runs, the models least recently used are moved off until it
fits, then it is moved on; each move is timed (``ModelState``, reported with every result: ``/health``
and ``/metrics`` read them). A model never moves while a loop of it runs: moves happen only on this
thread, between a loop's end and the next call or loop, and ``Residency.plan`` refuses to name a model
that is marked in use (``open_loop`` marks it, ``close_loop`` clears it). On the CPU the same rule runs
(with a budget given, the states and counts move as on a GPU; the "move" is the CPU's own memory).
Under ``--cpu-offload`` each model already keeps its weights in CPU memory, one component at a time on
the device: no budget applies.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Hashable, Mapping

from ...errors import ModelRefused
from ...protocol import InferenceJob, InferenceResult, ModelProfile, ModelState, StepCallback, StopFlag

log = logging.getLogger(__name__)

MARGIN = 0.15  # of the device's memory, at least, kept for activations when no budget is given


class Residency:
    """Which models are on the device, least recently used first; pure bookkeeping (no torch)."""

    def __init__(self, sizes: Mapping[str, int], budget: int | None) -> None:
        self.sizes = dict(sizes)
        self.budget = budget  # bytes the models' weights may take on the device; None: no limit
        self.on_device: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.in_use: set[str] = set()  # models under a running loop: never moved

    def used(self) -> int:
        return sum(self.sizes[n] for n in self.on_device)

    def fits_beside(self, name: str, others: list[str]) -> bool:
        return self.budget is None or self.sizes[name] + sum(self.sizes[n] for n in others) <= self.budget

    def plan(self, name: str) -> list[str]:
        """The models to move off the device, least recently used first, so that ``name`` fits beside
        the rest; never one in use. Where even all the others off would not make room, those that can
        go (the model runs over the budget: it is the one asked for)."""
        if name in self.on_device:
            return []
        staying = list(self.on_device)
        off: list[str] = []
        for other in list(self.on_device):
            if self.fits_beside(name, staying):
                break
            if other in self.in_use:
                continue
            staying.remove(other)
            off.append(other)
        return off

    def touch(self, name: str) -> None:
        self.on_device[name] = None
        self.on_device.move_to_end(name)

    def moved_off(self, name: str) -> None:
        if name in self.in_use:
            raise RuntimeError(f"{name} is under a running loop and cannot be moved")
        self.on_device.pop(name, None)


class ModelShelf:
    """Several loaded models as one ``Model`` (the module doc); used only on the model thread,
    ``count_tokens`` excepted."""

    def __init__(self, *, device: str, budget: int | None = None, offloaded: bool = False) -> None:
        self.models: dict[str, Any] = {}  # name -> DiffusersModel (or any Model), the default first
        self.device = device
        self.explicit_budget = budget  # ``--device-memory-budget`` in bytes; None: from the device
        # ``--cpu-offload``: each model's accelerate hooks place it; the shelf never moves one
        self.offloaded = offloaded
        self.residency = Residency({}, budget)
        self._states: dict[str, ModelState] = {}
        self._switched: dict[str, float] = {}  # request id -> the moves its job waited for, in ms
        self._peak_activations = 0  # the largest (peak - idle) a job measured: the default budget's margin
        self.profile: ModelProfile  # set by the first ``add``

    def add(self, name: str, model: Any) -> None:
        """A model just loaded onto the device; the least recently used go off if it does not fit beside them."""
        self.models[name] = model
        self.residency.sizes[name] = weight_bytes(model)
        place = "memory" if self.offloaded else "device"  # offloaded: in CPU memory, a component at a time on it
        self._states[name] = ModelState(name, place, model.profile.family, self.residency.sizes[name])
        self.residency.budget = self.budget()
        self.residency.touch(name)
        self._settle(name)
        self.profile = self._profile()

    def before_load(self) -> None:
        """Before the next model loads onto a device that reports its memory (CUDA): every model loaded so far
        goes to CPU memory, so that one that would not fit beside them still loads (they come back when
        asked). On the CPU, and under ``--cpu-offload``, nothing moves."""
        if self.device.startswith("cuda") and not self.offloaded:
            for name in list(self.residency.on_device):
                self._move(name, onto=False)

    def ready(self, name: str) -> None:
        """``name`` on the device (the others as the budget allows), as a job of it would place it."""
        self._place(name)
        self.profile = self._profile()

    @property
    def default(self) -> str:
        return next(iter(self.models))

    def _profile(self) -> ModelProfile:
        """The default model's profile, with the others' and every model's state (``ModelProfile.models``)."""
        others = tuple(m.profile for n, m in self.models.items() if n != self.default)
        return dataclasses.replace(self.models[self.default].profile, models=others, residency=self.states())

    @property
    def loads(self) -> int:
        return max(getattr(m, "loads", 0) for m in self.models.values())

    # -- which model ---------------------------------------------------------------------------
    def name_of(self, job: InferenceJob) -> str:
        asked = dict(job.options).get("model") or self.default
        if asked in self.models:
            return asked
        for name, model in self.models.items():
            if asked in (model.profile.name, model.profile.model_id):
                return name
        raise ModelRefused(f"no model named {asked!r} is served here; served: {', '.join(self.models)}")

    def model_of(self, job: InferenceJob) -> Any:
        return self.models[self.name_of(job)]

    def states(self) -> tuple[ModelState, ...]:
        return tuple(self._states.values())

    # -- residency ---------------------------------------------------------------------------
    def budget(self) -> int | None:
        """Bytes the weights may take on the device: ``--device-memory-budget``, else the device's total
        less the margin (module doc); None on a device that reports no memory (the CPU): no limit."""
        if self.offloaded:
            return None
        if self.explicit_budget is not None:
            return self.explicit_budget
        reading = self.device_memory()
        if reading is None:
            return None
        total = reading[0]
        return int(total - max(MARGIN * total, self._peak_activations))

    def _place(self, name: str) -> float:
        """``name`` on the device, others moved off first as the budget requires; the ms it took (0: it was there)."""
        self.residency.budget = self.budget()
        if name in self.residency.on_device:
            self.residency.touch(name)
            self._settle(name)  # over the budget since a loop held a model: the rule applies again
            return 0.0
        t0 = time.perf_counter()
        for other in self.residency.plan(name):
            self._move(other, onto=False)
        self._move(name, onto=True)
        self.residency.touch(name)
        return (time.perf_counter() - t0) * 1000

    def _settle(self, keep: str) -> None:
        """Move the least recently used off while the device holds more than the budget (not ``keep``, nor
        a model in use)."""
        for other in list(self.residency.on_device):
            budget = self.residency.budget
            if budget is None or self.residency.used() <= budget:
                return
            if other != keep and other not in self.residency.in_use:
                self._move(other, onto=False)

    def _move(self, name: str, *, onto: bool) -> None:
        """``name`` onto the device or off it to CPU memory (on the CPU: the same memory, the same rule)."""
        model = self.models[name]
        where = self.device if onto else "cpu"
        if not onto:
            self.residency.moved_off(name)  # refuses a model under a running loop
        t0 = time.perf_counter()
        move_to(model, where)
        ms = (time.perf_counter() - t0) * 1000
        state = self._states[name]
        self._states[name] = dataclasses.replace(
            state, state="device" if onto else "memory", moves=state.moves + 1,
            last_in_ms=round(ms, 3) if onto else state.last_in_ms,
            last_out_ms=state.last_out_ms if onto else round(ms, 3))  # fmt: skip
        if not onto and self.device != "cpu":
            model.free_memory()
        log.info("moved %s %s in %.1f ms", name, "onto the device" if onto else "to CPU memory", ms)

    def _ready(self, job: InferenceJob) -> Any:
        name = self.name_of(job)
        ms = self._place(name)
        if ms:
            self._switched[job.request_id] = ms
        return self.models[name]

    # -- the Model protocol ------------------------------------------------------------------
    def count_tokens(self, text: str, model: str = "") -> Mapping[str, int]:
        target = self.models.get(model) or self.models[self.default]
        return target.count_tokens(text)

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        return self._ready(job).generate(job, stop, on_step)

    def loop_key(self, job: InferenceJob) -> Hashable | None:
        """The job's model's (``protocol.loop_key`` holds the model's name: a loop runs one model)."""
        key_of = getattr(self.model_of(job), "loop_key", None)
        return key_of(job) if key_of is not None else None

    def open_loop(self, job: InferenceJob) -> Any:
        model = self._ready(job)
        self.residency.in_use.add(self.name_of(job))
        return model.open_loop(job)

    def close_loop(self) -> None:
        """The loop has ended: its model may move again."""
        self.residency.in_use.clear()

    def stamp(self, result: InferenceResult, job: InferenceJob) -> InferenceResult:
        """A job's result with its model, the moves it waited for, and every model's state."""
        if result.peak_memory_bytes and result.idle_bytes:
            self._peak_activations = max(self._peak_activations, result.peak_memory_bytes - result.idle_bytes)
        try:
            name = self.name_of(job)
        except ModelRefused:
            name = ""
        return dataclasses.replace(result, model=name, residency=self.states(),
                                   model_switch_ms=round(self._switched.pop(job.request_id, 0.0), 3))  # fmt: skip

    def device_memory(self) -> tuple[int, int] | None:
        probe = getattr(self.models[self.default], "device_memory", None)
        return probe() if probe is not None else None

    def free_memory(self) -> None:
        self.models[self.default].free_memory()


def weight_bytes(model: Any) -> int:
    """The bytes of a model's weights: every module of its pipeline and its ControlNets."""
    modules = list(_modules(model))
    seen: set[int] = set()
    total = 0
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def _modules(model: Any) -> list[Any]:
    pipe = getattr(model, "pipe", None)
    found = [c for c in getattr(pipe, "components", {}).values() if hasattr(c, "parameters")]
    found += [c for c in getattr(model, "controlnets", {}).values() if hasattr(c, "parameters")]
    return found


def move_to(model: Any, where: str) -> None:
    """A model's pipeline and ControlNets onto ``where`` (its device, or "cpu"), waited for."""
    pipe = getattr(model, "pipe", None)
    if pipe is not None:
        pipe.to(where)
    for controlnet in getattr(model, "controlnets", {}).values():
        controlnet.to(where)
    if where.startswith("cuda") or model.profile.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def model_hash(folder: Path | None) -> str:
    """AUTOMATIC1111's short model hash (``Model hash:``): the first 10 hex digits of the SHA-256 of the
    checkpoint file, here the denoiser's weights file in a local diffusers folder ("" elsewhere)."""
    if folder is None:
        return ""
    for part in ("unet", "transformer"):
        files = sorted((folder / part).glob("*.safetensors")) if (folder / part).is_dir() else []
        if files:
            digest = hashlib.sha256()
            with files[0].open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
            return digest.hexdigest()[:10]
    return ""
