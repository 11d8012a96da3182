"""``--compile`` and ``--channels-last`` (issue 17, section 6) on the CPU, with the embedded model.

Each variant loads through ``load_model(settings)`` as the app does and draws the same seeded job
as the eager model; the 8-bit images must agree within ``MEAN_LEVELS`` / ``MAX_LEVELS`` (levels of
255). Measured on the 2-core machine (torch 2.13.0+cpu, inductor with g++ 12, 1 torch thread):

- compile: the 8-bit images are identical to the eager ones (mean and max difference 0; before the
  quantisation the largest difference is 1.6e-6 of the full range). Compiling the first shape took
  35-52 s with a cold inductor cache (7 s warm); each new shape class (a new width and height, then a
  new batch) compiles once more, 27-95 s cold.
- channels_last: mean 0.00016 levels, max 1 level (a handful of pixels rounded the other way).
- The tolerance is tight enough to fail a real numeric change: the UNet's weights rounded to bf16
  and back give mean 0.052 levels (max 2).
- Speed, eager = 1, 20 steps, interleaved rounds: channels_last 0.92 at 64 px, 0.92 at 128 px,
  1.01 at 256 px (no gain); compile 0.87 at 64 px, 0.93 at 128 px. So both stay off by default:
  they are for a GPU, where ``bench/gpu.sh`` measures them.
"""

from __future__ import annotations

import logging
import threading
import types
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from pipeline.config import Settings
from pipeline.engine.model.speedups import compile_denoiser, cpu_compiler, is_compiled, use_channels_last
from pipeline.protocol import InferenceJob

# Importing inductor imports torch.utils.mkldnn, whose classes still use torch.jit.script_method
# (deprecated in torch 2.13): torch's own code, nothing this app calls.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

MEAN_LEVELS = 0.02  # mean absolute difference of the 8-bit images, in levels of 255
MAX_LEVELS = 2  # largest difference of any one pixel channel

# The shape the compiled warm-up uses (the default size and guidance: CFG makes a batch of 2 in the
# UNet), so drawing it costs no second compile.
JOB = InferenceJob("same", ("a red circle on a blue background",), ("",), (3,), 64, 64, 8, 4.0)
# New shapes: another width and height, and a batch of two images (a UNet batch of 4).
OTHER_JOBS = (
    InferenceJob("wider", ("a blue square",), ("",), (5,), 96, 64, 4, 4.0),
    InferenceJob("batch", ("a red circle", "a green triangle"), ("", "blurry"), (7, 8), 64, 64, 4, 4.0),
)


def draw(model: Any, job: InferenceJob = JOB) -> list[np.ndarray]:
    result = model.generate(job, threading.Event(), lambda *_: None)
    return [np.asarray(image, dtype=np.int16) for image in result.images]


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        diff = np.abs(a - b)
        assert diff.mean() <= MEAN_LEVELS and diff.max() <= MAX_LEVELS, (float(diff.mean()), int(diff.max()))


@pytest.fixture(scope="module")
def eager() -> Any:
    from pipeline.engine.model.loading import load_model

    return load_model(Settings(), warmup=False)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[Any, list[str], dict[str, int]]]:
    """The default model loaded with ``--compile`` and warmed up (the warm-up compiles)."""
    from torch._dynamo.utils import counters

    from pipeline.engine.model.loading import load_model

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler: inductor cannot build CPU kernels here (--compile stays eager)")
    records = _Records()
    engine = logging.getLogger("pipeline.engine")
    engine.addHandler(records)
    saved_level = engine.level
    engine.setLevel(logging.INFO)
    graphs_before = counters["stats"]["unique_graphs"]
    try:
        model = load_model(Settings(compile=True))
    finally:
        engine.removeHandler(records)
        engine.setLevel(saved_level)
    yield model, records.messages, {"before": graphs_before, "after_load": counters["stats"]["unique_graphs"]}


