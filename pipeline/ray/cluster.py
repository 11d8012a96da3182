"""Start Ray (or join a cluster), deploy ``ModelReplica``, and tear it down again.

Ray Serve routes each request to a replica and bounds admission:

- ``max_ongoing_requests = max_batch_size``: a replica admits as many requests as one batch can
  carry, so compatible requests meet inside it; its gate still runs one inference at a time.
- ``max_queued_requests = queue_size``: past that, Ray answers ``BackPressureError``, which the
  front end turns into ``QueueFull`` ("the queue is full, retry in a moment").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..config import Settings
from .replica import ModelReplica

APP_NAME = "t2i"
REPO_ROOT = Path(__file__).resolve().parent.parent.parent


# -- starting Ray and the deployment ---------------------------------------------------------------
@dataclass
class RayCluster:
    """What ``start`` set up, so ``stop`` undoes exactly that."""

    handle: Any
    replicas: int
    started_ray: bool
    replica_cpus: float
    replica_gpus: float
    app_name: str = APP_NAME


def replica_resources(settings: Settings, cluster: Mapping[str, float]) -> tuple[float, float]:
    """(CPUs, GPUs) per replica: the settings, or the cluster split evenly (one GPU each where there are GPUs)."""
    gpus = settings.replica_gpus
    if gpus is None:
        gpus = 1.0 if cluster.get("GPU", 0) >= settings.replicas and settings.device in ("auto", "cuda") else 0.0
    cpus = settings.replica_cpus
    if cpus is None:
        cpus = max(1.0, float(int(cluster.get("CPU", 1) // settings.replicas)))
    return cpus, gpus


def start(settings: Settings, app_name: str = APP_NAME) -> RayCluster:
    """Connect to ``settings.ray_address`` or start a local Ray (no dashboard), then deploy the replicas."""
    import ray
    from ray import serve

    started = False
    if not ray.is_initialized():
        if settings.ray_address:
            # A real cluster: ship this checkout to the workers.
            runtime_env = {
                "working_dir": str(REPO_ROOT),
                "excludes": [".git", "test-artifacts", "bench/results", "__pycache__"],
            }
            ray.init(address=settings.ray_address, runtime_env=runtime_env, log_to_driver=False)
        else:
            # Local: the workers import this checkout from the same disk.
            path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
            ray.init(
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path, "RAY_SERVE_LOG_TO_STDERR": "0"}},
            )
        started = True
    cpus, gpus = replica_resources(settings, ray.cluster_resources())
    per_replica = settings
    if settings.torch_threads is None:
        per_replica = dataclasses.replace(settings, torch_threads=max(1, int(cpus)))
    serve.start(proxy_location="Disabled")
    app = deployment(models_per_replica(settings)).options(**deployment_options(settings, cpus, gpus)).bind(per_replica)
    handle = serve.run(app, name=app_name, route_prefix=None)
    return RayCluster(handle, settings.replicas, started, cpus, gpus, app_name)


def stop(cluster: RayCluster) -> None:
    import ray
    from ray import serve

    with contextlib.suppress(Exception):
        serve.delete(cluster.app_name)
    if cluster.started_ray:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def deployment_options(settings: Settings, cpus: float, gpus: float) -> dict[str, Any]:
    """Replicas, their admission bounds (see the module docstring) and their resources."""
    return {
        "num_replicas": settings.replicas,
        "max_ongoing_requests": settings.max_batch_size,
        "max_queued_requests": settings.queue_size,
        "ray_actor_options": {"num_cpus": cpus, "num_gpus": gpus},
        "health_check_period_s": 2.0,
        "graceful_shutdown_timeout_s": 5.0,
    }


_DEPLOYMENTS: dict[int, Any] = {}


def models_per_replica(settings: Settings) -> int:
    """Several models (issue 52): how many each replica holds in Serve's multiplexing LRU, the models shared
    out over the replicas (two models on two replicas: one each, so each request goes where its model is)."""
    models = len(settings.model_specs())
    return max(1, -(-models // settings.replicas))


def deployment(models: int = 1) -> Any:
    """``ModelReplica`` as a Ray Serve deployment (built once per LRU size, when Ray is first needed).

    Several models: its ``held`` is Serve's ``@serve.multiplexed`` (``max_num_models_per_replica=models``):
    Serve keeps each replica's models in an LRU and routes a request whose ``multiplexed_model_id`` one
    holds to it; every replica has every model loaded (``engine.model.shelf``), so what the LRU decides is
    which replica a model's requests go to, and so which models stay on its device."""
    if models not in _DEPLOYMENTS:
        from ray import serve

        class Multiplexed(ModelReplica):
            @serve.multiplexed(max_num_models_per_replica=models)
            async def held(self, model_id: str) -> str:
                return model_id

        Multiplexed.__name__ = Multiplexed.__qualname__ = "ModelReplica"
        _DEPLOYMENTS[models] = serve.deployment(name="ModelReplica")(Multiplexed)
    return _DEPLOYMENTS[models]
