"""A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread.

``DiffusersModel`` implements ``protocol.Model``; it is owned by the engine's model thread and
must only be called from there (``count_tokens`` excepted). ``engine.model.loading`` builds it.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import threading
import time
from typing import Any, Hashable

import torch

from ...errors import Cancelled, OutOfMemory
from ...protocol import InferenceJob, InferenceResult, ModelProfile, StepCallback, StopFlag
from ..device_faults import kind_of
from ..loop.loop_base import MemberLoop, loop_kind
from . import samplers
from .families import call_arguments, counted_text, encoder_tokenizers, guidance_arguments, traits
from .family_table import family_for
from .lora import LoadedLoras, use_of
from .previews import Previewer
from .stepping import StepWatch, StoppedAtStep


class DiffusersModel:
    """A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread."""

    def __init__(
        self, pipe: Any, profile: ModelProfile, preview_map: Previewer | None = None, loras: LoadedLoras | None = None
    ) -> None:
        self.pipe = pipe
        self.loras = loras  # the --lora adapters (engine.model.lora), or None
        self.loads = 0  # how many times this process has loaded a model (engine.model.loading sets it)
        self.profile = profile
        self.preview_map = preview_map
        self._device = profile.device
        # The model's own scheduler: never stepped, only the config every job's scheduler is built from.
        self.base_scheduler = pipe.scheduler
        # Private copies for prepare-time token counting, so no other thread touches the tokenizers
        # the model thread uses (fast tokenizers raise "Already borrowed" under concurrent use).
        self.traits = traits(pipe, profile.name)
        self._count_tokenizers = [(name, copy.deepcopy(t)) for name, _, t in encoder_tokenizers(pipe)]
        self._count_lock = threading.Lock()

    def count_tokens(self, text: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self._count_lock:
            for name, tokenizer in self._count_tokenizers:
                ids = tokenizer(counted_text(name, text), truncation=False, add_special_tokens=False).input_ids
                counts[name] = max(counts.get(name, 0), len(ids))
        return counts

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        # 0. The job's own scheduler (schedulers are stateful: step index, multistep history), built
        #    from the model's config on this thread and put in the pipeline for this call only.
        self.pipe.scheduler = samplers.build(self.base_scheduler, job.scheduler)
        guiders = self._job_guiders(job)
        try:
            switch_ms = self.use_adapter(job)  # set_adapters / disable_lora, only if it differs from the last job's
            result = self._generate(job, stop, on_step)
            return dataclasses.replace(result, lora_switch_ms=switch_ms, model_loads=self.loads)
        finally:
            self.pipe.scheduler = self.base_scheduler
            for name, guider in guiders.items():
                setattr(self.pipe, name, guider)

    def use_adapter(self, job: InferenceJob) -> float:
        """Set ``job``'s LoRA adapter for the next call; the milliseconds the switch took (0: none needed)."""
        if job.lora and (self.loras is None or job.lora not in self.loras.names):
            raise ValueError(f"no LoRA adapter named {job.lora!r} is loaded")
        return self.loras.use(use_of(job)) if self.loras is not None else 0.0

    def _job_guiders(self, job: InferenceJob) -> dict[str, Any]:
        """A "guider" family (HunyuanImage 2.1) reads its scale from its guider components: this job
        gets copies with its own ``guidance_scale`` (``guider.new``); the originals are returned to restore."""
        if self.traits.guidance_kind != "guider":
            return {}
        originals = {}
        for name in ("guider", "ocr_guider"):
            guider = getattr(self.pipe, name, None)
            if guider is not None and hasattr(guider, "new"):
                originals[name] = guider
                setattr(self.pipe, name, guider.new(guidance_scale=job.guidance_scale))
        return originals

    def _generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        pipe = self.pipe
        watch = StepWatch(pipe, job, stop, on_step, self.preview_map)
        # 1. Per-image CPU generators: the same seed gives the same noise on any device and batch.
        generators = [torch.Generator("cpu").manual_seed(s) for s in job.seeds]
        kwargs: dict[str, Any] = dict(
            prompt=self._prompts(job.prompts),
            width=job.width,
            height=job.height,
            num_inference_steps=job.num_inference_steps,
            generator=generators,
        )
        kwargs.update(self.call_arguments(job))
        if stop.is_set():
            raise Cancelled(steps_done=0)
        cuda = self._device == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        # 2. Run. An out-of-memory error is turned into OutOfMemory *after* the except block, so
        #    the traceback's frames (and the tensors they hold) are gone before memory is freed.
        oom = False
        started = time.time()
        try:
            with torch.inference_mode(), watch:
                images = getattr(pipe(**kwargs), self.traits.output)
        except StoppedAtStep:
            raise Cancelled(steps_done=watch.steps_done) from None
        except Exception as exc:  # out of memory, or an allocation failure of cuBLAS / cuDNN
            if kind_of(exc) != "out_of_memory":
                raise
            oom = True
        if oom:
            self.free_memory()
            raise OutOfMemory(job.request_id)
        ended = time.time()
        peak = torch.cuda.max_memory_allocated() if cuda else None
        return InferenceResult(tuple(images), watch.steps_done, started, ended, peak)

    def _prompts(self, prompts: tuple[str, ...]) -> list[str]:
        """The prompts, cut to the first encoder's window where the pipeline raises on a longer one
        (Ideogram 4): the user was told the rest is ignored (``request`` notes), so it is."""
        family = family_for(type(self.pipe).__name__)
        if family is None or not family.truncate or not self._count_tokenizers:
            return list(prompts)
        window = dict(self.profile.text_encoders)[self._count_tokenizers[0][0]]
        with self._count_lock:
            tokenizer = self._count_tokenizers[0][1]
            cut = []
            for prompt in prompts:
                ids = tokenizer(prompt, truncation=False, add_special_tokens=False).input_ids
                cut.append(prompt if len(ids) <= window else tokenizer.decode(ids[:window]))
        return cut

    def call_arguments(self, job: InferenceJob) -> dict[str, Any]:
        """Guidance as the parameter this family reads, and the negative prompt where it is read."""
        t = self.traits
        kwargs = guidance_arguments(t, job.guidance_scale, job.num_inference_steps)
        kwargs.update(call_arguments(t.family, job.negative_prompts, t.negative_prompt, t.guidance_kind))
        return kwargs

    def loop_key(self, job: InferenceJob) -> Hashable | None:
        """Step-level joining (``engine.loop.joining``) for SD 1.x/2.x, FLUX, SD3, Chroma and Z-Image;
        ``None`` for the rest.

        Members of one loop share the latent shape (width, height) and the sampler name; prompts,
        negative prompts, seeds, image counts, steps and guidance (with or without CFG) may differ,
        and so may LoRA adapters where the profile's ``lora_batching`` is "mixed" (else the adapter
        and its scale are part of the key).
        """
        kind = loop_kind(self.pipe)
        if kind is None or not self.profile.step_joining:
            return None
        if self.loras is not None and self.profile.lora_batching != "mixed":  # a loop per adapter and scale
            return (kind, job.width, job.height, job.scheduler, use_of(job))
        return (kind, job.width, job.height, job.scheduler)

    def open_loop(self, job: InferenceJob) -> MemberLoop:
        """A new, empty loop for jobs with ``job``'s key (the family's ``loop_sd``/``loop_flow`` loop)."""
        kind = loop_kind(self.pipe)
        if kind == "sd":
            from ..loop.loop_sd import SDLoop

            return SDLoop(self)
        from ..loop.loop_flow import ChromaLoop, FluxLoop, SD3Loop, ZImageLoop

        loops: dict[str, type[MemberLoop]] = {
            "flux": FluxLoop, "sd3": SD3Loop, "chroma": ChromaLoop, "z-image": ZImageLoop}  # fmt: skip
        if kind is not None and kind in loops:
            return loops[kind](self)
        raise ValueError(f"{type(self.pipe).__name__} runs job-level only (loop_key is None)")

    def device_memory(self) -> tuple[int, int] | None:
        """(the device's total bytes, bytes allocated now) on a CUDA device; None elsewhere
        (``hosting.runner.DeviceMemory`` reports it; ``serving.scheduler.MemoryRoom`` admits joiners by it)."""
        if self._device != "cuda":
            return None
        _free, total = torch.cuda.mem_get_info()
        return int(total), int(torch.cuda.memory_allocated())

    def free_memory(self) -> None:
        gc.collect()
        if self._device == "cuda":
            torch.cuda.empty_cache()
