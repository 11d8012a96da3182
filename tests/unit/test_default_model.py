"""The shipped default model draws what the prompt says, judged by the same code as the evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.default_model import DEFAULT_MODEL_DIR, DefaultModelMissing, ensure_default_model, shapes
from pipeline.default_model.evaluate import SHOWCASE, generate, guidance_of, load, prompt_set


def test_the_scorer_reads_drawn_pictures_exactly() -> None:
    """Every combination, both sizes, every position: the scorer gets what was drawn."""
    for k, (fg, shape, bg) in enumerate(shapes.all_combos()):
        spec = shapes.Spec(fg, shape, bg, list(shapes.POSITIONS)[k % 5], ("small", "large")[k % 2])
        assert shapes.score(shapes.render(spec)) == shapes.Score(bg, fg, shape), spec


def test_the_scorer_can_say_no() -> None:
    """A blank picture has no foreground; a picture of one shape is not scored as another."""
    from PIL import Image

    assert shapes.score(Image.new("RGB", (64, 64), shapes.COLOURS["blue"])) == shapes.Score("blue", None, None)
    square = shapes.score(shapes.render(shapes.Spec("red", "square", "blue")))
    assert square.shape == "square" and square != shapes.score(shapes.render(shapes.Spec("red", "circle", "blue")))


def test_held_out_combinations_are_never_drawn_for_training() -> None:
    assert len(shapes.HELD_OUT) == 16
    trained = {s.combo for s in shapes.training_specs(5000, seed=0)}
    assert trained.isdisjoint(shapes.HELD_OUT)
    assert trained == set(shapes.training_combos())  # every other combination is
    held = sorted(shapes.HELD_OUT)  # and each held-out word is still seen in other combinations
    for fg, shape, bg in held:
        assert (
            any(c[0] == fg for c in trained)
            and any(c[1] == shape for c in trained)
            and any(c[2] == bg for c in trained)
        )
    assert {p for p, spec in prompt_set() if spec.combo in shapes.HELD_OUT}  # the evaluation covers them


def test_the_shipped_weights_are_trained_small_and_loadable() -> None:
    path = ensure_default_model()
    stamp = json.loads((path / "default_model_build.json").read_text())
    assert stamp["trained"] and not stamp["training"]["quick"]
    weights = sum(p.stat().st_size for p in path.rglob("*.safetensors"))
    assert 0 < weights <= 25 * 2**20, weights


def test_a_missing_default_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DefaultModelMissing, match=r"python -m pipeline\.default_model\.train"):
        ensure_default_model(tmp_path / "nothing-here")


@pytest.fixture(scope="module")
def pipe():
    return load(DEFAULT_MODEL_DIR)


def test_the_prompt_controls_the_picture(pipe) -> None:
    """Eight prompts (the UI's examples), a fixed seed, 64 px: the colours and shapes asked for."""
    prompts = list(SHOWCASE)
    assert len(prompts) >= 8
    images = generate(pipe, prompts, [0] * len(prompts), guidance_of(DEFAULT_MODEL_DIR))
    scores = [shapes.score(image) for image in images]
    wanted = [_parse(p) for p in prompts]
    bg = sum(s.bg == w[2] for s, w in zip(scores, wanted))
    fg = sum(s.fg == w[0] for s, w in zip(scores, wanted))
    shape = sum(s.shape == w[1] for s, w in zip(scores, wanted))
    detail = list(zip(prompts, scores))
    assert bg >= 7, detail
    assert fg >= 7, detail
    assert shape >= 5, detail


def test_the_same_prompt_with_other_colours_gives_other_colours(pipe) -> None:
    """Not a fixed picture: swapping the colour words swaps the colours drawn."""
    images = generate(
        pipe,
        ["a red square on a blue background", "a blue square on a red background"],
        [3, 3],
        guidance_of(DEFAULT_MODEL_DIR),
    )
    first, second = (shapes.score(i) for i in images)
    assert (first.fg, first.bg) == ("red", "blue") and (second.fg, second.bg) == ("blue", "red")


def _parse(prompt: str) -> tuple[str, str, str]:
    words = prompt.replace(" background", "").split()
    fg = next(w for w in words if w in shapes.COLOURS)
    shape = next(w for w in words if w in shapes.SHAPES)
    bg = words[-1]
    return fg, shape, bg


def test_training_is_deterministic_and_writes_a_loadable_model(tmp_path: Path) -> None:
    """The training script, end to end on a tiny configuration, twice: the same bytes, and the app's
    loader reads the result (with the defaults saved next to it)."""
    from pipeline.config import Settings
    from pipeline.default_model.train import train
    from pipeline.engine.model.loading import load_model

    tiny = dict(vae_images=32, vae_large=8, vae_steps=3, vae_batch=4, images=64, unet_steps=3, unet_batch=8)
    train(tmp_path / "a", seed=5, config=tiny, threads=1)
    train(tmp_path / "b", seed=5, config=tiny, threads=1)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.safetensors"))
    assert len(files) == 4  # unet, vae, text encoder, and the live-preview map fitted to this VAE
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    model = load_model(Settings(model=str(tmp_path / "a")), warmup=False)
    assert model.profile.default_guidance == guidance_of(tmp_path / "a")
    assert (model.profile.default_width, model.profile.size_multiple) == (64, 4)
