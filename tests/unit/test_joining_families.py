"""Step-level loops of real diffusers pipelines (``engine.loop_sd``, ``engine.loop_flow``): a job's pictures
are the same whether it ran alone (the pipeline's own ``__call__`` through ``DiffusersModel.generate``) or
joined a running loop mid-run, next to members with other prompts, seeds, steps, image counts and guidance.

Families: the embedded default model (SD, Euler, v-prediction, zero SNR) with every offered sampler, and the
tiny random-weight builds of ``tests/builds/`` (SD 1.x with PNDM, SD 2.x v-prediction with DDIM, FLUX dev
and schnell, SD3; Chroma and Z-Image after diffusers' own test components), all at 64 px and 2-4 steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.config import Settings
from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.errors import OutOfMemory
from pipeline.protocol import InferenceJob, InferenceResult, StepEvent
from tests.families import built_family
from tests.loops import assert_same, drive, mad

pytestmark = pytest.mark.timeout(600)

_MODELS: dict[str, Any] = {}
_ALONE: dict[tuple[str, InferenceJob], tuple[Image.Image, ...]] = {}


def model_of(name: str) -> DiffusersModel:
    """``"default"``: the embedded model; else a family of ``tests/families.py``. Loaded once per module."""
    from pipeline.engine.model.loading import load_model

    if name not in _MODELS:
        source = None if name == "default" else str(built_family(name))
        _MODELS[name] = load_model(Settings(model=source, device="cpu"), warmup=False)
    model = _MODELS[name]
    assert isinstance(model, DiffusersModel)
    return model


def alone(name: str, job: InferenceJob) -> tuple[Image.Image, ...]:
    """The job through the pipeline's own ``__call__`` (cached: the same job gives the same pictures)."""
    if (name, job) not in _ALONE:
        _ALONE[name, job] = model_of(name).generate(job, threading.Event(), lambda *_: None).images
    return _ALONE[name, job]


def job_a(sampler: str = "default", guidance: float = 3.0, **over: Any) -> InferenceJob:
    """Two images, classifier-free guidance (guidance > 1), 4 steps, a negative prompt on the second."""
    fields: dict[str, Any] = dict(
        request_id="A",
        prompts=("a red circle on a blue background", "a yellow star"),
        negative_prompts=("", "blurry"),
        seeds=(11, 12),
        width=64,
        height=64,
        num_inference_steps=4,
        guidance_scale=guidance,
        sampler=sampler,
        joinable=True,
    )
    return InferenceJob(**{**fields, **over})


def job_b(sampler: str = "default", **over: Any) -> InferenceJob:
    """One image, no classifier-free guidance (guidance 1), 3 steps: another prompt, seed and step count."""
    fields: dict[str, Any] = dict(
        request_id="B",
        prompts=("a green triangle",),
        negative_prompts=("",),
        seeds=(7,),
        width=64,
        height=64,
        num_inference_steps=3,
        guidance_scale=1.0,
        sampler=sampler,
        joinable=True,
    )
    return InferenceJob(**{**fields, **over})


# (model, sampler): the SD family with every sampler it offers on the embedded model, the SD builds with
# their own schedulers (SD 1.x's PNDM runs one step more than asked; SD 2.x: v-prediction with DDIM), and
# the flow-matching families with their own.
CASES = [
    ("default", "default"),
    ("default", "Euler"),
    ("default", "Euler a"),
    ("default", "DPM++ 2M Karras"),
    ("default", "DDIM"),
    ("default", "UniPC"),
    ("sd1", "default"),
    ("sd1", "Euler a"),
    ("sd2-v", "default"),
    ("sd2-v", "DPM++ 2M Karras"),
    ("flux-dev", "default"),
    ("flux-schnell", "default"),
    ("sd3", "default"),
    ("chroma", "default"),
    ("z-image", "default"),
    ("qwen-image", "default"),
]


