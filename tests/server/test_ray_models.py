"""Several models on the Ray Serve backend (issue 52 §6): two CPU replicas, two models (the embedded model and a
tiny SD 1.5 build), Serve's model multiplexing (``@serve.multiplexed``, one model per replica's LRU).

Each request is answered by a replica holding its model (the multiplexed id it ran under is its model), with
its model's picture; each replica runs one inference at a time (its own gate)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from pipeline.config import Settings
from pipeline.protocol import Output
from tests.families import built_family
from tests.helpers import ray_backend

ray = pytest.importorskip("ray")

from pipeline.ray import cluster as ray_cluster  # noqa: E402
from pipeline.ray.adapter import RayAdapter  # noqa: E402

pytestmark = pytest.mark.timeout(300)
MODELS = ("embedded-default", "tiny")


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayAdapter]:
    tmp = tmp_path_factory.mktemp("ray-models")
    models = ("embedded-default", f"tiny={built_family('sd1')}")
    assert ray_cluster.models_per_replica(Settings(backend="ray", replicas=2, models=models)) == 1
    with ray_backend(tmp, models=models) as adapter:
        yield adapter


def req(model: str, seed: int = 3) -> dict[str, Any]:
    return {"prompt": "a red circle on a blue background", "negative_prompt": "", "seed": seed,
            "randomize_seed": False, "width": 64, "height": 64, "num_inference_steps": 6, "guidance_scale": 4.0,
            "num_images": 1, "live_preview": False, "model": model}  # fmt: skip


async def done_of(adapter: RayAdapter, raw: dict[str, Any]) -> Output:
    async with contextlib.aclosing(adapter.run(raw)) as stream:
        async for event in stream:
            if event.kind == "done":
                return event
    raise AssertionError("no result")


def picture(done: Output) -> np.ndarray:
    with Image.open(Path(done.paths[0])) as png:
        return np.asarray(png.convert("RGB"), np.float32)


@pytest.mark.anyio
async def test_each_request_runs_on_a_replica_holding_its_model(side: RayAdapter) -> None:
    assert [p.model_id for p in side.profile.served] == list(MODELS)
    first = {m: await done_of(side, req(m)) for m in MODELS}  # each model's first request loads it on a replica
    assert np.abs(picture(first[MODELS[0]]) - picture(first[MODELS[1]])).mean() > 10  # two models, two pictures
    results = await asyncio.gather(*(done_of(side, req(MODELS[i % 2])) for i in range(8)))
    by_replica: dict[str, list[tuple[float, float]]] = {}
    for i, done in enumerate(results):
        model = MODELS[i % 2]
        assert done.info["model"] == model and done.info["multiplexed_model_id"] == model
        assert np.abs(picture(done) - picture(first[model])).mean() < 0.5  # its model's picture (a loop's noise)
        t = done.info["timings"]
        by_replica.setdefault(done.info["replica"], []).append((t["infer_start"], t["infer_end"]))
    for replica, intervals in by_replica.items():  # one inference at a time on each replica: overlaps 0
        ordered = sorted(set(intervals))
        assert all(s2 >= e1 for (_, e1), (s2, _) in zip(ordered, ordered[1:])), replica
    assert len(by_replica) == 2, list(by_replica)
    # Idle, Serve routes a request to the replica whose LRU holds its model (one model a replica): each model's
    # requests, one after another, go to one replica, and the two models to two (a burst may borrow either).
    # Serve's routing reads cached queue lengths and falls back to any replica when its probes are slow (a
    # loaded machine, once in a full run): three tries, the affinity shown in one.
    for _ in range(3):
        ran: dict[str, set[str]] = {m: set() for m in MODELS}
        for model in (*MODELS, *MODELS, *MODELS):
            done = await done_of(side, req(model))
            ran[model].add(done.info["replica"])
        if all(len(replicas) == 1 for replicas in ran.values()) and ran[MODELS[0]] != ran[MODELS[1]]:
            break
    assert all(len(replicas) == 1 for replicas in ran.values()) and ran[MODELS[0]] != ran[MODELS[1]], ran


@pytest.mark.anyio
async def test_a_model_name_no_replica_serves_is_refused_at_the_front(side: RayAdapter) -> None:
    from pipeline.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="model must be one of"):
        await done_of(side, req("nope"))
