"""A running Spark job and what guards it: a second driver on its checkpoint is refused by
the driver itself while the first renews its lease, and Airflow's stop operator ends the
run cleanly after a commit. (Reconfiguring a running job is tested through the example
DAG in test_airflow_dags.py.)"""

import json

from airflow_provider_backlog.operators.control import BacklogStopOperator
from tests.integration.jobs import (
    JobDirs,
    backlog_then_live,
    base_conf,
    checkpoints,
    console_job,
    finish,
    log_of,
    wait_for,
)


def test_a_second_driver_is_refused_and_a_stop_ends_the_run_after_a_commit(tmp_path, monkeypatch):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, 20_000, 4, events_per_s=200, file_every_s=0.5)
    conf = base_conf(dirs, "guarded", interval="1s", interval_during_backlog="1min")
    monkeypatch.setenv(
        "AIRFLOW_CONN_JOB_METRICS",
        json.dumps({"conn_type": "backlog_metrics", "host": str(dirs.metrics_dir / "metrics.db")}),
    )
    try:
        job = console_job(dirs, conf, "--timeout", "240s")
        wait_for(lambda: len(checkpoints(dirs)) >= 1, "a first checkpoint", 180, job)

        second = console_job(dirs, conf)
        assert second.wait(120) == 2
        refusal = log_of(second)
        assert "job 'guarded' at checkpoint file://" in refusal
        assert "is already run by" in refusal

        # Stopped from Airflow while data still arrives: after a commit, cleanly.
        stop = BacklogStopOperator(
            task_id="stop", job_name="guarded", metrics_conn_id="job_metrics", poll_interval_s=0.2
        )
        assert stop.execute({}).endswith("stops after its next committed checkpoint")
        finish(job, 60)
    finally:
        producer.stop()
    assert len({r["run_id"] for r in checkpoints(dirs)}) == 1, "the second driver ran"
