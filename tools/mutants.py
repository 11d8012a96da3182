"""Break the concurrency code on purpose and check that the tests guarding it fail.

    python -m tools.mutants [NAME ...]

Each mutant edits one file in a scratch copy of the repo (the working tree is never touched) and
runs the tests that must catch it. A mutant that survives (its tests pass) is a test that cannot
fail; the script exits non-zero then. Not part of the CI suite: it takes a few minutes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATE = "                await self._gate.acquire()\n"
RELEASE = "            self._gate.release()\n            self._line.notify()  # the gate opened: wake the line\n"


@dataclass(frozen=True)
class Mutant:
    name: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new)
    tests: str  # pytest node ids, space-separated


NO_GATE = (("pipeline/adapter.py", GATE, "                pass  # MUTANT\n"),
           ("pipeline/adapter.py", RELEASE, "            self._line.notify()  # MUTANT\n"))
ADAPTER = "pipeline/adapter.py"
THREAD_PER_JOB = (
    "pipeline/worker.py",
    "            self._tasks.put(_Task(job, stop, on_step, future))\n",
    "            threading.Thread(target=self._run, args=(_Task(job, stop, on_step, future),)).start()\n",
)
MUTANTS = [
    Mutant("no-gate", NO_GATE, "tests/test_gate.py::test_eight_concurrent_requests_never_overlap_in_inference"),
    Mutant(
        "gate-wraps-whole-request",
        (
            ("pipeline/adapter.py", "        self._gate = asyncio.Semaphore(1)\n",
             "        self._gate = asyncio.Semaphore(1)\n        self._whole = asyncio.Semaphore(1)\n"),
            ("pipeline/adapter.py",
             "        loop = asyncio.get_running_loop()\n        t: dict[str, float] = {\"received\": self._clock()}\n",
             "        async with self._whole:\n            async for e in self._inner(raw, request_id, alive):\n"
             "                yield e\n\n    async def _inner(self, raw, request_id, alive):\n"
             "        loop = asyncio.get_running_loop()\n        t: dict[str, float] = {\"received\": self._clock()}\n"),
        ),
        "tests/test_gate.py::test_preparation_overlaps_another_inference "
        "tests/test_gate.py::test_finalize_overlaps_the_next_inference",
    ),
    Mutant("no-gate-and-a-thread-per-job", (*NO_GATE, THREAD_PER_JOB),
           "tests/test_model.py::test_the_same_load_through_the_adapter_never_races"),
    # The plain `async with sem: await asyncio.to_thread(infer)`: a fresh thread per job, and the
    # gate released as soon as the waiting coroutine is cancelled.
    Mutant(
        "to-thread-releases-the-gate-on-cancel",
        (THREAD_PER_JOB, (ADAPTER, "            if not await _until_done(future, timeout=self.job_timeout):\n",
                          "            while not future.done() and not stop.is_set():\n"
                          "                await asyncio.sleep(0.001)\n"
                          "            if not future.done():\n"
                          "                return Cancelled()  # MUTANT: the gate opens, the thread still runs\n"
                          "            if not await _until_done(future, timeout=self.job_timeout):\n")),
        "tests/test_cancel.py::test_cancel_mid_inference_stops_within_one_step_and_holds_the_gate",
    ),
    # Dynamic batching: each rule of take_batch and of a batch's stop, broken once.
    Mutant("batch-ignores-compatibility", ((ADAPTER, " or member.key != head.key", ""),),
           "tests/test_batching.py::test_incompatible_requests_are_not_merged"),
    Mutant("no-batching", ((ADAPTER, "            if images + member.request.num_images <= max_images:\n",
                            "            if False:  # MUTANT\n"),),
           "tests/test_batching.py::test_compatible_waiting_requests_share_one_job_and_keep_their_own_images"),
    Mutant("batch-ignores-max-size", ((ADAPTER, "<= max_images:", "<= 10**6:"),),
           "tests/test_batching.py::test_max_batch_size_bounds_the_images_in_a_job"),
    Mutant("one-cancel-stops-the-batch", ((ADAPTER, "        if all(m.stop.is_set() for m in self.members):",
                                           "        if any(m.stop.is_set() for m in self.members):"),),
           "tests/test_batching.py::test_cancelling_one_member_does_not_fail_the_others"),
    Mutant("oom-no-retry", ((ADAPTER, " and len(batch.members) > 1:", " and False:"),),
           "tests/test_batching.py::test_out_of_memory_in_a_batch_is_retried_one_request_at_a_time"),
    # gr.skip() for the gallery in progress outputs (Gradio rebuilds the component at every yield).
    Mutant("skip-in-progress", (("app.py", "out: tuple[Any, ...] = (None, record, status_html(text))",
                                 "out: tuple[Any, ...] = (gr.skip(), record, status_html(text))"),),
           "tests/test_lifecycle.py::test_progress_outputs_never_rebuild_a_component"),
    # The Ray backend: a replica that admits 8 requests and runs each on its own thread, with no
    # gate; and a front end that never forwards a cancel to the replica.
    Mutant("ray-replica-without-a-gate",
           (*NO_GATE, THREAD_PER_JOB,
            ("pipeline/ray_backend.py", "max_ongoing_requests=settings.max_batch_size,", "max_ongoing_requests=8,")),
           "tests/test_ray.py::test_requests_spread_over_both_replicas_one_inference_each_at_a_time"),
    Mutant("ray-cancel-not-forwarded",
           (("pipeline/ray_backend.py", "        call.cancel()\n", "        pass  # MUTANT\n"),),
           "tests/test_ray.py::test_cancel_stops_the_remote_job_at_the_next_step"),
    # Rely on Gradio alone to notice a vanished client (it tells the handler at its next yield).
    Mutant("no-disconnect-watch",
           (("app.py", "                alive = caller_alive(demo)\n", "                alive = None\n"),),
           "tests/test_lifecycle.py::test_a_dropped_connection_stops_the_job"),
    # Stop says "stopped" without waiting for the session's job to end (what a timer in the page did).
    Mutant("stop-answers-at-once",
           (("app.py", "if session and not await page_jobs.wait_ended(session, STOP_WAIT_SECONDS):",
             "if False:  # MUTANT"),),
           "tests/test_browser.py::test_stop_cancels_the_running_job"),
    # Trust the slider: no server-side check of num_inference_steps.
    Mutant("no-steps-validation", (("pipeline/request.py",
            '    steps = _whole_number("num_inference_steps", raw.get("num_inference_steps"), limits.min_steps, limits.max_steps)\n',
            '    steps = raw.get("num_inference_steps")  # MUTANT\n'),),
           "tests/test_fuzz.py::test_raw_http_fuzz"),
    # Rely on nothing to bound the disk.
    Mutant("no-sweeper", (("app.py", "    sweeper.start()\n", "    pass  # MUTANT\n"),),
           "tests/test_load.py::test_soak_memory_and_files_level_off"),
    # The plain demo.close() on a signal.
    Mutant("plain-close-on-signal", (("app.py", "    shutdown(demo, adapter)\n", "    demo.close()\n"),),
           "tests/test_shutdown.py"),
]


def _apply(root: Path, file: str, old: str, new: str) -> None:
    path = root / file
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"mutant no longer applies: {old!r} not in {file}")
    path.write_text(text.replace(old, new, 1))


def run(mutant: Mutant) -> bool:
    """True if the tests caught the mutant (failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "repo"
        shutil.copytree(ROOT, scratch, ignore=shutil.ignore_patterns(".git", "__pycache__", "default-model"))
        model = ROOT / "assets" / "default-model"
        if model.exists():
            (scratch / "assets" / "default-model").symlink_to(model)
        for edit in mutant.edits:
            _apply(scratch, *edit)
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutant.tests.split()]
        result = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True)
    caught = result.returncode != 0
    last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"{'caught  ' if caught else 'SURVIVED'} {mutant.name}: {last}")
    return caught


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    return 0 if all([run(m) for m in chosen]) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
