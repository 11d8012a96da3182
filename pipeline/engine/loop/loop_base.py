"""What every step-level denoising loop of a real diffusers pipeline shares (``engine.loop.joining.Loop``).

A loop holds *members*, one per job, each with everything the pipeline's own ``__call__`` keeps
for one call: its own sampler (a diffusers scheduler instance, built from the model's config by ``samplers.build`` and
``set_timesteps`` exactly as the pipeline does), its own timesteps and step index, its own per-image
CPU generators (initial noise, then ancestral noise in ``sampler.step``), its own guidance and
text conditioning. Members share only what the loop key says (size and sampler) and the weights.

One ``step`` (``MemberLoop._step``):

1. Every member not yet done takes its rows of the denoiser input at its own timestep
   (the family's ``_predict``: one denoiser call for all rows, then each member's own guidance).
2. Each member's own ``sampler.step`` advances its own slice, with its own generators.
3. Members on a preview step get small previews of their denoised estimate, the way
   ``stepping.StepWatch`` makes them.

``decode`` runs the finishing members' latents through the VAE together, as the pipeline decodes
one call's batch. The family modules (``loop_sd``, ``loop_flow``) supply the encoding, the starting
latents, the denoiser call and the VAE decode; this module the bookkeeping, previews and out-of-memory
handling. Everything here runs on the model thread, under ``torch.inference_mode()``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, TypeVar

import torch
from PIL import Image

from ...errors import OutOfMemory
from ...fields import STEP_CACHE_OFF
from ...protocol import InferenceJob
from ..device_faults import kind_of
from ..model.lora import use_of
from ..model.previews import denoised, unpack
from .step_cache import MemberCache, RowCache

if TYPE_CHECKING:
    from ...protocol import ModelProfile
    from ..model.lora import LoadedLoras
    from ..model.previews import Previewer
    from ..model.prompt_weights import Encoded


class LoopHost(Protocol):
    """What a loop reads of the model that opened it (``DiffusersModel`` is one): the pipeline and its
    own sampler, the profile, the preview map, the adapters; a typed seam, so that this module does
    not import the model's (which imports the loops)."""

    pipe: Any
    base_sampler: Any
    profile: ModelProfile
    preview_map: Previewer | None
    loras: LoadedLoras | None
    loads: int
    controlnets: dict[str, Any]  # the ControlNets loaded at start (``--controlnet``), by name
    control_hooks: list[Any]  # under --cpu-offload, their offload hooks

    def use_adapter(self, job: InferenceJob) -> float: ...

    def clip_embeddings(self, job: InferenceJob, negatives: bool) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def flux_embeddings(self, job: InferenceJob, device: torch.device) -> tuple[torch.Tensor, ...]: ...

    def encoded(self, job: InferenceJob, negatives: bool) -> Encoded: ...

    def free_memory(self) -> None: ...


T = TypeVar("T")

# Loops whose denoiser input is one row per image (and CFG's [uncond, cond] per member), so that peft's
# mixed-adapter batches can give each row its own LoRA (``engine.model.lora``). Z-Image's transformer takes
# a list of images and packs their tokens together: its adapters batch a loop per adapter instead.
MIXED_LORA_LOOPS = frozenset({"sd", "sd3", "flux", "chroma"})
# Loops that start a member from a picture (image-to-image at its own first timestep, as the family's
# image-to-image pipeline does), beside text members: the SD 1.x/2.x loop. Elsewhere image-to-image
# runs as whole-pipeline calls (which share among themselves: ``serving.scheduler.batch_key``).
IMAGE_LOOPS = frozenset({"sd"})


def loop_kind(pipe: Any) -> str | None:
    """The loop this pipeline runs step-level (its registry entry's ``loop``), or None (job-level only).

    Only the exact text-to-image classes (``family_table.family_for``): subclasses and img2img/inpaint
    variants call their denoiser differently and keep job-level batching."""
    from ..model.family_table import family_for

    family = family_for(type(pipe).__name__)
    return family.loop if family is not None else None


def generators_of(job: InferenceJob) -> list[torch.Generator]:
    """One CPU generator per image, as ``DiffusersModel.generate`` makes them."""
    return [torch.Generator("cpu").manual_seed(seed) for seed in job.seeds]


def step_kwargs(sampler: Any, generators: list[torch.Generator], eta: float = 0.0) -> dict[str, Any]:
    """The pipeline's ``prepare_extra_step_kwargs``, for this member's own sampler."""
    accepted = set(inspect.signature(sampler.step).parameters)
    kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        kwargs["eta"] = eta
    if "generator" in accepted:
        kwargs["generator"] = generators
    return kwargs


