"""The real tiny diffusers pipeline on the CPU: offline loading, the scheduler race, profiles."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings
from pipeline.default_model import DEFAULT_MODEL_DIR, model_defaults
from pipeline.default_model.architecture import build_untrained
from pipeline.engine.hosting.runner import ModelRunner
from pipeline.request import Limits
from pipeline.serving.local import LocalAdapter
from tests.helpers import collect, raw_request

RACE_ATTEMPTS = 30


@pytest.fixture(scope="module")
def model() -> Any:
    from pipeline.engine.model.loading import load_model

    return load_model(Settings(), warmup=False)


def test_default_model_build_is_deterministic(tmp_path: Path) -> None:
    build_untrained(tmp_path / "a")
    build_untrained(tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert any(str(f).endswith(".safetensors") for f in files)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_default_model_profile_and_speed_settings(model: Any) -> None:
    p = model.profile
    assert (p.pipeline_class, p.sampler, p.device, p.dtype) == (
        "StableDiffusionPipeline",
        "EulerDiscreteScheduler",
        "cpu",
        "float32",
    )
    assert (p.default_width, p.default_height, p.default_steps, p.size_multiple) == (64, 64, 20, 4)
    assert p.default_guidance == model_defaults(DEFAULT_MODEL_DIR)["guidance"]  # saved with the trained weights
    assert p.text_encoders == (("CLIP", 75),) and p.supports_negative_prompt and p.family == "sd"
    counts = {"CLIP": 7, "CLIP chunks": 1, "CLIP chunks as written": 1}  # SD 1.x: CLIP prompts go in chunks
    assert model.count_tokens("a red circle on a blue background") == counts


def test_unguarded_threads_race_the_euler_scheduler(model: Any) -> None:
    """Two threads in one Euler pipeline share its step index: IndexError in ``step``."""
    import torch

    pipe = model.pipe
    errors: list[BaseException] = []

    def call(barrier: threading.Barrier, seed: int) -> None:
        barrier.wait()
        try:
            with torch.inference_mode():
                pipe(
                    "a cat", num_inference_steps=20, width=64, height=64, generator=torch.Generator().manual_seed(seed)
                )
        except BaseException as exc:
            errors.append(exc)

    for _attempt in range(RACE_ATTEMPTS):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=call, args=(barrier, s)) for s in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        if errors:
            break
    assert errors, f"no race in {RACE_ATTEMPTS} attempts"
    assert any(isinstance(e, IndexError) for e in errors), errors
    pipe.scheduler.set_timesteps(1)  # leave the shared pipeline in a sane state


@pytest.mark.anyio
async def test_the_same_load_through_the_adapter_never_races(model: Any, tmp_path: Path) -> None:
    runner = ModelRunner(lambda: model)
    runner.start(timeout=30)
    adapter = LocalAdapter(runner, Limits.for_model(model.profile), tmp_path)
    runs: list[list[Any]] = []
    try:
        for attempt in range(RACE_ATTEMPTS // 3):
            runs += await asyncio.gather(
                *(
                    collect(adapter, raw_request(prompt="a cat", seed=attempt * 2 + s, num_inference_steps=20))
                    for s in (1, 2)
                )
            )
    finally:
        adapter.shutdown_model(timeout=30)
        adapter.close()
    assert len(runs) == 2 * (RACE_ATTEMPTS // 3)
    assert all(r[-1].kind == "done" and r[-1].info["steps_done"] == 20 for r in runs)


def test_cancel_stops_at_the_next_step_without_decoding(model: Any) -> None:
    from pipeline.errors import Cancelled
    from pipeline.protocol import InferenceJob

    stop = threading.Event()
    seen: list[int] = []
    decodes: list[int] = []
    vae = model.pipe.vae
    original = vae.decode
    vae.decode = lambda *a, **k: decodes.append(1) or original(*a, **k)

    def on_step(step: int, total: int, latents: Any) -> None:
        seen.append(step)
        if step == 3:
            stop.set()

    job = InferenceJob("c", ("a cat",), ("",), (1,), 64, 64, 10, 7.5)
    try:
        with pytest.raises(Cancelled) as info:
            model.generate(job, stop, on_step)
    finally:
        vae.decode = original
    assert info.value.steps_done == 3 and seen == [1, 2, 3] and decodes == []
    done = model.generate(job, threading.Event(), lambda *_: None)  # the pipeline still works
    assert done.steps_done == 10 and done.images[0].size == (64, 64)


def test_device_and_dtype_choice() -> None:
    import torch

    from pipeline.engine.model.loading import pick_device, pick_dtype

    assert pick_device("cpu") == "cpu"
    assert pick_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_dtype("auto", "cpu", "StableDiffusionPipeline") == torch.float32
    assert pick_dtype("auto", "cuda", "StableDiffusionXLPipeline") == torch.float16
    assert pick_dtype("auto", "cuda", "FluxPipeline") == torch.bfloat16
    assert pick_dtype("bfloat16", "cpu", "x") == torch.bfloat16
    assert DEFAULT_MODEL_DIR.parent.name == "assets"


def test_out_of_memory_frees_memory_and_says_what_to_do(model: Any) -> None:
    import torch

    from pipeline.errors import OutOfMemory
    from pipeline.protocol import InferenceJob

    freed: list[int] = []
    pipe = model.pipe
    original_call, original_free = type(pipe).__call__, model.free_memory

    def oom(self: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    type(pipe).__call__ = oom
    model.free_memory = lambda: freed.append(1)
    try:
        with pytest.raises(OutOfMemory, match="smaller width and height, or fewer images") as info:
            model.generate(InferenceJob("oom", ("x",), ("",), (1,), 64, 64, 2, 7.5), threading.Event(), lambda *_: None)
    finally:
        type(pipe).__call__ = original_call
        model.free_memory = original_free
    assert freed == [1] and info.value.__context__ is None  # freed outside the except block
    assert (
        model.generate(
            InferenceJob("after", ("x",), ("",), (1,), 64, 64, 2, 7.5), threading.Event(), lambda *_: None
        ).steps_done
        == 2
    )


@pytest.mark.anyio
async def test_a_request_draws_the_same_images_alone_and_in_a_batch(model: Any, tmp_path: Path) -> None:
    """Dynamic batching on the real pipeline: per-image generators keep each request's own noise."""
    import numpy as np
    from PIL import Image

    runner = ModelRunner(lambda: model)
    runner.start(timeout=30)
    adapter = LocalAdapter(
        runner, Limits.for_model(model.profile, max_pixel_steps=128 * 128 * 60), tmp_path, max_batch_size=4
    )
    common = dict(num_inference_steps=8, width=64, height=64, guidance_scale=7.5)
    mine = raw_request(prompt="a red circle", negative_prompt="blurry", seed=1234, num_images=2, **common)
    # Both with a negative prompt: a request with one and a request without never share a job.
    other = raw_request(prompt="a blue square on a green background", negative_prompt="dark", seed=99, **common)
    try:
        alone = (await collect(adapter, mine))[-1]
        # A long blocker holds the gate while the two compatible requests line up behind it.
        blocker = asyncio.create_task(collect(adapter, raw_request(num_inference_steps=60, width=128, height=128)))
        while not adapter.inference_in_progress:
            await asyncio.sleep(0.005)
        together = await asyncio.gather(collect(adapter, other), collect(adapter, mine))
        await blocker
        theirs, batched = together[0][-1], together[1][-1]
    finally:
        adapter.shutdown_model(timeout=30)
        adapter.close()
    assert alone.info["batch_size"] == 2 and alone.info["batch_requests"] == 1
    assert batched.info["batch_size"] == 3 and batched.info["batch_requests"] == 2, "the two did not share a job"
    assert theirs.info["seeds"] == [99] and batched.info["seeds"] == [1234, 1235]
    for a_path, b_path in zip(alone.paths, batched.paths, strict=True):
        a, b = (np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) for p in (a_path, b_path))
        assert np.abs(a - b).mean() < 1.0, "a request's images changed when it shared a job"
    # And the other request's image is not a copy of this one's: prompts and seeds stayed apart.
    c = np.asarray(Image.open(theirs.paths[0]).convert("RGB"), dtype=np.float64)
    assert np.abs(c - np.asarray(Image.open(batched.paths[0]).convert("RGB"), dtype=np.float64)).mean() > 1.0


