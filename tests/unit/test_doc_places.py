"""Docs that cannot go stale about places (issue 37): every file path, dotted module name and
``Class.member`` that the README, ``docs/`` and the docstrings and comments of ``app.py``,
``pipeline/``, ``bench/`` and ``tools/`` name exists where they say (how each is resolved, and which
look-alikes are other libraries': ``tests/places.py``)."""

from __future__ import annotations

import pytest

from tests.places import EXTERNAL, ROOT, Mention, Project, mentions_in, prose, stale


@pytest.fixture(scope="module")
def project() -> Project:
    return Project()


@pytest.fixture(scope="module")
def mentions(project: Project) -> list[Mention]:
    return [m for path, first, text in prose(project) for m in mentions_in(path, first, text)]


def test_every_place_the_prose_names_exists(project: Project, mentions: list[Mention]) -> None:
    assert len(mentions) > 500, len(mentions)  # the docs and the docstrings were read
    bad = stale(mentions, project)
    fix = "name the real place, or add another library's name to EXTERNAL (tests/places.py) with its reason"
    assert not bad, f"stale references (file:line: reference); {fix}:\n" + "\n".join(bad)


def test_every_external_prefix_still_excuses_a_mention(project: Project, mentions: list[Mention]) -> None:
    """``EXTERNAL`` stays small: an entry that no longer excuses a mention goes."""
    excused: set[str] = set()
    stale(mentions, project, excused)
    assert set(EXTERNAL) == excused, sorted(set(EXTERNAL) - excused)


PLANTED = """
The old places: ``engine.runner.ModelRunner`` runs jobs, ``engine.joining`` joins them,
`Sweeper.close` stops the sweeper, `Line.take_joiners_now` picks joiners, `web/handler.request_user`
says who, each member's `Mailbox` (`jobs.py`), a `NoSuchClass.run`, and pipeline/engine/runner.py.
```
  serving/   jobs.py (the batch: GpuJobs, Mailbox)
```
"""

CURRENT = """
The real places: ``engine.hosting.runner.ModelRunner``, ``loop.joining.LoopDriver``, ``serving.scheduler``,
`Sweeper.stop`, `Scheduler.fits`, `WaitLine.order`, `web/page/handler.request_caller`, each member's
`Mailbox` (`scheduler.py`), `LocalAdapter.run` (pipeline/serving/local.py), `engine/hosting/runner.py`,
``bench.harness.Server``, ``tests.helpers.run_loop``. Not ours: `torch.cuda.synchronize`, `gr.Blocks`,
`job.steps`, `loop.run_in_executor`, `DiffusionPipeline.from_pretrained`, `Blocks` (`layout.py`).
```
  serving/   scheduler.py (the line: WaitLine, Mailbox), protocol.py (Output, InferenceResult, StopSignal)
```
"""


def test_a_stale_place_fails_with_its_file_and_the_reference(project: Project) -> None:
    planted = ROOT / "docs" / "planted.md"
    bad = stale(list(mentions_in(planted, 1, PLANTED)), project)
    assert sorted(bad) == sorted(
        [
            "docs/planted.md:2: engine.runner.ModelRunner (no such module, name or member)",
            "docs/planted.md:2: engine.joining (no such module, name or member)",
            "docs/planted.md:3: Sweeper.close (no such module, name or member)",
            "docs/planted.md:3: Line.take_joiners_now (no such module, name or member)",
            "docs/planted.md:3: web.handler.request_user (no such module, name or member)",
            "docs/planted.md:4: Mailbox in jobs.py (not defined there)",
            "docs/planted.md:4: NoSuchClass.run (no such module, name or member)",
            "docs/planted.md:4: pipeline/engine/runner.py (no such file)",
            "docs/planted.md:6: Mailbox in jobs.py (not defined there)",
        ]
    ), bad
    assert stale(list(mentions_in(planted, 1, CURRENT)), project) == []


def test_a_docstring_mention_is_reported_at_its_line(project: Project) -> None:
    source = ROOT / "pipeline" / "planted.py"
    bad = stale(list(mentions_in(source, 40, '"""One.\n\nTwo: ``engine.wire``."""')), project)
    assert bad == ["pipeline/planted.py:42: engine.wire (no such module, name or member)"]
