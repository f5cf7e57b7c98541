import itertools

import pytest

from spark_jobs.backlog.decider import CheckpointDecider, CommittedBatch, ThroughputEstimator
from spark_jobs.backlog.freshness import p95
from tests.spark_jobs.backlog.simulation import (
    Arrivals,
    FakeClock,
    SimBatch,
    config,
    gaps,
    simulate,
    starts,
)


def committed(clock: FakeClock, batch_id: int, seconds: float, rows: int) -> CommittedBatch:
    started = clock.now
    clock.advance(seconds)
    return CommittedBatch(batch_id, started, clock.now, rows)


# --- the first decision -------------------------------------------------------------------


def test_the_first_batch_may_start_at_once_and_take_up_to_the_row_cap():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="1s", interval_during_backlog="30s"), clock)
    assert decider.is_due()
    assert decider.decision.due_at == clock.now
    assert decider.decision.max_rows == 1_000_000


def test_first_status_report_is_not_a_switch():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="10s", interval_during_backlog="1h"), clock)
    decision = decider.on_batch_committed(committed(clock, 0, 2.0, 100_000), job_is_backlog=True)
    assert decision.is_backlog
    assert decision.due_at == clock.now  # back to back, no live deadline to honour


# --- real time ----------------------------------------------------------------------------


def test_real_time_batches_start_one_interval_apart():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="2s"), clock)
    batch = committed(clock, 0, 0.5, 10)
    decision = decider.on_batch_committed(batch, job_is_backlog=False)
    assert decision.due_at == batch.started_at + 2.0
    assert not decider.is_due()
    clock.advance(1.49)
    assert not decider.is_due()
    clock.advance(0.01)
    assert decider.is_due()
    assert decision.max_rows == 1_000_000  # all that has arrived, within the cap
    assert not decision.standing


def test_a_real_time_batch_longer_than_the_interval_is_followed_at_once():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="1s"), clock)
    decider.on_batch_committed(committed(clock, 0, 3.0, 10), job_is_backlog=False)
    assert decider.is_due()


# --- backlog ------------------------------------------------------------------------------


def test_backlog_batches_run_back_to_back_sized_from_measured_throughput():
    clock = FakeClock()
    cfg = config(interval="1s", interval_during_backlog="10s", max_batch_rows="100000000")
    decider = CheckpointDecider(cfg, clock)
    # batches cost 0.5 s plus 1 us per row
    for batch_id, rows in enumerate([100_000, 1_000_000, 3_000_000]):
        decision = decider.on_batch_committed(
            committed(clock, batch_id, 0.5 + rows * 1e-6, rows), job_is_backlog=True
        )
    assert decision.due_at == clock.now
    assert decision.standing
    assert decision.max_rows == pytest.approx(9_500_000, rel=0.01)  # (10 s - 0.5 s) / 1 us


def test_the_first_batch_of_a_run_only_stands_in_until_a_real_measurement():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="1s", interval_during_backlog="1min"), clock)
    warm_up = committed(clock, 0, 12.0, 100_000)
    first = CommittedBatch(0, warm_up.started_at, warm_up.committed_at, 100_000, first_of_run=True)
    # pessimistic: the warm-up batch's own rate, 100k rows per 12 s, for 60 s
    assert decider.on_batch_committed(first, job_is_backlog=True).max_rows == 500_000
    decision = decider.on_batch_committed(committed(clock, 1, 0.5, 100_000), True)
    assert decision.max_rows == 1_000_000


def test_backlog_decisions_stand_once_throughput_is_settled():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="1s", interval_during_backlog="1min"), clock)
    assert not decider.on_batch_committed(committed(clock, 0, 1.0, 1000), True).standing
    assert decider.on_batch_committed(committed(clock, 1, 2.0, 4000), True).standing
    unbounded = CheckpointDecider(config(interval="1s", interval_during_backlog="0"), clock)
    assert unbounded.on_batch_committed(committed(clock, 0, 1.0, 1000), True).standing


def test_backlog_batches_never_exceed_the_row_cap():
    clock = FakeClock()
    decider = CheckpointDecider(
        config(interval="1s", interval_during_backlog="1h", max_batch_rows="250000"), clock
    )
    decision = decider.on_batch_committed(committed(clock, 0, 0.1, 25_000), job_is_backlog=True)
    assert decision.max_rows == 250_000


def test_unset_backlog_interval_sizes_backlog_batches_to_the_interval():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="5s", max_batch_rows="100000000"), clock)
    decision = decider.on_batch_committed(committed(clock, 0, 1.0, 100_000), job_is_backlog=True)
    assert decision.interval_s == 5
    assert decision.max_rows == 500_000  # 100k rows/s for 5 s


