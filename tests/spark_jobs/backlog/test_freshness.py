import pytest

from spark_jobs.backlog.freshness import (
    Bounds,
    FreshnessWindow,
    LiveBatch,
    live_batch,
    oldest_event_at,
)

WIDE = Bounds(0.0, 60.0)


def steady(freshness_s: float, interval_s: float = 2.0, rows: int = 1000) -> LiveBatch:
    return LiveBatch(interval_s, interval_s, freshness_s, 0.5, rows)


def window_of(*batches: LiveBatch) -> FreshnessWindow:
    window = FreshnessWindow()
    for batch in batches:
        window.observe(batch)
    return window


# --- one batch ----------------------------------------------------------------------------


def test_a_batch_is_judged_by_its_oldest_event_or_else_by_the_previous_start():
    by_event = live_batch(2.0, 100.0, 100.5, 10, previous_started_at=98.0, oldest_event_at=97.5)
    assert by_event == LiveBatch(
        interval_s=2.0, gap_s=2.0, freshness_s=3.0, duration_s=0.5, rows=10
    )
    by_arrival = live_batch(2.0, 100.0, 100.5, 10, previous_started_at=98.0, oldest_event_at=None)
    assert by_arrival is not None and by_arrival.freshness_s == 2.5


@pytest.mark.parametrize(("rows", "previous"), [(0, 98.0), (10, None), (10, 100.0), (10, 101.0)])
def test_a_batch_without_rows_or_a_batch_before_it_says_nothing(rows, previous):
    assert live_batch(2.0, 100.0, 100.5, rows, previous, 97.0) is None


def test_a_longer_interval_adds_its_wait_and_the_rows_it_brings():
    batch = LiveBatch(interval_s=2.0, gap_s=2.0, freshness_s=3.0, duration_s=0.5, rows=1000)
    # 500 rows a second at 1 ms each: every second of interval adds 1.5 s of age.
    assert batch.largest_interval(6.0, seconds_per_row=0.001) == pytest.approx(4.0)
    assert batch.freshness_at(4.0, seconds_per_row=0.001) == pytest.approx(6.0)
    # Unmeasured cost: the batch's own 0.5 ms a row, fixed cost included.
    assert batch.largest_interval(6.0, seconds_per_row=None) == pytest.approx(2.0 + 3.0 / 1.25)


def test_a_shorter_interval_saves_only_the_wait():
    batch = LiveBatch(interval_s=2.0, gap_s=2.0, freshness_s=3.0, duration_s=0.5, rows=1000)
    assert batch.largest_interval(2.5, seconds_per_row=0.001) == pytest.approx(1.5)
    assert batch.freshness_at(1.5, seconds_per_row=0.001) == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ({"event_time": {"min_ms": 1_700_000_000_250}}, 1_700_000_000.25),
        ({"event_time": {"min_ms": 0}}, 0.0),
        ({"event_time": {"min_ms": None}}, None),  # a batch without rows
        ({"event_time": {"min_ms": True}}, None),
        ({"event_time": {"min_ms": "1"}}, None),
        ({"event_time": 5}, None),
        ({"other": {"min_ms": 1}}, None),
        ({}, None),
    ],
)
def test_the_oldest_event_time_is_read_from_the_event_time_observation(observed, expected):
    assert oldest_event_at(observed) == expected


# --- the choice ---------------------------------------------------------------------------


def test_until_three_batches_are_measured_half_the_target_within_bounds():
    window = window_of(steady(3.0), steady(3.0))
    first = window.choose(5.0, WIDE, None, 0.0)
    assert first.interval_s == 2.5
    assert first.reason == "freshness target 5s: 2.50s until 3 live batches are measured"
    assert window.choose(5.0, Bounds(0.0, 1.0), None, 0.0).interval_s == 1.0
    assert window.choose(5.0, Bounds(3.0, 60.0), None, 0.0).interval_s == 3.0