@dataclass
class LoopMember:
    """One job in the loop: what the pipeline's ``__call__`` keeps for one call."""

    job: InferenceJob
    sampler: Any  # the member's own diffusers scheduler instance
    timesteps: torch.Tensor
    latents: torch.Tensor  # (images, ...), as the pipeline holds them (FLUX: packed)
    cfg: bool  # classifier-free guidance: rows [uncond, cond], else [cond]
    rows_of: dict[str, torch.Tensor]  # per-row conditioning, concatenated across members
    shared: dict[str, Any] = field(default_factory=dict)  # the same for every member (FLUX's ids)
    step_kwargs: dict[str, Any] = field(default_factory=dict)
    done: int = 0
    cache: MemberCache | RowCache | None = None  # its own step cache (``step_cache``); None: every step computed
    control: Any = None  # its own ControlNet map, scale and window (``control.MemberControl``); None: none

    @property
    def images(self) -> int:
        return int(self.latents.shape[0])

    @property
    def rows(self) -> int:
        return self.images * (2 if self.cfg else 1)

    @property
    def total(self) -> int:
        return len(self.timesteps)

    @property
    def timestep(self) -> torch.Tensor:
        return self.timesteps[self.done]

    def guided(self, prediction: torch.Tensor) -> torch.Tensor:
        """The pipeline's guidance on this member's rows of the denoiser output."""
        if not self.cfg:
            return prediction
        uncond, cond = prediction.chunk(2)
        return uncond + self.job.guidance_scale * (cond - uncond)