def test_min_pause_separates_commit_from_next_start_in_both_modes():
    clock = FakeClock()
    decider = CheckpointDecider(
        config(interval="1s", interval_during_backlog="1min", min_pause="3s"), clock
    )
    backlog = decider.on_batch_committed(committed(clock, 0, 1.0, 1000), job_is_backlog=True)
    assert backlog.due_at == clock.now + 3
    assert not backlog.standing  # each batch must wait for its own commit to be seen
    live = decider.on_batch_committed(committed(clock, 1, 0.2, 10), job_is_backlog=False)
    assert live.due_at == clock.now + 3


# --- switching ----------------------------------------------------------------------------


def test_when_backlog_ends_between_commits_next_is_due_within_one_interval():
    clock = FakeClock()
    decider = CheckpointDecider(
        config(interval="1s", interval_during_backlog="1min", min_pause="5s"), clock
    )
    decider.on_batch_committed(committed(clock, 0, 1.0, 1000), job_is_backlog=True)
    clock.advance(0.5)
    decision = decider.on_status(job_is_backlog=False)
    assert decision.due_at == clock.now + 1  # not the 5 s that min-pause armed in backlog
    assert not decision.is_backlog
    assert decision.interval_s == 1


def test_when_backlog_ends_waiting_live_data_goes_at_once():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="10s", interval_during_backlog="1min"), clock)
    decider.on_batch_committed(committed(clock, 0, 1.0, 1000), job_is_backlog=True)
    assert decider.on_status(job_is_backlog=False).due_at <= clock.now


def test_when_backlog_starts_the_armed_deadline_stands():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="10s", interval_during_backlog="1min"), clock)
    live = decider.on_batch_committed(committed(clock, 0, 1.0, 10), job_is_backlog=False)
    clock.advance(2)
    decision = decider.on_status(job_is_backlog=True)
    assert decision.due_at == live.due_at
    assert decision.is_backlog
    assert decision.interval_s == 60


def test_a_batch_that_reports_backlog_starting_keeps_the_live_deadline_then_runs_back_to_back():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="10s", interval_during_backlog="1min"), clock)
    decider.on_batch_committed(committed(clock, 0, 1.0, 10), job_is_backlog=False)
    clock.advance(9)
    first = committed(clock, 1, 1.0, 10)
    decision = decider.on_batch_committed(first, job_is_backlog=True)
    assert decision.due_at == first.started_at + 10
    clock.now = decision.due_at
    decision = decider.on_batch_committed(committed(clock, 2, 5.0, 5000), job_is_backlog=True)
    assert decision.due_at == clock.now


# --- Flink's integration shapes, over simulated runs --------------------------------------


def test_checkpoints_occur_both_before_and_after_the_switch():
    batches = simulate(
        config(interval="1s", interval_during_backlog="30s"),
        backlog_rows=3_000_000,
        live_rows_per_s=1000,
        seconds=30,
    )
    backlog = [b for b in batches if b.is_backlog]
    live = [b for b in batches if not b.is_backlog]
    assert len(backlog) >= 2 and len(live) >= 10
    assert all(b.rows <= 1_000_000 for b in batches)
    # real time: one batch per interval, start to start
    steady = gaps(starts(live[2:]))
    assert all(0.99 <= g <= 1.11 for g in steady), steady


def test_with_zero_no_periodic_checkpoint_happens_before_the_switch():
    slow = dict(live_rows_per_s=100, seconds=400, row_cost_s=1e-4)  # backlog takes 300 s
    batches = simulate(config(interval="1s", interval_during_backlog="0"), 3_000_000, **slow)
    assert [b.rows for b in batches if b.is_backlog] == [1_000_000] * 3  # the row cap only
    # the same backlog with a time-based backlog interval is also split by time
    timed = simulate(config(interval="1s", interval_during_backlog="10s"), 3_000_000, **slow)
    backlog = [b for b in timed if b.is_backlog]
    assert len(backlog) > 20
    assert all(b.committed_at - b.started_at <= 11 for b in backlog[2:])


def test_with_zero_backlog_is_split_only_by_the_row_cap():
    batches = simulate(
        config(interval="1s", interval_during_backlog="0", max_batch_rows="1000000"),
        backlog_rows=2_500_000,
        live_rows_per_s=100,
        seconds=20,
    )
    assert [b.rows for b in batches if b.is_backlog] == [1_000_000, 1_000_000, 500_000]


