"""AUTOMATIC1111's prompt syntax and CLIP encoding (issue 49), against AUTOMATIC1111's own algorithm.

The parse is checked on the examples of A1111's own docstring (``modules/prompt_parser.py``,
``parse_prompt_attention``). The chunks and embeddings are checked against A1111's algorithm written
again here from its description (``modules/sd_hijack_clip.py``: ``tokenize_line`` with its
``next_chunk`` and comma backtrack, ``process_tokens`` with SD 2's padding; ``modules/sd_emphasis.py``:
"Original" and "No norm"), independently of ``engine.model.prompt_weights``, on the embedded model
(SD 1.x's tokenizer: padding is the end token) and the tiny SD 2.x build (padding ``!``).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.config import Settings
from pipeline.prompt_syntax import parse, plain
from pipeline.protocol import InferenceJob
from tests.families import built_family

# A1111's docstring examples, as it gives them.
A1111_EXAMPLES = [
    ("normal text", [("normal text", 1.0)]),
    ("an (important) word", [("an ", 1.0), ("important", 1.1), (" word", 1.0)]),
    ("(unbalanced", [("unbalanced", 1.1)]),
    ("\\(literal\\]", [("(literal]", 1.0)]),
    ("(unnecessary)(parens)", [("unnecessaryparens", 1.1)]),
    (
        "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
        [("a ", 1.0), ("house", 1.5730000000000004), (" ", 1.1), ("on", 1.0), (" a ", 1.1), ("hill", 0.55),
         (", sun, ", 1.1), ("sky", 1.4641000000000006), (".", 1.1)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "runs"), A1111_EXAMPLES)
def test_the_parse_gives_a1111s_own_examples(text: str, runs: list[tuple[str, float]]) -> None:
    assert same_runs(parse(text), runs)


def same_runs(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> bool:
    texts = [t for t, _ in got] == [t for t, _ in expected]
    return texts and [w for _, w in got] == pytest.approx([w for _, w in expected])


def test_break_nesting_weights_and_the_plain_text_for_other_encoders() -> None:
    assert parse("a cat BREAK a dog") == [("a cat", 1.0), ("BREAK", -1.0), ("a dog", 1.0)]
    assert same_runs(parse("((x))[y]"), [("x", 1.21), ("y", 1 / 1.1)])
    assert parse("(x:.)") == [("x:.)", 1.1)]  # A1111 raises here; the text stays
    assert plain("(worst quality:2), (low quality:2), ((monochrome))") == "worst quality, low quality, monochrome"
    assert plain("a \\(red\\) circle BREAK on blue") == "a (red) circle on blue"
    assert plain("no syntax: here") == "no syntax: here"


def test_break_splits_as_a1111s_pattern_does() -> None:
    """``BREAK`` and the whitespace around it, as A1111's ``\\s*\\bBREAK\\b\\s*`` splits a piece (that pattern
    is quadratic on whitespace; the app splits on the word and strips): the same runs on random texts."""
    import random
    import re

    a1111 = re.compile(r"\s*\bBREAK\b\s*", re.S)
    words = ["BREAK", " ", "\t", "\n", "a", "BREAKx", "xBREAK", ",", "  BREAK  ", "\u00a0", "\u3000", "(b)"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 10)))
        expected: list[tuple[str, float]] = []
        for i, part in enumerate(a1111.split(text)):
            expected += [("BREAK", -1.0)] * (i > 0) + [(part, 1.0)]
        if "(" not in text:  # without brackets, the runs are exactly the split (merged where weights meet)
            assert [t for t, _ in parse(text)] == [t for t, _ in _merged(expected)], repr(text)


def _merged(runs: list[tuple[str, float]]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for text, weight in runs:
        if out and out[-1][1] == weight and weight != -1.0:
            out[-1] = (out[-1][0] + text, weight)
        else:
            out.append((text, weight))
    return out


@pytest.mark.parametrize(
    "build",
    [
        lambda n: " " * n,  # A1111's BREAK pattern backtracks over whitespace: quadratic
        lambda n: "(" + "\t" * (n - 2) + ")",
        lambda n: "(a" * (n // 2),  # brackets never closed: A1111 multiplies every run at each
        lambda n: "(a" * (n // 3) + ")" * (n // 3),
        lambda n: ("(" * 40 + "a" + ")" * 40) * (n // 81),
        lambda n: ":" + " " * (n // 2) + "1" * (n // 2),
    ],
    ids=["spaces", "bracketed-tabs", "unclosed", "closing", "deep", "colon"],
)
def test_the_parse_is_linear_in_the_prompt(build: Any) -> None:
    """At the default prompt cap and four times it, a hostile prompt's parse stays far under a second
    (A1111's algorithm took 0.1 s on 2,000 spaces and grows with the square: 1.6 s at 8,000)."""
    import time

    for n in (2_000, 8_000):
        text = build(n)
        start = time.perf_counter()
        parse(text)
        plain(text)
        took = time.perf_counter() - start
        assert took < 0.5, f"{took:.2f} s at {n} characters"


# -- A1111's tokenize_line and process_tokens, written again -------------------------------------------
def a1111_chunks(tokenizer: Any, text: str) -> list[tuple[list[int], list[float]]]:
    chunk_length, backtrack = 75, 20
    id_start, id_end = tokenizer.bos_token_id, tokenizer.eos_token_id
    comma_token = tokenizer.get_vocab().get(",</w>", None)
    parsed = parse(text)
    tokenized = tokenizer([t for t, _ in parsed], truncation=False, add_special_tokens=False)["input_ids"]
    chunks: list[tuple[list[int], list[float]]] = []
    chunk: tuple[list[int], list[float]] = ([], [])
    last_comma = -1

    def next_chunk() -> None:
        nonlocal chunk, last_comma
        to_add = chunk_length - len(chunk[0])
        if to_add > 0:
            chunk[0].extend([id_end] * to_add)
            chunk[1].extend([1.0] * to_add)
        chunks.append(([id_start, *chunk[0], id_end], [1.0, *chunk[1], 1.0]))
        chunk, last_comma = ([], []), -1

    for tokens, (piece, weight) in zip(tokenized, parsed):
        if piece == "BREAK" and weight == -1:
            next_chunk()
            continue
        position = 0
        while position < len(tokens):
            token = tokens[position]
            if token == comma_token:
                last_comma = len(chunk[0])
            elif len(chunk[0]) == chunk_length and last_comma != -1 and len(chunk[0]) - last_comma <= backtrack:
                break_location = last_comma + 1
                reloc = chunk[0][break_location:], chunk[1][break_location:]
                del chunk[0][break_location:], chunk[1][break_location:]
                next_chunk()
                chunk = (list(reloc[0]), list(reloc[1]))
            if len(chunk[0]) == chunk_length:
                next_chunk()
            chunk[0].append(token)
            chunk[1].append(weight)
            position += 1
    if chunk[0] or not chunks:
        next_chunk()
    return chunks


def a1111_embedding(model: Any, text: str, emphasis: str, chunks_to: int) -> torch.Tensor:
    tokenizer, encoder = model.pipe.tokenizer, model.pipe.text_encoder
    id_end, id_pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    chunks = a1111_chunks(tokenizer, text)
    empty = a1111_chunks(tokenizer, "")[0]
    chunks += [empty] * (chunks_to - len(chunks))
    zs = []
    for tokens, multipliers in chunks:
        ids = torch.asarray([tokens])
        if id_end != id_pad:  # SD 2: everything after the first end token is padding
            ids[0, tokens.index(id_end) + 1 :] = id_pad
        with torch.no_grad():
            z = encoder(ids)[0]
        weights = torch.asarray([multipliers])
        original_mean = z.mean()
        z = z * weights.reshape(weights.shape + (1,)).expand(z.shape)
        if emphasis == "Original" and abs(z.mean()) > 1e-4 * z.abs().mean():  # the one deviation: no mean, no restore
            z = z * (original_mean / z.mean())
        zs.append(z)
    return torch.hstack(zs)


_MODELS: dict[str, Any] = {}


def model_of(name: str) -> Any:
    from pipeline.engine.model.loading import load_model

    if name not in _MODELS:
        source = None if name == "default" else str(built_family(name))
        _MODELS[name] = load_model(Settings(model=source, device="cpu"), warmup=False)
    return _MODELS[name]


COMMAS = ", ".join(f"shape number {i}" for i in range(30))  # commas near every chunk boundary
PROMPTS = [
    "a (red:1.3) circle on a [blue] background",
    "((a yellow star)), (on purple:0.7) BREAK a (green:1.4) triangle",
    f"a red circle, {COMMAS}, (blue background:1.2)",
    "a circle " * 60 + "(at the end:1.5)",  # no comma to move back to
]


@pytest.mark.parametrize("name", ["default", "sd2-v"])
@pytest.mark.parametrize("emphasis", ["Original", "No norm"])
def test_the_embeddings_equal_a1111s_algorithm(name: str, emphasis: str) -> None:
    model = model_of(name)
    negative = "(worst quality:2), (low quality:2), ((monochrome))"
    for prompt in PROMPTS:
        job = InferenceJob(request_id="x", prompts=(prompt,), negative_prompts=(negative,), seeds=(1,), width=64,
                           height=64, num_inference_steps=2, guidance_scale=5.0, options=(("emphasis", emphasis),))  # fmt: skip
        ours, ours_negative = model.clip_embeddings(job, negatives=True)
        count = max(len(a1111_chunks(model.pipe.tokenizer, t)) for t in (prompt, negative))
        theirs = a1111_embedding(model, prompt, emphasis, count)
        theirs_negative = a1111_embedding(model, negative, emphasis, count)
        assert ours.shape == theirs.shape == (1, 77 * count, theirs.shape[2]), (prompt, ours.shape, theirs.shape)
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours_negative, theirs_negative, rtol=1e-4, atol=1e-5)
    # the chunks: the commas moved whole into the next chunk, BREAK made its own
    counts = [len(a1111_chunks(model.pipe.tokenizer, p)) for p in PROMPTS]
    assert counts == [model.chunker.count(p, syntax=True) for p in PROMPTS] == [1, 2, 4, 2]