class MemberLoop:
    """The bookkeeping of ``joining.Loop`` over a real pipeline; a family subclass fills in the hooks."""

    def __init__(self, model: LoopHost) -> None:
        self.model = model
        self.pipe = model.pipe
        self.preview_map = model.preview_map
        self.device = torch.device(self.pipe._execution_device)
        self.members: dict[int, LoopMember] = {}
        self._switch_ms: dict[int, float] = {}  # slot -> the adapter switch its prompt encoding took
        self._cache_reports: dict[int, tuple[tuple[str, Any], ...]] = {}  # slot -> its step cache's counts
        self._next_slot = 0
        self._cuda = self.device.type == "cuda"
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()

    # -- family hooks ------------------------------------------------------------------------------

    def _enter(self, job: InferenceJob) -> LoopMember:
        """Encode the prompts, build the sampler and timesteps, draw the starting latents."""
        raise NotImplementedError

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        """One denoiser call for every member's rows; each member's guided prediction."""
        raise NotImplementedError

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        """The pipeline's VAE decode and postprocessing of these latents."""
        raise NotImplementedError

    # -- joining.Loop ------------------------------------------------------------------------------

    def add(self, job: InferenceJob) -> int:
        switch_ms = self.model.use_adapter(job)  # its text encoders read its prompts through its own adapter
        self._offload_all()  # mid-loop, the denoiser is on the device: its encoders must not join it there
        member = self._guarded(job.request_id, self._enter, job)
        method = str(dict(job.options).get("step_cache", STEP_CACHE_OFF))
        member.cache = MemberCache.of(method, member.total, member.rows)
        if job.mode != "text":
            self._offload_all()  # its picture went through the VAE: the VAE leaves before the next denoiser call
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self.members[slot] = member
        self._switch_ms[slot] = switch_ms
        return slot

    def result_fields(self, slot: int) -> dict[str, Any]:
        """What a member's result carries besides its images (``joining.LoopDriver``)."""
        return {"lora_switch_ms": self._switch_ms.pop(slot, 0.0), "model_loads": self.model.loads,
                "step_cache": self._cache_reports.pop(slot, ())}  # fmt: skip

    def step(self) -> Mapping[int, Mapping[int, Image.Image]]:
        return self._guarded(self._request_ids(), self._step)

    def steps_done(self, slot: int) -> int:
        return self.members[slot].done

    def total_steps(self, slot: int) -> int:
        return self.members[slot].total

    def decode(self, slots: Sequence[int]) -> Mapping[int, tuple[Image.Image, ...]]:
        members = [self.members.pop(slot) for slot in slots]  # they leave even if the decode fails
        if not members:
            return {}
        for slot, m in zip(slots, members):
            if m.cache is not None:
                self._cache_reports[slot] = m.cache.report()
        ids = ",".join(m.job.request_id for m in members)
        self._offload_all()  # the denoiser leaves for the decode, and comes back at its next call
        try:
            images = self._guarded(ids, self._pixels, torch.cat([m.latents for m in members]), members[0].job)
        finally:
            self._offload_all()  # and the VAE leaves before it does (the chain would not move it: it comes later)
        result: dict[int, tuple[Image.Image, ...]] = {}
        start = 0
        for slot, m in zip(slots, members):
            result[slot] = tuple(images[start : start + m.images])
            start += m.images
        return result

    def remove(self, slot: int) -> None:
        self.members.pop(slot, None)
        self._switch_ms.pop(slot, None)
        self._cache_reports.pop(slot, None)

    @property
    def images(self) -> int:
        return sum(m.images for m in self.members.values())

    def peak_memory_bytes(self) -> int | None:
        return int(torch.cuda.max_memory_allocated()) if self._cuda else None

    # -- one step ----------------------------------------------------------------------------------

    def _step(self) -> dict[int, dict[int, Image.Image]]:
        active = [(slot, m) for slot, m in self.members.items() if m.done < m.total]
        if not active:
            return {}
        # 1. One denoiser call for the rows of every member that computes this step, each at its own
        #    timestep, guidance and LoRA; a member whose own step cache skips it leaves the call (the
        #    batch shrinks) and steps with a prediction from its own last outputs (``step_cache``).
        computing = [(slot, m) for slot, m in active if m.cache is None or m.cache.computes(m.done)]
        members = [m for _, m in computing]
        loras = self.model.loras
        computed: list[torch.Tensor] = []
        if members and loras is not None:
            with loras.rows([use_of(m.job) for m in members for _ in range(m.rows)]):
                computed = self._predict(members)
        elif members:
            computed = self._predict(members)
        own = {slot: prediction for (slot, _), prediction in zip(computing, computed)}
        previews: dict[int, dict[int, Image.Image]] = {}
        for slot, m in active:
            if m.cache is None:
                prediction = own[slot]
            elif slot in own:
                prediction = own[slot]
                m.cache.record(m.done, prediction)
            else:
                prediction = m.cache.predict(m.done)
            # 2. The member's own scheduler on its own slice (its own generators for ancestral noise).
            t, sample = m.timestep, m.latents
            out = m.sampler.step(prediction, t, sample, **m.step_kwargs, return_dict=False)
            m.latents = out[0]
            m.done += 1
            # 3. Previews on the member's preview steps, as StepWatch makes them.
            shown = self._previews(m, out, prediction, t, sample)
            if shown:
                previews[slot] = shown
        return previews

    def _previews(
        self, m: LoopMember, out: Any, prediction: torch.Tensor, t: torch.Tensor, sample: torch.Tensor
    ) -> dict[int, Image.Image]:
        every, job = m.job.preview_every, m.job
        if self.preview_map is None or not every or m.done % every or m.done >= m.total:
            return {}
        x0 = denoised(m.sampler, out, prediction, t, sample)
        latents = unpack(self.pipe, x0, job.width, job.height)
        shown: dict[int, Image.Image] = {}
        for index in job.preview_images:
            if index < latents.shape[0] and latents.shape[1] == self.preview_map.channels:
                shown[index] = self.preview_map.image(latents[index], job.width, job.height)
        return shown

    def _request_ids(self) -> str:
        return ",".join(m.job.request_id for m in self.members.values())

    def _guarded(self, request_id: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn`` under inference mode; out of memory (an allocation failure of cuBLAS or cuDNN too,
        ``engine.device_faults``) becomes ``OutOfMemory``, raised outside the except block so the
        traceback's tensors are gone. Memory is freed by ``release``, which the driver calls once it
        has dropped the failed members (their latents and embeddings), not here while they live."""
        try:
            with torch.inference_mode():
                return fn(*args)
        except Exception as exc:
            if kind_of(exc) != "out_of_memory":
                raise
        raise OutOfMemory(request_id)

    def _offload_all(self) -> None:
        """Under ``--cpu-offload`` (accelerate's model offload hooks): every component off the device.

        ``pipe()`` calls its components in the offload chain's order, and each call moves the one
        before it off, so one model is on the device at a time. A loop calls them out of that order
        (a joiner's text encoders while the denoiser is on the device; a decode between two steps):
        without this, the chain would hold the denoiser beside a text encoder (for FLUX, 33 GB where
        offload promises 24). No-op without offload.
        """
        for hook in (*(getattr(self.pipe, "_all_hooks", None) or ()), *self.model.control_hooks):  # ControlNets'
            hook.offload()

    def release(self) -> None:
        """Free the device's cache: after a failure, once the failed members are gone (``LoopDriver``)."""
        self.model.free_memory()