def test_backlog_batches_are_far_fewer_and_larger_than_live_ones():
    batches = simulate(
        config(interval="1s", interval_during_backlog="30s"),
        backlog_rows=2_000_000,
        live_rows_per_s=2000,
        seconds=40,
    )
    backlog = [b for b in batches if b.is_backlog]
    live = [b for b in batches if not b.is_backlog]
    assert len(backlog) * 5 < len(live)
    assert min(b.rows for b in backlog) > 20 * max(b.rows for b in live[3:])


def test_backlog_drains_back_to_back():
    batches = simulate(
        config(interval="1s", interval_during_backlog="30s"),
        backlog_rows=2_000_000,
        live_rows_per_s=10,
        seconds=20,
    )
    backlog = [b for b in batches if b.is_backlog]
    idle = [b.started_at - a.committed_at for a, b in itertools.pairwise(backlog)]
    assert all(gap <= 0.15 for gap in idle)  # at most a tick (0.1 s) after the plan (0.05 s)


# --- the throughput estimate --------------------------------------------------------------


def test_estimator_separates_fixed_cost_from_per_row_cost():
    estimator = ThroughputEstimator()
    for rows in (10_000, 100_000, 1_000_000):
        estimator.observe(rows, 0.4 + rows * 2e-6)
    assert estimator.rows_for(10.4) == pytest.approx(5_000_000, rel=0.001)


def test_estimator_without_spread_folds_the_fixed_cost_in():
    estimator = ThroughputEstimator()
    estimator.observe(100_000, 1.0)
    assert estimator.rows_for(2.0) == 200_000


def test_a_target_below_the_fixed_cost_still_amortises_it_instead_of_shrinking_batches():
    estimator = ThroughputEstimator()
    estimator.observe(100, 1.68)  # measured on a slow machine: fixed cost about 1.3 s
    estimator.observe(60, 1.54)
    assert estimator.rows_for(1.0) == 380  # as many rows as the fixed cost takes (1.33 s)


def test_batches_whose_data_time_drowns_in_noise_at_least_double():
    estimator = ThroughputEstimator()
    estimator.observe(100, 0.9)
    estimator.observe(200, 0.8)  # more rows, less time: the fit says nothing
    assert estimator.rows_for(1.0) == 400


def test_backlog_under_a_short_interval_does_not_collapse_into_tiny_batches():
    batches = simulate(
        config(interval="1s", max_batch_rows="1000000"),
        backlog_rows=3_000_000,
        live_rows_per_s=100,
        seconds=30,
        overhead_s=0.8,
        row_cost_s=3e-6,
    )
    backlog = [b.rows for b in batches if b.is_backlog][3:-1]  # the last one is the rest
    assert backlog and min(backlog) >= 250_000  # 0.8 s of fixed cost is 266k rows' worth


def test_estimator_does_not_extrapolate_beyond_ten_times_what_it_saw():
    estimator = ThroughputEstimator()
    estimator.observe(1000, 0.001)
    assert estimator.rows_for(3600) == 10_000


def test_estimator_knows_nothing_before_a_measurement():
    estimator = ThroughputEstimator()
    estimator.observe(0, 1.0)  # empty batches say nothing about throughput
    assert estimator.rows_for(10) is None


# --- reconfiguration while running ---------------------------------------------------------


def test_a_shorter_interval_in_real_time_brings_the_next_batch_forward():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="30s"), clock)
    decider.on_batch_committed(committed(clock, 0, 1.0, 10), job_is_backlog=False)
    assert decider.decision.due_at == clock.now + 29.0
    decision = decider.reconfigure(config(interval="5s"))
    assert (decision.interval_s, decision.due_at) == (5.0, clock.now + 5.0)
    # a longer one leaves the armed deadline; later batches follow the new interval
    decider.reconfigure(config(interval="1min"))
    assert decider.decision.due_at == clock.now + 5.0
    batch = committed(clock, 1, 1.0, 10)
    assert decider.on_batch_committed(batch, job_is_backlog=False).due_at == (
        batch.started_at + 60.0
    )


def test_a_new_backlog_interval_resizes_backlog_batches():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="1s", interval_during_backlog="10s"), clock)
    for batch_id in range(3):
        decider.on_batch_committed(committed(clock, batch_id, 10.0, 100_000), True)
    before = decider.decision.max_rows
    after = decider.reconfigure(config(interval="1s", interval_during_backlog="20s"))
    assert (after.is_backlog, after.interval_s, after.due_at) == (True, 20.0, clock.now)
    assert after.max_rows == 2 * before