def test_a_plain_short_prompt_is_encoded_as_the_pipelines_own_encode_prompt() -> None:
    """No syntax, under 75 tokens: the very tensor diffusers' ``encode_prompt`` gives (nothing changed)."""
    model = model_of("default")
    job = InferenceJob(request_id="x", prompts=("a red circle on a blue background",), negative_prompts=("",),
                       seeds=(1,), width=64, height=64, num_inference_steps=2, guidance_scale=5.0)  # fmt: skip
    ours, negative = model.clip_embeddings(job, negatives=True)
    with torch.no_grad():
        theirs, theirs_negative = model.pipe.encode_prompt(list(job.prompts), "cpu", 1, True, [""])
    assert torch.equal(ours, theirs) and torch.equal(negative, theirs_negative)


def run(model: Any, prompt: str, emphasis: str = "default", steps: int = 8) -> np.ndarray:
    guidance = 5.0 if model.profile.supports_negative_prompt else model.profile.default_guidance
    job = InferenceJob(request_id="x", prompts=(prompt,), negative_prompts=("",), seeds=(3,), width=64, height=64,
                       num_inference_steps=steps, guidance_scale=guidance, options=(("emphasis", emphasis),))  # fmt: skip
    result = model.generate(job, threading.Event(), lambda *_: None)
    return np.asarray(result.images[0]).astype(float)


