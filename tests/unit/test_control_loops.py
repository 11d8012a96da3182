"""ControlNet per member in shared loops and batches (issue 51), in process: a request with its own map
joining a loop (or a batch) of another map and of no control draws what it draws alone, and what the
family's ControlNet pipeline draws; on the embedded model with its own trained ControlNet (where the shape
goes is checked too) and on tiny random-weight SD 1.5, SDXL and FLUX.1 ControlNet builds
(``tests/families.build_controlnet``). SD 1.x and FLUX.1 run a ControlNet per member in their step-level
loops; SDXL runs whole calls, each image with its own map (``scheduler.call_job``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from PIL import Image, ImageDraw

from pipeline.config import Settings
from pipeline.engine.model.diffusers_model import DiffusersModel
from pipeline.engine.model.loading import load_model
from pipeline.protocol import InferenceJob, StopSignal
from pipeline.request import Limits, validate, with_pictures
from pipeline.serving.scheduler import Entry, call_job, image_offsets
from tests.families import built_controlnet, built_family
from tests.helpers import raw_request
from tests.loops import assert_same, drive, mad

pytestmark = pytest.mark.timeout(600)

_MODELS: dict[str, DiffusersModel] = {}


def model_of(name: str) -> DiffusersModel:
    """``"default"``: the embedded model with its own ControlNet (``shapes``); else a family's build with
    a tiny ControlNet of its own (``tiny``)."""
    if name not in _MODELS:
        if name == "default":
            settings = Settings(device="cpu")
        else:
            settings = Settings(model=str(built_family(name)), device="cpu",
                                controlnets=(f"tiny={built_controlnet(name)}",))  # fmt: skip
        model = load_model(settings, warmup=False)
        assert isinstance(model, DiffusersModel)
        _MODELS[name] = model
    return _MODELS[name]


def disc_at(cx: float, size: int = 64) -> Image.Image:
    """A white disc on black at (cx, 0.5) of a map: what a person draws for the embedded ControlNet."""
    image = Image.new("RGB", (size, size), "black")
    x, r = cx * size, size * 11 / 64
    ImageDraw.Draw(image).ellipse([x - r, size / 2 - r, x + r, size / 2 + r], fill="white")
    return image


def controlled(rid: str, seed: int, where: float | None, name: str = "shapes", steps: int = 12,
               guidance: float = 4.0, **over: Any) -> InferenceJob:  # fmt: skip
    options = {"control": name if where is not None else "none", **over}
    return InferenceJob(request_id=rid, prompts=("a red circle on a blue background",), negative_prompts=("",),
                        seeds=(seed,), width=64, height=64, num_inference_steps=steps, guidance_scale=guidance,
                        joinable=True, options=tuple(options.items()),
                        controls=(disc_at(where),) if where is not None else ())  # fmt: skip


def whole(model: DiffusersModel, job: InferenceJob) -> tuple[Image.Image, ...]:
    """The job as one call of the family's pipeline (its ControlNet pipeline with a control)."""
    return model.generate(job, threading.Event(), lambda *_: None).images


def centre_x(picture: Image.Image) -> float:
    """The drawn shape's centre, as a fraction of the width (``default_model.control.centre_of``)."""
    from pipeline.default_model.control import centre_of

    found = centre_of(picture)
    assert found is not None
    return found[0]


def test_members_with_their_own_control_maps_share_a_loop_and_each_draws_what_it_draws_alone() -> None:
    """N (no control) runs; L (a disc on the left) joins after 2 steps, R (on the right, weight 0.8 until
    80 % of its steps) after 3: each equals itself alone and the ControlNet pipeline's own call, and the
    circle is drawn where its disc is."""
    model = model_of("default")
    assert model.profile.controls == ("shapes",) and "control" in model.profile.loop_modes
    n, left = controlled("N", 3, None), controlled("L", 1, 0.3)
    right = controlled("R", 2, 0.7, control_scale=0.8, control_end=0.8)
    run = drive(model, [(0, n), (2, left), (3, right)])
    for job in (n, left, right):
        alone = drive(model, [(0, job)]).images[job.request_id]
        assert_same(f"control {job.request_id}", run.images[job.request_id], alone)
        assert_same(f"control {job.request_id} against its pipeline", alone, whole(model, job))
    assert centre_x(run.images["L"][0]) < 0.4 and centre_x(run.images["R"][0]) > 0.6  # where the maps say
    assert 0.4 < centre_x(run.images["N"][0]) < 0.6  # without a map: the centre, as the caption is drawn


def test_a_control_at_weight_0_or_a_window_that_ends_at_step_0_is_no_control() -> None:
    model = model_of("default")
    plain = drive(model, [(0, controlled("Z", 1, None))]).images["Z"]
    for over in ({"control_scale": 0.0}, {"control_end": 0.0}):
        job = controlled("Z", 1, 0.3, **over)
        assert mad(drive(model, [(0, job)]).images["Z"], plain) <= 0.5, over  # the bound (0.00 here)
        assert mad(whole(model, job), plain) <= 0.5, over