# --- a freshness target instead of a live interval ------------------------------------------


def live_after(batches: list[SimBatch], seconds: float) -> list[SimBatch]:
    """Live batches with rows that started ``seconds`` or more after the first batch."""
    t0 = batches[0].started_at
    return [
        b
        for b in batches
        if not b.is_backlog and b.freshness_s is not None and b.started_at - t0 >= seconds
    ]


def test_a_target_is_met_with_far_fewer_checkpoints_than_a_short_interval():
    run = dict(backlog_rows=3_000_000, live_rows_per_s=2000, seconds=400)
    targeted = simulate(config(interval="30s", freshness_target="5s"), **run)
    fixed = simulate(config(interval="1s", interval_during_backlog="30s"), **run)
    steady = live_after(targeted, 100)
    assert p95([b.freshness_s for b in steady]) <= 5.0
    assert 4.0 <= min(b.interval_s for b in steady) <= max(b.interval_s for b in steady) <= 5.0
    assert len(live_after(fixed, 100)) >= 3 * len(steady)
    # every change is said once, with its reason; the first until live batches are measured
    reasons = [b.interval_reason for b in targeted if b.interval_reason]
    assert reasons[0] == "freshness target 5s: 2.50s until 3 live batches are measured"
    assert all(r.startswith("freshness target 5s: ") for r in reasons)
    assert 2 <= len(reasons) <= 5
    # backlog keeps its own interval
    assert {b.interval_s for b in targeted if b.is_backlog} == {30.0}


def test_event_time_behind_arrival_makes_the_interval_shorter_not_the_data_older():
    run = dict(backlog_rows=0, live_rows_per_s=2000, seconds=300)
    punctual = simulate(config(interval="30s", freshness_target="5s"), **run)
    delayed = simulate(config(interval="30s", freshness_target="5s"), event_delay_s=1.0, **run)
    assert p95([b.freshness_s for b in live_after(delayed, 60)]) <= 5.0
    assert live_after(delayed, 60)[-1].interval_s < live_after(punctual, 60)[-1].interval_s - 0.8


def test_after_a_rate_step_the_target_is_met_again():
    batches = simulate(
        config(interval="30s", freshness_target="5s"),
        backlog_rows=0,
        live_rows_per_s=2000,
        seconds=600,
        row_cost_s=2e-5,  # 20,000 rows a second cost 0.4 s of every second
        arrivals=Arrivals(2000, step_at_s=200, step_rows_per_s=20_000),
    )
    before = live_after(batches, 100)[0].interval_s
    after = live_after(batches, 400)
    assert p95([b.freshness_s for b in after]) <= 5.0
    assert max(b.interval_s for b in after) < before


def test_a_target_that_cannot_be_met_runs_batches_back_to_back_and_says_why():
    batches = simulate(
        config(interval="30s", freshness_target="5s"),
        backlog_rows=0,
        live_rows_per_s=2000,
        seconds=200,
        overhead_s=6.0,
    )
    reasons = [b.interval_reason for b in batches if b.interval_reason]
    assert reasons[-1].startswith(
        "freshness target 5s cannot be met: at the shortest interval (0.00s, min-pause)"
    )
    assert {b.interval_s for b in live_after(batches, 100)} == {0.0}
    assert len(reasons) == 2


def test_the_interval_bounds_the_choice_from_above_and_min_pause_from_below():
    run = dict(backlog_rows=0, live_rows_per_s=2000, seconds=200)
    capped = simulate(config(interval="2s", freshness_target="5s"), **run)
    assert {b.interval_s for b in live_after(capped, 20)} == {2.0}
    paused = simulate(
        config(interval="30s", freshness_target="5s", min_pause="4.5s"), overhead_s=1.0, **run
    )
    assert {b.interval_s for b in live_after(paused, 100)} == {4.5}


def test_a_new_target_applies_at_once_and_is_said():
    clock = FakeClock()
    decider = CheckpointDecider(config(interval="30s"), clock)
    decider.on_batch_committed(committed(clock, 0, 0.5, 10), job_is_backlog=False)
    assert decider.decision.interval_s == 30.0
    decision = decider.reconfigure(config(interval="30s", freshness_target="4s"))
    assert (decision.interval_s, decision.due_at) == (2.0, clock.now + 2.0)
    assert decision.interval_reason == (
        "freshness target 4s: 2.00s until 3 live batches are measured"
    )
    clock.advance(1.5)
    following = decider.on_batch_committed(committed(clock, 1, 0.5, 10), job_is_backlog=False)
    assert following.interval_s == 2.0 and following.interval_reason is None