# inductor compiles in worker subprocesses: 35-52 s with a cold cache
def test_compile_wraps_the_unet_and_draws_the_same_images(compiled: Any, eager: Any) -> None:
    from torch._dynamo.utils import counters

    model, messages, graphs = compiled
    assert is_compiled(model.pipe.unet), type(model.pipe.unet)
    assert torch._dynamo.config.recompile_limit >= 16
    assert any("torch.compile(mode='default')" in m for m in messages), messages
    assert any("the first call compiles the denoiser (64x64" in m for m in messages), messages
    assert graphs["after_load"] > graphs["before"], "the warm-up did not run the compiled UNet"
    # The warm-up compiled the call this job makes where it is served, in a step-level loop (issue 36
    # §4: a timestep per row): serving it compiles nothing new.
    from dataclasses import replace

    from tests.helpers import run_loop

    served = run_loop(model, replace(JOB, joinable=True))["same"]
    assert counters["stats"]["unique_graphs"] == graphs["after_load"]
    assert_close([np.asarray(i, dtype=np.int16) for i in served.images], draw(eager))
    assert_close(draw(model), draw(eager))  # as one pipe() call too (its scalar timestep: one more graph)


@pytest.mark.slow  # each new shape class compiles once more: 2-3 minutes with a cold cache
def test_compile_serves_new_sizes_and_batches(compiled: Any, eager: Any) -> None:
    model, _, _ = compiled
    for job in (*OTHER_JOBS, JOB, *OTHER_JOBS):  # new shapes recompile; seen ones are reused
        assert_close(draw(model, job), draw(eager, job))
    assert is_compiled(model.pipe.unet)


def test_channels_last_converts_the_convolutions_and_draws_the_same_images(eager: Any) -> None:
    from pipeline.engine.model.loading import load_model

    model = load_model(Settings(channels_last=True), warmup=False)
    for part in ("unet", "vae"):
        convs = [m for m in getattr(model.pipe, part).modules() if isinstance(m, torch.nn.Conv2d)]
        assert convs
        for conv in convs:
            assert conv.weight.is_contiguous(memory_format=torch.channels_last), (part, conv)
    # Without the flag they are not: the first convolution (4 -> 32 channels, 3x3) is NCHW.
    assert not eager.pipe.unet.conv_in.weight.is_contiguous(memory_format=torch.channels_last)
    assert_close(draw(model), draw(eager))