def test_live_previews_look_like_the_final_picture(model: Any) -> None:
    """The preview a person sees last (step 18 of 20) is the picture to come: the denoised estimate
    through the map fitted to this VAE, within a mean colour difference of 0.12 (0-1 scale). Halfway
    (step 10) it is already close: the noisy latents of the step would not be."""
    import threading

    import numpy as np

    from pipeline.default_model import EXAMPLE_PROMPTS
    from pipeline.protocol import InferenceJob

    diffs = []
    for seed, prompt in enumerate(EXAMPLE_PROMPTS[:4]):
        previews: dict[int, Any] = {}
        job = InferenceJob("p", (prompt,), ("",), (seed,), 64, 64, 20, 4.0, preview_every=2)
        result = model.generate(
            job, threading.Event(), lambda step, total, shown: previews.update({step: shown[0]} if 0 in shown else {})
        )
        assert sorted(previews) == list(range(2, 20, 2))  # every 2 steps, never the last
        final = np.asarray(result.images[0], dtype=np.float32) / 255
        diffs.append([float(np.abs(np.asarray(previews[s], dtype=np.float32) / 255 - final).mean()) for s in (10, 18)])
    assert max(last for _, last in diffs) <= 0.12, diffs
    assert max(half for half, _ in diffs) <= 0.12, diffs


