"""A make-before-break relaunch through spark-submit: the next run warms up and stands by
while the running one serves on, takes the lease the moment the running one lets go after
a commit, and carries on from the checkpoint; every event lands exactly once."""

from __future__ import annotations

import sqlalchemy as sa

from spark_jobs.metrics import control, lease
from spark_jobs.metrics.schema import STOP, backlog_leases, make_engine
from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    assert_stopped_after_a_commit,
    backlog_then_live,
    base_conf,
    checkpoints,
    finish,
    kill_hard,
    submitted_job,
    wait_for,
)

JOB = "handover"
HISTORY = 20_000


def database(dirs: JobDirs, work):  # type: ignore[no-untyped-def]
    engine = make_engine(dirs.metrics_url)
    try:
        with engine.begin() as connection:
            return work(connection)
    finally:
        engine.dispose()


def committed_by(dirs: JobDirs, run_id: str) -> list[int]:
    return [row["batch_id"] for row in checkpoints(dirs) if row["run_id"] == run_id]


def rows_read(dirs: JobDirs) -> int:
    return sum(row["num_input_rows"] for row in checkpoints(dirs))


def stop(dirs: JobDirs, run_id: str) -> None:
    database(dirs, lambda connection: control.send(connection, JOB, STOP, for_run_id=run_id))


def test_a_standby_takes_over_from_the_running_run_at_its_release_exactly_once(tmp_path):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, HISTORY, 4, events_per_s=500, file_every_s=0.25)
    conf = base_conf(dirs, JOB, interval="1s", interval_during_backlog="30s")
    jobs = []
    try:
        first = submitted_job(dirs, {**conf, "spark.backlog.run-id": "first"})
        jobs.append(first)
        wait_for(
            lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= 3,
            "3 live checkpoints of the first run",
            300,
            first,
        )
        standby_conf = {
            **conf,
            "spark.backlog.run-id": "second",
            "spark.backlog.lease.wait-for-handover": "5min",
        }
        second = submitted_job(dirs, standby_conf)
        jobs.append(second)
        wait_for(
            lambda: database(dirs, lambda c: lease.standing_by(c, JOB, "second")),
            "the second run standing by",
            300,
            second,
        )
        # The first run serves on while the second stands by, which runs no batch.
        served = len(committed_by(dirs, "first"))
        wait_for(lambda: len(committed_by(dirs, "first")) >= served + 3, "3 more", 60, first)
        assert committed_by(dirs, "second") == []

        stop(dirs, "first")
        finish(first, 120)
        wait_for(lambda: len(committed_by(dirs, "second")) >= 3, "3 by the second", 120, second)
        producer.stop()
        # Every event written read, whether its batch committed before this line or after.
        written = HISTORY + producer.stats.events
        wait_for(lambda: rows_read(dirs) == written, f"all {written} events", 120, second)
        stop(dirs, "second")
        finish(second, 120)
    finally:
        if producer.is_alive():
            producer.stop()
        for job in jobs:
            if job.poll() is None:
                kill_hard(job)

    rows = checkpoints(dirs)
    assert [row["batch_id"] for row in rows] == list(range(len(rows))), "one line of batches"
    runs = [row["run_id"] for row in rows]
    assert runs == sorted(runs, key=["first", "second"].index), "the second only after the first"
    leases = database(dirs, lambda c: c.execute(sa.select(backlog_leases)).all())
    assert [(row.run_id, row.released_at is not None, row.standby_run_id) for row in leases] == [
        ("second", True, None)
    ]
    assert_stopped_after_a_commit(dirs)
    assert_exactly_once(dirs, window_s=10.0)
