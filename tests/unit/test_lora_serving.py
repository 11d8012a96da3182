"""Per-request LoRAs on the serving side, with the fake model: the ``--lora`` specs, the
``lora``/``lora_scale`` checks at join time, which requests share a job or a loop, and the PNG metadata
(``<lora:NAME:SCALE>`` in the prompt, ``Lora hashes``) that Paste parameters reads back."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

from pipeline.config import load_settings
from pipeline.errors import InvalidRequest
from pipeline.loras import LoraSpec, parse_all, short_hash, strip_tags
from pipeline.protocol import LoraInfo
from pipeline.request import Limits, validate
from pipeline.serving.postprocess import a1111_parameters
from pipeline.web.apis.a1111 import fill_from, parse_parameters
from tests.fakes import FAKE_PROFILE, FakeModel
from tests.helpers import collect, raw_request, wait_until

ADAPTERS = (LoraInfo("ink", 0.8, "0123456789ab", ("unet",)), LoraInfo("Pixel-Art", 1.0, "ba9876543210", ("unet",)))
PROFILE = dataclasses.replace(FAKE_PROFILE, loras=ADAPTERS, lora_batching="mixed")
LIMITS = Limits.for_model(PROFILE)


# -- --lora ----------------------------------------------------------------------------------------------


def test_specs_from_flags_and_from_the_environment() -> None:
    s = load_settings(["--lora", "ink=/m/ink.safetensors:0.8", "--lora", "px=user/pixel-art"], environ={})
    assert s.lora_specs() == (LoraSpec("ink", "/m/ink.safetensors", 0.8), LoraSpec("px", "user/pixel-art", 1.0))
    env = load_settings([], environ={"T2I_LORAS": "ink=./ink:-0.5, px=C:\\loras\\px.safetensors"})
    assert env.lora_specs() == (LoraSpec("ink", "./ink", -0.5), LoraSpec("px", "C:\\loras\\px.safetensors", 1.0))
    assert load_settings(["--lora", "a=/x"], environ={"T2I_LORAS": "b=/y"}).loras == ("a=/x",)  # the flag wins


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ink", "must be NAME=PATH_OR_HUB_ID"),
        ("=/x", "must be 1 to 64 letters"),
        ("none=/x", "and not 'none'"),
        ("in k=/x", "must be 1 to 64 letters"),
        ("ink=/x:3", "scale must be between -2 and 2; got 3"),
    ],
)
def test_a_bad_spec_stops_the_app_with_its_reason(spec: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        load_settings(["--lora", spec], environ={})


def test_a_name_given_twice_is_an_error_not_an_override() -> None:
    with pytest.raises(ValueError, match="'INK' is given twice"):
        parse_all(["ink=/a", "INK=/b"])
    with pytest.raises(SystemExit, match="--lora-batching must be auto, mixed or separate"):
        load_settings(["--lora-batching", "some"], environ={})


def test_the_short_hash_skips_a_safetensors_header(tmp_path: Any) -> None:
    """A1111's LoRA hash (Civitai's AutoV3): the tensor bytes only, so editing the metadata keeps it."""
    import hashlib
    import struct

    def file(header: bytes) -> Any:
        path = tmp_path / f"f{len(header)}.safetensors"
        path.write_bytes(struct.pack("<Q", len(header)) + header + b"TENSORDATA")
        return path

    a, b = file(b'{"__metadata__":{"x":"1"}}'), file(b'{"__metadata__":{"x":"a longer note"}}')
    assert short_hash(a) == short_hash(b) == hashlib.sha256(b"TENSORDATA").hexdigest()[:12]


# -- validation at join time -------------------------------------------------------------------------------


def test_a_request_picks_an_adapter_by_name_in_any_case_or_none() -> None:
    assert validate(raw_request(lora="ink", lora_scale=0.5), LIMITS).lora_use.name == "ink"
    assert validate(raw_request(lora="pixel-art"), LIMITS).lora == "Pixel-Art"
    for none in ("none", "None", "", None):
        r = validate(raw_request(lora=none, lora_scale=1.5), LIMITS)
        assert r.lora == "" and r.lora_use.name == "" and r.to_job().lora == "" and r.to_job().lora_scale == 0.0
    r = validate(raw_request(lora="ink", lora_scale=-1.25), LIMITS)
    assert (r.to_job().lora, r.to_job().lora_scale) == ("ink", -1.25)
    assert r.parameters()["lora"] == "ink" and r.parameters()["lora_scale"] == -1.25


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"lora": "inky"}, "lora", "lora must be one of: none, ink, Pixel-Art; got &#x27;inky&#x27;"),
        ({"lora": 3}, "lora", "lora must be one of: none, ink, Pixel-Art; got 3"),
        ({"lora": "ink", "lora_scale": 2.5}, "lora_scale", "lora_scale must be a number between -2 and 2; got 2.5"),
        ({"lora": "ink", "lora_scale": float("nan")}, "lora_scale", "lora_scale must be a number between -2 and 2"),
        ({"lora_scale": "1"}, "lora_scale", "lora_scale must be a number between -2 and 2"),
    ],
)
def test_a_bad_adapter_or_scale_names_the_field_and_the_choices(raw: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        validate(raw_request(**raw), LIMITS)
    assert caught.value.field == field and message in str(caught.value)


def test_on_a_server_without_adapters_only_none_is_accepted_and_it_says_how_to_load_one() -> None:
    plain = Limits.for_model(FAKE_PROFILE)
    assert validate(raw_request(lora="none"), plain).lora == ""
    with pytest.raises(InvalidRequest, match="one of: none \\(this server loaded no LoRAs: start it with --lora"):
        validate(raw_request(lora="ink"), plain)


# -- which requests share a job or a loop -----------------------------------------------------------------


def _model(**kw: Any) -> FakeModel:
    model = FakeModel(**kw)
    model.profile = dataclasses.replace(model.profile, loras=ADAPTERS, lora_batching="mixed")
    return model


@pytest.mark.anyio
async def test_a_job_holds_one_adapter_at_one_scale(make_adapter: Any) -> None:
    adapter, model = make_adapter(_model(hold=True), max_batch_size=8)
    first = asyncio.create_task(collect(adapter, raw_request(prompt="blocker"), request_id="blocker"))
    await wait_until(lambda: model.active == 1, "the blocker is in the model")
    plan = [("a", "ink", 0.8), ("b", "Pixel-Art", 0.8), ("c", "ink", 0.8), ("d", "ink", 0.5), ("e", "none", 0.8)]
    tasks = []
    for i, (rid, lora, scale) in enumerate(plan):
        tasks.append(
            asyncio.create_task(collect(adapter, raw_request(seed=i, lora=lora, lora_scale=scale), request_id=rid))
        )
        await wait_until(lambda: adapter.gpu_queue_depth == i + 1, f"{rid} waits")
    for _ in range(6):
        model.release.release()
    results = await asyncio.gather(first, *tasks)
    assert all(r[-1].kind == "done" for r in results)
    assert [job.request_id.split(",") for job in model.calls] == [["blocker"], ["a", "c"], ["b"], ["d"], ["e"]]
    jobs = {job.request_id: job for job in model.calls}
    assert (jobs["a,c"].lora, jobs["a,c"].lora_scale) == ("ink", 0.8)
    assert (jobs["d"].lora, jobs["d"].lora_scale) == ("ink", 0.5) and jobs["e"].lora == ""
    info = results[1][-1].info
    assert info["lora"] == "ink" and info["lora_scale"] == 0.8 and info["lora_hash"] == "0123456789ab"
    assert results[5][-1].info["lora"] == "none" and "lora_hash" not in results[5][-1].info


@pytest.mark.anyio
@pytest.mark.parametrize("batching", ["mixed", "separate"])
async def test_a_loop_takes_other_adapters_when_it_mixes_them_and_each_adapter_at_one_scale(
    make_adapter: Any, batching: str
) -> None:
    steps = threading.Semaphore(0)
    model = _model(joining=True, step_gate=steps)
    model.profile = dataclasses.replace(model.profile, lora_batching=batching)
    adapter, model = make_adapter(model, max_batch_size=8, step_joining=True)
    a = asyncio.create_task(collect(adapter, raw_request(lora="ink", num_inference_steps=3), request_id="a"))
    await wait_until(lambda: model.loop_step_started == 1, "a's loop runs")
    late = [("b", "Pixel-Art", 1.0), ("d", "ink", 1.0), ("c", "ink", 0.5)]
    tasks = []
    for i, (rid, lora, scale) in enumerate(late):
        raw = raw_request(seed=i, lora=lora, lora_scale=scale, num_inference_steps=3)
        tasks.append(asyncio.create_task(collect(adapter, raw, request_id=rid)))
        await wait_until(lambda: adapter.gpu_queue_depth + adapter.side._tasks.qsize() == i + 1, f"{rid} is in")
    steps.release(100)
    await asyncio.gather(a, *tasks)
    loras = {"a": "ink", "b": "Pixel-Art", "d": "ink", "c": "ink@0.5"}
    if batching == "mixed":
        assert {"a", "b", "d"} <= set(dict(model.loop_steps[1]))  # ink and Pixel-Art in one call
        assert not any("c" in dict(step) and ({"a", "d"} & set(dict(step))) for step in model.loop_steps)
    else:  # a loop per adapter and scale
        assert all(len({loras[rid] for rid, _ in step}) == 1 for step in model.loop_steps)
        assert len(model.loop_steps) >= 9


# -- the PNG's parameters, and Paste parameters ---------------------------------------------------------


def _params(**over: Any) -> dict[str, Any]:
    request = validate(raw_request(prompt="a lighthouse, stormy", **over), LIMITS)
    params = request.parameters()
    if request.lora:
        params["lora_hash"] = next(i.hash for i in ADAPTERS if i.name == request.lora)
    return params


def test_the_adapter_is_written_the_a1111_way_and_read_back() -> None:
    text = a1111_parameters(_params(lora="Pixel-Art", lora_scale=0.65), 7, "fake-model", "EulerDiscreteScheduler")
    first, *_, last = text.splitlines()
    assert first == "a lighthouse, stormy <lora:Pixel-Art:0.65>"
    assert 'Lora hashes: "Pixel-Art: ba9876543210"' in last
    fill = fill_from(parse_parameters(text), LIMITS, lora_hashes={i.name: i.hash for i in ADAPTERS})
    assert fill.values["prompt"] == "a lighthouse, stormy"
    assert fill.values["lora"] == "Pixel-Art" and fill.values["lora_scale"] == 0.65
    assert not [n for n in fill.notes if "LoRA" in n or "Lora" in n]
    plain = a1111_parameters(_params(), 7, "fake-model", "EulerDiscreteScheduler")
    assert "<lora:" not in plain and "Lora hashes" not in plain
    assert fill_from(parse_parameters(plain), LIMITS).values["lora"] == "none"


def test_paste_notes_an_unknown_adapter_a_changed_file_and_a_second_tag() -> None:
    hashes = {i.name: i.hash for i in ADAPTERS}
    text = ('castle, <lora:watercolor:0.7>, <lora:INK:1.5>, <lora:pixel-art>\nSteps: 20, Sampler: Euler, '
            'CFG scale: 7, Seed: 1, Size: 64x64, Lora hashes: "ink: ffffffffffff, watercolor: 1234"')  # fmt: skip
    fill = fill_from(parse_parameters(text), LIMITS, lora_hashes=hashes)
    notes = "\n".join(fill.notes)
    assert fill.values["prompt"] == "castle" and fill.values["lora"] == "ink" and fill.values["lora_scale"] == 1.5
    assert "LoRA 'watercolor' not applied: this app has none, ink, Pixel-Art." in notes
    assert "Only LoRA 'ink' applied: this app runs one LoRA per image." in notes
    assert "the text's file hash is ffffffffffff, this app's is 0123456789ab" in notes
    assert "Lora hashes" not in notes  # read, not "not used"
    assert strip_tags("a <lora:x:0.5> b") == ("a  b", [("x", 0.5)])
