"""The boundary vocabulary, in one module: plain, picklable data in and out, and nothing else. Free of torch.

Two boundaries: the model side's (below) and the serving side's to the web layer (at the end:
``Waiting``, ``Step``, ``Done`` from ``Adapter.run``; a request's ``End``, with its ``FinishReason``).

The serving side calls the model side with one frozen ``InferenceJob`` and reads back a stream of
``ModelEvent`` values: ``StepEvent`` (step k of N, with optional small encoded previews), then exactly one
terminal event, an ``InferenceResult`` (images, timings, peak memory) or an ``ErrorEvent`` (an error
as a value, classified by ``kind``). Stop is a separate one-way signal, any object with
``is_set()``, which the model side reads at every step boundary: in-thread, the caller's flag
itself; to the model process, a ``StopJob`` message sent the moment the flag is set
(``engine.hosting.wire``); on ZeroGPU, the closing of the GPU call's stream at its next yield.

Stops, one type per role: ``StopFlag``, what the model side reads at every step (anything with
``is_set()``); ``StopSignal``, the one concrete flag (a request's on the serving side, set by a
cancel, a disconnect, a time limit or shutdown; a job's in a model process), which remembers the
step it was set at and calls back when set; and ``engine.hosting.wire.StopJob``, the stop crossing
to a model process by the job's serial. Inside the model side, ``engine.hosting.runner``'s private
``_JobStop`` (the caller's flag or the stream closed) and ``engine.model.stepping.StoppedAtStep``
(the exception that ends a pipeline call at the step boundary where the flag was found set) are how
it reads them.

No closures, locks or callbacks cross: the same generator (``engine.hosting.runner.run_job``) runs on the
in-process model thread, in ZeroGPU's forked process (which pickles its arguments and every yield),
in a Ray replica, and in a model process of our own.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Literal, Mapping, Protocol

from PIL import Image


@dataclass(frozen=True)
class ModelProfile:
    """What the loaded model is and which defaults and limits suit it."""

    name: str
    pipeline_class: str
    scheduler: str
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
    # Sampler names a request may ask for ("default": the model's own scheduler; see engine.model.samplers)
    schedulers: tuple[str, ...] = ("default",)
    # The __call__ argument the guidance control drives (None: guidance is baked into the model)
    guidance_arg: str | None = "guidance_scale"
    step_choices: tuple[int, ...] = ()  # only these step counts run (empty: any in [min_steps, max_steps])
    size_choices: tuple[tuple[int, int], ...] = ()  # only these (width, height) run (empty: any on the grid)
    negative_prompt_reason: str = ""  # why a negative prompt is refused, where it is
    previews: bool = True  # whether live previews can be drawn for this model
    preview_note: str = ""  # why not, where they cannot (the start log, /health and the page say it)
    cfg_above: float = 1.0  # classifier-free guidance (and so a negative prompt) runs above this guidance
    loras: tuple[LoraInfo, ...] = ()  # the LoRA adapters loaded at start (``--lora``), in flag order
    # how jobs with different adapters batch: "mixed" (one denoiser call, a LoRA per row: step-level
    # loops), "separate" (a job or loop per adapter and scale)
    lora_batching: str = "separate"


NONE = "none"  # a request's LoRA value for no adapter


@dataclass(frozen=True)
class LoraUse:
    """The LoRA a request asks for: ``name`` "" for none (the scale is then irrelevant, and 0)."""

    name: str = ""
    scale: float = 0.0

    @classmethod
    def of(cls, name: str, scale: float) -> LoraUse:
        return cls(name, float(scale)) if name and name != NONE else cls()


@dataclass(frozen=True)
class LoraInfo:
    """A LoRA adapter the model side loaded: its name, recommended scale, A1111 short hash and where it went."""

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
    scheduler: str = "default"  # a name from ModelProfile.schedulers; each job gets its own instance
    # True: the job enters the running denoising loop ``loop_id`` at a step boundary (it opens that
    # loop when none runs), step-level batching (``engine.loop.joining``); False: it runs as one call.
    # The serving side's scheduler decides which jobs share a loop; the model side only follows the tags.
    joinable: bool = False
    loop_id: int = 0
    # The request ids of members of that loop on their last step: the server sends a joiner a step
    # early, for their place, and the model side holds it until they have left.
    enters_after: tuple[str, ...] = ()
    # The LoRA adapter the job runs with (a name from ModelProfile.loras; "": none) and its scale.
    lora: str = ""
    lora_scale: float = 0.0

    @property
    def num_images(self) -> int:
        return len(self.prompts)


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
    Gradio's cache (``web.outputs``), so it never encodes one either. The final images stay PNGs.
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


@dataclass(frozen=True)
class InferenceResult:
    """The job's images (in job order), the steps it ran, when it ran and its peak device memory."""

    images: tuple[Image.Image, ...]
    steps_done: int
    started: float
    ended: float
    peak_memory_bytes: int | None = None
    # Step-level runs only (``engine.loop.joining``): the most images and jobs its loop held while this job
    # was in it, and how many loop steps had run when it joined (0: it opened or started with the loop).
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