@pytest.mark.parametrize(("name", "sampler"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_the_same_images_alone_and_after_joining_mid_run(name: str, sampler: str) -> None:
    """A (2 images, guidance 3.5, 4 steps) starts; C (1 image, guidance 2, 3 steps) joins after 1 step and
    leaves with A, decoded together; B (1 image, guidance 1: no CFG, 3 steps) joins after 2 and ends alone."""
    model = model_of(name)
    a, b = job_a(sampler, guidance=3.5), job_b(sampler)
    c = job_b(sampler, request_id="C", prompts=("a purple square",), seeds=(5,), guidance_scale=2.0)
    assert model.profile.step_joining and model.loop_key(a) == model.loop_key(b) == model.loop_key(c) is not None
    run = drive(model, [(0, a), (1, c), (2, b)])
    extra = 1 if (name, sampler) == ("sd1", "default") else 0  # PNDM runs one step more than asked for
    assert run.decoded == [(4 + extra, ["A", "C"]), (5 + extra, ["B"])]
    for job in (a, b, c):
        assert_same(f"{name}/{sampler} {job.request_id}", run.images[job.request_id], alone(name, job))
    assert [len(run.images[r]) for r in "ABC"] == [2, 1, 1]
    assert model.pipe.scheduler is model.base_sampler  # never stepped, never swapped by a loop
    assert all(im.size == (64, 64) and im.mode == "RGB" for r in "ABC" for im in run.images[r])
    # The pictures are not trivially equal (flat or alike): the prompts and seeds differ.
    assert mad(run.images["A"][:1], run.images["B"]) > 5.0 and mad(run.images["C"], run.images["B"]) > 5.0


# Prompts of one, two and three CLIP chunks (``prompt_weights``): a long prompt, and BREAKs with weights.
TWO_CHUNKS = ", ".join(["a red circle on a blue background"] + [f"simple flat shape {i}" for i in range(11)])
THREE_CHUNKS = "a yellow star BREAK on a (purple:1.3) BREAK [background]"


@pytest.mark.parametrize("name", ["default", "sd1", "sd2-v"])
def test_members_of_one_two_and_three_chunks_share_a_loop_and_each_draws_what_it_draws_alone(name: str) -> None:
    """Issue 49: each member reads only its own chunks (the shorter ones padded and masked in the loop's
    denoiser call), so a prompt's picture does not depend on who shares its steps."""
    model = model_of(name)
    one = job_b(request_id="ONE", guidance_scale=3.0, num_inference_steps=4)
    two = job_b(request_id="TWO", prompts=(TWO_CHUNKS,), seeds=(8,), guidance_scale=3.0)
    three = job_b(request_id="THREE", prompts=(THREE_CHUNKS,), negative_prompts=("(blurry:1.2)",), seeds=(9,),
                  guidance_scale=2.5)  # fmt: skip
    assert model.chunker is not None
    assert [model.chunker.count(j.prompts[0], syntax=True) for j in (one, two, three)] == [1, 2, 3]
    assert model.loop_key(one) == model.loop_key(two) == model.loop_key(three) is not None
    run = drive(model, [(0, one), (1, two), (1, three)])
    for job in (one, two, three):
        assert_same(f"{name} {job.request_id}", run.images[job.request_id], alone(name, job))
    assert mad(run.images["ONE"], run.images["TWO"]) > 5.0 and mad(run.images["TWO"], run.images["THREE"]) > 5.0


def test_sd3_members_of_one_chunk_count_share_a_loop_and_one_of_another_count_fails_alone() -> None:
    """SD3 (issue 49): its joint attention takes no text mask, so the scheduler keys its loops by chunk
    count; members of one count, weighted or not, draw what they draw alone. A member of another count
    that reached a loop anyway is refused by itself (a named error), the others carry on."""
    model = model_of("sd3")
    two = job_b(request_id="TWO", prompts=(TWO_CHUNKS,), seeds=(8,), guidance_scale=3.0, num_inference_steps=4)
    star = job_b(request_id="STAR", prompts=("a yellow star BREAK on (purple:1.3)",),
                 negative_prompts=("(blurry:1.2)",), seeds=(9,), guidance_scale=2.5)  # fmt: skip
    assert model.chunker is not None
    assert [model.chunker.count(j.prompts[0], syntax=True) for j in (two, star)] == [2, 2]
    run = drive(model, [(0, two), (1, star)])
    for job in (two, star):
        assert_same(f"sd3 {job.request_id}", run.images[job.request_id], alone("sd3", job))
    loop = model.open_loop(two)
    loop.add(two)
    with pytest.raises(ValueError, match="text tokens"):
        loop.add(job_b(request_id="ONE", guidance_scale=3.0))
    assert loop.images == 1


@pytest.mark.parametrize("name", ["flux-dev", "flux-schnell"])
def test_flux_members_with_weighted_t5_prompts_draw_what_they_draw_alone(name: str) -> None:
    """Issue 49: FLUX.1's T5 weights (``prompt_weights.flux_encode``) in its loop as in its calls."""
    model = model_of(name)
    plain = job_b(request_id="PLAIN", num_inference_steps=4)
    red = job_b(request_id="RED", prompts=("a (red:1.6) circle on [blue]",), seeds=(8,))
    star = job_b(request_id="STAR", prompts=("((a yellow star)) BREAK on (purple:0.6)",), seeds=(9,))
    run = drive(model, [(0, plain), (1, red), (1, star)])
    for job in (plain, red, star):
        assert_same(f"{name} {job.request_id}", run.images[job.request_id], alone(name, job))


def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))


