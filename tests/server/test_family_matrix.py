"""Every model family a user can pick, served correctly: one family of each build group through the
launched app and ``gradio_client``, the others' engine in process with the same calls
(``tests/inprocess.py``).

Each family is a tiny random-weight pipeline built from configs (``tests/builds/``) with the
family's real VAE factor, latent channels, default size, schedulers and text encoders, loaded by the
app through ``from_pretrained`` from disk. The rows: it starts (warm-up with a valid step count), its
defaults and limits come from the model, the negative prompt means something or is refused, every
offered size works and a wrong one is named, progress and cancel work, the pixels equal a plain
diffusers call's, the long-prompt note names the encoder that cut, and batching keeps each image.
The table of outcomes is written to ``test-artifacts/family-matrix.md`` (the README's table).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from pipeline.fields import WEIGHING
from tests.families import built_family, mode_files, plain_diffusers_images, plain_mode_images
from tests.helpers import ROOT, gate_held, raw_request, wait_for
from tests.inprocess import handle_file, refused, served_family, step_cache_row

WHOLE = "CLIP whole (chunks of 75, at most 300)"
pytestmark = pytest.mark.timeout(600)

# family: (steps, guidance, size multiple, negative prompt offered, the encoder a 100-word prompt hits)
EXPECTED: dict[str, tuple[int, float, int, bool, str]] = {
    "sd1": (50, 7.5, 8, True, "CLIP"),
    "sd2-v": (50, 7.5, 8, True, "CLIP"),
    "sdxl": (50, 5.0, 8, True, "CLIP"),
    "sd3": (28, 7.0, 16, True, "CLIP"),
    "flux-schnell": (4, 0.0, 16, False, "CLIP"),
    "flux-dev": (28, 3.5, 16, False, "CLIP"),
    "pixart-alpha": (20, 4.5, 16, True, "T5"),
    "pixart-sigma": (20, 4.5, 16, True, "T5"),
    "sana": (20, 4.5, 32, True, "Gemma"),
}
FAMILIES = list(EXPECTED)
# One family of each build group (tests/builds/) through the launched app and gradio_client; the
# others' engine in process (tests/inprocess.py), the same tests.
LAUNCHED = ("sdxl", "flux-dev", "sana")
RESULTS: dict[str, dict[str, str]] = {}
SERVED_MAX_GUIDANCE = [1.5]  # the family being served's top guidance (the fixture sets it)
ROWS = (
    "starts",
    "defaults",
    "negative prompt",
    "sizes",
    "progress + cancel",
    "same pixels",
    "long prompt",
    "batching + seed",
    "image modes",
    "step cache",
)


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    family = str(request.param)
    folder = built_family(family)
    tmp = tmp_path_factory.mktemp(family)
    # The model on a thread of the test process: the family is under test here, not the model process
    # (tests/unit/test_model_process.py), which would cost each family ~8 s to start.
    with served_family(tmp, folder, family in LAUNCHED, "--max-batch-size", "4") as (client, adapter):
        RESULTS.setdefault(family, {})["starts"] = "yes"
        SERVED_MAX_GUIDANCE[0] = adapter.profile.max_guidance
        yield family, client, adapter


def record(family: str, row: str, text: str = "yes") -> None:
    RESULTS.setdefault(family, {})[row] = text


def pixels(gallery: list[dict[str, Any]], i: int = 0) -> np.ndarray:
    with Image.open(gallery[i]["image"]) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255


def generate(client: Any, **over: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    gallery, info = client.predict(**request(None, **over), api_name="/generate")
    return gallery, info


def request(adapter: Any = None, **over: Any) -> dict[str, Any]:
    """``raw_request`` with a guidance the family accepts (1.5; a guidance-distilled one has only 0)."""
    top = adapter.profile.max_guidance if adapter is not None else SERVED_MAX_GUIDANCE[0]
    return raw_request(**{"guidance_scale": min(1.5, top), **over})


def steps_for(family: str) -> int:
    return 2  # every family's fewest valid steps (PixArt's scheduler fails at 1)


def test_defaults_and_limits_come_from_the_model(served: tuple[str, Any, Any]) -> None:
    family, _, adapter = served
    steps, guidance, multiple, negative, _ = EXPECTED[family]
    p = adapter.profile
    assert (p.default_steps, p.default_guidance, p.size_multiple, p.supports_negative_prompt) == (
        steps,
        guidance,
        multiple,
        negative,
    ), p
    assert p.min_steps <= 2 and p.default_width % multiple == 0
    record(family, "defaults", f"{steps} steps, guidance {guidance:g}")


def test_the_negative_prompt_changes_the_image_or_is_refused(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    size = max(64, adapter.profile.size_multiple * 4)
    gs = min(5.0, adapter.profile.max_guidance)
    plain = dict(width=size, height=size, num_inference_steps=steps_for(family), seed=11, guidance_scale=gs)
    if EXPECTED[family][3]:
        without, _ = generate(client, **plain)
        with_negative, _ = generate(client, negative_prompt="a blue square", **plain)
        assert np.abs(pixels(without) - pixels(with_negative)).mean() > 1e-3
        record(family, "negative prompt", "changes the image")
    else:
        with pytest.raises(refused(), match="negative_prompt must be empty"):
            generate(client, negative_prompt="a blue square", **plain)
        record(family, "negative prompt", "hidden; refused by the API")


def test_every_offered_size_works_and_a_wrong_one_names_the_multiple(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    m = adapter.profile.size_multiple
    width, height = max(64, m * 2), max(64, m * 2) + m  # not square, each a multiple
    gallery, _info = generate(client, width=width, height=height, num_inference_steps=steps_for(family))
    with Image.open(gallery[0]["image"]) as image:
        assert image.size == (width, height)
    if m > 8:
        with pytest.raises(refused(), match=f"height must be a multiple of {m}"):
            generate(client, width=width, height=height + 8, num_inference_steps=steps_for(family))
    record(family, "sizes", f"multiples of {m}")


def test_progress_and_cancel(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    steps = min(60, adapter.profile.max_steps)
    job = client.submit(
        **request(adapter, width=64, height=64, num_inference_steps=steps, live_preview=True), api_name="/generate"
    )
    # The first preview comes at once; later ones at most every 0.25 s, and a short job (FLUX schnell's
    # 8 steps here) may end before another: cancel at the first step reported, or find the job done.
    wait_for(
        lambda: any(o[1].get("status") == "running" and o[1].get("step", 0) >= 1 for o in job.outputs()) or job.done(),
        "a step reported",
        timeout=120,
    )
    job.cancel()
    wait_for(lambda: not adapter.inference_in_progress, "the cancelled job left the model", timeout=60)
    registry = adapter.metrics.registry
    after = registry.get_sample_value("steps_after_stop_sum") / max(
        1, registry.get_sample_value("steps_after_stop_count")
    )
    assert after <= 1, f"{after} steps ran after the stop"
    shown = client.submit(
        **request(adapter, width=64, height=64, num_inference_steps=8, live_preview=True), api_name="/generate"
    )
    _, info = shown.result(timeout=300)
    previews = [o[0] for o in shown.outputs() if o[1].get("status") == "running" and o[0]]
    assert info["status"] == "done" and len(previews) >= 1, "no live preview"
    record(family, "progress + cancel", f"yes; {len(previews)} previews in 8 steps")


def test_the_same_pixels_as_a_plain_diffusers_call(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    size = max(64, adapter.profile.size_multiple * 4)
    gs = min(4.0, adapter.profile.max_guidance)
    args = dict(width=size, height=size, num_inference_steps=steps_for(family), guidance_scale=gs, seed=5)
    gallery, _ = generate(client, **args)
    plain = plain_diffusers_images(family, size, args["num_inference_steps"], gs, 5)[0]
    diff = float(np.abs(pixels(gallery) - np.asarray(plain, dtype=np.float32) / 255).mean())
    assert diff <= 1 / 255, diff
    record(family, "same pixels", f"yes ({diff * 255:.2f}/255)")


def test_the_long_prompt_note_names_the_encoder_that_cut_it(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    encoders = dict(adapter.profile.text_encoders)
    encoder = EXPECTED[family][4]
    if adapter.profile.family in WEIGHING and encoder == "CLIP":  # issue 49: CLIP prompts read whole, in chunks
        words = encoders[encoder] + 40
        _, info = generate(client, prompt="red " * words, width=64, height=64, num_inference_steps=steps_for(family))
        assert not any("CLIP text encoder" in w for w in info["warnings"]), info
        record(family, "long prompt", ", ".join([WHOLE, *(f"{e} {n}" for e, n in encoders.items() if e != "CLIP")]))
        return
    words = encoders[encoder] + 40
    _, info = generate(client, prompt="red " * words, width=64, height=64, num_inference_steps=steps_for(family))
    assert any(f"the {encoder} text encoder reads the first {encoders[encoder]}" in w for w in info["warnings"]), info
    record(family, "long prompt", ", ".join(f"{e} {n}" for e, n in encoders.items()))


def test_batching_keeps_each_image_and_a_seed_repeats(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    common = dict(
        width=64,
        height=64,
        num_inference_steps=steps_for(family),
        guidance_scale=min(1.5, adapter.profile.max_guidance),
    )
    alone, _ = generate(client, seed=21, **common)
    again, _ = generate(client, seed=21, **common)
    assert np.array_equal(pixels(alone), pixels(again))
    with gate_held(adapter):  # the GPU busy: both requests line up behind it
        jobs = [
            client.submit(**request(seed=s, prompt=p, **common), api_name="/generate")
            for s, p in ((21, "a red circle"), (22, "a green star"))
        ]
        wait_for(lambda: adapter.gpu_queue_depth == 2, "both requests wait at the gate", timeout=60)
    results = [job.result(timeout=300) for job in jobs]
    sizes = [info["batch_size"] for _, info in results]
    assert sizes == [2, 2], sizes  # both waited at the gate and shared one job
    diff = float(np.abs(pixels(results[0][0]) - pixels(alone)).mean())
    assert diff <= 1 / 255, diff
    record(family, "batching + seed", f"batch of {max(sizes)}, {diff * 255:.2f}/255 from alone")


def test_image_modes_give_the_plain_pipelines_pixels_or_are_refused_by_name(
    served: tuple[str, Any, Any], tmp_path: Path
) -> None:
    """Image-to-image and inpainting (uploads: ``handle_file``) equal the family's own
    mode pipeline (``AutoPipelineFor*.from_pipe``) within 1/255; where the family has none, the API
    refuses the mode naming the reason (the class and the diffusers version)."""
    family, client, adapter = served
    size = max(64, adapter.profile.size_multiple * 4)
    gs = min(4.0, adapter.profile.max_guidance)
    source, mask = mode_files(tmp_path, size, size)
    notes = dict(adapter.profile.mode_notes)
    shown = []
    for mode in ("image", "inpaint"):
        args = dict(width=size, height=size, num_inference_steps=4, guidance_scale=gs, seed=5, mode=mode,
                    image=handle_file(client, source), strength=0.75,
                    mask=handle_file(client, mask) if mode == "inpaint" else None, mask_blur=0)  # fmt: skip
        if mode not in adapter.profile.modes:
            with pytest.raises(Exception, match="this model does not serve") as refused:
                generate(client, **args)
            assert notes[mode].split(" (")[0] in str(refused.value), (notes[mode], str(refused.value))
            shown.append(f"{mode}: refused")
            continue
        gallery, info = generate(client, **args)
        # int(4 × 0.75); SD 1.5's PNDM runs one scheduler step more in a whole call (its first step repeats)
        assert info["mode"] == mode and info["steps_done"] in (3, 4 if family == "sd1" else 3), info
        with Image.open(source) as picture, Image.open(mask) as hole_image:
            plain = plain_mode_images(family, mode, size, 4, gs, 5, picture.convert("RGB"),
                                      hole_image.convert("L") if mode == "inpaint" else None)[0]  # fmt: skip
        diff = float(np.abs(pixels(gallery) - np.asarray(plain, dtype=np.float32) / 255).mean())
        assert diff <= 1 / 255, (mode, diff)
        shown.append(f"{mode}: {diff * 255:.2f}/255")
    record(family, "image modes", "; ".join(shown))


def test_a_step_cache_request_joins_and_draws_what_it_draws_alone(served: tuple[str, Any, Any]) -> None:
    """Issue 50: "auto" runs the family's recommended method per member of its loop (taylorseer) and draws,
    joined mid-way beside an uncached request, what it draws alone; a family without a loop runs it off."""
    family, client, adapter = served
    steps = min(12, adapter.profile.max_steps)
    base = request(adapter, width=64, height=64, num_inference_steps=steps, seed=9)
    record(family, "step cache", step_cache_row(client, adapter, base, steps_for(family)))


def test_zz_write_the_matrix(served: tuple[str, Any, Any]) -> None:
    """Writes the family x capability table (after the family's other rows ran)."""
    family = served[0]
    assert RESULTS.get(family, {}).get("starts") == "yes"
    out = Path(os.environ.get("T2I_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| family | " + " | ".join(ROWS) + " |", "|---|" + "---|" * len(ROWS)]
    for name in FAMILIES:
        if name in RESULTS:
            lines.append(f"| {name} | " + " | ".join(RESULTS[name].get(row, "FAILED") for row in ROWS) + " |")
    (out / "family-matrix.md").write_text("\n".join(lines) + "\n")
