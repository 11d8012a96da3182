"""Validation: every field, before any GPU work, with an error naming the field and the range."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pipeline.errors import InvalidRequest
from pipeline.request import Limits, validate
from tests.fakes import FAKE_PROFILE
from tests.helpers import raw_request

LIMITS = Limits.for_model(FAKE_PROFILE, max_images=4, max_prompt_chars=100)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("width", 1000.5, "width must be a multiple of 8 between 64 and 512; got 1000.5"),
        ("width", 100, "width must be a multiple of 8 between 64 and 512; got 100"),
        ("height", math.nan, "height must be a multiple of 8 between 64 and 512; got nan"),
        ("height", "64", "height must be a multiple of 8 between 64 and 512; got &#x27;64&#x27;"),
        ("num_inference_steps", 0, "num_inference_steps must be a whole number between 1 and 50; got 0"),
        ("num_inference_steps", -3, "num_inference_steps must be a whole number between 1 and 50; got -3"),
        ("num_inference_steps", 2.5, "num_inference_steps must be a whole number between 1 and 50; got 2.5"),
        ("num_inference_steps", True, "num_inference_steps must be a whole number between 1 and 50; got True"),
        ("guidance_scale", math.inf, "guidance_scale must be a number between 0 and 20; got inf"),
        ("guidance_scale", None, "guidance_scale must be a number between 0 and 20; got None"),
        ("num_images", 5, "num_images must be a whole number between 1 and 4; got 5"),
        ("seed", -1, "seed must be a whole number between 0 and 4294967295; got -1"),
        ("seed", [1], "seed must be a whole number between 0 and 4294967295; got [1]"),
        ("randomize_seed", "yes", "randomize_seed must be true or false; got &#x27;yes&#x27;"),
        ("prompt", 42, "prompt must be text of at most 100 characters; got 42"),
        ("prompt", "x" * 101, "prompt must be text of at most 100 characters; got 101 characters"),
        ("negative_prompt", ["a"], "negative_prompt must be text of at most 100 characters; got [&#x27;a&#x27;]"),
        (
            "scheduler",
            "Heun",
            "scheduler must be one of: default, Euler, Euler a, DPM++ 2M Karras, DDIM, UniPC; got &#x27;Heun&#x27;",
        ),
        ("scheduler", 3, "scheduler must be one of: default, Euler, Euler a, DPM++ 2M Karras, DDIM, UniPC; got 3"),
    ],
)
def test_bad_values_name_the_field_and_the_range(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(raw_request(**{field: value}), LIMITS)
    assert str(info.value) == message
    assert info.value.field == field


def test_user_text_in_errors_is_escaped() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(raw_request(width="<img src=x onerror=alert(1)>"), LIMITS)
    assert "<img" not in str(info.value) and "&lt;img" in str(info.value)


def test_scheduler_is_one_of_the_models_names_and_defaults_to_its_own() -> None:
    assert validate(raw_request(scheduler="DPM++ 2M Karras"), LIMITS).to_job().sampler == "DPM++ 2M Karras"
    for unset in ({}, {"scheduler": None}):
        raw = {k: v for k, v in raw_request().items() if k != "scheduler"} | unset
        assert validate(raw, LIMITS).sampler == "default"
    own_only = Limits.for_model(dataclasses.replace(FAKE_PROFILE, samplers=("default",)))  # FLUX, SD3
    with pytest.raises(InvalidRequest, match="^scheduler must be one of: default; got &#x27;DDIM&#x27;$"):
        validate(raw_request(scheduler="DDIM"), own_only)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(InvalidRequest, match="unknown field"):
        validate({**raw_request(), "denoising_strength": 1}, LIMITS)  # AUTOMATIC1111's name, not ours


def test_pixel_budget() -> None:
    tight = Limits.for_model(FAKE_PROFILE, max_size=512)
    tight = Limits(**{**tight.__dict__, "max_pixels": 256 * 256})
    with pytest.raises(InvalidRequest, match="width × height must be at most 65536 pixels; got 512×256"):
        validate(raw_request(width=512, height=256), tight)


def test_valid_request_keeps_values_and_derives_seeds() -> None:
    r = validate(raw_request(seed=4294967295, num_images=3, width=64.0, guidance_scale=3), LIMITS)
    assert (r.width, r.seed, r.guidance_scale, r.num_images) == (64, 4294967295, 3.0, 3)
    assert r.seeds == (4294967295, 0, 1)
    job = r.to_job()
    assert job.prompts == ("a red circle",) * 3 and job.seeds == r.seeds


def test_randomize_seed_picks_a_fresh_seed() -> None:
    seeds = {validate(raw_request(randomize_seed=True), LIMITS).seed for _ in range(5)}
    assert len(seeds) > 1


def test_long_prompt_is_accepted_with_a_visible_note() -> None:
    """Where the family reads CLIP prompts whole (SD 1.x/2.x: chunks of 75), no note; elsewhere, the cut."""
    other = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="pixart"), max_prompt_chars=2000)
    r = validate(raw_request(prompt="word " * 80), other, lambda text: {"CLIP": len(text.split())})
    assert r.warnings == ("prompt is 80 tokens; the CLIP text encoder reads the first 75, so it ignored the rest",)
    assert validate(raw_request(), LIMITS, lambda text: {"CLIP": len(text.split())}).warnings == ()
    sd = Limits.for_model(FAKE_PROFILE, max_prompt_chars=2000)
    whole = validate(raw_request(prompt="word " * 80), sd, lambda text: {"CLIP": 80, "CLIP chunks": 2})
    assert whole.warnings == () and whole.prompt_chunks == 2


def test_a_prompt_past_the_chunk_limit_is_refused_by_name_and_breaks_are_counted() -> None:
    """A short prompt with BREAKs is counted (each starts a chunk); past four chunks, the field is named."""
    counted: list[str] = []

    def count(text: str) -> dict[str, int]:
        counted.append(text)
        n = 1 + text.count("BREAK")
        return {"CLIP": 3, "CLIP chunks": n, "CLIP chunks as written": 1}

    three = validate(raw_request(prompt="a BREAK b BREAK c"), LIMITS, count)
    assert counted == ["a BREAK b BREAK c"] and three.prompt_chunks == 3
    with pytest.raises(InvalidRequest) as refused:
        validate(raw_request(negative_prompt="a BREAK b BREAK c BREAK d BREAK e", guidance_scale=5.0), LIMITS, count)
    assert refused.value.field == "negative_prompt"
    assert "at most 4 chunks of 75 CLIP tokens" in str(refused.value) and "got 5" in str(refused.value)
    # read as written (emphasis "None"), BREAK is a word: one chunk
    as_written = validate(raw_request(prompt="a BREAK b BREAK c BREAK d BREAK e", emphasis="None"), LIMITS, count)
    assert as_written.prompt_chunks == 1


def test_the_long_prompt_note_names_the_encoder_that_cut_it() -> None:
    """FLUX.1 reads a prompt with CLIP (75 tokens, its pooled embedding) and T5 (511): a 100-token prompt
    is cut by CLIP only. SD3 reads CLIP in chunks (issue 49): only T5 past its 255 is noted there."""
    flux = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="flux", text_encoders=(("CLIP", 75), ("T5", 511))))
    r = validate(raw_request(prompt="word " * 100), flux, lambda text: {"CLIP": 100, "T5": 100})
    assert r.warnings == (
        "prompt is 100 tokens; the CLIP text encoder reads the first 75, so it ignored the rest (T5 reads up to 511)",
    )
    sd3 = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="sd3", text_encoders=(("CLIP", 75), ("T5", 255))))
    r = validate(raw_request(prompt="word " * 100), sd3, lambda text: {"CLIP": 100, "T5": 100, "CLIP chunks": 2})
    assert r.warnings == () and r.prompt_chunks == 2
    r = validate(raw_request(prompt="word " * 300), sd3, lambda text: {"CLIP": 300, "T5": 300, "CLIP chunks": 4})
    assert r.warnings == ("prompt is 300 tokens; the T5 text encoder reads the first 255, so it ignored the rest",)
    t5_only = Limits.for_model(dataclasses.replace(FAKE_PROFILE, text_encoders=(("T5", 119),)))
    long = validate(raw_request(prompt="word " * 150), t5_only, lambda text: {"T5": 150})
    assert long.warnings == ("prompt is 150 tokens; the T5 text encoder reads the first 119, so it ignored the rest",)
    assert validate(raw_request(prompt="word " * 100), t5_only, lambda text: {"T5": 100}).warnings == ()


def test_the_tokens_counted_are_those_of_the_text_the_encoders_read() -> None:
    """A T5- or LLM-only family reads the words with the syntax removed (issue 49): its note counts those,
    not the brackets and weights; read as written (emphasis "None"), the text as written."""
    from pipeline.prompt_syntax import plain

    t5_only = Limits.for_model(dataclasses.replace(FAKE_PROFILE, family="pixart", text_encoders=(("T5", 119),)))
    counted: list[str] = []

    def count(text: str) -> dict[str, int]:
        counted.append(text)
        return {"T5": len(text.split())}

    prompt = "a (red:1.3) circle, [[blue]] " * 30
    validate(raw_request(prompt=prompt), t5_only, count)
    validate(raw_request(prompt=prompt, emphasis="None"), t5_only, count)
    assert counted == [plain(prompt), prompt] and "(" not in counted[0]


def test_a_short_ascii_prompt_needs_no_token_count() -> None:
    """Counting costs a round trip to the model process; a prompt that surely fits every window skips it."""
    counted: list[str] = []

    def count(text: str) -> dict[str, int]:
        counted.append(text)
        return {"CLIP": 1}

    window = dict(LIMITS.text_encoders)["CLIP"]
    validate(raw_request(prompt="a red circle", negative_prompt="blurry"), LIMITS, count)
    validate(raw_request(prompt="x" * (window - 1)), LIMITS, count)
    assert counted == []
    long, wide = "x" * window, "\ufdfa"  # one character over; one character that NFKC makes 18
    validate(raw_request(prompt=long), LIMITS, count)
    validate(raw_request(prompt=wide), LIMITS, count)
    assert counted == [long, wide]


@pytest.mark.parametrize("family", ["clip", "t5", "gemma"])
def test_an_ascii_text_is_at_most_one_token_per_character_plus_one(family: str) -> None:
    """What ``fields.fits_every_window`` rests on, checked on each family's tokenizer as the model counts."""
    import random
    import string

    from tests.builds import components

    make = {
        "clip": components.make_clip_tokenizer,
        "t5": components.make_t5_tokenizer,
        "gemma": components.make_gemma_tokenizer,
    }[family]
    tokenizer = make()
    rng = random.Random(17)
    words = list(components.WORDS)
    texts = ["a", "1", " a", "a ", "  ", "a  b", "!!!", "\t\n", "x" * 80, " ".join(words[:40])]
    texts += ["".join(rng.choices(string.printable, k=rng.randint(1, 120))) for _ in range(300)]
    texts += [" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(100)]
    for text in texts:
        tokens = len(tokenizer(text, truncation=False, add_special_tokens=False).input_ids)
        assert tokens <= len(text) + 1, (text, tokens)


def test_the_byt5_glyph_window_counts_only_the_quoted_text_and_the_shortcut_holds() -> None:
    """HunyuanImage's ByT5 reads only the quoted text, as ``Text "...". `` (``counted_text``); a text that
    ``fits_every_window`` lets through uncounted is within its 128 tokens, even made of quotes only."""
    import random

    from transformers import ByT5Tokenizer

    from pipeline.engine.model.families import counted_text
    from pipeline.fields import fits_every_window

    tokenizer = ByT5Tokenizer()

    def tokens(text: str) -> int:
        return len(tokenizer(counted_text("ByT5", text), add_special_tokens=False).input_ids)

    assert counted_text("ByT5", 'a sign that says "OPEN" on a door') == 'Text "OPEN". '
    assert tokens("red " * 400) == 0 and counted_text("T5", "red") == "red"
    rng = random.Random(3)
    encoders = (("Qwen", 1000), ("ByT5", 128))
    worst = 0.0
    for _ in range(400):
        n = rng.randint(1, 40)
        text = "".join(rng.choices("'\"a ", weights=(4, 4, 1, 1), k=n))
        worst = max(worst, tokens(text) / (len(text) + 1))
        if fits_every_window(text, encoders):
            assert tokens(text) <= 128, text
    assert worst > 2.0  # the quotes do inflate it: the shortcut must not count characters alone


def test_an_empty_prompt_is_valid_and_the_gradio_events_refuse_it() -> None:
    """Issue 49: diffusers and AUTOMATIC1111 draw an empty prompt unconditionally (A1111's default is
    ""); the Gradio events, where a person pressed Generate on an empty box, refuse it by name."""
    from pipeline.request import gradio_checks

    assert validate(raw_request(prompt=""), LIMITS).to_job().prompts == ("",)
    for empty in ("", "   "):
        with pytest.raises(InvalidRequest, match="prompt must not be empty") as refused:
            gradio_checks(raw_request(prompt=empty))
        assert refused.value.field == "prompt"
    gradio_checks(raw_request(prompt="a red circle"))
