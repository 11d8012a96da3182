"""The mutants: each breaks one guarantee by replacing a named seam (a method, a function, a hook).

Applied at interpreter start by ``tools/mutant_site/sitecustomize.py`` when ``T2I_MUTANT`` names one,
so the pytest process and every process it starts (``python app.py``, Ray's workers) run the same
broken code. Seams are names, not source text: they survive reformatting and moves within a module.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from importlib import import_module
from typing import Any, Callable

from tools.mutant_gpu import GPU
from tools.mutant_seams import Patch, attr, install, on
from tools.mutant_security import SECURITY


def _no_gate() -> None:
    from pipeline.serving.local import LocalAdapter

    LocalAdapter.make_gate = staticmethod(lambda: asyncio.Semaphore(10**6))  # type: ignore[method-assign]


def _thread_per_job() -> None:
    """No single model thread: every job gets a fresh thread, and the pipeline is called from it."""
    from pipeline.engine.hosting.runner import ModelRunner
    from pipeline.protocol import InferenceResult, StepEvent
    from pipeline.serving.streamer import ModelStreamer

    def stream(self: Any, job: Any, stop: Any = None) -> Any:
        events: list[Any] = []
        try:
            result = self.model.generate(job, stop or threading.Event(), lambda s, t, p: events.append(StepEvent(s, t)))
        except Exception as exc:
            yield from events
            yield InferenceResult.ended_by("failed", repr(exc))
            return
        yield from events
        yield result if isinstance(result, InferenceResult) else InferenceResult.ended_by("failed", "no result")

    def submit(self: Any, job: Any, stop: Any, deliver: Any, context: Any = None) -> Any:
        import concurrent.futures

        from pipeline.protocol import Submission

        terminal: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def emit(event: Any) -> None:
            if isinstance(event, InferenceResult):
                terminal.set_result(event) if not terminal.done() else None
            else:
                deliver(event)

        task = Submission(job, stop, emit)
        threading.Thread(target=lambda: (context or contextvars.copy_context()).run(self._drive, task)).start()
        return terminal

    ModelRunner.stream = stream  # type: ignore[method-assign]
    ModelStreamer.submit = submit  # type: ignore[method-assign]


def _gate_wraps_whole_request() -> None:
    from pipeline.serving.local import LocalAdapter

    original = LocalAdapter.run

    async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        whole = self.__dict__.setdefault("_mutant_whole", asyncio.Semaphore(1))
        async with whole:
            async for event in original(self, *args, **kwargs):
                yield event

    LocalAdapter.run = run  # type: ignore[method-assign]


def _release_gate_on_cancel() -> None:
    """The plain ``async with gate: await to_thread(infer)``: the gate opens when the waiter is told to stop."""
    from pipeline.serving.local import LocalAdapter

    async def _own_gate(self: Any, batch: Any) -> None:
        job = asyncio.create_task(self.jobs.run(batch))
        while not job.done() and not all(e.stop.is_set() for e in batch.entries):
            await asyncio.sleep(0.001)
        self._gate.release()
        self.scheduler.ended(batch)
        await job

    LocalAdapter._own_gate = _own_gate  # type: ignore[method-assign]


def _one_stop_stops_the_call(entries: Any) -> Any:
    """A closed batch's call stopped as soon as any one of its entries stops."""
    from pipeline.protocol import StopSignal

    stop = StopSignal()
    for entry in entries:
        entry.stop.on_set(stop.set)
    if any(e.stop.is_set() for e in entries):
        stop.set()
    return stop


def _pictures_from_step_0() -> None:
    """An image-to-image loop member that ignores its strength: it enters at the schedule's first step."""
    import dataclasses

    from pipeline.engine.loop import loop_sd

    original = loop_sd.SDLoop._from_pictures

    def from_step_0(self: Any, job: Any, *args: Any) -> Any:
        return original(self, dataclasses.replace(job, strength=1.0), *args)

    loop_sd.SDLoop._from_pictures = from_step_0  # type: ignore[method-assign,assignment]


