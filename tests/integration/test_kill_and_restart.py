"""SIGKILL in real time on landing files, then a second driver on the same checkpoint
refused by the driver itself, and a stop from Airflow's stop operator after a commit: the
output stays exactly-once. (A kill in the middle of the backlog is the fault campaign's
``sigkill-files``, tests/integration/test_chaos.py.)"""

import json

from airflow_provider_backlog.operators.control import BacklogStopOperator
from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    assert_stopped_after_a_commit,
    backlog_then_live,
    base_conf,
    checkpoints,
    console_job,
    finish,
    kill_hard,
    log_of,
    transitions,
    wait_for,
)


def test_killed_in_real_time_then_restarted_a_second_driver_refused_and_stopped_from_airflow(
    tmp_path, monkeypatch
):
    dirs = JobDirs(tmp_path)
    monkeypatch.setenv(
        "AIRFLOW_CONN_JOB_METRICS",
        json.dumps({"conn_type": "backlog_metrics", "host": str(dirs.metrics_dir / "metrics.db")}),
    )
    producer = backlog_then_live(dirs, 30_000, 6, events_per_s=300, file_every_s=0.5)
    conf = base_conf(
        dirs, "restarts", interval="1s", interval_during_backlog="1min", max_batch_rows="15000"
    )
    try:
        job = console_job(dirs, conf)
        wait_for(
            lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= 4,
            "4 live checkpoints",
            240,
            job,
        )
        kill_hard(job)
        killed_at = max(r["batch_id"] for r in checkpoints(dirs))

        job = console_job(dirs, conf, "--timeout", "240s")
        wait_for(lambda: len(checkpoints(dirs)) >= killed_at + 2, "more checkpoints", 120, job)
        second = console_job(dirs, conf)
        assert second.wait(120) == 2
        refusal = log_of(second)
        assert "job 'restarts' at checkpoint file://" in refusal
        assert "is already run by" in refusal

        # Stopped from Airflow while data still arrives: after a commit, cleanly.
        stop = BacklogStopOperator(
            task_id="stop", job_name="restarts", metrics_conn_id="job_metrics", poll_interval_s=0.2
        )
        assert stop.execute({}).endswith("stops after its next committed checkpoint")
        finish(job, 60)
        assert_stopped_after_a_commit(dirs)
    finally:
        producer.stop()

    rows = checkpoints(dirs)
    batch_ids = [r["batch_id"] for r in rows]
    assert len(batch_ids) == len(set(batch_ids)), "a batch was committed twice"
    assert len({r["run_id"] for r in rows}) == 2
    # The first run starts in backlog; the restart continues the job's status, so the
    # only change is the switch to live.
    assert [t["is_backlog"] for t in transitions(dirs)] == [True, False]
    assert_exactly_once(dirs, window_s=10)
