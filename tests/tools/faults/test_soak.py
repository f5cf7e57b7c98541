"""The soak's judgement (slopes of floors against bounds per hour), and a one-minute soak
whose retained series must level off: what an hour-long run would only show late."""

import json
import os
from pathlib import Path

import pytest

from spark_jobs.jobs.startup import JavaMissing, require_java
from tests.support.prerequisites import missing
from tools.faults.soak import (
    SERIES,
    Series,
    directory_usage,
    first_batch_at,
    floor,
    human,
    judge,
    last_half,
    main,
    points,
    slope_per_h,
)

MIB = 1024 * 1024


def test_the_slope_is_per_hour_and_zero_without_two_distinct_times():
    assert slope_per_h([(0, 10), (60, 11), (120, 12)]) == pytest.approx(60)
    assert slope_per_h([(0, 5), (60, 5)]) == 0
    assert slope_per_h([(30, 1)]) == 0
    assert slope_per_h([(30, 1), (30, 2)]) == 0


def test_the_last_half_starts_midway_between_the_first_batch_and_the_end():
    points = [(t, t) for t in range(0, 101, 10)]
    assert last_half(points)[0] == (50, 50)
    assert last_half(points, since=40)[0] == (70, 70)
    assert last_half([]) == []


def test_a_saw_tooth_shorter_than_a_window_has_a_flat_floor():
    # Files pile up for 9 samples, then a clean-up: a period of 10 s, windows of 20 s.
    points = [(t, 100 + (t + 3) % 10) for t in range(120)]
    floors = floor(points, 6)
    assert floors == [(7 + 10 * i, 100) for i in range(0, 12, 2)]
    assert slope_per_h(floors) == 0


def test_a_steady_growth_keeps_its_slope_in_the_floor():
    points = [(t, 2 * t + (5 if t % 2 else 0)) for t in range(0, 600)]
    assert slope_per_h(floor(points, 6)) == pytest.approx(7200, rel=0.01)


def test_collections_do_not_count_as_growth_a_leak_under_the_bound_is_bounded():
    # Allocation climbs 50 MiB between collections that always return to 200 MiB.
    heap = [(t, (200 + (t % 30) * 50 / 30) * MIB) for t in range(0, 1800, 5)]
    series = Series("heap", "heap", "bytes", 16 * MIB)
    assert judge(series, heap).slope_per_h == 0
    leaking = judge(series, [(t, v + t * 1000) for t, v in heap])  # 3.6 MB/h
    assert leaking.slope_per_h == pytest.approx(3.6e6, rel=0.05) and leaking.bounded
    assert not judge(series, [(t, v + t * 10_000) for t, v in heap]).bounded  # 36 MB/h


def test_a_series_over_its_bound_grows_and_context_is_not_judged():
    rows = [(t, t / 2) for t in range(0, 600, 5)]  # a row every other second
    assert not judge(Series("rows", "rows", "rows", 20), rows).bounded
    assert judge(Series("out", "output", "files", None), rows).bounded is None
    assert judge(Series("rows", "rows", "rows", 20), []) is None


def test_directory_usage_counts_files_and_bytes_without_the_part_left_out(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_bytes(b"x" * 10)
    (tmp_path / "state" / "0").mkdir(parents=True)
    (tmp_path / "state" / "0" / "1.changelog").write_bytes(b"y" * 100)
    assert directory_usage(tmp_path) == (2, 110)
    assert directory_usage(tmp_path, leave_out=tmp_path / "state") == (1, 10)
    assert directory_usage(tmp_path / "missing") == (0, 0)


def test_human_figures():
    assert human(3 * MIB / 2, "bytes") == "1.5 MiB"
    assert human(-2048, "bytes") == "-2.0 KiB"
    assert human(12_345, "rows") == "12,345 rows"


#: What a short run lets settle: Spark keeps 2 batches of logs (not 100), RocksDB takes a
#: snapshot every 2 batches (not 10) and cleans up every 5 s (not 60 s).
SHORT_RETENTION = (
    "spark.sql.streaming.minBatchesToRetain=2",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot=2",
    "spark.sql.streaming.stateStore.maintenanceInterval=5s",
)


@pytest.mark.spark
def test_a_short_soak_reports_every_series_and_keeps_the_retained_ones_flat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    try:
        require_java()
    except JavaMissing as error:
        missing(str(error))
    monkeypatch.setenv("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    conf = [arg for item in SHORT_RETENTION for arg in ("--conf", item)]
    # What it judges grows with batches, not with their rows: a tenth of the default rate.
    argv = ["--minutes", "1.0", "--workdir", str(tmp_path), "--events", "20000", "--files", "4"]
    argv += ["--live-events-per-s", "200"]
    assert main([*argv, "--every", "1s", *conf]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(report) == {
        "minutes",
        "samples",
        "batches",
        "committed_batches",
        "live_events_per_s",
        "load_average_1min",
        "bounded",
        "series",
    }
    assert set(report["series"]) == {s.key for s in SERIES}
    assert report["batches"] >= 5, report
    assert report["load_average_1min"] is not None
    series = report["series"]
    # The metrics journal, the metrics tables but backlog_checkpoints (which the retention,
    # at least an hour, cannot thin in a minute: one row a batch, no more), and the
    # driver's log at the level the provider launches with (at INFO it grew by ~45 KiB a
    # batch).
    for key in ("journal_files", "transition_rows", "lease_rows", "driver_log_bytes"):
        assert series[key]["bounded"], (key, series[key])
    # Spark's offset and commit logs keep 2 batches here, 4 files each, and purge in steps:
    # the count saws between 12 and 16 files for tens of seconds at a time, too coarse for
    # a slope over 30 s. A file a batch kept would pass 50 within the judged half.
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    judged = last_half(points(samples, "checkpoint_files"), first_batch_at(samples))
    assert max(files for _, files in judged) <= 20, judged
    # Read once the job has exited: one metrics row for each batch Spark committed.
    assert series["checkpoint_rows"]["last"] == report["batches"] == report["committed_batches"]
    assert (tmp_path / "soak.png").stat().st_size > 0
