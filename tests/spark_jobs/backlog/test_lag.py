from datetime import UTC, datetime

import pytest

from spark_jobs.backlog.lag import LagDetector, LagRules, Thresholds, watermark_lag_s
from spark_jobs.backlog.status import SourceStatus
from tests.spark_jobs.backlog.simulation import FakeClock

OFFSETS = Thresholds(enter=1000, leave=100)


def kafka(offsets_behind: int | None = None, name: str = "events") -> SourceStatus:
    """A live-phase status, with or without the offset lag metric."""
    lag = {} if offsets_behind is None else {"offsets_behind_latest": offsets_behind}
    return SourceStatus(name, phase="kafka", lag=lag, rule="kafka-phase")


def hybrid(backlog: bool, offsets_behind: int | None = None) -> SourceStatus:
    lag = {} if offsets_behind is None else {"offsets_behind_latest": offsets_behind}
    phase = "history" if backlog else "landing"
    return SourceStatus("events", is_backlog=backlog, phase=phase, lag=lag, rule="hybrid-phase")


def states(detector: LagDetector, statuses: list[SourceStatus]) -> list[tuple[bool, str | None]]:
    results = [detector.observe(status) for status in statuses]
    return [(s.is_backlog, s.rule) for s in results]


def test_offset_lag_enters_above_enter_and_leaves_at_or_below_leave():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    lags = [1000, 1001, 999, 101, 100, 999, 1000, 1001]
    assert [detector.observe(kafka(lag)).is_backlog for lag in lags] == [
        False,  # at enter: not above it
        True,
        True,  # between leave and enter: stays
        True,
        False,  # at leave
        False,  # between: stays live
        False,
        True,
    ]


def test_min_dwell_blocks_a_flip_until_the_state_has_lasted_that_long():
    clock = FakeClock(1_000.0)
    detector = LagDetector(LagRules(offsets=OFFSETS, min_dwell_s=30), clock)
    observed = []
    for at, lag in [(1_000, 5000), (1_010, 0), (1_029.9, 0), (1_030, 0), (1_059.9, 5000)]:
        clock.now = at
        observed.append(detector.observe(kafka(lag)).is_backlog)
    # the first flip is not delayed; the release waits 30 s from the entry and the
    # re-entry 30 s from the release
    assert observed == [True, True, True, False, False]
    clock.now = 1_060
    assert detector.observe(kafka(5000)).is_backlog is True


def test_a_source_goes_back_to_backlog_as_often_as_its_lag_grows():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    assert states(detector, [kafka(lag) for lag in (0, 5000, 50, 20_000, 0, 1500)]) == [
        (False, "kafka-phase"),
        (True, "offset-lag"),
        (False, "offset-lag"),
        (True, "offset-lag"),
        (False, "offset-lag"),
        (True, "offset-lag"),
    ]


def test_hybrid_phase_turning_live_with_high_lag_stays_in_backlog_until_lag_releases_it():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    statuses = [
        hybrid(backlog=True),  # no metric yet: the phase alone decides
        hybrid(backlog=True, offsets_behind=8000),  # both hold it: the phase is named
        hybrid(backlog=False, offsets_behind=8000),  # handoff while far behind
        hybrid(backlog=False, offsets_behind=500),
        hybrid(backlog=False, offsets_behind=40),
        hybrid(backlog=True, offsets_behind=40),  # a new backlog child
        hybrid(backlog=False, offsets_behind=40),  # released by the phase this time
    ]
    assert states(detector, statuses) == [
        (True, "hybrid-phase"),
        (True, "hybrid-phase"),
        (True, "offset-lag"),
        (True, "offset-lag"),
        (False, "offset-lag"),
        (True, "hybrid-phase"),
        (False, "hybrid-phase"),
    ]
    final = detector.observe(hybrid(backlog=False, offsets_behind=40))
    assert final == hybrid(backlog=False, offsets_behind=40)


def test_watermark_lag_holds_and_releases_like_the_offset_lag():
    rules = LagRules(watermark_s=Thresholds(enter=300, leave=60))
    detector = LagDetector(rules, FakeClock())
    observed = [
        detector.observe(kafka(), lag) for lag in (10.0, 301.0, 120.0, None, 60.0, None, 400.0)
    ]
    assert [(s.is_backlog, s.rule) for s in observed] == [
        (False, "kafka-phase"),
        (True, "watermark-lag"),
        (True, "watermark-lag"),
        (True, "watermark-lag"),  # no watermark lag known: unchanged
        (False, "watermark-lag"),
        (False, "watermark-lag"),
        (True, "watermark-lag"),
    ]


def test_the_first_rule_holding_is_named_and_the_last_one_to_let_go_releases():
    rules = LagRules(offsets=OFFSETS, watermark_s=Thresholds(enter=300, leave=60))
    detector = LagDetector(rules, FakeClock())
    observed = [
        detector.observe(kafka(offsets), lag)
        for offsets, lag in ((5000, 10.0), (5000, 400.0), (50, 400.0), (50, 30.0))
    ]
    assert [(s.is_backlog, s.rule) for s in observed] == [
        (True, "offset-lag"),
        (True, "offset-lag"),
        (True, "watermark-lag"),
        (False, "watermark-lag"),
    ]


def test_a_status_without_the_metric_leaves_the_rule_state_alone():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    assert detector.observe(kafka()).is_backlog is False
    assert detector.observe(kafka(5000)).is_backlog is True
    assert detector.observe(kafka()).is_backlog is True
    assert detector.observe(kafka(0)).is_backlog is False
    assert detector.observe(kafka()).is_backlog is False


def test_each_source_has_its_own_state():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    assert detector.observe(kafka(5000, name="orders")).is_backlog is True
    assert detector.observe(kafka(500, name="payments")).is_backlog is False
    assert detector.observe(kafka(500, name="orders")).is_backlog is True


def test_without_rules_statuses_pass_unchanged():
    detector = LagDetector(LagRules(), FakeClock())
    for status in (kafka(10**9), hybrid(backlog=True), hybrid(backlog=False, offsets_behind=5)):
        assert detector.observe(status, watermark_lag=10**6) == status


def test_a_finished_source_held_by_lag_does_not_count():
    detector = LagDetector(LagRules(offsets=OFFSETS), FakeClock())
    status = SourceStatus("history", finished=True, lag={"offsets_behind_latest": 5000})
    final = detector.observe(status)
    assert (final.is_backlog, final.counts_as_backlog) == (True, False)


WATERMARK = datetime(2026, 11, 21, 11, 49, 58, 882000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("watermark", "rows", "expected"),
    [
        (WATERMARK, 200, 601.118),
        (WATERMARK, 1, 601.118),
        (WATERMARK, 0, None),  # an idle batch: the watermark stands still, not the job
        (None, 200, None),
    ],
)
def test_watermark_lag_is_known_only_from_batches_that_read_rows(watermark, rows, expected):
    now = datetime(2026, 11, 21, 12, 0, tzinfo=UTC).timestamp()
    lag = watermark_lag_s(now, watermark, rows)
    assert lag == (None if expected is None else pytest.approx(expected))
