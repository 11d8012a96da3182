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
    app = deployment().options(**deployment_options(settings, cpus, gpus)).bind(per_replica)
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


_DEPLOYMENT: Any = None


def deployment() -> Any:
    """``ModelReplica`` as a Ray Serve deployment (built once, when Ray is first needed)."""
    global _DEPLOYMENT
    if _DEPLOYMENT is None:
        from ray import serve

        _DEPLOYMENT = serve.deployment(name="ModelReplica")(ModelReplica)
    return _DEPLOYMENT