def test_channels_last_leaves_a_transformer_denoiser_alone(caplog: pytest.LogCaptureFixture) -> None:
    transformer = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 2, stride=2), torch.nn.Flatten())
    pipe = types.SimpleNamespace(transformer=transformer, vae=torch.nn.Conv2d(4, 8, 3))
    with caplog.at_level(logging.INFO, logger="pipeline.engine.model.speedups"):
        assert use_channels_last(pipe) == ("vae",)
    assert "the denoiser is a transformer (Sequential)" in caplog.text
    assert not transformer[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert pipe.vae.weight.is_contiguous(memory_format=torch.channels_last)


def test_compile_mode_follows_the_device(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA graphs on CUDA, inductor's default elsewhere; no C++ compiler on a CPU: stays eager.
    ``torch.compile`` is lazy, so wrapping compiles nothing here."""

    def pipe() -> Any:
        return types.SimpleNamespace(unet=torch.nn.Conv2d(4, 4, 3))

    on_cuda, on_cpu = pipe(), pipe()
    with caplog.at_level(logging.INFO, logger="pipeline.engine.model.speedups"):
        assert compile_denoiser(on_cuda, "cuda") == "reduce-overhead"
        assert compile_denoiser(on_cpu, "cpu") == ("default" if cpu_compiler() else None)
    assert is_compiled(on_cuda.unet) and "torch.compile(mode='reduce-overhead')" in caplog.text
    assert compile_denoiser(on_cuda, "cuda") == "already compiled"  # never wrapped twice
    # Model CPU offload moves the weights for every call: no CUDA graphs then.
    assert compile_denoiser(pipe(), "cuda", offloaded=True) == "default"

    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/g++",))
    without = pipe()
    assert compile_denoiser(without, "cpu") is None and not is_compiled(without.unet)
    assert compile_denoiser(types.SimpleNamespace(vae=torch.nn.Conv2d(4, 4, 3)), "cuda") is None


# inductor lowers the UNet before it finds out there is no compiler (~10 s)
def test_a_compile_that_fails_at_the_warm_up_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.config as inductor_config

    from pipeline.engine.model import loading

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler: the denoiser is never wrapped")
    # Dynamo caches compiled code per code object (UNet2DConditionModel.forward), for every instance:
    # forget what another test compiled, or this model would reuse it and never compile.
    torch._dynamo.reset()
    model = loading.load_model(Settings(compile=True), warmup=False)
    assert is_compiled(model.pipe.unet)
    # The compiler disappears between the wrap and the first call (and no cached kernel hides it).
    monkeypatch.setattr(inductor_config.cpp, "cxx", ("/nonexistent/g++",))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    loading._warm_up(model, compiled=True)
    assert not is_compiled(model.pipe.unet), "a model whose compile failed must still serve"
    assert len(draw(model)) == 1


@pytest.mark.slow  # a cold compile of the UNet with LoRA layers: 1-2 minutes on 2 cores
def test_lora_switches_under_compile_hotswap_and_never_recompile() -> None:
    """``--compile --lora``: the adapters hotswap into one slot (issue 29), so switching the adapter,
    its scale or to none leaves the compiled graphs as they are, with each adapter's own pixels."""
    from dataclasses import replace

    from torch._dynamo.utils import counters

    from pipeline.engine.model.loading import load_model
    from tests.loras import loras_of

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler: inductor cannot build CPU kernels here (--compile stays eager)")
    loras = loras_of("default")
    specs = (f"a={loras['a']}", f"c={loras['c']}")  # b adapts the text encoder: refused under --compile
    model = load_model(Settings(compile=True, loras=specs))
    eager = load_model(Settings(loras=specs), warmup=False)
    assert model.loras is not None and model.loras.hotswap and model.profile.lora_batching == "separate"
    draw(model, replace(JOB, lora="a", lora_scale=1.0))  # the first job with weights in the slot
    graphs = counters["stats"]["unique_graphs"]
    for lora, scale in (("c", 1.0), ("", 0.0), ("a", 0.5), ("c", 1.5), ("a", 1.0)):
        job = replace(JOB, lora=lora, lora_scale=scale)
        assert_close(draw(model, job), draw(eager, job))
    assert counters["stats"]["unique_graphs"] == graphs, "a switch recompiled the denoiser"


def test_members_joining_and_leaving_a_loop_never_recompile_after_the_warm_up() -> None:
    """Issue 36 §4: the compiled denoiser's batch is dynamic from the warm-up on, so a loop whose rows
    go 2 -> 6 -> 2 as a member joins and leaves compiles nothing more. (Without ``dynamic_batch``
    the first join recompiles: the count grows by one.) Issue 50: a member whose step cache skips a
    step leaves that step's call (here 6 -> 4 rows on its steps 4 and 5): no recompile either. Issue 51:
    nor a member with a ControlNet map (the warm-up compiles the call with its residuals too)."""
    from torch._dynamo.utils import counters

    from pipeline.engine.model.loading import load_model
    from tests.helpers import run_loop

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler: inductor cannot build CPU kernels here (--compile stays eager)")
    before = counters["stats"]["unique_graphs"]
    model = load_model(Settings(compile=True))  # a new model: its warm-up compiles (batch 2: guidance)
    warmed = counters["stats"]["unique_graphs"]
    assert warmed > before, "the warm-up compiled nothing: the count below would prove nothing"
    first = InferenceJob("a", ("a red circle",), ("",), (1,), 64, 64, 8, 4.0, joinable=True,
                         options=(("step_cache", "taylorseer"),))  # computes steps 0-3, 6, 7  # fmt: skip
    joiner = InferenceJob("b", ("a blue square", "a star"), ("", ""), (2, 3), 64, 64, 4, 4.0, joinable=True)
    ended = run_loop(model, first, joiner, join_at=2)
    assert set(ended) == {"a", "b"} and all(hasattr(e, "images") for e in ended.values()), ended
    assert dict(ended["a"].step_cache) == {"method": "taylorseer", "computed": 6, "skipped": 2}
    # Issue 51: a member with a ControlNet map joins a plain loop (its residuals on its rows, zeros on
    # the others'): the warm-up compiled that call too.
    disc = Image.new("RGB", (64, 64))
    ImageDraw.Draw(disc).ellipse([5, 21, 27, 43], fill="white")
    mapped = InferenceJob("c", ("a red circle",), ("",), (4,), 64, 64, 4, 4.0, joinable=True,
                          options=(("control", "shapes"),), controls=(disc,))  # fmt: skip
    ended = run_loop(model, first, mapped, join_at=2)
    assert set(ended) == {"a", "c"} and all(hasattr(e, "images") for e in ended.values()), ended
    assert counters["stats"]["unique_graphs"] == warmed, "a member joining or leaving recompiled the denoiser"