# Image-to-image members in the SD loop, beside text members: the embedded model's own Euler (v-prediction,
# zero SNR) and a multistep sampler (whose begin index matters), PNDM (SD 1.x: its first step repeats), DDIM.
IMAGE_CASES = [("default", "default"), ("default", "DPM++ 2M Karras"), ("sd1", "default"), ("sd2-v", "default")]


@pytest.mark.parametrize(("name", "sampler"), IMAGE_CASES, ids=[f"{n}-{s}" for n, s in IMAGE_CASES])
def test_image_to_image_members_join_a_text_loop_at_their_own_first_timestep(name: str, sampler: str) -> None:
    """A (text, 4 steps) starts; I (image-to-image, 8 steps at strength 0.5: its last 4) joins after 1 step;
    J (two pictures, no guidance, 4 steps at strength 0.75: its last 3) joins after 2. Each gives the
    pictures of the family's own image-to-image pipeline run alone (``DiffusersModel.generate``)."""
    model = model_of(name)
    assert model.profile.loop_modes[:2] == ("text", "image"), model.profile  # (and "control": issue 51)
    a = job_a(sampler, guidance=3.5)
    i = job_b(sampler, request_id="I", mode="image", images=(picture(1),), strength=0.5, num_inference_steps=8,
              guidance_scale=4.0)  # fmt: skip
    j = job_b(sampler, request_id="J", mode="image", images=(picture(2), picture(3)), prompts=("a", "b"),
              negative_prompts=("", ""), seeds=(4, 5), strength=0.75, num_inference_steps=4)  # fmt: skip
    assert model.loop_key(a) == model.loop_key(i) == model.loop_key(j) is not None
    run = drive(model, [(0, a), (1, i), (2, j)])
    extra = 1 if (name, sampler) == ("sd1", "default") else 0  # PNDM: one scheduler step more
    assert run.progress["I"][-1] == (4 + extra, 4 + extra) and run.progress["J"][-1] == (3 + extra, 3 + extra)
    for job in (a, i, j):
        expected = model.generate(job, threading.Event(), lambda *_: None).images
        assert_same(f"{name}/{sampler} {job.request_id}", run.images[job.request_id], expected)
    # Not trivially equal: the member started from its own picture, not from noise nor from another's.
    assert mad(run.images["J"][:1], run.images["J"][1:]) > 5.0


def test_inpainting_and_hires_fix_stay_whole_pipeline_calls() -> None:
    model = model_of("default")
    mask = Image.new("L", (64, 64), 255)
    assert model.loop_key(job_b(mode="inpaint", images=(picture(1),), masks=(mask,), strength=0.5)) is None
    assert model.loop_key(job_b(hires_width=96, hires_height=96, hires_steps=2, hires_strength=0.5)) is None
    flux = model_of("flux-dev")  # its loop starts from noise only: image-to-image runs as whole calls there
    assert flux.profile.loop_modes == ("text",) and flux.loop_key(job_b(mode="image", images=(picture(1),))) is None


