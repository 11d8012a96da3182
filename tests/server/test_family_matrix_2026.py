"""The model families people pick in 2026, served the way their authors run them (issue 27).

Each family is a tiny random-weight build of the exact diffusers class, made from diffusers' own
test components (``tests/builds/``, a module per group of families), saved and loaded by the
app through ``from_pretrained``, and driven through the launched app and ``gradio_client`` (one family
of each build group) or, for the others, the engine in process with the same calls
(``tests/inprocess.py``). The checks per family: the defaults match the pipeline and the model card; the size step is the
family's and an off-step size is refused naming it; the pixels equal a plain diffusers call that
sends the family's own guidance argument; the guidance control and the negative prompt each change
the image where offered (and are refused, with the reason, where not); progress, a cancel within
one step, and live previews; the long-prompt note names the encoder that cut and its window; two
requests waiting together share one job (or one step-level loop) and each keeps its alone pixels.
The outcomes go to ``test-artifacts/family-matrix-2026.md`` (the README's table).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from pipeline.fields import WEIGHING
from tests.families import built_family
from tests.helpers import ROOT, gate_held, raw_request, wait_for
from tests.inprocess import handle_file, refused, served_family, step_cache_row

WHOLE = "CLIP whole (chunks of 75, at most 300)"
pytestmark = pytest.mark.timeout(900)

GS = "guidance_scale"
# family: (steps, guidance, guidance argument, size step, default size, negative prompt offered,
#          the encoder with the narrowest window, fixed arguments a plain call sends)
EXPECTED: dict[str, tuple[int, float, str | None, int, int, bool, str, dict[str, Any]]] = {
    "flux2-dev": (50, 4.0, GS, 16, 1024, False, "Mistral", {}),  # card: 50 steps, guidance 4 (embedded)
    "flux2-klein": (4, 0.0, None, 16, 1024, False, "Qwen", {}),  # is_distilled: guidance is ignored
    "flux2-klein-base": (50, 4.0, GS, 16, 1024, False, "Qwen", {}),  # card: 50 steps at 4.0
    "chroma": (35, 5.0, GS, 16, 1024, True, "T5", {}),
    "ovis-image": (50, 5.0, GS, 16, 1024, True, "Qwen", {}),
    "longcat-image": (50, 4.5, GS, 16, 1024, True, "Qwen", {}),
    "ernie-image": (50, 4.0, GS, 16, 1024, True, "Mistral", {}),
    "qwen-image": (50, 4.0, "true_cfg_scale", 16, 1024, True, "Qwen", {"negative_prompt": [" "]}),
    "z-image-turbo": (9, 0.0, GS, 16, 1024, False, "Qwen", {}),  # card: 9 steps, guidance 0
    "z-image": (50, 5.0, GS, 16, 1024, True, "Qwen", {}),
    "hidream": (50, 5.0, GS, 16, 1024, True, "CLIP", {}),
    "hunyuanimage-2.1": (50, 3.5, GS, 64, 2048, True, "Qwen", {}),  # the scale is its guider's
    "kandinsky5": (50, 3.5, GS, 16, 1024, True, "CLIP", {}),
    "sana-sprint": (2, 4.5, GS, 32, 1024, False, "Gemma", {}),  # SCM: 1-4 steps
    "krea2": (28, 4.5, GS, 16, 1024, True, "Qwen", {}),
    "ideogram4": (48, 7.0, GS, 16, 2048, False, "Qwen", {"guidance_schedule": None}),
    "lumina2": (30, 4.0, GS, 16, 1024, True, "Gemma", {}),
    "cogview4": (50, 5.0, GS, 16, 1024, True, "GLM", {}),
    "sd-turbo": (1, 0.0, GS, 8, 512, False, "CLIP", {}),  # card: 1 step, guidance 0
    "sdxl-lcm": (4, 8.0, GS, 8, 1024, False, "CLIP", {}),  # card: 4 steps, guidance 8 through the UNet
}
FAMILIES = list(EXPECTED)
# One family of each build group (tests/builds/) not launched by test_family_matrix.py goes through the
# launched app and gradio_client (and Qwen-Image: issue 50 asks for its step cache there); the others'
# engine in process (tests/inprocess.py), the same tests.
LAUNCHED = ("z-image", "qwen-image", "lumina2")
# Tiny builds whose text path does not reach the pixels (diffusers' dummy components zero-initialise it):
# neither a guidance change nor a negative prompt can show there, in the app or in diffusers.
INERT_TEXT = ("ernie-image", "kandinsky5")
RESULTS: dict[str, dict[str, str]] = {}
ROWS = (
    "defaults",
    "size step",
    "same pixels",
    "guidance",
    "negative prompt",
    "progress + cancel",
    "previews",
    "long prompt",
    "batching",
    "image modes",
    "step cache",
)


@pytest.fixture(scope="module", params=FAMILIES)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, Any]]:
    family = str(request.param)
    folder = built_family(family)
    tmp = tmp_path_factory.mktemp(family)
    # The model on a thread of the test process: the family is what is under test here, and a model
    # process of its own (tests/unit/test_model_process.py) would cost each family ~8 s to start.
    flags = ("--max-prompt-chars", "20000", "--max-pixel-steps", str(2048 * 2048 * 200))
    with served_family(tmp, folder, family in LAUNCHED, *flags) as (client, adapter):
        yield family, client, adapter


def record(family: str, row: str, text: str) -> None:
    RESULTS.setdefault(family, {})[row] = text


def pixels(gallery: list[dict[str, Any]], i: int = 0) -> np.ndarray:
    with Image.open(gallery[i]["image"]) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255


def size_of(adapter: Any) -> tuple[int, int]:
    p = adapter.profile
    if p.size_choices:
        return p.size_choices[0]
    side = max(64, 2 * p.size_multiple)
    return side, side


def steps_of(adapter: Any, wanted: int = 2) -> int:
    p = adapter.profile
    wanted = max(wanted, p.min_steps)
    return wanted if not p.step_choices or wanted in p.step_choices else p.step_choices[0]


def generate(client: Any, adapter: Any, **over: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    width, height = size_of(adapter)
    args = {
        "width": width,
        "height": height,
        "num_inference_steps": steps_of(adapter),
        "guidance_scale": adapter.profile.default_guidance,
        **over,
    }
    return client.predict(**raw_request(**args), api_name="/generate")


def test_defaults_and_the_size_step(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    steps, guidance, arg, step, size, negative, _, _ = EXPECTED[family]
    p = adapter.profile
    assert (
        p.default_steps,
        p.default_guidance,
        p.guidance_arg,
        p.size_multiple,
        p.default_width,
        p.supports_negative_prompt,
    ) == (steps, guidance, arg, step, size, negative), p
    record(family, "defaults", f"{steps} steps, " + (f"{arg} {guidance:g}" if arg else "no guidance"))
    width, height = size_of(adapter)
    if p.size_choices:
        with pytest.raises(refused(), match=r"width × height must be one of 1024×1024"):
            generate(client, adapter, width=width - step)
        record(family, "size step", f"{step}; only {len(p.size_choices)} sizes (the pipeline redraws others)")
    else:
        with pytest.raises(refused(), match=f"height must be a multiple of {step}"):
            generate(client, adapter, height=height + step // 2)
        record(family, "size step", f"{step}; an off-step size is refused")


def test_the_same_pixels_as_a_plain_diffusers_call_and_the_controls(served: tuple[str, Any, Any]) -> None:
    import torch
    from diffusers import DiffusionPipeline

    family, client, adapter = served
    _, _, arg, _, _, negative, _, fixed = EXPECTED[family]
    p = adapter.profile
    width, height = size_of(adapter)
    steps = steps_of(adapter)
    gallery, info = generate(client, adapter, seed=5)
    assert info["status"] == "done" and Image.open(gallery[0]["image"]).size == (width, height)
    pipe = DiffusionPipeline.from_pretrained(str(built_family(family)))
    pipe.set_progress_bar_config(disable=True)
    call = dict(
        prompt=["a red circle"],
        width=width,
        height=height,
        num_inference_steps=steps,
        generator=[torch.Generator("cpu").manual_seed(5)],
        **fixed,
    )
    if arg is not None and family != "hunyuanimage-2.1":  # HunyuanImage's scale is its guider's config
        call[arg] = p.default_guidance
    with torch.inference_mode():
        out = pipe(**call)
    plain = (getattr(out, "images", None) or out.image)[0]
    diff = float(np.abs(pixels(gallery) - np.asarray(plain, dtype=np.float32) / 255).mean())
    assert diff <= 1 / 255, diff
    record(family, "same pixels", f"yes ({diff * 255:.2f}/255)")
    # The guidance control drives what the family reads, or is refused where the model has none.
    if arg is None:
        with pytest.raises(refused(), match="guidance_scale must be"):
            generate(client, adapter, seed=5, guidance_scale=1.5)
        record(family, "guidance", "none (distilled); refused")
    else:  # the app at another guidance equals diffusers at it; it changes the image where diffusers' does
        other = p.default_guidance + 2.0 if p.default_guidance + 2.0 <= p.max_guidance else p.max_guidance / 2
        changed, _ = generate(client, adapter, seed=5, guidance_scale=other)
        call["generator"] = [torch.Generator("cpu").manual_seed(5)]
        call["prompt"] = ["a red circle"]  # Z-Image templates the prompt list in place
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)  # as fresh as the app's per job
        if family == "hunyuanimage-2.1":  # its scale is the guider's (diffusers' way: guider.new)
            pipe.guider = pipe.guider.new(guidance_scale=other)
        else:
            call[arg] = other
        with torch.inference_mode():
            out = pipe(**call)
        plain_other = np.asarray((getattr(out, "images", None) or out.image)[0], dtype=np.float32) / 255
        assert float(np.abs(pixels(changed) - plain_other).mean()) <= 1 / 255
        moved = float(np.abs(plain_other - np.asarray(plain, dtype=np.float32) / 255).mean())
        if moved > 1e-4:
            assert np.abs(pixels(changed) - pixels(gallery)).mean() > 1e-4, f"{arg} changed nothing"
        record(
            family,
            "guidance",
            f"{arg} " + ("changes the image" if moved > 1e-4 else "reaches the model (no effect in the tiny build)"),
        )
    if negative:
        with_negative, _ = generate(client, adapter, seed=5, negative_prompt="a blue square")
        changed_by = float(np.abs(pixels(with_negative) - pixels(gallery)).mean())
        if family not in INERT_TEXT:
            assert changed_by > 1e-4, "the negative prompt changed nothing"
        record(
            family,
            "negative prompt",
            "changes the image" if changed_by > 1e-4 else "sent (no effect in the tiny build)",
        )
    else:
        with pytest.raises(refused(), match="negative_prompt must be empty: "):
            generate(client, adapter, seed=5, negative_prompt="a blue square")
        record(family, "negative prompt", f"hidden; refused: {p.negative_prompt_reason}")


def test_progress_cancel_and_previews(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    p = adapter.profile
    width, height = size_of(adapter)
    steps = p.step_choices[-1] if p.step_choices else min(30, p.max_steps)
    job = client.submit(
        **raw_request(
            width=width, height=height, num_inference_steps=steps, live_preview=True, guidance_scale=p.default_guidance
        ),
        api_name="/generate",
    )
    wait_for(
        lambda: any(o[1].get("status") == "running" and o[1].get("step", 0) >= 1 for o in job.outputs()) or job.done(),
        "a step reported",
        timeout=300,
    )
    job.cancel()
    wait_for(lambda: not adapter.inference_in_progress, "the cancelled job left the model", timeout=120)
    registry = adapter.metrics.registry
    after = registry.get_sample_value("steps_after_stop_sum") / max(
        1, registry.get_sample_value("steps_after_stop_count")
    )
    assert after <= 1, f"{after} steps ran after the stop"
    record(family, "progress + cancel", "yes")
    shown = client.submit(
        **raw_request(
            width=width,
            height=height,
            num_inference_steps=steps_of(adapter, 4),
            live_preview=True,
            guidance_scale=p.default_guidance,
        ),
        api_name="/generate",
    )
    _, info = shown.result(timeout=300)
    previews = [o[0] for o in shown.outputs() if o[1].get("status") == "running" and o[0]]
    assert info["status"] == "done"
    if p.previews:
        assert previews, "no live preview"
    record(family, "previews", f"{len(previews)} in {steps_of(adapter, 4)} steps" if previews else "none")


def test_the_long_prompt_note_names_the_encoder_that_cut_it(served: tuple[str, Any, Any]) -> None:
    family, client, adapter = served
    encoders = dict(adapter.profile.text_encoders)
    encoder = EXPECTED[family][6]
    if adapter.profile.family in WEIGHING and encoder == "CLIP":  # issue 49: CLIP prompts read whole, in chunks
        words = encoders[encoder] + 40
        _, info = generate(client, adapter, prompt="red " * words, num_inference_steps=steps_of(adapter, 1))
        assert not any("CLIP text encoder" in w for w in info["warnings"]), info
        record(family, "long prompt", ", ".join([WHOLE, *(f"{e} {n}" for e, n in encoders.items() if e != "CLIP")]))
        return
    if encoders[encoder] > 4000:  # ERNIE's Mistral reads its tokenizer's whole length: no prompt reaches it
        record(family, "long prompt", ", ".join(f"{e} {n}" for e, n in encoders.items()))
        return
    words = encoders[encoder] + 40
    _, info = generate(client, adapter, prompt="red " * words, num_inference_steps=steps_of(adapter, 1))
    assert any(f"the {encoder} text encoder reads the first {encoders[encoder]}" in w for w in info["warnings"]), info
    if "ByT5" in encoders:  # HunyuanImage's glyph encoder reads the quoted text only
        assert not any("ByT5" in w for w in info["warnings"]), info
        _, info = generate(
            client, adapter, prompt='a sign that says "' + "x" * 150 + '"', num_inference_steps=steps_of(adapter, 1)
        )
        assert any(
            "prompt's quoted text is 159 tokens; the ByT5 text encoder reads the first 128" in w
            for w in info["warnings"]
        ), info
    record(family, "long prompt", ", ".join(f"{e} {n}" for e, n in encoders.items()))


def test_two_waiting_requests_share_a_job_and_keep_their_own_pixels(served: tuple[str, Any, Any]) -> None:
    """With the gate held, two compatible requests (other prompts and seeds) line up; released, they
    run as one job (job-level) or one loop (Chroma, Z-Image: step-level), and each image equals the
    same request alone."""
    family, client, adapter = served
    first = dict(seed=5, prompt="a red circle")
    second = dict(seed=9, prompt="a green star")
    alone, _ = generate(client, adapter, **first)
    with gate_held(adapter):
        width, height = size_of(adapter)
        jobs = [
            client.submit(
                **raw_request(
                    width=width,
                    height=height,
                    num_inference_steps=steps_of(adapter),
                    guidance_scale=adapter.profile.default_guidance,
                    **r,
                ),
                api_name="/generate",
            )
            for r in (first, second)
        ]
        wait_for(lambda: adapter.gpu_queue_depth == 2, "both requests wait at the gate", timeout=60)
    (gallery, info), (other, other_info) = (job.result(timeout=300) for job in jobs)
    assert (info["batch_size"], other_info["batch_size"]) == (2, 2), (info, other_info)
    diff = float(np.abs(pixels(gallery) - pixels(alone)).mean())
    assert diff <= 1 / 255, diff
    assert float(np.abs(pixels(other) - pixels(alone)).mean()) > 1e-3, "the second request got the first's image"
    record(family, "batching", f"{info['batching']}-level, {diff * 255:.2f}/255 from alone")


def test_image_modes_give_the_plain_pipelines_pixels_or_are_refused_by_name(
    served: tuple[str, Any, Any], tmp_path: Path
) -> None:
    """Where diffusers gives the family a strength-based image-to-image or inpainting pipeline (Qwen-Image,
    Z-Image, SD-Turbo, SDXL-LCM), it equals the plain pipeline within 1/255;
    elsewhere the API refuses the mode with the reason (the class, and why)."""
    from tests.families import mode_files, plain_mode_images

    family, client, adapter = served
    width, height = size_of(adapter)
    steps = steps_of(adapter, 4)
    strength = 0.75 if steps >= 2 else 1.0
    guidance, guidance_arg, fixed = adapter.profile.default_guidance, EXPECTED[family][2], EXPECTED[family][7]
    source, mask = mode_files(tmp_path, width, height)
    notes, shown = dict(adapter.profile.mode_notes), []
    for mode in ("image", "inpaint"):
        args = dict(num_inference_steps=steps, seed=5, mode=mode, image=handle_file(client, source),
                    strength=strength, mask=handle_file(client, mask) if mode == "inpaint" else None,
                    mask_blur=0)  # fmt: skip
        if mode not in adapter.profile.modes:
            with pytest.raises(Exception, match="this model does not serve") as refused:
                generate(client, adapter, **args)
            assert notes[mode].split(" (")[0] in str(refused.value), (notes[mode], str(refused.value))
            shown.append(f"{mode}: refused")
            continue
        gallery, info = generate(client, adapter, **args)
        assert info["mode"] == mode and info["steps_done"] == int(steps * strength), info
        with Image.open(source) as picture, Image.open(mask) as hole_image:
            plain = plain_mode_images(family, mode, width, steps, guidance, 5, picture.convert("RGB"),
                                      hole_image.convert("L") if mode == "inpaint" else None, strength,
                                      guidance_arg, **fixed)[0]  # fmt: skip
        diff = float(np.abs(pixels(gallery) - np.asarray(plain, dtype=np.float32) / 255).mean())
        assert diff <= 1 / 255, (mode, diff)
        shown.append(f"{mode}: {diff * 255:.2f}/255")
    record(family, "image modes", "; ".join(shown))


def test_a_step_cache_request_joins_and_draws_what_it_draws_alone(served: tuple[str, Any, Any]) -> None:
    """Issue 50: "auto" runs the family's recommended method per member of its loop (taylorseer) and draws,
    joined mid-way beside an uncached request, what it draws alone; a family without a loop runs it off."""
    family, client, adapter = served
    width, height = size_of(adapter)
    steps = min(steps_of(adapter, 12), adapter.profile.max_steps)
    base = raw_request(width=width, height=height, num_inference_steps=steps,
                       guidance_scale=adapter.profile.default_guidance, seed=9)  # fmt: skip
    record(family, "step cache", step_cache_row(client, adapter, base, steps_of(adapter)))


def test_zz_write_the_matrix(served: tuple[str, Any, Any]) -> None:
    """Writes the family x capability table (after the family's other rows ran)."""
    family = served[0]
    assert RESULTS.get(family)
    out = Path(os.environ.get("T2I_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| family | " + " | ".join(ROWS) + " |", "|---|" + "---|" * len(ROWS)]
    for name in FAMILIES:
        if name in RESULTS:
            lines.append(f"| {name} | " + " | ".join(RESULTS[name].get(row, "FAILED") for row in ROWS) + " |")
    (out / "family-matrix-2026.md").write_text("\n".join(lines) + "\n")
