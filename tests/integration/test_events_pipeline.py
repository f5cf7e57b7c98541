"""The real pipeline, launched with spark-submit: historical files, then live landing files."""

import json
import statistics

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    backlog_then_live,
    base_conf,
    batch_starts,
    checkpoints,
    finish,
    stay_alive,
    submitted_job,
    transitions,
    wait_for,
)

INTERVAL_S = 2.0
#: Spark's durationMs parts of a batch, as the metrics name them; triggerExecution
#: (batch_duration_ms) spans them all, and Spark's own steps between them.
PARTS = {
    "latest_offset_ms": "latestOffset",
    "get_batch_ms": "getBatch",
    "query_planning_ms": "queryPlanning",
    "add_batch_ms": "addBatch",
    "wal_commit_ms": "walCommit",
    "commit_offsets_ms": "commitOffsets",
}
#: The pipeline's operators, sources first, as Spark's analyzed plan names them.
PLAN = [
    "StreamingRelationV2#6",
    "CollectMetrics#5",
    "EventTimeWatermark#4",
    "Filter#3",
    "Project#2",
    "Aggregate#1",
    "Project#0",
]


def spark_durations(events) -> dict[int, dict]:
    """Each executed batch's ``durationMs``, from Spark's event log."""
    found = {}
    for path in events.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"].endswith("QueryProgressEvent"):
                progress = event["progress"]
                if "addBatch" in progress["durationMs"]:
                    found[progress["batchId"]] = progress["durationMs"]
    return found


def live_rows(dirs):
    return [r for r in checkpoints(dirs) if not r["is_backlog"]]


def test_backlog_then_live_exactly_once_with_a_metrics_outage(tmp_path):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, 300_000, 30, events_per_s=400, file_every_s=0.25)
    conf = base_conf(
        dirs,
        "pipeline",
        interval=f"{INTERVAL_S:g}s",
        interval_during_backlog="1min",
        max_batch_rows="200000",
    )
    # Spark's own record of each batch's progress, to hold the metrics against.
    events = tmp_path / "spark-events"
    events.mkdir()
    conf |= {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": str(events),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    job = submitted_job(dirs, conf, "--stop-when-idle", "3s", "--timeout", "300s")
    try:
        wait_for(lambda: len(live_rows(dirs)) >= 4, "4 live checkpoints", 240, job)
        # The metrics database goes away for a while and comes back: nothing may be lost.
        away = dirs.metrics_dir.with_name("metrics-away")
        dirs.metrics_dir.rename(away)
        dirs.metrics_dir.write_text("not a directory")
        stay_alive(job, 6)
        dirs.metrics_dir.unlink()
        away.rename(dirs.metrics_dir)
        wait_for(lambda: len(live_rows(dirs)) >= 12, "12 live checkpoints", 120, job)
    finally:
        producer.stop()
    log = finish(job, 120)

    rows = checkpoints(dirs)
    assert [r["batch_id"] for r in rows] == list(range(len(rows))), "a metrics row was lost"
    phases = [r["is_backlog"] for r in rows]
    backlog = [r for r in rows if r["is_backlog"]]
    live = [r for r in rows if not r["is_backlog"]]
    assert phases == [True] * len(backlog) + [False] * len(live)
    assert {r["effective_interval_ms"] for r in backlog} == {60_000}
    assert {r["effective_interval_ms"] for r in live} == {2_000}
    assert "cannot write metrics" in log and "reachable again" in log

    first, transition = transitions(dirs)
    assert (first["is_backlog"], first["reason"]) == (
        True,
        "hybrid-phase: events is in backlog (history)",
    )
    assert transition["is_backlog"] is False
    assert transition["reason"] == "hybrid-phase: events is live (landing)"
    assert transition["at"] == live[0]["committed_at"]

    # Backlog: few, large batches; real time: one small batch per interval.
    assert len(backlog) * 3 <= len(live)
    steady = live[2:]
    assert min(r["num_input_rows"] for r in backlog) >= 10 * max(
        r["num_input_rows"] for r in steady
    )
    gaps = [b - a for a, b in zip(batch_starts(steady), batch_starts(steady)[1:], strict=False)]
    # The trigger holds most batches an interval apart (the outage outlasts the lease's time
    # to live, so a few wait until it is confirmed again). A loaded machine only stretches the
    # gaps: the upper bound only tells the live interval apart from the backlog's 1 min.
    assert statistics.quantiles(gaps, n=10)[1] >= 0.75 * INTERVAL_S, gaps
    assert statistics.median(gaps) < 5 * INTERVAL_S, gaps

    # Where each checkpoint's time went, as Spark timed it: each part, and the whole that
    # spans them; the windowed state lives in RocksDB (SST files only from the first
    # snapshot, changelog checkpointing keeps the rest in memory and the changelog).
    timed = spark_durations(events)
    for row in rows:
        spark = timed[row["batch_id"]]
        assert row["batch_duration_ms"] == spark["triggerExecution"], (row, spark)
        assert {p: row[p] for p in PARTS} == {p: spark.get(k) for p, k in PARTS.items()}, spark
        assert sum(row[p] or 0 for p in PARTS) <= row["batch_duration_ms"], row
    assert {(r["sink_output_rows"], r["sink_commit_ms"]) for r in rows} == {(None, None)}
    assert all(r["state_rows_total"] > 0 and r["state_memory_bytes"] > 0 for r in rows)
    assert all(r["state_disk_bytes"] is not None for r in rows)
    [operator] = json.loads(rows[-1]["state_operators"])
    assert operator["name"] == "stateStoreSave"
    assert "rocksdbCommitFileSyncLatencyMs" in operator["rocksdb_commit_ms"]
    # Each operator's status at each transition, from the query's own plan.
    for change in (first, transition):
        operators = json.loads(change["operators"])
        assert [op["id"] for op in operators] == PLAN
        assert operators[0]["source"] == "events"
        assert {op["is_backlog"] for op in operators} == {change["is_backlog"]}

    # Every input row was read once, and the sink equals a batch recomputation.
    assert sum(r["num_input_rows"] for r in rows) == 300_000 + producer.stats.events
    assert_exactly_once(dirs, window_s=10)
