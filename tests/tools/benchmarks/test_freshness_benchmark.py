import math

import pytest

from tools.benchmarks.freshness_benchmark import Outcome, Window, after_backlog, plot, table
from tools.pipelines.report import Checkpoint


def live(batch_id: int, start: float, freshness: float, rows: int = 100) -> Checkpoint:
    commit = start + 0.5
    return Checkpoint(
        batch_id,
        start,
        commit,
        False,
        rows,
        0,
        (commit - freshness / 2,),
        oldest_event_s=commit - freshness,
    )


def backlog(batch_id: int, start: float) -> Checkpoint:
    return Checkpoint(batch_id, start, start + 1, True, 1000, 5, ())


def test_a_window_judges_each_batch_by_its_oldest_event_and_the_rows_by_their_quantiles():
    batches = [live(i, 4.0 * i, 3.0) for i in range(19)] + [live(19, 76.0, 9.0)]
    window = Window.of(batches, 80.0)
    assert (window.checkpoints, window.median_interval_s) == (20, 4.0)
    assert window.batch_p95_s == 3.0  # one of twenty may exceed
    assert window.row_p95_s == 1.5
    worse = Window.of([*batches[:18], live(18, 72.0, 8.0), batches[19]], 80.0)
    assert worse.batch_p95_s == 8.0  # two of twenty may not
    empty = Window.of([], 60.0)
    assert empty.checkpoints == 0 and math.isnan(empty.batch_p95_s)


def test_after_a_step_only_live_batches_past_the_last_backlog_one_count_less_three():
    after = [
        live(0, 0, 3),
        backlog(1, 1),
        live(2, 3, 9),
        *(live(i, 2.0 * i, 3) for i in range(3, 8)),
    ]
    assert [c.batch_id for c in after_backlog(after)] == [5, 6, 7]
    assert after_backlog([live(i, i, 3) for i in range(3)]) == []


def test_the_table_has_a_row_per_window_and_the_ratio_is_of_checkpoints():
    fixed = Window(60, 60.0, 1.8, 1.4, 1.0)
    target = Window(15, 60.0, 4.6, 4.1, 4.0)
    outcome = Outcome("landing", fixed, target, None, "freshness target 5s: ...")
    assert table([outcome], 5.0)[2:] == [
        "| landing: fixed 1 s (60 s) | 60 | 1.00 | 1.80 | 1.40 |",
        "| landing: target 5 s (60 s) | 15 | 4.00 | 4.60 | 4.10 |",
    ]
    assert outcome.as_json()["checkpoint_ratio"] == pytest.approx(4.0)


def test_the_chart_has_a_panel_per_live_phase(tmp_path):
    from PIL import Image

    targeted = [backlog(0, 0.0), *(live(i, 4.0 * i, 4.5) for i in range(1, 10))]
    fixed = [backlog(0, 0.0), *(live(i, 1.0 * i, 1.5) for i in range(1, 40))]
    changes = [(4.5, 2.5, "until measured"), (16.5, 3.8, "keeps p95")]
    panel = ("landing-target-5s", targeted, changes, 20.0, fixed)
    path = plot([panel, panel], 5.0, tmp_path / "chart.png")
    with Image.open(path) as image:
        assert image.format == "PNG"
        assert image.size == (1320, 704)  # 12 x 6.4 inches at 110 dpi