# crashed: the model process died during the job (it is being restarted); device_lost: the device failed in a way
# that poisons the process (``engine.device_faults``; the model side ends itself); engine_dead: no model side left
ErrorKind = Literal["cancelled", "out_of_memory", "failed", "crashed", "device_lost", "engine_dead"]
# Why a request ended: every ending is a value with a reason (the model side's ``ErrorKind``s, the
# serving side's time limit and shutdown, or done), translated into the user's words once
# (``serving.local.LocalAdapter._outcome``).
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
class ErrorEvent:
    """The job ended without images. ``detail`` is for the log (a traceback), never for users."""

    kind: ErrorKind
    message: str
    steps_done: int = 0
    detail: str = ""


ModelEvent = StepEvent | InferenceResult | ErrorEvent
TERMINAL = (InferenceResult, ErrorEvent)


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

    def count_tokens(self, text: str) -> Mapping[str, int]: ...

    def stream(self, job: InferenceJob, stop: StopFlag) -> Generator[ModelEvent, None, None]:
        """Run ``job`` and yield its events, ending with exactly one terminal event.

        Blocking: iterate it off the event loop. Closing the iterator early stops the job at its
        next step and returns only once the model side has left it.
        """
        ...

    def shutdown(self, timeout: float | None = None) -> None: ...


# -- what the serving side yields: to the web layer (``Adapter.run``), and a request's end --------------
@dataclass(frozen=True)
class Waiting:
    """Prepared and in line for the GPU; ``ahead`` jobs (the running one included) come first.

    ``eta_seconds``: the estimated time until this request's images (the running job's time left,
    each job ahead, then its own), from measured rates (``eta.py``); None until a job has been measured.
    """

    ahead: int
    eta_seconds: float | None = None


@dataclass(frozen=True)
class Step:
    """Step ``step`` of ``total`` has run; ``eta_seconds``: the job's estimated time left (None: not known yet)."""

    step: int
    total: int
    preview: EncodedPreview | None = None
    eta_seconds: float | None = None


@dataclass(frozen=True)
class Done:
    paths: list[Path]
    info: dict[str, Any]


Event = Waiting | Step | Done


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


@dataclass(frozen=True)
class End:
    """The last item on a request's stream: why it ended (``protocol.FinishReason``) and, when done,
    its share of the job's images; else the model side's or the scheduler's words, for the log."""

    reason: FinishReason = "done"
    result: InferenceResult | None = None
    message: str = ""
    steps_done: int = 0  # cancelled: the steps it ran
    limit: float = 0.0  # timed_out: the time limit, in seconds
    batch_size: int = 1  # images in the job this request ran in (step-level: the most its loop held)
    batch_requests: int = 1  # requests in that job (step-level: the most its loop held)
    batching: str = "job"  # job: one call for the whole batch; step: a step-level loop (engine.loop.joining)
    joined_at_step: int | None = None  # step-level: loop steps run before it joined
