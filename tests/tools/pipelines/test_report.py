import json
from dataclasses import replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from spark_jobs.metrics.schema import CheckpointRow, TransitionRow
from spark_jobs.metrics.writer import MetricsWriter
from tools.pipelines.report import (
    Checkpoint,
    LabelPlace,
    Reentry,
    cadence_s,
    caught_up,
    cost_lines,
    freshness_s,
    load,
    periods,
    phase_changes,
    phase_stats,
    place_labels,
    plot_timeline,
    reentry,
    steady_live,
    timeline_figure,
    warm_up_s,
    weighted_percentile,
)

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def checkpoint(batch_id, start, seconds, backlog, rows, behind=0, quantiles=()):
    return Checkpoint(batch_id, start, start + seconds, backlog, rows, behind, tuple(quantiles))


def test_load_reads_back_what_the_coordinator_wrote(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    sources = [{"name": "events", "is_backlog": False, "lag": {"files_behind": 2}}]
    observed = {"event_time": {"rows": 10, "min_ms": 500, "quantiles_ms": [1_000, 2_000]}}
    with MetricsWriter(url) as writer:
        writer.record_checkpoint(
            CheckpointRow(
                "j",
                "r",
                7,
                T0,
                False,
                1000,
                10,
                1500,
                None,
                json.dumps(sources),
                json.dumps(observed),
                add_batch_ms=1180,
                state_rows_total=5,
                state_disk_bytes=3915,
            )
        )
        writer.record_transition(TransitionRow("j", "r", T0, False, "hybrid-phase: x"))
        writer.record_checkpoint(
            CheckpointRow("other", "r", 1, T0, True, None, 5, 10, None, "[]", None)
        )
    [loaded], [transition] = load(url, "j")
    assert loaded == Checkpoint(
        7,
        T0.timestamp() - 1.5,
        T0.timestamp(),
        False,
        10,
        2,
        (1.0, 2.0),
        data_ms=1180,
        fixed_cost_ms=320,
        state_disk_bytes=3915,
        state_rows=5,
        oldest_event_s=0.5,
        run_id="r",
        interval_ms=1000,
    )
    assert loaded.freshness_s == T0.timestamp() - 0.5
    assert transition["reason"] == "hybrid-phase: x"


def test_phase_stats_span_first_start_to_last_commit():
    stats = phase_stats([checkpoint(0, 100, 5, True, 600), checkpoint(1, 105, 5, True, 400)])
    assert (stats.checkpoints, stats.duration_s, stats.rows, stats.rows_per_s) == (2, 10, 1000, 100)
    assert phase_stats([]).rows_per_s == 0


def test_steady_real_time_starts_after_the_batch_that_caught_up():
    batches = [
        checkpoint(0, 0, 5, True, 10**6),
        checkpoint(1, 5, 1, False, 9000, behind=30),
        checkpoint(2, 6, 1, False, 9000, behind=0),  # still carries the pile-up
        checkpoint(3, 7, 1, False, 2000, behind=0),
        checkpoint(4, 8, 1, False, 2000, behind=1),
    ]
    assert [c.batch_id for c in caught_up(batches)] == [3, 4]
    assert caught_up(batches[:2]) == []


def test_freshness_weighs_each_batch_by_its_rows():
    small = checkpoint(0, 10, 1, False, 100, quantiles=[10.0, 10.5])  # commit at 11
    large = checkpoint(1, 20, 1, False, 900, quantiles=[17.0, 18.0])  # commit at 21
    samples = freshness_s([small, large])
    assert samples == [(1.0, 50.0), (0.5, 50.0), (4.0, 450.0), (3.0, 450.0)]
    assert weighted_percentile(samples, 0.5) == 3.0
    assert weighted_percentile(samples, 0.05) == 0.5
    assert weighted_percentile(samples, 0.95) == 4.0


def test_cadence_is_start_to_start():
    batches = [checkpoint(i, start, 0.4, False, 1) for i, start in enumerate([0, 2, 4.5])]
    assert cadence_s(batches) == pytest.approx([2, 2.5])


def test_the_timeline_chart_is_a_png(tmp_path):
    batches = [
        checkpoint(0, 0, 5, True, 10**6),
        checkpoint(1, 5, 1, False, 2000, quantiles=[4.0, 4.5]),
    ]
    path = plot_timeline([("run", batches), ("empty", [])], tmp_path / "t.png", "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_the_legend_covers_no_bar_however_tall():
    batches = [
        checkpoint(0, 0, 5, True, 10**9),
        *(checkpoint(i, 5 + i, 1, False, 10**9, quantiles=[4.0 + i]) for i in range(1, 30)),
    ]
    figure = timeline_figure([("tall", batches), ("also tall", batches)], "title")
    figure.draw_without_rendering()
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert [t.get_text() for t in legend.get_texts()] == [
        "backlog batch",
        "backlog by lag",
        "live batch",
        "live freshness p50",
    ]
    texts = [figure._suptitle, *(axis.xaxis.label for axis in figure.axes)]
    covered = [*figure.axes, *texts]
    assert not any(box.overlaps(item.get_window_extent()) for item in covered)
    assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1
    assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1


def test_labels_clear_of_each_other_share_the_row_nearest_the_bars():
    places = place_labels([0, 100, 300], [80, 150, 50], right=1000, gap=6)
    # 0-80, 100-250 and 300-350: each starts more than 6 px after the one before ends.
    assert places == [LabelPlace(0, False), LabelPlace(0, False), LabelPlace(0, False)]


def test_labels_that_would_touch_go_to_the_lowest_row_free_where_they_start():
    places = place_labels([0, 50, 60, 200], [100, 100, 100, 30], right=1000, gap=6)
    # 0-100, then 50-150 and 60-160 overlap it and each other; 200 is clear of row 0's end.
    assert places == [
        LabelPlace(0, False),
        LabelPlace(1, False),
        LabelPlace(2, False),
        LabelPlace(0, False),
    ]
    # Within the gap of the label before it in row 0 (ends at 100): a row up.
    assert place_labels([0, 105], [100, 10], right=1000, gap=6)[1] == LabelPlace(1, False)
    assert place_labels([0, 106], [100, 10], right=1000, gap=6)[1] == LabelPlace(0, False)


def test_a_label_that_would_pass_the_right_edge_ends_at_its_mark_instead():
    places = place_labels([900, 950], [120, 40], right=1000, gap=6)
    # 950-990 fits; 900-1020 would not, so it spans 780-900, clear of 950.
    assert places == [LabelPlace(0, True), LabelPlace(0, False)]
    # In the order of the marks given: 870-990 starts 70 px after 700-800 ends.
    assert place_labels([990, 700], [120, 100], right=1000, gap=6) == [
        LabelPlace(0, True),
        LabelPlace(0, False),
    ]


def test_the_timeline_keeps_every_mark_label_clear_of_the_bars_and_of_each_other():
    batches = [
        checkpoint(0, 0, 20, True, 10**5),
        *(
            checkpoint(i, 20 + 2 * i, 1, False, 4000, quantiles=[19.0 + 2 * i])
            for i in range(1, 20)
        ),
    ]
    t0 = batches[0].started_at
    # Close together, and one at the right edge.
    marks = [(t0 + at, f"transition {at}: events is in backlog (history)") for at in (5, 6, 7, 58)]
    figure = timeline_figure([("marked", batches), ("unmarked", batches)], "title", [marks])
    figure.draw_without_rendering()
    bars = [axis for axis in figure.axes if axis.get_ylabel() == "rows per batch"]
    labels = [text for axis in figure.axes for text in axis.texts]
    assert len(bars) == 2 and [t.get_text() for t in labels] == [text for _, text in marks]
    boxes = [label.get_window_extent() for label in labels]
    page = figure.bbox
    for box in boxes:
        assert not any(box.overlaps(axis.get_window_extent()) for axis in bars)
        assert page.x0 <= box.x0 and box.x1 <= page.x1
    for index, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[index + 1 :])
    # Above their panel's bars, below its title.
    marked = bars[0].get_window_extent()
    assert all(box.y0 >= marked.y1 for box in boxes)


def test_times_cross_the_database_as_utc(tmp_path):
    url = f"sqlite:///{tmp_path}/m.db"
    local = T0.astimezone(ZoneInfo("America/New_York"))
    with MetricsWriter(url) as writer:
        writer.record_checkpoint(CheckpointRow("j", "r", 0, local, True, 1, 1, 0, None, "[]", None))
    [loaded], _ = load(url, "j")
    assert loaded.committed_at == T0.timestamp()


def test_steady_live_time_is_the_second_half_of_a_runs_live_time():
    run = [
        checkpoint(0, 0, 10, True, 10**5),
        *(checkpoint(i, 10 + 2 * i, 1, False, 4000) for i in range(1, 8)),
    ]
    # Live commits at 13, 15, ..., 25: halfway is 19.
    assert [c.batch_id for c in steady_live(run)] == [4, 5, 6, 7]
    assert [c.batch_id for c in steady_live(run[:2])] == [1]
    assert steady_live(run[:1]) == []


def test_reentry_times_run_from_the_burst_to_backlog_and_from_there_to_live():
    at = [datetime(2026, 11, 21, 12, 0, s, tzinfo=UTC) for s in (10, 31, 44, 50)]
    transitions = [
        {"at": at[0], "is_backlog": False},  # the first switch to live, before the burst
        {"at": at[1], "is_backlog": True},
        {"at": at[2], "is_backlog": False},
        {"at": at[3], "is_backlog": True},
    ]
    burst_at = datetime(2026, 11, 21, 12, 0, 28, tzinfo=UTC).timestamp()
    assert reentry(transitions, burst_at) == Reentry(3.0, 13.0)
    assert reentry(transitions[:2], burst_at) == Reentry(3.0, None)
    assert reentry(transitions[:1], burst_at) == Reentry(None, None)
    assert reentry(transitions, None) == Reentry(None, None)


def test_periods_split_at_every_change_of_status_and_handoffs_are_marked():
    run = [
        replace(checkpoint(0, 0, 1, True, 10), phase="history"),
        replace(checkpoint(1, 1, 1, True, 10), phase="kafka"),
        replace(checkpoint(2, 2, 1, False, 10), phase="kafka"),
        replace(checkpoint(3, 3, 1, True, 10), phase="kafka"),
    ]
    assert [[c.batch_id for c in period] for period in periods(run)] == [[0, 1], [2], [3]]
    assert phase_changes(run) == [(1, "handoff: history -> kafka")]


def costed(batch_id, backlog, fixed_ms, data_ms, disk=None, rows=None):
    return replace(
        checkpoint(batch_id, batch_id, (fixed_ms + data_ms) / 1000, backlog, 100),
        data_ms=data_ms,
        fixed_cost_ms=fixed_ms,
        state_disk_bytes=disk,
        state_rows=rows,
    )


def test_each_phase_s_median_checkpoint_splits_its_fixed_cost_from_its_data_work():
    run = [
        costed(0, True, 400, 8_000, disk=0, rows=20_000),
        costed(1, True, 700, 9_000, disk=0, rows=22_000),
        checkpoint(2, 2, 1, True, 100),  # recovered: its parts are unknown
        costed(3, False, 180, 600, disk=350_000, rows=100),
        costed(4, False, 170, 700, disk=359_233, rows=150),
        costed(5, False, 250, 650, disk=359_233, rows=100),
    ]
    assert cost_lines(run) == [
        "where a checkpoint's time goes, median per phase:",
        "phase    checkpoints  fixed cost (ms)  data (ms)  state on disk (B)  state rows",
        "backlog            2              550      8,500                  0      21,000",
        "live               3              180        650            359,233         100",
    ]
    stateless = [costed(0, False, 90, 10)]
    assert cost_lines(stateless)[2:] == [
        "live               1               90         10                  -           -"
    ]


def test_the_warm_up_is_the_first_batchs_time_beyond_its_rows_at_the_later_rate():
    backlog = [
        checkpoint(0, 0.0, 6.0, True, 500_000),
        checkpoint(1, 6.0, 1.5, True, 500_000),
        checkpoint(2, 7.5, 0.5, True, 100_000),
    ]
    # Later: 600,000 rows in 2 s; the first batch's rows would take 1.667 s of its 6 s.
    assert warm_up_s(backlog) == pytest.approx(6.0 - 500_000 * 2.0 / 600_000)
    assert warm_up_s(backlog[:1]) is None
    assert warm_up_s([backlog[0], checkpoint(1, 6.0, 0.2, True, 0)]) is None