def test_a_preview_decoder_from_a_local_folder_draws_the_previews(tmp_path: Path) -> None:
    """``--preview-decoder PATH``: a tiny AutoencoderTiny (random weights here) decodes the previews."""
    import threading

    import torch
    from diffusers import AutoencoderTiny

    from pipeline.engine.model.loading import load_model
    from pipeline.engine.model.previews import DecoderPreview
    from pipeline.protocol import InferenceJob

    torch.manual_seed(0)
    AutoencoderTiny(
        encoder_block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        num_encoder_blocks=(1, 1, 1, 1),
        num_decoder_blocks=(1, 1, 1, 1),
    ).save_pretrained(tmp_path / "taesd")
    model = load_model(Settings(preview_decoder=tmp_path / "taesd"), warmup=False)
    assert isinstance(model.preview_map, DecoderPreview)
    decoded: list[tuple[int, ...]] = []
    original = model.preview_map.decoder.decode
    model.preview_map.decoder.decode = lambda z, **kw: (decoded.append(tuple(z.shape)), original(z, **kw))[1]
    shown: dict[int, Any] = {}
    job = InferenceJob("d", ("a red circle",), ("",), (1,), 64, 64, 8, 4.0, preview_every=2)
    model.generate(job, threading.Event(), lambda step, total, previews: shown.update(previews and {step: previews[0]}))
    assert sorted(shown) == [2, 4, 6] and all(image.size == (64, 64) for image in shown.values())
    assert decoded == [(1, 4, 16, 16)] * 3  # the denoised estimate, decoded by the tiny decoder


def test_each_job_gets_its_own_scheduler_and_the_pipelines_own_is_never_stepped(model: Any) -> None:
    """Schedulers are stateful (step index, multistep history): every job builds its own on the model
    thread from the model's config, and puts the pipeline's back afterwards, unstepped."""
    import torch

    from pipeline.protocol import InferenceJob

    pipe = model.pipe
    base = pipe.scheduler
    before = (base.timesteps.clone(), base.step_index, dict(base.config), pipe.config["scheduler"])
    used = []
    for name in ("DDIM", "Euler a", "default", "default"):
        job = InferenceJob(name, ("a red circle",), ("",), (1,), 64, 64, 4, 4.0, sampler=name)
        during: list[Any] = []
        model.generate(job, threading.Event(), lambda *_: during.append(pipe.scheduler))
        assert len(during) == 4 and all(s is during[0] for s in during), name  # one instance for the whole job
        used.append(during[0])
    assert [type(s).__name__ for s in used] == [
        "DDIMScheduler",
        "EulerAncestralDiscreteScheduler",
        "EulerDiscreteScheduler",
        "EulerDiscreteScheduler",
    ]
    assert len({id(s) for s in [*used, base]}) == 5  # four jobs, four instances, none of them the pipeline's
    assert all(len(s.timesteps) == 4 for s in used)  # each was set up for its own job
    assert pipe.scheduler is base and pipe.config["scheduler"] == before[3]
    assert torch.equal(base.timesteps, before[0]) and base.step_index == before[1]
    assert dict(base.config) == before[2]


@pytest.mark.parametrize("scheduler", ["Euler", "Euler a", "DPM++ 2M Karras", "DDIM", "UniPC"])
def test_every_sampler_draws_the_prompt_and_its_previews_announce_the_picture(model: Any, scheduler: str) -> None:
    """Each sampler on the embedded model: the picture scores as the prompt says (colours and shape, by
    ``shapes.score``), and the preview two steps before the end is within 0.12 of it (as for the default)."""
    import numpy as np

    from pipeline.default_model import shapes
    from pipeline.protocol import InferenceJob

    prompt = "a large yellow circle in the center on a blue background"
    previews: dict[int, Any] = {}
    job = InferenceJob("p", (prompt,), ("",), (3,), 64, 64, 20, 4.0, preview_every=2, sampler=scheduler)
    result = model.generate(
        job, threading.Event(), lambda step, total, shown: previews.update({step: shown[0]} if 0 in shown else {})
    )
    assert sorted(previews) == list(range(2, 20, 2))
    score = shapes.score(result.images[0])
    assert (score.bg, score.fg, score.shape) == ("blue", "yellow", "circle"), score
    final = np.asarray(result.images[0], dtype=np.float32) / 255
    assert float(np.abs(np.asarray(previews[18], dtype=np.float32) / 255 - final).mean()) <= 0.12