@pytest.mark.parametrize("name", ["default", "sd1", "flux-dev", "sd3", "chroma", "z-image", "qwen-image"])
def test_a_member_leaves_when_its_own_steps_are_done(name: str) -> None:
    """Both start together; B (2 steps) is decoded after loop step 2 while A (4 steps) keeps running."""
    model = model_of(name)
    a, b = job_a(), job_b(num_inference_steps=2, seeds=(8,))
    run = drive(model, [(0, a), (0, b)])
    extra = 1 if name == "sd1" else 0  # PNDM (SD 1.5's own) runs one scheduler step more than asked for
    total_a, total_b = 4 + extra, 2 + extra
    assert run.progress["B"] == [(k, total_b) for k in range(1, total_b + 1)]
    assert run.progress["A"] == [(k, total_a) for k in range(1, total_a + 1)]
    assert run.decoded == [(total_b, ["B"]), (total_a, ["A"])]
    assert_same(f"leave {name} A", run.images["A"], alone(name, a))
    assert_same(f"leave {name} B", run.images["B"], alone(name, b))


@pytest.mark.parametrize(("name", "sampler"), [("default", "Euler a"), ("flux-dev", "default")])
def test_removing_a_member_leaves_the_others_images_unchanged(name: str, sampler: str) -> None:
    model = model_of(name)
    a, b = job_a(sampler), job_b(sampler, num_inference_steps=4)
    run = drive(model, [(0, a), (1, b)], remove_at={"B": 2})
    assert run.progress["B"] == [(1, 4)] and "B" not in run.images
    assert run.decoded == [(4, ["A"])]
    assert_same(f"remove {name}/{sampler} A", run.images["A"], alone(name, a))


@pytest.mark.parametrize("name", ["default", "flux-dev", "sd3", "chroma", "z-image", "qwen-image"])
def test_previews_on_each_members_preview_steps_as_the_pipeline_shows_them(name: str) -> None:
    """A previews image 1 every 2 steps, B image 0 every step; none on a member's last step. Each preview
    looks like the one ``StepWatch`` shows for the same job alone."""
    model = model_of(name)
    assert model.preview_map is not None
    a = job_a(preview_every=2, preview_images=(1,))
    b = job_b(preview_every=1, preview_images=(0, 5))  # 5: past its images, never shown
    run = drive(model, [(0, a), (1, b)])
    assert {step: sorted(shown) for step, shown in run.previews["A"].items()} == {2: [1]}
    assert {step: sorted(shown) for step, shown in run.previews["B"].items()} == {1: [0], 2: [0]}
    for job in (a, b):
        seen: dict[int, dict[int, Image.Image]] = {}

        def on_step(k: int, n: int, shown: Any, seen: dict[int, dict[int, Image.Image]] = seen) -> None:
            if shown:
                seen[k] = dict(shown)

        model.generate(job, threading.Event(), on_step)
        assert seen.keys() == run.previews[job.request_id].keys()
        for step, shown in seen.items():
            for index, picture in shown.items():
                joined = run.previews[job.request_id][step][index]
                assert joined.size == picture.size == (64, 64)
                assert_same(f"preview {name} {job.request_id} step {step} image {index}", (joined,), (picture,))