def test_on_the_embedded_model_weights_do_what_they_say_and_long_prompts_are_read_whole() -> None:
    model = model_of("default")
    d = lambda a, b: float(np.abs(a - b).mean())  # noqa: E731
    red, blue = "a red circle on a white background", "a red circle on a blue background"
    assert d(run(model, red), run(model, "a (red:1.0) circle on a white background")) < 0.5
    assert d(run(model, red), run(model, "a (red:1.0) circle on a white background", "None")) > 5  # as written
    assert d(run(model, blue), run(model, "a red circle on a (blue:1.0) background")) < 0.5
    assert d(run(model, blue), run(model, "a red circle on a (blue:1.6) background")) > 0.5
    assert d(run(model, "a (red) circle", "None"), run(model, "a \\(red\\) circle")) < 0.5  # escapes are text
    long = "a red circle on a white background, " + ", ".join(["simple shape"] * 40)
    assert len(model.pipe.tokenizer(long).input_ids) > 100
    assert d(run(model, long + ", green"), run(model, long + ", yellow triangle")) > 0.05  # cut at 75: 0.00


def a1111_sdxl(model: Any, text: str, count: int, pool_both: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A1111's SDXL conditioning written again: each CLIP's chunks through its penultimate layer, "No norm"
    emphasis, the two side by side; the pooled embedding of the first chunk of the second (projected),
    or (``pool_both``: SD3) of both, side by side."""
    outputs, pooled, pools = [], None, []
    for tokenizer, encoder in ((model.pipe.tokenizer, model.pipe.text_encoder),
                               (model.pipe.tokenizer_2, model.pipe.text_encoder_2)):  # fmt: skip
        id_end, id_pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        chunks = a1111_chunks(tokenizer, text)
        chunks += [a1111_chunks(tokenizer, "")[0]] * (count - len(chunks))
        zs = []
        for i, (tokens, multipliers) in enumerate(chunks):
            ids = torch.asarray([tokens])
            if id_end != id_pad:
                ids[0, tokens.index(id_end) + 1 :] = id_pad
            with torch.no_grad():
                out = encoder(ids, output_hidden_states=True)
            if i == 0 and out[0].ndim == 2:
                pooled = out[0]
                pools.append(pooled)
            zs.append(out.hidden_states[-2] * torch.asarray([multipliers]).unsqueeze(-1))
        outputs.append(torch.hstack(zs))
    assert pooled is not None
    return torch.cat(outputs, dim=-1), (torch.cat(pools, dim=-1) if pool_both else pooled)


def test_sdxl_reads_both_clips_as_a1111_with_no_norm_and_a_plain_prompt_as_its_pipeline() -> None:
    model = model_of("sdxl")
    assert model.emphasis(InferenceJob(request_id="x", prompts=("a",), negative_prompts=("",), seeds=(1,),
                                       width=64, height=64, num_inference_steps=2, guidance_scale=5.0)) == "No norm"  # fmt: skip
    negative = "(worst quality:2), ((monochrome))"
    for prompt in PROMPTS:
        job = InferenceJob(request_id="x", prompts=(prompt,), negative_prompts=(negative,), seeds=(1,), width=64,
                           height=64, num_inference_steps=2, guidance_scale=5.0)  # fmt: skip
        ours = model.encoded(job, negatives=True)
        count = max(len(a1111_chunks(model.pipe.tokenizer, t)) for t in (prompt, negative))
        theirs, theirs_pooled = a1111_sdxl(model, prompt, count)
        theirs_negative, theirs_negative_pooled = a1111_sdxl(model, negative, count)
        torch.testing.assert_close(ours.embeds, theirs, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.pooled, theirs_pooled, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.negative, theirs_negative, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.negative_pooled, theirs_negative_pooled, rtol=1e-4, atol=1e-5)
    plain = InferenceJob(request_id="x", prompts=("a red circle",), negative_prompts=("",), seeds=(1,), width=64,
                         height=64, num_inference_steps=2, guidance_scale=5.0)  # fmt: skip
    ours = model.encoded(plain, negatives=True)
    with torch.no_grad():
        embeds, negative_embeds, pooled, negative_pooled = model.pipe.encode_prompt(
            ["a red circle"], device="cpu", do_classifier_free_guidance=True, negative_prompt=None
        )
    for got, expected in ((ours.embeds, embeds), (ours.pooled, pooled), (ours.negative, negative_embeds),
                          (ours.negative_pooled, negative_pooled)):  # fmt: skip
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # one batch for both texts: float order


def test_sdxl_weights_and_long_prompts_change_its_pictures_and_plain_text_does_not() -> None:
    model = model_of("sdxl")
    d = lambda a, b: float(np.abs(a - b).mean())  # noqa: E731
    plain_run = run(model, "a red circle")  # random tiny weights: small effects, but never none
    assert d(plain_run, run(model, "a (red:1.0) circle")) == 0.0
    assert d(plain_run, run(model, "a (red:1.8) circle")) > 0.01
    long = "a red circle, " + ", ".join(["simple shape"] * 40)
    assert d(run(model, long + ", green"), run(model, long + ", yellow triangle")) > 0.01


@pytest.mark.parametrize("name", ["qwen-image", "pixart-sigma"])
def test_llm_and_t5_only_families_read_the_text_with_the_syntax_removed(name: str) -> None:
    """Qwen-Image (an LLM encoder) and PixArt-Σ (T5 alone) take no weights here: a request's job carries
    the text with the syntax removed, so a weighted prompt draws what its plain words draw (and
    ``emphasis`` "None" reads the brackets as text)."""
    from pipeline.request import limits_for, validate
    from tests.helpers import raw_request

    model = model_of(name)
    limits = limits_for(Settings(), model.profile)
    common = dict(width=64, height=64, num_inference_steps=2, guidance_scale=model.profile.default_guidance,
                  negative_prompt="", seed=3)  # fmt: skip

    def drawn(**over: Any) -> np.ndarray:
        job = validate(raw_request(**{**common, **over}), limits).to_job()
        return np.asarray(model.generate(job, threading.Event(), lambda *_: None).images[0]).astype(float)

    weighted = drawn(prompt="a (red:1.5) circle BREAK on [blue]")
    assert np.array_equal(weighted, drawn(prompt="a red circle on blue"))
    assert not np.array_equal(weighted, drawn(prompt="a (red:1.5) circle BREAK on [blue]", emphasis="None"))


def comfyui_t5(model: Any, runs: list[tuple[str, float]], length: int, number: int = 2) -> torch.Tensor:
    """ComfyUI's T5 weighting written again: the runs' tokens, the end token, padding; encoded with and
    without weights, each weighted position ``empty + (z - empty) × weight`` (T5: the pipeline's
    ``tokenizer_2``/``text_encoder_2`` for FLUX.1, ``number`` 3 for SD3)."""
    tokenizer = getattr(model.pipe, f"tokenizer_{number}")
    encoder = getattr(model.pipe, f"text_encoder_{number}")
    tokens: list[int] = []
    weights: list[float] = []
    for text, weight in runs:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        tokens += ids
        weights += [weight] * len(ids)
    tokens, weights = tokens[: length - 1], weights[: length - 1]  # cut as the pipeline's tokenizer call cuts
    pad = length - 1 - len(tokens)
    tokens += [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * pad
    weights += [1.0] * (pad + 1)
    empty_ids = [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * (length - 1)
    with torch.no_grad():
        z = encoder(torch.tensor([tokens]))[0]
        empty = encoder(torch.tensor([empty_ids]))[0]
    out = z.clone()
    for j, w in enumerate(weights):
        if w != 1.0:
            out[0, j] = empty[0, j] + (z[0, j] - empty[0, j]) * w
    return out


def test_flux_weighs_t5_by_comfyuis_rule_and_reads_a_plain_prompt_as_its_pipeline() -> None:
    from pipeline.engine.model.families import call_default

    model = model_of("flux-schnell")
    length = call_default(model.pipe, "max_sequence_length", 512)
    device = torch.device("cpu")
    job = InferenceJob(request_id="x", prompts=("a red circle on blue",), negative_prompts=("",), seeds=(1,),
                       width=64, height=64, num_inference_steps=2, guidance_scale=0.0)  # fmt: skip
    ours = model.flux_embeddings(job, device)
    with torch.no_grad():
        theirs = model.pipe.encode_prompt(prompt=list(job.prompts), prompt_2=None, device=device,
                                          num_images_per_prompt=1, max_sequence_length=length)  # fmt: skip
    for got, expected in zip(ours, theirs):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)  # the same ids; float order aside
    weighted = replace(job, prompts=("a (red:1.5) circle on [blue]",))
    embeds, pooled, _ = model.flux_embeddings(weighted, device)
    expected_t5 = comfyui_t5(model, [("a ", 1.0), ("red", 1.5), (" circle on ", 1.0), ("blue", 1 / 1.1)], length)
    torch.testing.assert_close(embeds, expected_t5, rtol=1e-3, atol=1e-4)  # 1.4e-5 seen on another CPU
    torch.testing.assert_close(pooled, theirs[1], rtol=1e-5, atol=1e-6)  # CLIP pooled: the words alone
    d = lambda a, b: float(np.abs(a - b).mean())  # noqa: E731
    plain_run = run(model, "a red circle", steps=2)
    assert d(plain_run, run(model, "a (red:1.0) circle", steps=2)) == 0.0
    assert d(plain_run, run(model, "a (red:1.8) circle", steps=2)) > 0.0  # random tiny weights: small, never none


def test_sd3_reads_both_clips_as_a1111_and_t5_by_comfyuis_rule_and_a_plain_prompt_as_its_pipeline() -> None:
    """SD3 (issue 49): CLIP-L and CLIP-G as SDXL's ("No norm", chunks of 75, pooled from each first
    chunk, side by side), zero-padded to T5's width, then T5 by ComfyUI's rule at the call's 256 tokens."""
    from pipeline.engine.model.families import call_default
    from pipeline.prompt_syntax import BREAK, weighted

    model = model_of("sd3")
    length = call_default(model.pipe, "max_sequence_length", 256)
    negative = "(worst quality:2), ((monochrome))"
    for prompt in PROMPTS:
        job = InferenceJob(request_id="x", prompts=(prompt,), negative_prompts=(negative,), seeds=(1,), width=64,
                           height=64, num_inference_steps=2, guidance_scale=5.0)  # fmt: skip
        assert model.emphasis(job) == "No norm"
        ours = model.encoded(job, negatives=True)
        count = max(len(a1111_chunks(model.pipe.tokenizer, t)) for t in (prompt, negative))
        for text, embeds, pooled in (
            (prompt, ours.embeds, ours.pooled),
            (negative, ours.negative, ours.negative_pooled),
        ):
            clip, clip_pooled = a1111_sdxl(model, text, count, pool_both=True)
            runs = [(t, w) for t, w in weighted(text, True) if not (t == BREAK and w == -1.0)]
            t5 = comfyui_t5(model, runs, length, number=3)
            clip = torch.nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
            torch.testing.assert_close(embeds, torch.cat([clip, t5], dim=-2), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(pooled, clip_pooled, rtol=1e-4, atol=1e-5)
    plain = InferenceJob(request_id="x", prompts=("a red circle on blue",), negative_prompts=("",), seeds=(1,),
                         width=64, height=64, num_inference_steps=2, guidance_scale=5.0)  # fmt: skip
    ours = model.encoded(plain, negatives=True)
    with torch.no_grad():
        theirs = model.pipe.encode_prompt(prompt=["a red circle on blue"], prompt_2=None, prompt_3=None,
                                          negative_prompt=None, do_classifier_free_guidance=True, device="cpu",
                                          max_sequence_length=length)  # fmt: skip
    for got, expected in zip((ours.embeds, ours.negative, ours.pooled, ours.negative_pooled), theirs):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # one batch for both texts: float order
    d = lambda a, b: float(np.abs(a - b).mean())  # noqa: E731
    plain_run = run(model, "a red circle", steps=2)
    assert d(plain_run, run(model, "a (red:1.0) circle", steps=2)) == 0.0
    assert d(plain_run, run(model, "a (red:1.8) circle", steps=2)) > 0.0  # random tiny weights: small, never none
    long = "a red circle, " + ", ".join(["simple shape"] * 40)
    assert d(run(model, long + ", green", steps=2), run(model, long + ", yellow triangle", steps=2)) > 0.0