def _one_cache_decision_for_every_row() -> None:
    """Issue 50: the step cache's skip decision shared across rows, as diffusers' hooks share one state
    per module: every member follows the step index of the first cache made (not its own)."""
    from pipeline.engine.loop import step_cache

    original = step_cache.MemberCache.computes
    lead: dict[str, Any] = {}

    def computes(self: Any, step: int) -> bool:
        first = lead.setdefault("cache", self)
        if first is self:
            lead["step"] = step
        return original(self, lead.get("step", step))

    step_cache.MemberCache.computes = computes  # type: ignore[method-assign]


def _first_map_for_all(original: Any) -> Any:
    """Issue 51's mutant: every controlled member of a step given the first one's map."""
    import dataclasses

    def residuals(controlnets: Any, members: Any, *args: Any) -> Any:
        held = [m.control for m in members]
        first = next((c for c in held if c is not None), None)
        for m in members:
            if m.control is not None and first is not None:
                m.control = dataclasses.replace(m.control, cond=first.cond[:1].expand(m.rows, *first.cond.shape[1:]))
        try:
            return original(controlnets, members, *args)
        finally:
            for m, control in zip(members, held):
                m.control = control

    return residuals


def _one_sd_control_map() -> None:
    from pipeline.engine.loop import loop_sd

    loop_sd.residuals = _first_map_for_all(loop_sd.residuals)


def _one_flux_control_map() -> None:
    from pipeline.engine.loop import loop_flow

    loop_flow.flux_residuals = _first_map_for_all(loop_flow.flux_residuals)


def _one_call_control_map() -> None:
    """A whole call's batch given the first request's map for every image (``scheduler.call_job``)."""
    import dataclasses

    from pipeline.serving import scheduler

    original = scheduler.call_job

    def call_job(entries: Any) -> Any:
        job = original(entries)
        return dataclasses.replace(job, controls=job.controls[:1] * len(job.controls)) if job.controls else job

    scheduler.call_job = call_job


def _loop_key_without_the_model() -> None:
    """Several models (issue 52): the serving side's loop key forgets the model, so requests of two models
    share a loop (run on the first one's model)."""
    from pipeline.protocol import loop_key as protocol_loop_key
    from pipeline.serving import scheduler

    def loop_key(request: Any, mixed_loras: bool) -> Any:
        r = request
        return protocol_loop_key(r.width, r.height, r.sampler, r.lora_use, per_lora=not mixed_loras)

    scheduler.loop_key = loop_key


def _joiners_pass_another_models_request() -> None:
    """Several models: "serve what is loaded" without the fairness bound: a request for another model at the
    head of the line no longer stops the joining, so the loaded model's backlog passes it."""
    from pipeline.serving.scheduler import Scheduler

    original = Scheduler._joiners

    def joiners(self: Any, batch: Any, fair: Any, *, take: bool) -> Any:
        model = batch.entries[0].request.model if batch.entries else None
        return original(self, batch, [e for e in fair if model is None or e.request.model == model], take=take)

    Scheduler._joiners = joiners  # type: ignore[method-assign]


def _one_first_block_decision_for_the_batch() -> None:
    """Issue 50: First-Block Cache decided once for the whole batch (diffusers' hook: one scalar over
    every row), not per row: every row skips only when all would."""
    from pipeline.engine.loop import loop_flow

    original = loop_flow.row_hits

    def row_hits(members: Any, first: Any, counts: Any = None) -> Any:
        hits = original(members, first, counts)
        return hits.all().expand_as(hits).clone()

    loop_flow.row_hits = row_hits


async def _stopped_at_once(self: Any, session: str, timeout: float) -> bool:
    return True


def _pass_the_stop_event() -> None:
    from pipeline.engine.hosting.zerogpu import ZeroGpuSide

    def stream(self: Any, job: Any, stop: Any) -> Any:
        yield from self._gpu_stream(job, stop)  # the old boundary: a threading.Event crosses

    ZeroGpuSide.stream = stream  # type: ignore[method-assign]


