import json
from datetime import UTC, datetime, timedelta

import pytest

from spark_jobs.coordinator.progress import BatchProgress
from tools.benchmarks.cost_probe import PARTS, RunCost, combine, run_cost, summary, table

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def progress(batch_id, start_s, parts, state_commit_ms=(40, 60)):
    """A committed batch's progress: its parts back to back, then 5 ms of Spark's own."""
    return BatchProgress.from_json(
        json.dumps(
            {
                "id": "q",
                "runId": "r",
                "name": "cost",
                "batchId": batch_id,
                "timestamp": (T0 + timedelta(seconds=start_s)).isoformat(),
                "numInputRows": 4000,
                "durationMs": {**parts, "triggerExecution": sum(parts.values()) + 5},
                "stateOperators": [{"commitTimeMs": ms} for ms in state_commit_ms],
                "sources": [],
                "sink": {},
            }
        )
    )


PARTS_MS = {
    "latestOffset": 2,
    "getBatch": 0,
    "queryPlanning": 30,
    "walCommit": 40,
    "addBatch": 400,
    "commitOffsets": 23,
}  # 495 ms, 500 ms with Spark's own


def test_a_run_costs_its_median_commit_to_commit_cycle_after_the_warm_up():
    # Two warm-up batches, then batches 500 ms long every 600 ms: a 100 ms gap.
    batches = [progress(0, 0.0, PARTS_MS | {"addBatch": 9000}), progress(1, 10.0, PARTS_MS)]
    batches += [progress(n, 11.0 + 0.6 * (n - 2), PARTS_MS) for n in range(2, 8)]
    cost = run_cost(list(reversed(batches)), handling_ms=[3.0, 5.0, 4.0])
    assert cost.batches == 6
    assert cost.cycle_ms == pytest.approx(600)
    assert cost.gap_ms == pytest.approx(100)
    assert cost.trigger_ms == 500
    assert cost.parts_ms == PARTS_MS
    assert cost.state_commit_ms == 100
    assert cost.handling_ms == 4.0


def test_a_run_too_short_to_measure_is_refused():
    with pytest.raises(ValueError, match="3 batches: too few"):
        run_cost([progress(n, n, PARTS_MS) for n in range(3)])


def cost(cycle_ms, handling_ms=None):
    return RunCost(6, cycle_ms, 10.0, cycle_ms - 10, dict.fromkeys(PARTS, 1.0), 50.0, handling_ms)


def test_rounds_combine_by_the_median_of_each_figure():
    combined = combine([cost(500), cost(700, 4.0), cost(600, 6.0)])
    assert (combined.batches, combined.cycle_ms, combined.handling_ms) == (18, 600, 5.0)


def test_the_table_and_summary_compare_each_variant_with_the_baseline():
    costs = {"plain": cost(500), "gated": cost(520, 4.0), "tuned": cost(300)}
    lines = table(costs, "plain")
    assert lines[0].split()[:4] == ["variant", "cycle", "x", "plain"]
    assert lines[2].split()[:3] == ["gated", "520", "1.04"]
    assert lines[3].split()[-1] == "-" and lines[2].split()[-1] == "4.0"
    found = summary(costs, "plain")
    assert found["cycle_ratio"] == {"plain": 1.0, "gated": 1.04, "tuned": 0.6}
    assert found["driver_handling_ms"]["plain"] is None
