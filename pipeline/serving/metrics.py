"""Prometheus metrics for one adapter, in its own registry (so tests and apps never collide)."""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..protocol import ModelState

OUTCOMES = ("completed", "cancelled", "failed", "rejected")
_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self, gpu_queue_depth: Callable[[], float], inference_in_progress: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.denoise_steps = Counter("denoise_steps", "Denoising steps run on the model thread", registry=r)
        self.jobs = Counter("jobs", "Finished generate requests by outcome", ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.jobs.labels(outcome)  # export every outcome from the start, at 0
        self.images = Counter("images_generated", "Images returned to users", registry=r)
        Gauge("inference_in_progress", "1 while the model runs a job", registry=r).set_function(inference_in_progress)
        Gauge("gpu_queue_depth", "Prepared requests waiting for the GPU gate", registry=r).set_function(gpu_queue_depth)
        self.in_flight = Gauge("requests_in_flight", "Requests inside the generate handler", registry=r)
        self.gate_wait = Histogram(
            "gate_wait_seconds", "Time waiting for the GPU gate", buckets=_TIME_BUCKETS, registry=r
        )
        self.inference = Histogram("inference_seconds", "Time in the model", buckets=_TIME_BUCKETS, registry=r)
        self.steps_after_stop = Histogram(
            "steps_after_stop",
            "Denoising steps a cancelled job ran after its stop event was set",
            buckets=(0, 1, 2, 5, 10),
            registry=r,
        )
        self.stops = Counter(
            "stops", "Requests stopped through Adapter.abort, by how they were stopped", ["reason"], registry=r
        )
        self.batch_images = Histogram(
            "batch_images",
            "Images per inference job (requests batched together)",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=r,
        )
        self.oom_retries = Counter(
            "oom_batch_retries", "Batched jobs retried one request at a time after OOM", registry=r
        )
        self.finalize = Histogram("finalize_seconds", "PNG encoding and info record", buckets=_TIME_BUCKETS, registry=r)
        # Several models (issue 52): the moves a job waited for, and each model's place after the last job.
        self.model_switch = Histogram(
            "model_switch_seconds", "Moves of models onto the device a job waited for", buckets=_TIME_BUCKETS,
            registry=r)  # fmt: skip
        self.model_on_device = Gauge("model_on_device", "1 while a model is on the device", ["model"], registry=r)
        self.model_moves = Gauge("model_moves", "Times a model was moved on or off the device", ["model"], registry=r)
        self.model_last_move = Gauge("model_last_move_seconds", "A model's last move's time", ["model", "direction"],
                                     registry=r)  # fmt: skip
        self.models: tuple[ModelState, ...] = ()  # the last reported states (``/health``'s "models")
        self.last_switch_seconds = 0.0  # the last switch measured (the ETA adds it where the model changes)
        self.last_model = ""  # the model the last job ran on

    def set_models(self, states: tuple[ModelState, ...]) -> None:
        """Where every model is (several models, issue 52): after each job, as its result reports it."""
        self.models = states
        for s in states:
            self.model_on_device.labels(s.name).set(1.0 if s.state == "device" else 0.0)
            self.model_moves.labels(s.name).set(s.moves)
            self.model_last_move.labels(s.name, "in").set(s.last_in_ms / 1000)
            self.model_last_move.labels(s.name, "out").set(s.last_out_ms / 1000)

    def watch_disk(self, stats: Callable[[], object]) -> None:
        """Export the sweeper's last count of kept output files and bytes."""
        Gauge("output_files", "Generated files kept on disk", registry=self.registry).set_function(
            lambda: float(getattr(stats(), "files", 0))
        )
        Gauge("output_bytes", "Bytes of generated files kept on disk", registry=self.registry).set_function(
            lambda: float(getattr(stats(), "bytes", 0))
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
