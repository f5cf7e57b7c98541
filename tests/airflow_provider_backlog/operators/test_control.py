from datetime import timedelta

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.operators.control import (
    BacklogReconfigureOperator,
    BacklogStopOperator,
)
from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.coordinator.appliers import SourceGatedApplier
from spark_jobs.coordinator.control import ControlPoller
from spark_jobs.coordinator.coordinator import BacklogCoordinator
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.writer import MetricsWriter
from spark_jobs.sources.gate import PlanChannel
from tests.airflow_provider_backlog.conftest import CONN_ID


@pytest.fixture
def running_job(connected, tmp_path):
    """The driver side of a running job (coordinator and control poller), without Spark."""
    conf = {
        "spark.backlog.job-name": "events",
        "spark.backlog.run-id": "run-1",
        "spark.backlog.checkpointing.interval": "2s",
        "spark.backlog.checkpointing.interval-during-backlog": "1min",
        "spark.backlog.metrics.url": connected,
    }
    config = BacklogConfig.from_spark_conf(conf)
    writer = MetricsWriter(connected)
    coordinator = BacklogCoordinator(
        config, SourceGatedApplier(PlanChannel(tmp_path / "channel"), config), writer
    )
    coordinator.start()
    leases = LeaseStore(connected)
    lease = leases.acquire("events", "file:///checkpoint", "run-1", 30).lease
    # As the runtime does: a stop ends the run, which lets go of its lease.
    poller = ControlPoller(
        config, conf, coordinator.reconfigure, lambda: leases.release(lease), every_s=0.1
    )
    poller.start()
    yield coordinator
    poller.close()
    leases.close()
    writer.close()


def reconfigure(**kwargs) -> BacklogReconfigureOperator:
    return BacklogReconfigureOperator(
        task_id="reconfigure",
        job_name="events",
        metrics_conn_id=CONN_ID,
        poll_interval_s=0.1,
        **kwargs,
    )


def test_the_job_applies_new_intervals_and_the_task_returns_them(running_job):
    answer = reconfigure(interval="5s", interval_during_backlog="2min").execute({})
    assert answer == (
        "job=events run=run-1 interval=5s interval-during-backlog=2min min-pause=0 "
        "max-batch-rows=1000000"
    )
    assert (running_job.config.interval_s, running_job.config.interval_during_backlog_s) == (
        5.0,
        120.0,
    )


def test_invalid_values_fail_the_task_with_the_jobs_message_and_change_nothing(running_job):
    with pytest.raises(AirflowException) as raised:
        reconfigure(interval="5 parsecs").execute({})
    assert str(raised.value).startswith(
        "job 'events' rejected {'spark.backlog.checkpointing.interval': '5 parsecs'}: "
        "invalid backlog configuration:\n  spark.backlog.checkpointing.interval = '5 parsecs' "
        "is invalid: "
    )
    assert running_job.config.interval_s == 2.0


def test_no_running_job_fails_the_task_and_a_later_run_does_not_act_on_it(connected, tmp_path):
    with pytest.raises(AirflowException) as raised:
        reconfigure(interval="5s", answer_timeout=timedelta(seconds=0.5)).execute({})
    assert str(raised.value) == (
        "job 'events' did not answer reconfigure request 1 within 0.5 s: is it running?"
    )
    # The request was withdrawn: a run that starts afterwards finds nothing to answer.
    config = BacklogConfig.from_spark_conf(
        {"spark.backlog.job-name": "events", "spark.backlog.metrics.url": connected}
    )
    poller = ControlPoller(config, {}, lambda new: None, lambda: None)
    try:
        assert poller.poll_once() == 0
    finally:
        poller.close()


def test_nothing_to_change_is_refused_when_the_dag_is_parsed():
    with pytest.raises(
        ValueError,
        match=r"^set at least one of interval, interval_during_backlog, freshness_target$",
    ):
        BacklogReconfigureOperator(task_id="x", job_name="events")


def test_settings_that_render_empty_fail_the_task_naming_each(running_job):
    with pytest.raises(AirflowException) as raised:
        reconfigure(interval="", freshness_target=None).execute({})
    assert str(raised.value) == (
        "interval, interval_during_backlog, freshness_target are all empty once rendered "
        "('', None, None): set at least one"
    )


def test_a_freshness_target_set_on_a_running_job_chooses_its_live_interval(running_job):
    answer = reconfigure(freshness_target="3s").execute({})
    assert answer == (
        "job=events run=run-1 interval=2s interval-during-backlog=1min min-pause=0 "
        "max-batch-rows=1000000 freshness-target=3s"
    )
    # nothing measured yet: half the target
    assert running_job.decider.decision.interval_s == 1.5
    with pytest.raises(AirflowException) as raised:
        reconfigure(freshness_target="0").execute({})
    assert "spark.backlog.checkpointing.freshness-target = '0' is invalid: " in str(raised.value)
    assert running_job.config.freshness_target_s == 3.0


def test_a_stop_is_answered_and_waits_until_the_run_has_ended(running_job, connected):
    stop = BacklogStopOperator(
        task_id="stop", job_name="events", metrics_conn_id=CONN_ID, poll_interval_s=0.1
    )
    assert stop.execute({}) == "run run-1 stops after its next committed checkpoint"
    assert LeaseStore(connected).get("file:///checkpoint").released_at is not None
