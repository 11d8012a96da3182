"""A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread.

``DiffusersModel`` implements ``protocol.Model``; it is owned by the engine's model thread and
must only be called from there (``count_tokens`` excepted). ``engine.model.loading`` builds it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import threading
import time
from typing import Any, Hashable

import torch
from PIL import Image

from ...errors import Cancelled, OutOfMemory
from ...fields import DEFAULT_EMPHASIS, STEP_CACHE_OFF, T5_WEIGHING, WEIGHING, resolved_emphasis
from ...prompt_syntax import plain
from ...protocol import NONE, InferenceJob, InferenceResult, ModelProfile, StepCallback, StopFlag, loop_key
from ..device_faults import kind_of
from ..loop.loop_base import MemberLoop, loop_kind
from . import controls, samplers
from .families import call_arguments, call_default, counted_text, encoder_tokenizers, guidance_arguments, traits
from .family_table import family_for
from .lora import LoadedLoras, use_of
from .modes import takes_size
from .previews import Previewer
from .prompt_weights import ClipChunker, Encoded, PromptEncoder, flux_encode, sd3_encode
from .stepping import StepWatch, StoppedAtStep


class DiffusersModel:
    """A loaded diffusers pipeline that runs one ``InferenceJob`` at a time on the model thread."""

    def __init__(
        self,
        pipe: Any,
        profile: ModelProfile,
        preview_map: Previewer | None = None,
        loras: LoadedLoras | None = None,
        modes: dict[str, Any] | None = None,
        controlnets: dict[str, Any] | None = None,
    ) -> None:
        self.pipe = pipe
        self.modes = modes or {}  # mode -> its pipeline, sharing pipe's components (``engine.model.modes``)
        self.controlnets = controlnets or {}  # the --controlnets by name (``engine.model.controls``)
        self.control_hooks: list[Any] = []  # under --cpu-offload, theirs (``controls.offload_controlnets``)
        self._control_pipes: dict[tuple[str, str], Any] = {}  # (mode, name) -> its ControlNet pipeline
        self.loras = loras  # the --LoRAs (engine.model.lora), or None
        self.loads = 0  # how many times this process has loaded a model (engine.model.loading sets it)
        self.profile = profile
        self.preview_map = preview_map
        self._device = profile.device
        # The model's own scheduler: never stepped, only the config every job's scheduler is built from.
        self.base_sampler = pipe.scheduler
        # Private copies for prepare-time token counting, so no other thread touches the tokenizers
        # the model thread uses (fast tokenizers raise "Already borrowed" under concurrent use).
        self.traits = traits(pipe, profile.name)
        self._count_tokenizers = [(name, copy.deepcopy(t)) for name, _, t in encoder_tokenizers(pipe)]
        self._count_lock = threading.Lock()
        # A1111's prompt syntax and chunks where the family weighs CLIP tokens (``prompt_weights``):
        # one chunker for the model thread, one for counting (tokenizers are not thread-safe).
        first = getattr(pipe, "tokenizer", None) or getattr(pipe, "tokenizer_2", None)
        self.weighs = profile.family in WEIGHING and first is not None
        self.prompt_encoder = PromptEncoder(pipe, profile.family) if self.weighs else None
        self.chunker = self.prompt_encoder.chunker if self.prompt_encoder is not None else None
        self._count_chunker = ClipChunker(copy.deepcopy(first)) if self.weighs else None
        self.t5_weighs = profile.family in T5_WEIGHING  # FLUX.1, SD3: T5 by ComfyUI's rule, its count on the words

    def count_tokens(self, text: str) -> dict[str, int]:
        """Tokens per encoder (the note of a cut text); where CLIP prompts go in chunks, also the
        chunks the text takes with the syntax read ("CLIP chunks") and as written."""
        counts: dict[str, int] = {}
        with self._count_lock:
            read = plain(text) if self.t5_weighs else text  # FLUX.1, SD3: T5 reads the words, not the syntax
            for name, tokenizer in self._count_tokenizers:
                ids = tokenizer(counted_text(name, read), truncation=False, add_special_tokens=False).input_ids
                counts[name] = max(counts.get(name, 0), len(ids))
            if self._count_chunker is not None:
                counts["CLIP chunks"] = self._count_chunker.count(text, syntax=True)
                counts["CLIP chunks as written"] = self._count_chunker.count(text, syntax=False)
        return counts

    def emphasis(self, job: InferenceJob) -> str:
        """The emphasis ``job`` runs with ("Original", "No norm" or "None": ``fields.resolved_emphasis``)."""
        return resolved_emphasis(str(dict(job.options).get("emphasis", DEFAULT_EMPHASIS)), self.profile.family)

    def clip_embeddings(self, job: InferenceJob, negatives: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SD 1.x/2.x: the job's prompt embeddings (and, ``negatives``, its negative prompts'), as
        AUTOMATIC1111 encodes them (``prompt_weights``): every text of the job padded to one chunk count."""
        encoded = self.encoded(job, negatives)
        return encoded.embeds, encoded.negative

    @functools.cached_property
    def execution_device(self) -> torch.device:
        """The pipeline's execution device, read once (diffusers walks every module's hooks for it)."""
        return torch.device(self.pipe._execution_device)

    def flux_embeddings(self, job: InferenceJob, device: torch.device) -> tuple[torch.Tensor, ...]:
        """FLUX.1: (T5 embeddings, CLIP pooled, text ids) of the job's prompts, A1111's syntax read
        (``prompt_weights.flux_encode``), at the length the pipeline's own call encodes."""
        length = call_default(self.pipe, "max_sequence_length", 512)
        return flux_encode(self.pipe, job.prompts, self.emphasis(job), device, length)

    def encoded(self, job: InferenceJob, negatives: bool) -> Encoded:
        """The job's texts through ``prompt_weights.PromptEncoder`` with its emphasis (SD3: and its T5,
        ``prompt_weights.sd3_encode``, at the length the pipeline's own call encodes)."""
        assert self.prompt_encoder is not None
        negative = job.negative_prompts if negatives else None
        emphasis, device = self.emphasis(job), self.execution_device
        if self.profile.family == "sd3":
            length = call_default(self.pipe, "max_sequence_length", 256)
            return sd3_encode(self.prompt_encoder, job.prompts, negative, emphasis, device, length)
        return self.prompt_encoder.encode(job.prompts, negative, emphasis, device)

    def text_arguments(self, job: InferenceJob, pipe: Any) -> dict[str, Any] | None:
        """The call's text arguments as AUTOMATIC1111 reads the prompts (embeddings instead of
        ``prompt`` and ``negative_prompt``), or None where the pipeline reads the text itself."""
        if self.weighs:  # SD 1.x/2.x, SDXL, SD3: chunks and weights, negatives where guidance runs
            unet = getattr(pipe, "unet", None)
            cfg = job.guidance_scale > 1 and (unet is None or getattr(unet.config, "time_cond_proj_dim", None) is None)
            return self.encoded(job, negatives=cfg).call_arguments()
        if self.t5_weighs:  # FLUX.1: T5 weighted, CLIP pooled from the words (its negative prompt is never read)
            embeds, pooled, _ = self.flux_embeddings(job, self.execution_device)
            return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
        return None

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        guiders = self._job_guiders(job)
        try:
            switch_ms = self.use_adapter(job)  # set_adapters / disable_lora, only if it differs from the last job's
            result = self._hires(job, stop, on_step) if job.hires_width else self._pass(job, stop, on_step)
            return dataclasses.replace(result, lora_switch_ms=switch_ms, model_loads=self.loads)
        finally:
            for name, guider in guiders.items():
                setattr(self.pipe, name, guider)

    def _pass(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        """One pipeline call in ``job``'s mode. The job's own scheduler (schedulers are stateful: step
        index, multistep history), built from the model's config on this thread, is put in the
        pipeline for this call only."""
        if dict(job.options).get("step_cache", STEP_CACHE_OFF) != STEP_CACHE_OFF and self.loop_key(job) is not None:
            return self._looped(job, stop, on_step)  # a hires fix pass with a step cache
        pipe = self._pipe_for(job)
        pipe.scheduler = samplers.build(self.base_sampler, job.sampler)
        try:
            return self._generate(job, stop, on_step, pipe)
        finally:
            pipe.scheduler = self.base_sampler

    def _looped(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        """One pass as a step-level loop of its own member (hires fix with a step cache, issue 50: each pass
        a member of its own, with its own cache and warm-up), with the call's progress, stop and previews."""
        loop = self.open_loop(job)
        slot = loop.add(job)
        started, total = time.time(), loop.total_steps(slot)
        try:
            while loop.steps_done(slot) < total:
                if stop.is_set():
                    raise Cancelled(steps_done=loop.steps_done(slot))
                shown = loop.step().get(slot, {})
                on_step(loop.steps_done(slot), total, shown)
            images = loop.decode([slot])[slot]
        except OutOfMemory:
            loop.remove(slot)
            loop.release()
            raise
        return InferenceResult(images, total, started, time.time(), loop.peak_memory_bytes(),
                               step_cache=loop.result_fields(slot)["step_cache"])  # fmt: skip

    def _hires(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        """Hires fix, one job in two passes with one progress over both: the text pass, each picture
        upscaled (Lanczos) to the hires size, then an image-to-image pass there with the same seeds."""
        first = dataclasses.replace(job, hires_width=0, hires_height=0, hires_steps=0, hires_strength=0.0)
        second_steps = min(int(job.hires_steps * job.hires_strength), job.hires_steps)
        first_total = [job.num_inference_steps]

        def first_step(step: int, total: int, previews: Any) -> None:
            first_total[0] = total
            on_step(step, total + second_steps, previews)

        drawn = self._pass(first, stop, first_step)
        size = (job.hires_width, job.hires_height)
        upscaled = tuple(image.resize(size, Image.Resampling.LANCZOS) for image in drawn.images)
        if second_steps == 0:  # strength 0: upscaled, not redrawn (AUTOMATIC1111's denoising_strength 0)
            return dataclasses.replace(drawn, images=upscaled, first_pass=drawn.images)
        second = dataclasses.replace(
            first,
            mode="image",
            images=upscaled,
            masks=(),
            strength=job.hires_strength,
            num_inference_steps=job.hires_steps,
            width=size[0],
            height=size[1],
        )
        done = first_total[0]
        try:
            final = self._pass(second, stop, lambda step, total, previews: on_step(done + step, done + total, previews))
        except Cancelled as exc:
            raise Cancelled(str(exc), steps_done=drawn.steps_done + exc.steps_done) from None
        peaks = [p for p in (drawn.peak_memory_bytes, final.peak_memory_bytes) if p is not None]
        return dataclasses.replace(
            final,
            first_pass=drawn.images,
            steps_done=drawn.steps_done + final.steps_done,
            started=drawn.started,
            step_cache=both_passes(drawn.step_cache, final.step_cache),
            peak_memory_bytes=max(peaks, default=None),
        )

    def _pipe_for(self, job: InferenceJob) -> Any:
        """The pipeline that runs ``job``'s mode: the loaded one, or its mode pipeline (or ControlNet
        pipeline, issue 51) with the loaded one's current components (a compiled denoiser included:
        ``from_pipe`` ran before the compile)."""
        control = controls.acting(job)
        if control != NONE:
            if control not in self.controlnets:
                raise ValueError(f"no ControlNet named {control!r} is loaded")
            key = (job.mode, control)
            if key not in self._control_pipes:
                self._control_pipes[key] = controls.control_pipeline(self.pipe, job.mode, self.controlnets[control])
            pipe = self._control_pipes[key]
        elif job.mode == "text":
            return self.pipe
        elif (pipe := self.modes.get(job.mode)) is None:
            raise ValueError(f"{self.profile.name} does not serve mode {job.mode!r}")
        for name, component in self.pipe.components.items():
            if name != "scheduler" and name in pipe.components and getattr(pipe, name) is not component:
                setattr(pipe, name, component)
        return pipe

    def use_adapter(self, job: InferenceJob) -> float:
        """Set ``job``'s LoRA for the next call; the milliseconds the switch took (0: none needed)."""
        if job.lora and (self.loras is None or job.lora not in self.loras.names):
            raise ValueError(f"no LoRA named {job.lora!r} is loaded")
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

    def _generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback, pipe: Any) -> InferenceResult:
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
        # The prompts as AUTOMATIC1111 reads them, encoded as the pipeline's own call would (in inference
        # mode: with autograd on, bf16 matmuls on a CPU take another kernel and round otherwise).
        with torch.inference_mode():
            texts = self.text_arguments(job, pipe)
        if texts is not None:
            del kwargs["prompt"]
            kwargs.pop("negative_prompt", None)
            kwargs.update(texts)
        if job.mode != "text":  # the pictures, already at width x height (the serving side sized them)
            kwargs.update(image=list(job.images), strength=job.strength)
            if job.mode == "inpaint":
                kwargs["mask_image"] = list(job.masks)
            if not takes_size(pipe):
                del kwargs["width"], kwargs["height"]
        if controls.acting(job) != NONE:  # its ControlNet's maps, scale and window (issue 51)
            kwargs.update(controls.call_arguments(job, pipe))
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
        finally:
            for hook in self.control_hooks:  # under --cpu-offload a ControlNet leaves with the call's components
                hook.offload()
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
        """Step-level joining (``engine.loop.joining``) for SD 1.x/2.x, FLUX, SD3, Chroma, Z-Image and
        Qwen-Image; ``None`` for the rest.

        Members of one loop share the latent shape (width, height) and the sampler name; prompts,
        negative prompts, seeds, image counts, steps and guidance (with or without CFG) may differ,
        and so may LoRAs where the profile's ``lora_batching`` is "mixed" (else the LoRA
        and its scale are part of the key).
        """
        kind = loop_kind(self.pipe)
        if kind is None or not self.profile.step_joining or job.mode not in self.profile.loop_modes or job.hires_width:
            return None
        if job.controls and "control" not in self.profile.loop_modes:  # a whole call of its ControlNet pipeline
            return None
        per_lora = self.loras is not None and self.profile.lora_batching != "mixed"  # a loop per LoRA and scale
        model = str(dict(job.options).get("model", ""))
        return (kind, *loop_key(job.width, job.height, job.sampler, use_of(job), per_lora=per_lora, model=model))

    def open_loop(self, job: InferenceJob) -> MemberLoop:
        """A new, empty loop for jobs with ``job``'s key (the family's ``loop_sd``/``loop_flow`` loop)."""
        kind = loop_kind(self.pipe)
        if kind == "sd":
            from ..loop.loop_sd import SDLoop

            return SDLoop(self)
        if kind == "qwen-image":
            from ..loop.loop_qwen import QwenImageLoop

            return QwenImageLoop(self)
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


def both_passes(first: tuple[tuple[str, Any], ...], second: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """A hires fix's step cache record: the method, and both passes' evaluations computed and skipped."""
    if not first or not second:
        return first or second
    a, b = dict(first), dict(second)
    return (
        ("method", a["method"]),
        ("computed", a["computed"] + b["computed"]),
        ("skipped", a["skipped"] + b["skipped"]),
    )