def _no_user_context() -> None:
    from pipeline.serving.streamer import ModelStreamer

    original = ModelStreamer.submit

    def submit(self: Any, job: Any, stop: Any, deliver: Any, context: Any = None) -> Any:
        return original(self, job, stop, deliver, contextvars.Context())  # not the user's context

    ModelStreamer.submit = submit  # type: ignore[method-assign]


def _ray_replica_admits_eight() -> None:
    from pipeline.ray import cluster

    original = cluster.deployment_options
    cluster.deployment_options = lambda *a: {**original(*a), "max_ongoing_requests": 8}


def _model_process_never_hears_stop() -> None:
    from pipeline.engine.hosting.process import _Child

    original = _Child.send
    from pipeline.engine.hosting.wire import StopJob

    _Child.send = lambda self, message: True if isinstance(message, StopJob) else original(self, message)  # type: ignore[method-assign]


def _restart_gives_up_at_once(self: Any) -> None:
    with self._cond:
        self._state = "dead"
        self._cond.notify_all()


def _fills_nothing(pasted: Any, limits: Any, **kwargs: Any) -> Any:
    from pipeline.web.apis.a1111 import Fill

    return Fill({}, [])


def _leave_drops_another() -> None:
    """A leave that drops another member: when one member stops, the next one in the loop goes too."""
    from pipeline.engine.loop.joining import LoopDriver
    from pipeline.protocol import InferenceResult

    def _leave_stopped(self: Any) -> None:
        for m in [m for m in self.members if m.task.stop.is_set()]:
            if m not in self.members:
                continue
            gone = [m] + [o for o in self.members if o is not m][:1]
            for o in gone:
                self.members.remove(o)
                done = self.loop.steps_done(o.slot)
                self.loop.remove(o.slot)
                o.task.emit(InferenceResult.ended_by("cancelled", "stopped", done))

    LoopDriver._leave_stopped = _leave_stopped  # type: ignore[method-assign]


def _joiner_waits_for_the_end() -> None:
    """No place promised on a member's last step: its successor is sent when it has left."""
    from pipeline.serving.jobs import GpuJobs

    original = GpuJobs._deliver_step

    def deliver(self: Any, entries: Any, offsets: Any, event: Any, clock: Any, joinable: bool) -> None:
        original(self, entries, offsets, event, clock, False)

    GpuJobs._deliver_step = deliver  # type: ignore[method-assign]


def _joiners_skip_the_head() -> None:
    """Joiners taken from anywhere in the line: compatible requests overtake one that cannot join."""
    from pipeline.serving.scheduler import Scheduler, loop_key

    original = Scheduler._joiners

    def _joiners(self: Any, batch: Any, fair: Any, *, take: bool) -> Any:
        fair = [e for e in fair if loop_key(e.request, self.mixed_loras) == batch.key]
        return original(self, batch, fair, take=take)

    Scheduler._joiners = _joiners  # type: ignore[method-assign]


def _one_login_one_user(self: Any) -> str:
    """The identity before issue 26: a --auth login alone, wherever its users are."""
    if self.hf_user:
        return f"hf:{self.hf_user}"
    return f"user:{self.login}" if self.login else f"addr:{self.network}"


def _leftmost_forwarded(peer: str, forwarded: Any, trusted: Any) -> str:
    """X-Forwarded-For's first hop, from anyone: what a client writes itself."""
    hops = [h.strip() for line in forwarded for h in line.split(",") if h.strip()]
    return hops[0] if hops else peer


def _plain_uvicorn(limits: Any) -> Any:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


def _rename_without_cleanup(path: Any, write: Callable[[Any], object]) -> Any:
    tmp = path.with_suffix(path.suffix + ".tmp")
    write(tmp)
    tmp.replace(path)
    return path


