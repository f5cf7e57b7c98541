"""Airflow's reconfigure operator against a running Spark job: new intervals are applied
without a restart, and an invalid request is refused with the job's reason while the job
keeps running; a second driver on its checkpoint is refused; a stop ends it cleanly."""

import json
from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.operators.control import (
    BacklogReconfigureOperator,
    BacklogStopOperator,
)
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


def reconfigure(**kwargs) -> str:
    return BacklogReconfigureOperator(
        task_id="reconfigure",
        job_name="reconfigured",
        metrics_conn_id="job_metrics",
        answer_timeout=timedelta(seconds=60),
        poll_interval_s=0.2,
        **kwargs,
    ).execute({})


def live_intervals_ms(dirs: JobDirs) -> list[int]:
    return [r["effective_interval_ms"] for r in checkpoints(dirs) if not r["is_backlog"]]


def test_a_running_job_takes_new_intervals_and_refuses_invalid_ones(tmp_path, monkeypatch):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, 20_000, 4, events_per_s=200, file_every_s=0.5)
    conf = base_conf(dirs, "reconfigured", interval="1s", interval_during_backlog="1min")
    monkeypatch.setenv(
        "AIRFLOW_CONN_JOB_METRICS",
        json.dumps({"conn_type": "backlog_metrics", "host": str(dirs.metrics_dir / "metrics.db")}),
    )
    try:
        job = console_job(dirs, conf, "--timeout", "240s")
        wait_for(lambda: len(live_intervals_ms(dirs)) >= 2, "2 live checkpoints", 180, job)
        before = len(checkpoints(dirs))

        answer = reconfigure(interval="3s", interval_during_backlog="2min")
        assert "interval=3s interval-during-backlog=2min" in answer
        wait_for(lambda: live_intervals_ms(dirs)[-2:] == [3000, 3000], "3 s checkpoints", 60, job)

        with pytest.raises(AirflowException) as raised:
            reconfigure(interval="5min")
        assert (
            "spark.backlog.checkpointing.interval-during-backlog = '2min' is invalid: it must "
            "be 0 (no periodic checkpoint during backlog) or at least "
            "spark.backlog.checkpointing.interval (5min)" in str(raised.value)
        )
        count = len(checkpoints(dirs))
        wait_for(lambda: len(checkpoints(dirs)) >= count + 2, "the job running on", 60, job)

        # A second driver on the same checkpoint is refused while the first one lives.
        second = console_job(dirs, conf)
        assert second.wait(120) == 2
        refusal = log_of(second)
        assert "job 'reconfigured' at checkpoint file://" in refusal
        assert "is already run by" in refusal

        # Stopped from Airflow while data still arrives: after a commit, cleanly.
        stop = BacklogStopOperator(
            task_id="stop",
            job_name="reconfigured",
            metrics_conn_id="job_metrics",
            poll_interval_s=0.2,
        )
        assert stop.execute({}).endswith("stops after its next committed checkpoint")
        finish(job, 60)
    finally:
        producer.stop()

    rows = checkpoints(dirs)
    assert len({r["run_id"] for r in rows}) == 1, "the job was restarted"
    assert {r["effective_interval_ms"] for r in rows[before:] if not r["is_backlog"]} >= {3000}
    assert live_intervals_ms(dirs)[-1] == 3000