# Z-Image runs CFG whenever guidance > 0: B's guidance 1 has two rows there.
@pytest.mark.parametrize(
    ("name", "rows"), [("default", 5), ("flux-dev", 3), ("sd3", 5), ("chroma", 5), ("z-image", 6), ("qwen-image", 5)]
)
def test_one_denoiser_call_per_step_with_guidance_rows_only_where_guidance_is_over_1(name: str, rows: int) -> None:
    """A (2 images, guidance 3): [uncond, cond] rows (none on FLUX: no true CFG); B (guidance 1): [cond] only."""
    model = model_of(name)
    denoiser = getattr(model.pipe, "unet", None) or model.pipe.transformer
    calls: list[int] = []

    def count(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rows = args[0] if args else kwargs["hidden_states"]
        calls.append(len(rows) if isinstance(rows, list) else int(rows.shape[0]))  # Z-Image: a list of latents

    handle = denoiser.register_forward_pre_hook(count, with_kwargs=True)
    try:
        drive(model, [(0, job_a(num_inference_steps=2)), (0, job_b(num_inference_steps=2))])
    finally:
        handle.remove()
    assert calls == [rows, rows]


def test_no_previews_without_a_preview_map() -> None:
    model = model_of("default")
    bare = DiffusersModel(model.pipe, model.profile, None)
    run = drive(bare, [(0, job_a(preview_every=1)), (0, job_b(preview_every=1))])
    assert run.previews == {} and set(run.images) == {"A", "B"}


def test_loop_keys_name_size_and_sampler_and_only_the_supported_families_have_one() -> None:
    model = model_of("default")
    a = job_a()
    assert model.loop_key(a) == ("sd", 64, 64, "default", "")  # "": the one model (several: its name)
    assert model.loop_key(replace(a, options=(("model", "other"),))) != model.loop_key(a)
    assert model.loop_key(job_b(negative_prompts=("ugly",), guidance_scale=9.0, num_inference_steps=7)) == (
        model.loop_key(a)
    )
    assert model.loop_key(job_a(width=128)) != model.loop_key(a)
    assert model.loop_key(job_a("Euler a")) != model.loop_key(a)
    # The profile says whether the model runs step-level; off there, no key.
    off = DiffusersModel(model.pipe, replace(model.profile, step_joining=False), model.preview_map)
    assert off.loop_key(a) is None

    class PixArtSigmaPipeline:  # any pipeline without a loop: job-level batching, as before
        scheduler = model.pipe.scheduler

        def __call__(
            self,
            prompt: Any = None,
            negative_prompt: Any = None,
            height: int | None = None,
            width: int | None = None,
            num_inference_steps: int = 20,
            guidance_scale: float = 4.5,
        ) -> None: ...

    other = DiffusersModel(PixArtSigmaPipeline(), replace(model.profile, family="pixart"), None)
    assert other.loop_key(a) is None
    with pytest.raises(ValueError, match="job-level"):
        other.open_loop(a)


def test_out_of_memory_in_a_step_becomes_out_of_memory_and_release_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step raises; the memory is freed by ``release``, once the driver has dropped the failed
    members (``tests/unit/test_device_faults.py`` checks the order through the driver)."""
    model = model_of("default")
    loop = model.open_loop(job_a())
    loop.add(job_a())
    freed: list[bool] = []
    monkeypatch.setattr(model, "free_memory", lambda: freed.append(True))

    def no_memory(*_: Any, **__: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(model.pipe.unet, "forward", no_memory)
    with pytest.raises(OutOfMemory):
        loop.step()
    assert freed == []
    loop.release()
    assert freed == [True]


def test_the_loop_driver_runs_a_real_loop() -> None:
    """``joining.LoopDriver`` over the SD loop: B joins at loop step 2 and gets its own events and pictures."""
    from pipeline.engine.loop.joining import LoopDriver

    @dataclass
    class Task:
        job: InferenceJob
        stop: threading.Event = field(default_factory=threading.Event)
        events: list[Any] = field(default_factory=list)

        def emit(self, event: Any) -> None:
            self.events.append(event)

    model = model_of("default")
    first, second = Task(job_a("Euler")), Task(job_b("Euler"))
    waiting = [second]

    def pull() -> Task | None:
        return waiting.pop() if waiting and driver.steps == 2 else None

    driver = LoopDriver(model.open_loop(first.job), pull)
    driver.run(first)
    for task, joined_at, total in ((first, 0, 4), (second, 2, 3)):
        steps, result = task.events[:-1], task.events[-1]
        assert all(isinstance(e, StepEvent) for e in steps)
        assert [(e.step, e.total) for e in steps] == [(k, total) for k in range(1, total + 1)]
        assert isinstance(result, InferenceResult) and result.joined_at_step == joined_at
        assert result.batch_jobs == 2 and result.batch_images == 3
        assert_same(f"driver {task.job.request_id}", result.images, alone("default", task.job))


# -- step caching per member (issue 50, ``engine.loop.step_cache``) ---------------------------------
def cached_job(rid: str, cache: str, seed: int, steps: int, **over: Any) -> Any:
    fields = dict(request_id=rid, seeds=(seed,), num_inference_steps=steps, options=(("step_cache", cache),))
    return job_b(**{**fields, **over})


CACHE_CASES = [
    ("default", 7.5, 12),
    ("flux-dev", 3.5, 8),
    ("sd3", 3.0, 8),
    ("chroma", 3.0, 8),
    ("z-image", 3.0, 8),
    ("qwen-image", 3.0, 8),
]


@pytest.mark.parametrize(("name", "guidance", "steps"), CACHE_CASES, ids=[c[0] for c in CACHE_CASES])
def test_a_cached_member_that_joins_mid_way_draws_what_it_draws_alone(name: str, guidance: float, steps: int) -> None:
    """A (auto: taylorseer) joins after 3 steps of X (off), beside R (reuse, joining after 4): each
    equals itself alone, and the cache skipped some of A's evaluations and changed its picture."""
    model = model_of(name)
    x = cached_job("X", "off", 1, steps, prompts=("a yellow star",), guidance_scale=guidance)
    a = cached_job("A", "taylorseer", 9, steps, prompts=("a red circle on a blue background",), guidance_scale=guidance)
    r = cached_job("R", "reuse", 2, steps, prompts=("a green triangle",), guidance_scale=1.0)
    run = drive(model, [(0, x), (3, a), (4, r)])
    for job in (x, a, r):
        alone = drive(model, [(0, job)]).images[job.request_id]
        assert_same(f"{name} {job.request_id}", run.images[job.request_id], alone)
    uncached = drive(model, [(0, cached_job("A", "off", 9, steps, prompts=a.prompts, guidance_scale=guidance))])
    assert mad(run.images["A"], uncached.images["A"]) > 0.0  # the cache ran (its steps were predicted)


def test_the_record_counts_a_members_own_evaluations_and_off_counts_none() -> None:
    model = model_of("default")
    loop = model.open_loop(cached_job("A", "taylorseer", 9, 20))
    slots = {
        rid: loop.add(job)
        for rid, job in (("A", cached_job("A", "taylorseer", 9, 20)), ("O", cached_job("O", "off", 1, 20)))
    }
    while loop.images:
        loop.step()
        done = [s for s in slots.values() if s in loop.members and loop.steps_done(s) >= loop.total_steps(s)]
        if done:
            loop.decode(done)
    assert dict(loop.result_fields(slots["A"])["step_cache"]) == {"method": "taylorseer", "computed": 10, "skipped": 10}
    assert loop.result_fields(slots["O"])["step_cache"] == ()


@pytest.mark.parametrize("name", ["flux-dev", "flux-schnell", "chroma", "qwen-image", "z-image"])
def test_first_block_cache_decides_per_row_and_a_joined_member_draws_what_it_draws_alone(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First-Block Cache per row in FLUX.1's, Chroma's, Qwen-Image's and Z-Image's loops (issue 50): A
    (fbcache, two images) joins X (off) after 2 steps, beside R (taylorseer); each equals itself alone;
    A's rows skipped some of their remaining blocks (at a loose threshold: see below)."""
    from pipeline.engine.loop import step_cache

    # the tiny random transformers' first residuals move 40-80 % a step: thresholds that make some rows hit
    monkeypatch.setitem(step_cache.ROW_METHODS, "fbcache", 0.7 if name == "z-image" else 0.5)
    model = model_of(name)
    assert "fbcache" in model.profile.step_caches
    x = cached_job("X", "off", 1, 8, prompts=("a yellow star",))
    cfg = 3.0 if name in ("chroma", "qwen-image", "z-image") else 1.0  # guidance rows, each deciding
    a = cached_job("A", "fbcache", 9, 8, prompts=("a red circle", "a blue square"), negative_prompts=("", ""),
                   seeds=(9, 10), guidance_scale=cfg)  # fmt: skip
    r = cached_job("R", "taylorseer", 2, 8, prompts=("a green triangle",))
    run = drive(model, [(0, x), (2, a), (3, r)])
    for job in (x, a, r):
        assert_same(
            f"{name} {job.request_id}", run.images[job.request_id], drive(model, [(0, job)]).images[job.request_id]
        )
    loop = model.open_loop(a)
    slot = loop.add(a)
    while loop.steps_done(slot) < loop.total_steps(slot):
        loop.step()
    loop.decode([slot])
    report = dict(loop.result_fields(slot)["step_cache"])
    rows = 2 * (2 if cfg > 1 else 1)
    assert report["method"] == "fbcache" and report["computed"] + report["skipped"] == 8 * rows
    assert report["skipped"] > 0 and report["computed"] >= 2  # its first step computes both rows


def test_a_cached_hires_fix_runs_each_pass_as_a_member_of_its_own_with_its_own_warm_up() -> None:
    """Issue 50: hires fix with a step cache on a model whose loop runs text and image-to-image (the
    embedded model): the text pass equals the same text request cached, the second pass equals an
    image-to-image request cached on the upscaled first pass (its warm-up from its own first step),
    and the record counts both passes' evaluations."""
    model = model_of("default")
    hires = dict(hires_width=96, hires_height=96, hires_steps=12, hires_strength=0.75)
    job = cached_job("H", "taylorseer", 9, 12, guidance_scale=7.5, **hires)
    progress: list[tuple[int, int]] = []
    result = model.generate(job, threading.Event(), lambda k, n, _: progress.append((k, n)))
    assert progress == [(k, 21) for k in range(1, 22)]  # one progress over 12 + 9 steps
    # 12 steps: 0-3, 6, 9 and 11 computed; 9 steps: 0-3, 6 and 8
    assert dict(result.step_cache) == {"method": "taylorseer", "computed": 7 + 6, "skipped": 5 + 3}
    text = replace(job, hires_width=0, hires_height=0, hires_steps=0, hires_strength=0.0)
    assert_same("hires first pass", result.first_pass, drive(model, [(0, text)]).images["H"])
    upscaled = tuple(p.resize((96, 96), Image.Resampling.LANCZOS) for p in result.first_pass)
    second = replace(text, mode="image", images=upscaled, strength=0.75, width=96, height=96)
    assert_same("hires second pass", result.images, drive(model, [(0, second)]).images["H"])
    uncached = model.generate(replace(job, options=(("step_cache", "off"),)), threading.Event(), lambda *_: None)
    assert uncached.step_cache == () and mad(result.images, uncached.images) > 0.0  # the cache ran


def test_a_cached_image_to_image_member_warms_up_from_its_own_first_step_and_previews_its_skipped_steps() -> None:
    """Issue 50 §5: I (image-to-image, 12 steps at strength 0.75: its last 9, taylorseer) joins a text loop
    after 2 steps, previewing every step: its warm-up counts from its own first step (computed 0-3, 6
    and 8 of its 9: 6 computed, 3 skipped), its skipped steps show previews from the predicted output,
    and its pictures and previews equal it alone."""
    model = model_of("default")
    x = cached_job("X", "off", 1, 12, prompts=("a yellow star",), guidance_scale=7.5)
    i = cached_job("I", "taylorseer", 9, 12, mode="image", images=(picture(1),), strength=0.75, guidance_scale=7.5,
                   preview_every=1, preview_images=(0,))  # fmt: skip
    run, alone = drive(model, [(0, x), (2, i)]), drive(model, [(0, i)])
    assert_same("cached image-to-image", run.images["I"], alone.images["I"])
    assert sorted(run.previews["I"]) == list(range(1, 9))  # every step but its last, skipped ones too
    for step, shown in run.previews["I"].items():
        assert_same(f"cached preview {step}", (shown[0],), (alone.previews["I"][step][0],))
    loop = model.open_loop(i)
    slot = loop.add(i)
    while loop.steps_done(slot) < loop.total_steps(slot):
        loop.step()
    loop.decode([slot])
    assert dict(loop.result_fields(slot)["step_cache"]) == {"method": "taylorseer", "computed": 6, "skipped": 3}
