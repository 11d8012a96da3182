"""Text-to-image demo: a Gradio Blocks UI that admits many users and runs one inference at a time.

    python app.py [--model HUB_ID_OR_PATH] [--host 0.0.0.0] [--port 7860] [--share] ...

settings -> create_app -> launch -> signals. The model side (``pipeline/engine``: one named thread
that owns the model and the device) answers the serving side (``pipeline/serving``: the adapter
whose gate wraps only the inference) with plain data; ``pipeline/web`` is the Gradio page and API.
"""

from __future__ import annotations

import os

# Gradio's analytics would phone home from every event; this machine (and many Spaces) can't reach
# it, and it costs a thread per event. Set before gradio is imported, unless the user chose.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# After every event Gradio's queue rebuilds a pandas summary of up to 10,000 past events on a
# worker thread, only for its /monitoring page (off here; /metrics replaces it). That is GIL time
# taken from the event loop and the model thread on every request: keep one record, never recompute.
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(10**12))
os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1")

import logging
import signal
import sys
import threading
from typing import Any, Callable, Sequence

import gradio as gr

from pipeline import allocator
from pipeline.config import Settings, load_settings
from pipeline.errors import EngineDead
from pipeline.protocol import Model, ModelProfile, ModelSide
from pipeline.request import limits_for
from pipeline.serving import owners
from pipeline.serving.base import Adapter
from pipeline.serving.local import LocalAdapter
from pipeline.serving.quota import ImageQuota
from pipeline.serving.sweeper import Sweeper
from pipeline.web import lifecycle
from pipeline.web.gradio_internals import forget_temp_files
from pipeline.web.lifecycle import launch, own_gradio_cache, shutdown
from pipeline.web.page.layout import build_demo

log = logging.getLogger("app")

LOG_FORMAT = "%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s"
__all__ = ["create_app", "launch", "main", "shutdown"]


def start_backend(settings: Settings, load: Callable[[], Model] | None = None) -> Adapter:
    """The backend the settings choose, with its model loaded.

    ``local``: one model side (``start_model_side``) under a ``LocalAdapter``. ``ray``: Ray Serve
    replicas under a ``RayAdapter`` (the only place that imports ``pipeline.ray``). ``load``
    replaces the real loader (tests inject a fake model through it; local backend only).
    """
    if settings.backend == "ray":
        from pipeline.ray.adapter import RayAdapter
        from pipeline.ray.cluster import start, stop

        cluster = start(settings)
        try:
            return RayAdapter(cluster, settings)
        except BaseException:
            stop(cluster)
            raise
    side, profile = start_model_side(settings, load)
    return LocalAdapter(
        side,
        limits_for(settings, profile),
        settings.output_dir,
        job_timeout=settings.job_timeout,
        # A compile takes tens of seconds per new shape (README, --compile): its jobs get room for one.
        auto_limit_floor=300.0 if settings.compile else 30.0,
        max_batch_size=settings.max_batch_size,
        max_waiting_per_user=settings.resolved_max_waiting_per_user(),
        step_joining=settings.step_joining == "on",
    )


def start_model_side(settings: Settings, load: Callable[[], Model] | None = None) -> tuple[ModelSide, ModelProfile]:
    """The local backend's model side, loaded: in a model process of its own, or on a thread here.

    ``process`` (the default): ``ProcessSide``, restarted when it dies; the server never imports
    torch. ``thread``: a ``ModelRunner`` in this process, behind ``@spaces.GPU`` on ZeroGPU (whose
    wrapper is the process boundary there, so ``auto`` picks ``thread`` on ZeroGPU). An injected
    ``load`` runs in-thread unless ``--model-side process`` is asked for (then it must pickle).
    """
    from pipeline.engine.hosting.zerogpu import model_side, zero_gpu_active

    where = settings.model_side
    if where == "auto":
        where = "thread" if zero_gpu_active() or load is not None else "process"
    elif where == "process" and zero_gpu_active():
        log.warning("ZeroGPU: --model-side process is not possible there (@spaces.GPU is the process); using thread")
        where = "thread"
    if where == "process":
        from pipeline.engine.hosting.process import ProcessSide, SettingsLoader

        side = ProcessSide(load if load is not None else SettingsLoader(settings))
        return side, side.profile
    from pipeline.engine.hosting.runner import ModelRunner

    if load is None:
        from pipeline.engine.model.loading import load_model

        def load() -> Model:
            return load_model(settings)

    runner = ModelRunner(load)
    profile = runner.start()
    return model_side(runner), profile


def create_app(settings: Settings, load: Callable[[], Model] | None = None) -> tuple[gr.Blocks, Any]:
    """Start the model side (waits for the model to load) and build the UI around it."""
    adapter = start_backend(settings, load)
    adapter.max_in_flight = settings.admitted()  # every admitted request waits in the fair line, none in Gradio's
    if settings.quota_images_per_hour:  # counted where every protocol meets: the adapter's run
        adapter.quota = ImageQuota(settings.quota_images_per_hour)
    # The app's own sweeper keeps its outputs and Gradio's copies of them within budget, in a
    # Gradio cache folder of its own (never Gradio's shared default).
    gradio_cache = own_gradio_cache(settings, os.environ)
    if settings.output_key:
        owners.use_key(settings.output_dir, settings.output_key)
    owners.key_of(settings.output_dir)  # made at first start: the names in image URLs reveal nobody
    sweeper = Sweeper(
        list(dict.fromkeys([settings.output_dir, gradio_cache])),  # one folder when they are the same
        max_bytes=settings.output_max_mb * 2**20,
        max_age=settings.output_max_age_minutes * 60,
        interval=settings.sweep_interval,
        min_age=min(10.0, settings.sweep_interval),
        max_owners=settings.max_users_on_disk,
    )
    demo = build_demo(adapter, settings)
    # Every output path joins a Gradio temp-file set and would stay there: the sweeper's deletions leave them.
    sweeper.on_deleted = lambda paths: forget_temp_files(demo, paths)
    adapter.on_close(sweeper.stop)
    sweeper.start()
    adapter.metrics.watch_disk(lambda: sweeper.last)
    return demo, adapter


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    allocator.tune()  # before the first image: see pipeline/allocator.py
    settings = load_settings(argv)
    try:
        demo, adapter = create_app(settings)
    except EngineDead as exc:  # the model was refused or failed to load: say why, and exit
        sys.exit(f"cannot serve {settings.model or 'the embedded model'}: {exc}")
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    launch(demo, adapter, settings)
    while not stop.wait(0.5):
        pass
    lifecycle.shutdown(demo, adapter)
    log.info("stopped")


if __name__ == "__main__":
    main()