def test_the_choice_keeps_the_p95_at_the_target_ignoring_the_worst_five_percent():
    typical = [steady(3.0) for _ in range(37)]  # each would reach 5 s at a 4 s interval
    worst = [steady(4.0), steady(4.5), steady(5.0)]  # at 3, 2.5 and 2 s
    choice = window_of(*worst, *typical).choose(5.0, WIDE, None, 0.0)
    # two of 40 may exceed, the third not; and 5% below that
    assert choice.interval_s == pytest.approx(0.95 * 3.0)
    assert choice.reason == (
        "freshness target 5s: 2.85s keeps p95 freshness at 4.85s over the last 40 live batches"
    )
    assert choice.meets_target
    fewer = window_of(*worst, *typical[:17]).choose(5.0, WIDE, None, 0.0)
    assert fewer.interval_s == pytest.approx(0.95 * 2.5)  # one of 20 may exceed


def test_a_longer_interval_is_taken_in_steps_and_a_shorter_one_at_once_with_headroom():
    window = window_of(*[steady(2.1, interval_s=2.0) for _ in range(5)])  # allows 4.9 s
    aim = 0.95 * 4.9
    assert window.choose(5.0, WIDE, current_s=2.0, seconds_per_row=0.0).interval_s == 4.0
    assert window.choose(5.0, WIDE, 4.0, 0.0).interval_s == pytest.approx(aim)
    assert window.choose(5.0, WIDE, 4.3, 0.0).interval_s == 4.3  # not 10% more: kept
    assert window.choose(5.0, WIDE, 0.0, 0.0).interval_s == 0.5  # from zero, half a second
    assert window.choose(5.0, WIDE, 4.95, 0.0).interval_s == pytest.approx(aim)


def test_a_target_the_shortest_interval_cannot_meet_is_said_once_at_the_shortest():
    slow = [LiveBatch(0.5, 6.0, 12.0, 6.0, 1000) for _ in range(3)]
    choice = window_of(*slow).choose(5.0, Bounds(0.5, 60.0), 2.5, 0.0)
    assert choice.interval_s == 0.5
    assert not choice.meets_target
    assert choice.reason == (
        "freshness target 5s cannot be met: at the shortest interval (0.50s, min-pause) live "
        "data would be 12.00s old at p95 over the last 3 live batches"
    )
    assert not window_of(*slow).choose(5.0, Bounds(0.5, 60.0), 0.5, 0.0).differs_from(choice)


def test_the_interval_caps_the_choice_and_the_reason_says_so():
    choice = window_of(*[steady(2.1) for _ in range(3)]).choose(5.0, Bounds(0.0, 3.0), 3.0, 0.0)
    assert choice.interval_s == 3.0
    assert choice.reason == (
        "freshness target 5s: 3.00s keeps p95 freshness at 3.10s over the last 3 live "
        "batches, at most interval"
    )


def test_the_latest_batches_shorten_the_interval_before_the_window_p95_notices():
    calm = [steady(3.0) for _ in range(38)]  # would allow 4 s
    stepped = [steady(4.5), steady(4.6)]  # a higher rate: 2.5 and 2.4 s
    choice = window_of(*calm, *stepped).choose(5.0, WIDE, 3.8, 0.0)
    assert choice.interval_s == pytest.approx(0.95 * 2.5)  # the median of the last three
    one_off = window_of(*calm, steady(4.6), steady(3.0))
    assert one_off.choose(5.0, WIDE, 3.8, 0.0).interval_s == 3.8  # one slow batch: kept


def test_event_times_from_the_future_cannot_make_the_interval_leap():
    # A producer's clock 10 s ahead: freshness is negative, and would allow a long interval.
    skewed = window_of(*[steady(-8.0) for _ in range(5)])
    assert skewed.choose(5.0, WIDE, 2.0, 0.0).interval_s == 4.0  # at most double a batch
    assert skewed.choose(5.0, WIDE, 4.0, 0.0).interval_s == 5.0  # and never past the target
