"""bench.queue_model's arithmetic: the two designs as ideal queues (no server, no timing)."""

from __future__ import annotations

import pytest

from bench import queue_model as qm


def flat(ms: float) -> qm.Cost:
    return lambda b: ms


def test_with_a_batch_of_one_both_designs_are_the_same_fifo_queue() -> None:
    arrivals = qm.poisson(40.0, 2000, seed=3)
    job = qm.job_level(arrivals, 5, flat(0.004), 1)
    step = qm.step_level(arrivals, 5, flat(0.004), 1)
    assert step == pytest.approx(job)


def test_a_late_arrival_joins_the_running_loop_but_waits_for_the_job() -> None:
    # one step costs 1 s whatever the batch; a 3-step request at 0, a second at 0.5 s
    job = qm.job_level([0.0, 0.5], 3, flat(1.0), 4)
    step = qm.step_level([0.0, 0.5], 3, flat(1.0), 4)
    assert job == pytest.approx([3.0, 5.5])  # the second waits for the first job's end, then 3 steps
    assert step == pytest.approx([3.0, 3.5])  # it joins at the step boundary at 1 s: steps 2-4


def test_a_batch_costs_alpha_per_extra_image() -> None:
    cost = {b: 1 + 0.5 * (b - 1) for b in range(1, 5)}
    assert qm.job_level([0.0, 0.0, 0.0], 2, cost.__getitem__, 4) == pytest.approx([4.0, 4.0, 4.0])


def test_percentiles_are_linear_between_ranks() -> None:
    assert qm.percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert qm.percentile([0, 10], 0.99) == pytest.approx(9.9)
