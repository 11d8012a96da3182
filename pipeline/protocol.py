"""The boundary vocabulary, in one module: plain, picklable data in and out, and nothing else. Free of torch.

Requests: ``InferenceJob``, one frozen call of the pipeline (or one member of a step-level loop), and
``Submission``, a job in a host's hands (the job, its stop, where its events go). Outputs, three
shapes: ``StepEvent`` (step k of N, with small encoded previews), then exactly one ``InferenceResult``,
the one ending (done with its images, or another ``FinishReason`` with its words: an error is a value),
from every host; and ``Output``, what the serving side yields to the web layer (``Adapter.run``)
about one request: its place in line, its steps, its end. A request's mailbox carries the same
``Output`` steps and its share of the job's ``InferenceResult``.

Stops, one type per role: ``StopFlag``, what the model side reads at every step (anything with
``is_set()``); ``StopSignal``, the one that is set (a request's on the serving side, by a cancel, a
disconnect, a time limit or shutdown; a job's in a model process), which remembers the step it was
set at and calls back when set; and ``engine.hosting.wire.StopJob``, the stop crossing to a model
process by the job's serial, sent the moment the flag is set. On ZeroGPU the stop is the closing
of the GPU call's stream at its next yield. Inside the model side, ``engine.hosting.runner``'s
``_JobStop`` is a ``StopFlag`` too (the caller's flag, or the stream closed), and
``engine.model.stepping.StoppedAtStep`` is the exception that ends a pipeline call at the step
boundary where the flag was found set.

No closures, locks or callbacks cross a process: the same generator (``engine.hosting.runner.run_job``)
runs on the in-process model thread, in ZeroGPU's forked process (which pickles its arguments and
every yield), in a Ray replica, and in a model process of our own.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Hashable, Literal, Mapping, Protocol

from PIL import Image


@dataclass(frozen=True)
class ModelProfile:
    """What the loaded model is and which defaults and limits suit it."""

    name: str
    pipeline_class: str
    sampler: str  # the model's own sampler: its diffusers scheduler class
    device: str
    dtype: str
    default_width: int
    default_height: int
    default_steps: int
    default_guidance: float
    min_steps: int = 1
    max_steps: int = 100
    min_guidance: float = 0.0
    max_guidance: float = 20.0
    size_multiple: int = 8
    min_size: int = 64
    max_size: int = 1024
    # (encoder, text tokens it reads), e.g. (("CLIP", 75), ("T5", 255)): the long-prompt note names the one that cut
    text_encoders: tuple[tuple[str, int], ...] = (("CLIP", 75),)
    supports_negative_prompt: bool = True
    family: str = "sd"  # sd, sdxl, sd3, flux, pixart, sana, other (see engine.model.families)
    # Whether jobs may run step-level: enter a running denoising loop at a step boundary (engine.loop.joining)
    step_joining: bool = False
    # Sampler names a request may ask for ("default": the model's own; see engine.model.samplers)
    samplers: tuple[str, ...] = ("default",)
    # The __call__ argument the guidance control drives (None: guidance is baked into the model)
    guidance_arg: str | None = "guidance_scale"
    step_choices: tuple[int, ...] = ()  # only these step counts run (empty: any in [min_steps, max_steps])
    size_choices: tuple[tuple[int, int], ...] = ()  # only these (width, height) run (empty: any on the grid)
    negative_prompt_reason: str = ""  # why a negative prompt is refused, where it is
    previews: bool = True  # whether live previews can be drawn for this model
    preview_note: str = ""  # why not, where they cannot (the start log, /health and the page say it)
    cfg_above: float = 1.0  # classifier-free guidance (and so a negative prompt) runs above this guidance
    loras: tuple[LoraInfo, ...] = ()  # the LoRAs loaded at start (``--lora``), in flag order
    # how jobs with different LoRAs batch: "mixed" (one denoiser call, a LoRA per row: step-level
    # loops), "separate" (a job or loop per adapter and scale)
    lora_batching: str = "separate"
    # The modes this model serves (``engine.model.modes``), and why each other one is not served.
    modes: tuple[str, ...] = ("text",)
    mode_notes: tuple[tuple[str, str], ...] = ()
    # The modes whose jobs enter step-level loops (with ``step_joining``): text, and image-to-image
    # where the family's loop starts a member from a picture (``engine.loop.loop_sd``); the others
    # run as whole-pipeline calls. "control": its loops run a ControlNet per member (issue 51).
    loop_modes: tuple[str, ...] = ("text",)
    # The step-cache methods its loops run per member (``engine.loop.step_cache``; "auto"'s first), where
    # jobs run step-level; () elsewhere (issue 50).
    step_caches: tuple[str, ...] = ()
    # The ControlNets loaded at start (``--controlnet``), by name, in flag order (issue 51).
    controls: tuple[str, ...] = ()
    # The pipeline modes its family has a ControlNet pipeline for (``AutoPipelineFor*.from_pipe``), of text,
    # image and inpaint (issue 51); a control in another is refused by name.
    control_modes: tuple[str, ...] = ()
    # Several models on one server (issue 52): the other models' profiles (on the default's; each of
    # theirs has none), their states at load, and this model's short hash as AUTOMATIC1111 forms it.
    models: tuple[ModelProfile, ...] = ()
    residency: tuple[ModelState, ...] = ()
    hash: str = ""

    @functools.cached_property
    def served(self) -> tuple[ModelProfile, ...]:
        """Every model this server serves, the default first (``models`` left off each); made once."""
        return (dataclasses.replace(self, models=(), residency=()), *self.models)

    def of(self, name: str | None) -> ModelProfile:
        """The served model ``name`` picks (its ``model_id``, its name or its title; None or "": the
        default); the default where no model has that name (the request's check refuses those first)."""
        for i, profile in enumerate(self.served if name else ()):
            if name in (profile.model_id, profile.name):
                return profile if i else self
        return self

    @property
    def model_id(self) -> str:
        """The name as an id a client can type (OpenAI's ``model``, ``/v1/models``): the name before
        a note in brackets, spaces as hyphens (``embedded-default (tiny SD ...)`` is ``embedded-default``)."""
        return "-".join(self.name.split(" (", 1)[0].split()) or self.name


NONE = "none"  # a request's LoRA value for no LoRA


@dataclass(frozen=True)
class ModelState:
    """A served model's place (issue 52): ``state`` "device" (on the device), "memory" (moved off to CPU
    memory) or "disk" (not loaded); its weights' bytes, how many times it was moved, and the last move's
    time in ms (onto the device: ``last_in_ms``; off it: ``last_out_ms``)."""

    name: str
    state: str
    family: str = ""
    bytes: int = 0
    moves: int = 0
    last_in_ms: float = 0.0
    last_out_ms: float = 0.0


@dataclass(frozen=True)
class LoraUse:
    """The LoRA a request asks for: ``name`` "" for none (the scale is then irrelevant, and 0)."""

    name: str = ""
    scale: float = 0.0

    @classmethod
    def of(cls, name: str, scale: float) -> LoraUse:
        return cls(name, float(scale)) if name and name != NONE else cls()


def loop_key(
    width: int, height: int, sampler: str, lora: LoraUse, *, per_lora: bool, model: str = ""
) -> tuple[Hashable, ...]:
    """Whether two requests can share a step-level loop, computed once for both sides: the serving
    side's scheduler from a request, the model side from a job (its family's loop kind prepended). The
    same model (several models: a loop holds one), latent size and sampler (prompts, seeds, image counts,
    steps and guidance may differ), and the same LoRA at one scale where the model's loops run one LoRA a
    loop (``per_lora``)."""
    return (width, height, sampler, lora, model) if per_lora else (width, height, sampler, model)


@dataclass(frozen=True)
class LoraInfo:
    """A LoRA the model side loaded: its name, recommended scale, A1111 short hash and where it went."""

    name: str
    scale: float = 1.0
    hash: str = ""  # ``loras.short_hash`` of its file ("" where the file is not on disk here)
    components: tuple[str, ...] = ()  # the pipeline components it adapts (unet, transformer, text_encoder, ...)


@dataclass(frozen=True)
class InferenceJob:
    """One call of the pipeline: one image per entry of ``prompts``/``seeds``.

    A job may carry several requests (dynamic batching): they share size, steps, guidance and
    scheduler, and each image keeps its own prompt, negative prompt and seed.
    """

    request_id: str
    prompts: tuple[str, ...]
    negative_prompts: tuple[str, ...]
    seeds: tuple[int, ...]
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    preview_every: int = 0  # 0: no previews; k: a cheap latent preview every k steps
    preview_images: tuple[int, ...] = (0,)  # which images get previews (the first of each request)
    sampler: str = "default"  # a name from ModelProfile.samplers; each job gets its own instance
    # True: the job enters the running denoising loop ``loop_id`` at a step boundary (it opens that
    # loop when none runs), step-level batching (``engine.loop.joining``); False: it runs as one call.
    # The serving side's scheduler decides which jobs share a loop; the model side only follows the tags.
    joinable: bool = False
    loop_id: int = 0
    # The request ids of members of that loop on their last step: the server sends a joiner a step
    # early, for their place, and the model side holds it until they have left.
    enters_after: tuple[str, ...] = ()
    # The LoRA the job runs with (a name from ModelProfile.loras; "": none) and its scale.
    lora: str = ""
    lora_scale: float = 0.0
    # The mode (``engine.model.modes``): "text"; "image" (image-to-image: ``images``, one per image of
    # the job at width x height, denoised from ``strength``); "inpaint" (also ``masks``, white where
    # it repaints). Pictures cross as PIL images: plain RGB (masks L), already sized by the serving side.
    mode: str = "text"
    images: tuple[Image.Image, ...] = ()
    masks: tuple[Image.Image, ...] = ()
    strength: float = 1.0
    # Hires fix (0: off): after the text pass, each picture is upscaled to hires_width x hires_height
    # (Lanczos) and redrawn image-to-image from hires_strength with hires_steps steps.
    hires_width: int = 0
    hires_height: int = 0
    hires_steps: int = 0
    hires_strength: float = 0.0
    # The table fields (``fields.TABLE_FIELDS``: step_cache, control, ...), by name, as the request checked them.
    options: tuple[tuple[str, Any], ...] = ()
    # ControlNet (issue 51; its name, scale and window in ``options``): one map per image, RGB at
    # width x height, already preprocessed by the serving side; () without a control.
    controls: tuple[Image.Image, ...] = ()

    @property
    def num_images(self) -> int:
        return len(self.prompts)

    @property
    def steps_run(self) -> int:
        """The denoising steps the job runs at its size: an image mode's ``int(steps × strength)``
        (diffusers' count), plus a hires fix's second pass in steps of the first pass's size."""
        steps = self.num_inference_steps
        run = steps if self.mode == "text" else min(int(steps * self.strength), steps)
        if self.hires_width:
            second = min(int(self.hires_steps * self.hires_strength), self.hires_steps)
            run += round(second * self.hires_width * self.hires_height / (self.width * self.height))
        return run


PREVIEW_MAX_SIDE = 256  # a live preview's longest side, in pixels: sized for display, not for the picture
PREVIEW_QUALITY = 85  # JPEG quality of a live preview


def display_size(width: int, height: int) -> tuple[int, int]:
    """A preview's size: the picture's aspect, at most ``PREVIEW_MAX_SIDE`` on its longest side (the
    browser scales it to the gallery; a full-size preview would cost a picture's encode per step)."""
    scale = min(1.0, PREVIEW_MAX_SIDE / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class EncodedPreview:
    """A live preview as it crosses the boundary: a small JPEG, encoded on the model thread.

    The model side makes previews at display size (at most ``PREVIEW_MAX_SIDE`` on the longest
    side) and encodes them where the model runs (its own process, with its own GIL), so a step
    carries a few kilobytes, never a picture; the server writes the bytes as they are into
    Gradio's cache (``web.page.outputs``), so it never encodes one either. The final images stay PNGs.
    """

    data: bytes
    width: int
    height: int
    format: Literal["jpeg"] = "jpeg"

    @classmethod
    def of(cls, image: Image.Image) -> EncodedPreview:
        import io

        if max(image.size) > PREVIEW_MAX_SIDE:  # a preview map sizes for display; this bounds any other
            image = image.copy()
            image.thumbnail((PREVIEW_MAX_SIDE, PREVIEW_MAX_SIDE), Image.Resampling.BILINEAR)
        out = io.BytesIO()
        image.convert("RGB").save(out, "JPEG", quality=PREVIEW_QUALITY)
        return cls(out.getvalue(), image.width, image.height)

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height

    def image(self) -> Image.Image:
        """The decoded picture (for callers that need pixels, and for tests)."""
        import io

        with Image.open(io.BytesIO(self.data)) as picture:
            return picture.convert("RGB")


def encoded(previews: Mapping[int, Image.Image] | object) -> tuple[tuple[int, EncodedPreview], ...]:
    """A step's previews (image index -> picture) as they travel: encoded, in index order."""
    if not isinstance(previews, Mapping):
        return ()
    return tuple((i, EncodedPreview.of(image)) for i, image in sorted(previews.items()))


@dataclass(frozen=True)
class StepEvent:
    """Step ``step`` of ``total`` has run. ``previews``: (image index, small encoded preview) pairs."""

    step: int
    total: int
    previews: tuple[tuple[int, EncodedPreview], ...] = ()

    def preview(self, index: int) -> EncodedPreview | None:
        return next((image for i, image in self.previews if i == index), None)


# Why a job, or a request, ended: every ending is a value with a reason, translated into the user's
# words once (``serving.local.LocalAdapter._outcome``). The model side's: done, cancelled,
# out_of_memory, failed, crashed (the model process died during the job; it is being restarted),
# device_lost (the device failed in a way that poisons the process, ``engine.device_faults``),
# engine_dead (no model side left); the serving side's: timed_out, shutting_down.
FinishReason = Literal[
    "done",
    "cancelled",
    "timed_out",
    "out_of_memory",
    "failed",
    "crashed",
    "device_lost",
    "engine_dead",
    "shutting_down",
]


@dataclass(frozen=True)
class InferenceResult:
    """How a job ended, and a request's share of it: the one ending, on every host and to the mailbox.

    ``reason`` "done": its images (in job order), the steps it ran, when it ran and its peak device
    memory. Any other reason: no images, and ``message`` says why (``detail``, a traceback, is for
    the log, never for users). An error is a value, never an exception across the boundary.
    """

    images: tuple[Image.Image, ...] = ()
    steps_done: int = 0
    started: float = 0.0
    ended: float = 0.0
    peak_memory_bytes: int | None = None
    # The most images and jobs that shared its denoiser calls while it ran (its loop, or its call;
    # 0: the job's own), and how many loop steps had run when it joined (None: it ran as one call;
    # 0: it opened or started with the loop).
    batch_images: int = 0
    batch_jobs: int = 0
    joined_at_step: int | None = None
    # The time this job's adapter switch took on the model side (0: the adapters were already set),
    # and how many times that model side has loaded the model (a switch never loads it again).
    lora_switch_ms: float = 0.0
    model_loads: int = 0
    # The device's memory, where it reports it (not the CPU): its total and its idle footprint (the
    # weights) when the loop or call began; the scheduler learns from them what a joiner needs.
    device_total_bytes: int | None = None
    idle_bytes: int | None = None
    reason: FinishReason = "done"
    message: str = ""
    detail: str = ""
    limit: float = 0.0  # timed_out: the time limit, in seconds
    # cancelled in a model process: the model's own step count when the stop reached it (None: unknown)
    steps_at_stop: int | None = None
    # Hires fix: each image's first pass, at the text pass's size (what it upscaled and redrew); else ().
    first_pass: tuple[Image.Image, ...] = ()
    # Its step cache where it ran one (``engine.loop.step_cache``): (("method", m), ("computed", n),
    # ("skipped", k)), the denoiser evaluations of its own steps; () where every step was computed.
    step_cache: tuple[tuple[str, Any], ...] = ()
    # Several models (issue 52): the model it ran on, the time its model's moves onto the device took
    # before it (0: it was there), and every model's state after it.
    model: str = ""
    model_switch_ms: float = 0.0
    residency: tuple[ModelState, ...] = ()

    @classmethod
    def ended_by(
        cls, reason: FinishReason, message: str, steps_done: int = 0, detail: str = "", **more: Any
    ) -> InferenceResult:
        """An ending without images: ``reason`` and the words for the log."""
        return cls(steps_done=steps_done, reason=reason, message=message, detail=detail, **more)

    @property
    def ok(self) -> bool:
        return self.reason == "done"

    @property
    def batching(self) -> str:
        """ "step": it ran in a step-level loop (``engine.loop.joining``); "job": as one call."""
        return "job" if self.joined_at_step is None else "step"


ModelEvent = StepEvent | InferenceResult


@dataclass(frozen=True)
class Submission:
    """A job in a host's hands between threads: the job, its stop, and where its events go (``emit``,
    called on the host's thread with each event, the last one an ``InferenceResult``). The one carrier
    on every queue a job waits in: the model-stream thread's (``serving.streamer``), the model
    thread's (``engine.hosting.runner``) and a step-level loop's seat (``engine.loop.joining``)."""

    job: InferenceJob
    stop: StopFlag
    emit: Callable[[ModelEvent], None]


class StopFlag(Protocol):
    """A one-way stop signal read at every step boundary (``threading.Event`` satisfies it)."""

    def is_set(self) -> bool: ...


class StopSignal(threading.Event):
    """The one concrete stop: a request's on the serving side, a job's in a model process.

    It remembers how many steps had run when it was first set: ``note(step)`` is called as steps
    complete (the runner calls a stop's ``note`` if it has one, else the thread that relays the
    job's steps does), and ``set`` (from any thread) records the count, so a cancelled job can
    report how many steps it ran after being told to stop (at most 1 by design). ``on_set``
    listeners are called on the setting thread: a model process's side forwards the stop that way.
    """

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.steps_at_set: int | None = None
        self._listeners: list[Callable[[], None]] = []

    def note(self, step: int) -> None:
        self.steps = max(self.steps, step)

    def set(self) -> None:
        if self.steps_at_set is None:
            self.steps_at_set = self.steps
        super().set()
        for listener in list(self._listeners):
            listener()

    def on_set(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the setting thread) whenever this signal is set."""
        self._listeners.append(listener)


# on_step(step, total, previews): called on the model thread after every denoising step, inside the
# model side only (it never crosses the boundary). ``previews`` maps an image index (of
# ``job.preview_images``) to a small RGB image on the job's preview steps; it is empty otherwise.
StepCallback = Callable[[int, int, "Mapping[int, Image.Image]"], None]


class Model(Protocol):
    """A loaded model, hosted by the engine's model thread (``engine.hosting.runner.ModelRunner``)."""

    profile: ModelProfile

    def count_tokens(self, text: str) -> Mapping[str, int]:
        """Tokens ``text`` takes in each text encoder (by name), without special tokens. Thread-safe."""
        ...

    def generate(self, job: InferenceJob, stop: StopFlag, on_step: StepCallback) -> InferenceResult:
        """Run ``job``; check ``stop`` after every step and raise ``errors.Cancelled`` when it is set."""
        ...


class ModelSide(Protocol):
    """What the serving side drives, whatever hosts the model: the in-process thread
    (``engine.hosting.runner.ModelRunner``, also inside each Ray replica), the model process
    (``engine.hosting.process.ProcessSide``) and ZeroGPU (``engine.hosting.zerogpu.ZeroGpuSide``)."""

    @property
    def many_in_flight(self) -> bool:
        """Whether ``submit`` returns at once, so that several jobs can be in flight (step-level
        joining); False: ``submit`` runs the job to its end on the calling thread."""
        ...

    def submit(self, job: InferenceJob, stop: StopFlag, emit: Callable[[ModelEvent], None]) -> object:
        """Run ``job``, calling ``emit`` with each of its events (exactly one terminal), from the
        side's own thread (``many_in_flight``) or the caller's."""
        ...

    @property
    def profile(self) -> ModelProfile: ...

    @property
    def alive(self) -> bool: ...

    def count_tokens(self, text: str, model: str = "") -> Mapping[str, int]:
        """Tokens ``text`` takes in each text encoder of the model ``model`` names ("": the default)."""
        ...

    def stream(self, job: InferenceJob, stop: StopFlag) -> Generator[ModelEvent, None, None]:
        """Run ``job`` and yield its events, ending with exactly one terminal event.

        Blocking: iterate it off the event loop. Closing the iterator early stops the job at its
        next step and returns only once the model side has left it.
        """
        ...

    def shutdown(self, timeout: float | None = None) -> None: ...


# -- what the serving side yields to the web layer (``Adapter.run``) ----------------------------------
@dataclass(frozen=True)
class Output:
    """One request's news, each time something its caller would see changes: the one output message.

    Waiting in line: ``ahead`` requests' jobs (the running one included) come first. Running: step
    ``step`` of ``total`` has run, with the request's first image's ``preview`` on preview steps.
    ``eta_seconds``: the estimated time until its images (waiting: the running job's time left,
    each job ahead, then its own; running: its job's time left), from measured rates (``eta.py``);
    None until a job has been measured. The last one has ``finish`` "done" with the images'
    ``paths`` and the ``info`` record; any other ending is raised as a ``ServingError`` in the user's
    words (``serving.local.LocalAdapter._outcome``), so a caller never reads a failure as a picture.
    A hires fix's ``done`` also has ``first_pass``: each image's text pass as a PNG (the page's
    before/after slider shows it against the result). Across a Ray hop a replica sends its PNGs as
    ``files`` and ``first_pass_files`` (name, bytes), and its first output (ahead 0) names the
    replica in ``info``.
    """

    request_id: str = ""
    ahead: int | None = None
    step: int = 0
    total: int = 0
    preview: EncodedPreview | None = None
    eta_seconds: float | None = None
    finish: FinishReason | None = None
    paths: tuple[Path, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)
    files: tuple[tuple[str, bytes], ...] = ()
    first_pass: tuple[Path, ...] = ()
    first_pass_files: tuple[tuple[str, bytes], ...] = ()

    @property
    def kind(self) -> Literal["waiting", "step", "done"]:
        if self.finish is not None:
            return "done"
        return "waiting" if self.ahead is not None else "step"


@dataclass
class Timings:
    """Wall-clock times (``time.time()``) of one request's stages, written by its orchestrator."""

    received: float = 0.0
    prepare_start: float = 0.0
    prepare_end: float = 0.0
    gpu_wait_start: float = 0.0
    infer_start: float = 0.0
    infer_end: float = 0.0
    finalize_start: float = 0.0
    finalize_end: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def durations_ms(self) -> dict[str, float]:
        def ms(a: float, b: float) -> float:
            return round((b - a) * 1000, 3)

        return {
            "prepare": ms(self.prepare_start, self.prepare_end),
            "gpu_wait": ms(self.gpu_wait_start, self.infer_start),
            "inference": ms(self.infer_start, self.infer_end),
            "finalize": ms(self.finalize_start, self.finalize_end),
            "total": ms(self.received, self.finalize_end),
        }