def _backtracking_pairs(line: str) -> list[tuple[str, str]]:
    """The settings line read by A1111's regular expression: quadratic on a long line with no colon."""
    import json
    import re

    pairs = []
    for key, value in re.findall(r'\s*(\w[\w \-/+.]*):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)', line):
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        pairs.append((key.strip(), value))
    return pairs


def _previews_for_everyone() -> None:
    """Every request's job asks for previews, whether its caller did or not."""
    import dataclasses

    from pipeline.request import GenerateRequest

    original = GenerateRequest.to_job

    def to_job(self: Any) -> Any:
        job = original(self)
        return dataclasses.replace(job, preview_every=max(1, job.num_inference_steps // 8))

    GenerateRequest.to_job = to_job  # type: ignore[method-assign]


def _full_size_previews() -> None:
    """Previews drawn at the picture's size and encoded whole (before issue 28: PNGs of the full size)."""
    import io

    from pipeline.engine.model import previews
    from pipeline.protocol import EncodedPreview

    def of(cls: Any, image: Any) -> Any:
        out = io.BytesIO()
        image.convert("RGB").save(out, "JPEG", quality=85)
        return cls(out.getvalue(), image.width, image.height)

    previews.display_size = lambda width, height: (width, height)
    EncodedPreview.of = classmethod(of)  # type: ignore[method-assign, assignment]


def _previous_adapter_leaks() -> None:
    """A job with no adapter keeps whatever the last job set (no ``disable_lora``)."""
    from pipeline.engine.model.lora import LoadedLoras

    original = LoadedLoras.use
    LoadedLoras.use = lambda self, use: 0.0 if not use.name else original(self, use)  # type: ignore[method-assign]


def _mixed_batch_one_adapter() -> None:
    """A loop with members on different adapters runs every row through the first member's adapter."""
    import contextlib

    from pipeline.engine.model.lora import LoadedLoras

    @contextlib.contextmanager
    def rows(self: Any, per_row: Any) -> Any:
        self.use(next((u for u in per_row if u.name), per_row[0]))
        yield

    LoadedLoras.rows = rows  # type: ignore[method-assign]


def _thread_off_the_map() -> None:
    """The serving side starts a thread the concurrency map (docs/architecture.md) does not name."""
    import time

    from pipeline.serving.streamer import ModelStreamer

    original = ModelStreamer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        threading.Thread(target=time.sleep, args=(60,), name="stream-helper", daemon=True).start()

    ModelStreamer.__init__ = init  # type: ignore[method-assign]


NO_GATE = on("pipeline.serving.local", _no_gate)
THREAD_PER_JOB = [("pipeline.engine.hosting.runner", _thread_per_job)]

MUTANTS: dict[str, list[Patch]] = (
    {
        "no-gate": NO_GATE,
        "gate-wraps-whole-request": on("pipeline.serving.local", _gate_wraps_whole_request),
        "no-gate-and-a-thread-per-job": NO_GATE + THREAD_PER_JOB,
        "to-thread-releases-the-gate-on-cancel": THREAD_PER_JOB + on("pipeline.serving.local", _release_gate_on_cancel),
        "batch-ignores-compatibility": attr("pipeline.serving.scheduler", "batch_key", lambda request: 0),
        "no-batching": attr("pipeline.serving.scheduler", "Scheduler.fits", lambda self, images, entry: False),
        "batch-ignores-max-size": attr("pipeline.serving.scheduler", "Scheduler.fits", lambda self, *a: True),
        "img2img-loop-member-ignores-strength": on("pipeline.engine.loop.loop_sd", _pictures_from_step_0),
        "step-cache-decision-shared-across-rows": on(
            "pipeline.engine.loop.step_cache", _one_cache_decision_for_every_row
        ),
        "fbcache-one-decision-for-the-batch": on(
            "pipeline.engine.loop.loop_flow", _one_first_block_decision_for_the_batch
        ),
        # Issue 51: one ControlNet map for the whole batch (diffusers' pipelines take one per call), in the
        # SD 1.x/2.x and FLUX.1 loops and in a whole call's batch.
        # FLUX.1's own forward under First-Block Cache without the ControlNet's samples
        "flux-control-lost-under-fbcache": attr("pipeline.engine.loop.loop_flow", "_sampled", lambda *args: None),
        # Issue 52: two models' requests in one loop; the loaded model's backlog passing a request for another
        "several-models-share-a-loop": on("pipeline.serving.scheduler", _loop_key_without_the_model),
        "joiners-pass-another-models-request": on("pipeline.serving.scheduler", _joiners_pass_another_models_request),
        "controlnet-one-map-for-the-batch": on("pipeline.engine.loop.loop_sd", _one_sd_control_map)
        + on("pipeline.engine.loop.loop_flow", _one_flux_control_map)
        + on("pipeline.serving.scheduler", _one_call_control_map),
        "img2img-never-joins-loops": attr(
            "pipeline.serving.scheduler", "joins_loops", lambda request, loop_modes=("text",): request.mode == "text"
        ),
        "img2img-never-shares-calls": attr("pipeline.serving.scheduler", "batch_key", lambda request: (id(request),)),
        "image-modes-join-text-loops": attr(
            "pipeline.serving.scheduler", "joins_loops", lambda request, loop_modes=("text",): True
        ),
        "one-cancel-stops-the-batch": attr("pipeline.serving.jobs", "_all_stopped", _one_stop_stops_the_call),
        "oom-no-retry": attr("pipeline.serving.jobs", "GpuJobs.retry_alone", staticmethod(lambda *a: False)),
        "skip-in-progress": attr("pipeline.web.page.shown", "progress_gallery", lambda: __import__("gradio").skip()),
        "ray-replica-without-a-gate": NO_GATE + THREAD_PER_JOB + on("pipeline.ray.cluster", _ray_replica_admits_eight),
        "ray-cancel-not-forwarded": attr("pipeline.ray.adapter", "_cancel", lambda call: None),
        "no-disconnect-watch": attr("pipeline.web.page.handler", "caller_alive", lambda demo: None),
        "stop-answers-at-once": attr("pipeline.web.page.handler", "PageJobs.wait_ended", _stopped_at_once),
        "no-steps-validation": attr("pipeline.request", "_steps", lambda raw, limits: raw.get("num_inference_steps")),
        "no-sweeper": attr("pipeline.serving.sweeper", "Sweeper.start", lambda self: None),
        "plain-close-on-signal": attr(
            "pipeline.web.lifecycle", "shutdown", lambda demo, adapter, deadline=8.0: demo.close()
        ),
        "zerogpu-passes-the-stop-event": on("pipeline.engine.hosting.zerogpu", _pass_the_stop_event),
        "zerogpu-runs-outside-the-users-context": on("pipeline.serving.streamer", _no_user_context),
        "model-process-never-hears-stop": on("pipeline.engine.hosting.process", _model_process_never_hears_stop),
        "model-process-not-restarted": attr(
            "pipeline.engine.hosting.process", "ProcessSide._restart", _restart_gives_up_at_once
        ),
        "recovering-not-reported": attr("pipeline.serving.local", "LocalAdapter._recovering", lambda self: False),
        "liveness-watch-never-looks": attr(
            "pipeline.serving.base",
            "LivenessWatch.watching",
            lambda self, alive, on_gone: __import__("contextlib").nullcontext(),
        ),
        # The page (issue 18): each helper around generate, broken in the browser.
        "join-ignores-compatibility": attr("pipeline.serving.scheduler", "loop_key", lambda request, mixed: 0),
        "leave-drops-another-member": on("pipeline.engine.loop.joining", _leave_drops_another),
        "joiner-waits-for-the-end": on("pipeline.serving.jobs", _joiner_waits_for_the_end),
        "early-joiner-not-held": attr(
            "pipeline.engine.loop.joining", "enters_after_members", lambda job, in_loop: False
        ),
        # Issue 37: the scheduler's fair order inside a running loop, skipped by joiners.
        "joiners-skip-the-fair-head": on("pipeline.serving.scheduler", _joiners_skip_the_head),
        "swap-does-nothing": attr("pipeline.web.page.page_tools", "swapped", lambda width, height: (width, height)),
        "history-restores-nothing": attr("pipeline.web.page.page_tools", "restore", lambda history, index: None),
        "paste-fills-nothing": attr("pipeline.web.page.page_tools", "fill_from", _fills_nothing),
        "escape-does-nothing": attr("pipeline.web.page.page_tools", "KEYS_JS", "() => {}"),
        # Issue 26: hostile clients. Each defence of the front door and below it, removed.
        "one-login-one-user": attr("pipeline.web.door.identity", "Caller.key", property(_one_login_one_user)),
        "forwarded-for-believed": attr("pipeline.web.door.identity", "client_address", _leftmost_forwarded),
        "no-connection-limits": attr("pipeline.web.lifecycle", "limited_protocol", _plain_uvicorn),
        "full-disk-leaves-a-tmp": attr("pipeline.serving.postprocess", "write_then_rename", _rename_without_cleanup),
        "notes-rendered": attr("pipeline.web.apis.a1111", "notes_html", lambda fill: "<br>".join(fill.notes)),
        "ui-events-unbounded": attr("pipeline.web.page.page_tools", "UI_CONCURRENCY", None)
        + attr(
            "pipeline.web.page.page_tools",
            "UI",
            {"api_visibility": "private", "concurrency_id": "ui", "concurrency_limit": None, "show_progress": "hidden"},
        ),
        "auto-limit-off": attr("pipeline.serving.jobs", "GpuJobs.time_limit", lambda self, job: self.job_timeout),
        "paste-regex-backtracks": attr("pipeline.web.apis.a1111", "settings_pairs", _backtracking_pairs),
        # Issue 27: the guidance control sent as guidance_scale whatever the family reads (Qwen-Image's is
        # true_cfg_scale); packed latents previewed as they are (no unpacking: no preview for FLUX.2 and kin);
        # Z-Image's step-level loop without its classifier-free guidance.
        "guidance-always-guidance-scale": attr(
            "pipeline.engine.model.families",
            "guidance_arguments",
            lambda t, guidance, steps=0: {**t.fixed, "guidance_scale": guidance},
        ),
        "packed-previews-not-unpacked": attr(
            "pipeline.engine.model.previews", "unpack", lambda pipe, latents, width, height: latents
        ),
        # Issue 28: previews for a caller who did not ask; previews at the picture's full size; a preview
        # made at every step whatever the job asked (a picture-sized payload per step with previews off).
        "previews-for-everyone": on("pipeline.request", _previews_for_everyone),
        "previews-at-full-size": on("pipeline.protocol", _full_size_previews),
        "previews-every-step": attr(
            "pipeline.engine.model.stepping", "StepWatch._preview_due", lambda self, step: self.preview_map is not None
        ),
        "z-image-loop-without-guidance": attr(
            "pipeline.engine.loop.loop_flow",
            "ZImageLoop._guided",
            staticmethod(lambda pos, neg, scale, normalization: pos),
        ),
        # Every job runs without its LoRA (the request's choice never reaches the weights).
        "lora-adapter-ignored": attr(
            "pipeline.engine.model.lora", "use_of", lambda job: import_module("pipeline.protocol").LoraUse()
        ),
        "lora-previous-adapter-leaks": on("pipeline.engine.model.lora", _previous_adapter_leaks),
        "lora-mixed-batch-one-adapter": on("pipeline.engine.model.lora", _mixed_batch_one_adapter),
        "thread-off-the-map": on("pipeline.serving.streamer", _thread_off_the_map),
    }
    | SECURITY
    | GPU
)


def apply(name: str) -> None:
    """Patch each seam of mutant ``name`` now if its module is loaded, else as soon as it is."""
    install(MUTANTS[name])
