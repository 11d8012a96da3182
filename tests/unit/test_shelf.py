"""Several models under one model thread (issue 52): ``engine.model.shelf``'s residency rule.

Models of known weight sizes (a linear layer each) under a budget: the least recently used goes off the device
first, a model under a running loop is never moved (the test tries), each move is timed and reported with
the result, and a job runs on the model it names."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pipeline.config import load_settings
from pipeline.engine.model.shelf import ModelShelf, Residency
from pipeline.errors import ModelRefused
from pipeline.protocol import InferenceJob, InferenceResult, ModelProfile

MIB = 2**20


class Sized:
    """A model whose weights take ``mib`` MiB: it records where it was moved and which jobs it ran."""

    def __init__(self, name: str, mib: int) -> None:
        layer = torch.nn.Linear(1, mib * MIB // 8)  # float32 weights and bias: mib MiB
        self.moved: list[str] = []
        self.ran: list[str] = []
        self.pipe = SimpleNamespace(components={"unet": layer}, to=self.moved.append)
        self.profile = ModelProfile(name, "Fake", "Euler", "cpu", "float32", 64, 64, 4, 4.0, family="sd")

    def generate(self, job: InferenceJob, stop: Any, on_step: Any) -> InferenceResult:
        self.ran.append(job.request_id)
        return InferenceResult(steps_done=job.num_inference_steps)

    def loop_key(self, job: InferenceJob) -> tuple[str, ...]:
        return ("sd", self.profile.name)

    def open_loop(self, job: InferenceJob) -> str:
        return f"loop of {self.profile.name}"

    def free_memory(self) -> None:
        pass

    def count_tokens(self, text: str) -> dict[str, int]:
        return {"CLIP": len(text.split()) + (self.profile.name == "b")}


def job(rid: str, model: str = "") -> InferenceJob:
    options = (("model", model),) if model else ()
    return InferenceJob(rid, ("a circle",), ("",), (1,), 64, 64, 4, 4.0, options=options)


def shelf(budget_mib: int | None, *sizes: tuple[str, int]) -> tuple[ModelShelf, dict[str, Sized]]:
    models = {name: Sized(name, mib) for name, mib in sizes}
    s = ModelShelf(device="cpu", budget=None if budget_mib is None else budget_mib * MIB)
    for name, model in models.items():
        s.add(name, model)
    return s, models


def states(s: ModelShelf) -> dict[str, str]:
    return {m.name: m.state for m in s.states()}


def test_the_least_recently_used_goes_off_first_and_each_move_is_timed() -> None:
    s, models = shelf(5, ("a", 2), ("b", 2), ("c", 2))  # two fit
    assert states(s) == {"a": "memory", "b": "device", "c": "device"}  # loaded in order: a went off for c
    assert [m.bytes for m in s.states()] == [2 * MIB] * 3
    result = s.stamp(s.generate(job("1", "a"), threading.Event(), lambda *_: None), job("1", "a"))
    assert models["a"].ran == ["1"] and states(s) == {"a": "device", "b": "memory", "c": "device"}  # b: LRU
    assert result.model == "a" and result.model_switch_ms > 0 and {m.name: m.state for m in result.residency}["a"]
    moved = {m.name: m for m in s.states()}
    assert moved["a"].moves == 2 and moved["a"].last_in_ms > 0 and moved["b"].last_out_ms > 0
    again = s.stamp(s.generate(job("2", "a"), threading.Event(), lambda *_: None), job("2", "a"))
    assert again.model_switch_ms == 0 and moved["a"].moves == {m.name: m for m in s.states()}["a"].moves
    s.generate(job("3"), threading.Event(), lambda *_: None)  # no model named: the default, the first
    assert models["a"].ran == ["1", "2", "3"] and models["a"].moved[-1] == "cpu"


def test_a_model_under_a_running_loop_is_never_moved() -> None:
    s, models = shelf(3, ("a", 2), ("b", 2))  # one fits
    assert s.open_loop(job("1", "a")) == "loop of a" and states(s)["a"] == "device"
    with pytest.raises(RuntimeError, match="under a running loop"):
        s._move("a", onto=False)  # what a move under the loop would do: refused
    assert s.residency.plan("b") == []  # a is in use: nothing may go for b
    s.generate(job("2", "b"), threading.Event(), lambda *_: None)  # b runs over the budget rather than move a
    assert states(s) == {"a": "device", "b": "device"} and models["b"].ran == ["2"]
    s.close_loop()
    s.generate(job("3", "b"), threading.Event(), lambda *_: None)
    s.generate(job("4", "a"), threading.Event(), lambda *_: None)
    assert states(s) == {"a": "device", "b": "memory"}  # the loop over, the rule applies again


def test_without_a_budget_on_the_cpu_nothing_moves_and_unknown_models_are_refused() -> None:
    s, models = shelf(None, ("a", 1), ("b", 1))
    s.generate(job("1", "b"), threading.Event(), lambda *_: None)
    assert states(s) == {"a": "device", "b": "device"} and not models["a"].moved and not models["b"].moved
    with pytest.raises(ModelRefused, match="served: a, b"):
        s.generate(job("2", "c"), threading.Event(), lambda *_: None)
    assert s.count_tokens("a b", "b") == {"CLIP": 3} and s.count_tokens("a b") == {"CLIP": 2}
    assert s.loop_key(job("3", "a")) != s.loop_key(job("3", "b"))
    assert [p.name for p in s.profile.served] == ["a", "b"] and s.profile.of("b").name == "b"


def test_under_cpu_offload_no_model_is_ever_moved() -> None:
    s = ModelShelf(device="cpu", budget=1 * MIB, offloaded=True)  # --cpu-offload: accelerate's hooks place them
    models = {name: Sized(name, 2) for name in ("a", "b")}
    for name, model in models.items():
        s.add(name, model)
    s.generate(job("1", "a"), threading.Event(), lambda *_: None)
    s.generate(job("2", "b"), threading.Event(), lambda *_: None)
    assert not models["a"].moved and not models["b"].moved and states(s) == {"a": "memory", "b": "memory"}


def test_on_a_gpu_each_model_loads_beside_none_and_the_default_ends_on_the_device(monkeypatch: Any) -> None:
    """``loading.load_model``'s order on CUDA: before each load the models so far go to CPU memory (one that
    would not fit beside them still loads), then the default comes back first (the CPU plays the device)."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    s = ModelShelf(device="cuda", budget=3 * MIB)  # one fits
    models = {name: Sized(name, 2) for name in ("a", "b", "c")}
    for name, model in models.items():
        s.before_load()
        assert not s.residency.on_device  # nothing on the device while the next one loads
        s.add(name, model)
    s.ready(s.default)
    assert states(s) == {"a": "device", "b": "memory", "c": "memory"} and models["a"].moved == ["cpu", "cuda"]
    assert {m.name: m.state for m in s.profile.residency} == states(s)


def test_residency_plans_by_recency_and_skips_what_is_in_use() -> None:
    r = Residency({"a": 2, "b": 2, "c": 2}, budget=4)
    r.touch("a")
    r.touch("b")
    assert r.plan("c") == ["a"]
    r.touch("a")  # a used again: b is now the least recently used
    assert r.plan("c") == ["b"]
    r.in_use.add("b")
    assert r.plan("c") == ["a"]


def test_the_model_flag_takes_names_and_refuses_a_name_twice() -> None:
    settings = load_settings(["--model", "embedded-default", "--model", "sd=some/hub-id"], {})
    assert [(s.name, s.source) for s in settings.model_specs()] == [("embedded-default", None), ("sd", "some/hub-id")]
    assert settings.model is None and settings.one_model(settings.model_specs()[1]).model == "some/hub-id"
    with pytest.raises(SystemExit, match="given twice"):
        load_settings(["--model", "x=a/b", "--model", "x=c/d"], {})
    with pytest.raises(SystemExit, match="reserved"):
        load_settings(["--model", "default=a/b"], {})
    with pytest.raises(SystemExit, match="device-memory-budget"):
        load_settings(["--device-memory-budget", "0"], {})