@pytest.mark.parametrize("family", ["sd1", "flux-dev"])
def test_on_a_tiny_build_a_control_joins_a_loop_of_another_map_and_of_none_and_draws_what_it_draws_alone(
    family: str,
) -> None:
    """The same as on the embedded model, on a family's tiny build and a random-weight ControlNet: N (no
    control) runs; L (a map on the left) joins after 1 step, R (on the right, weight 0.8, until 75 % of its
    steps) after 2. Each equals itself alone and the family's ControlNet pipeline; the maps move the
    pictures (against the same request without a control), so a member given another's map is caught."""
    model = model_of(family)
    assert model.profile.controls == ("tiny",) and "control" in model.profile.loop_modes
    guidance = 3.5 if family == "flux-dev" else 4.0
    jobs = {"N": controlled("N", 3, None, "tiny", 4, guidance),
            "L": controlled("L", 1, 0.3, "tiny", 4, guidance),
            "R": controlled("R", 1, 0.7, "tiny", 4, guidance, control_scale=0.8, control_end=0.75)}  # fmt: skip
    run = drive(model, [(0, jobs["N"]), (1, jobs["L"]), (2, jobs["R"])])
    for rid, job in jobs.items():
        alone = drive(model, [(0, job)]).images[rid]
        assert_same(f"{family} control {rid}", run.images[rid], alone)
        assert_same(f"{family} control {rid} against its pipeline", alone, whole(model, job))
    uncontrolled = drive(model, [(0, controlled("L", 1, None, "tiny", 4, guidance))]).images["L"]
    assert mad(run.images["L"], uncontrolled) > 0.5 and mad(run.images["L"], run.images["R"]) > 0.5


def test_on_sdxl_requests_with_their_own_maps_share_one_call_and_each_draws_what_it_draws_alone() -> None:
    """SDXL runs whole calls: two requests of one control, weight and window with different maps share
    a batch (``scheduler.batch_key``), and the call gives each image its own map (``call_job``): each
    request's pictures equal it alone, and the maps differ in what they draw."""
    model = model_of("sdxl")
    assert model.profile.controls == ("tiny",) and "control" not in model.profile.loop_modes
    limits = Limits.for_model(model.profile)
    entries = []
    for rid, where, seed in (("L", 0.3, 1), ("R", 0.7, 1)):
        raw = raw_request(prompt="a red circle", seed=seed, width=64, height=64, num_inference_steps=3,
                          guidance_scale=4.0, control="tiny", control_image=disc_png(where))  # fmt: skip
        request = with_pictures(validate(raw, limits, pictures_later=True, request_id=rid), raw, limits)
        entries.append(Entry(request, StopSignal()))
    job = call_job(entries)
    assert len(job.controls) == len(job.prompts) == 2
    together = whole(model, job)
    offsets = image_offsets(entries)
    for i, entry in enumerate(entries):
        alone = whole(model, entry.request.to_job())
        assert_same(f"sdxl control {i}", together[offsets[i] : offsets[i + 1]], alone)
    assert mad(together[:1], together[1:]) > 0.5  # each its own map: the same seed and prompt draw apart


def disc_png(cx: float) -> bytes:
    import io

    out = io.BytesIO()
    disc_at(cx).save(out, format="PNG")
    return out.getvalue()


def test_on_flux_a_control_beside_first_block_cache_is_added_after_each_block_as_the_transformer_adds_it() -> None:
    """FLUX.1 with First-Block Cache runs its own transformer forward, row by row (``loop_flow.flux_rows``):
    the ControlNet's samples are added there after each block as diffusers' forward adds them. F (its own
    map, fbcache) and N (fbcache, no control) beside L (a map, no cache): each equals itself alone, and F
    (every row missing on random weights: all blocks run) equals the ControlNet pipeline's call."""
    model = model_of("flux-dev")
    assert "fbcache" in model.profile.step_caches
    jobs = {"F": controlled("F", 2, 0.3, "tiny", 4, 3.5, step_cache="fbcache"),
            "N": controlled("N", 3, None, "tiny", 4, 3.5, step_cache="fbcache"),
            "L": controlled("L", 1, 0.7, "tiny", 4, 3.5)}  # fmt: skip
    run = drive(model, [(0, jobs["N"]), (1, jobs["F"]), (1, jobs["L"])])
    for rid, job in jobs.items():
        assert_same(f"flux fbcache control {rid}", run.images[rid], drive(model, [(0, job)]).images[rid])
    assert_same("flux fbcache control F against its pipeline", run.images["F"], whole(model, jobs["F"]))
