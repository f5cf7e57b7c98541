import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk.exceptions import AirflowException, TaskDeferred

from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor, BacklogPhaseSensor
from airflow_provider_backlog.triggers.metrics import JobExpectationTrigger
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import (
    CONN_ID,
    add_checkpoints,
    use_connection,
)
from tools.faults.chaos import database_away


def live_sensor(**kwargs) -> BacklogPhaseSensor:
    return BacklogPhaseSensor(
        task_id="events_live",
        job_name="events",
        phase="live",
        for_checkpoints=2,
        metrics_conn_id=CONN_ID,
        **kwargs,
    )


def test_poking_waits_for_the_phase_to_hold_for_enough_checkpoints(connected):
    start = datetime.now(UTC) - timedelta(seconds=30)
    sensor = live_sensor(deferrable=False, mode="reschedule")
    assert not sensor.poke({})
    add_checkpoints(connected, "events", "run-1", start, "bbl")
    assert not sensor.poke({})
    add_checkpoints(connected, "events", "run-1", start + timedelta(seconds=3), "l", 3)
    answer = sensor.poke({})
    assert answer and answer.xcom_value == {
        "job_name": "events",
        "run_id": "run-1",
        "last_committed_at": (start + timedelta(seconds=3)).isoformat(),
        "phase": "live",
        "streak": 2,
    }


def test_a_deferrable_sensor_hands_the_wait_to_the_triggerer(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC), "bl")
    with pytest.raises(TaskDeferred) as deferred:
        live_sensor(
            deferrable=True,
            poke_interval=5,
            timeout=600,
            database_retry_timeout=timedelta(minutes=2),
        ).execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, JobExpectationTrigger)
    kwargs = trigger.serialize()[1]
    since = datetime.fromisoformat(kwargs.pop("since"))
    assert abs((datetime.now(UTC) - since).total_seconds()) < 60
    assert kwargs == {
        "metrics_conn_id": CONN_ID,
        "job_name": "events",
        "expectation": {"phase": "live", "checkpoints": 2, "within_s": None},
        "poll_interval_s": 5,
        "database_retry_timeout_s": 120.0,
    }
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(minutes=10)


def test_a_deferrable_sensor_whose_wait_is_over_does_not_defer(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC), "ll")
    assert live_sensor(deferrable=True).execute({})["streak"] == 2


def test_an_error_event_fails_the_task_with_its_message():
    with pytest.raises(AirflowException, match=r"^cannot read the metrics of job 'events'$"):
        live_sensor().execute_complete(
            {}, {"status": "error", "message": "cannot read the metrics of job 'events'"}
        )


def test_freshness_is_a_checkpoint_within_the_given_time(connected):
    sensor = BacklogFreshnessSensor(
        task_id="fresh",
        job_name="events",
        within=timedelta(minutes=1),
        metrics_conn_id=CONN_ID,
        deferrable=False,
    )
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC) - timedelta(minutes=5), "l")
    assert not sensor.poke({})
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC), "l", 1)
    assert sensor.poke({})


def test_an_impossible_wait_is_refused_when_the_dag_is_parsed():
    with pytest.raises(
        ValueError, match=r"^phase 'caught-up' must be one of \['live', 'backlog'\]"
    ):
        BacklogPhaseSensor(task_id="x", job_name="events", phase="caught-up")


def test_a_run_that_ended_while_awaited_fails_the_sensor_but_an_earlier_one_does_not(connected):
    store = LeaseStore(connected)
    try:
        store.release(store.acquire("events", "file:///ck", "run-1", 30).lease)
        sensor = live_sensor(deferrable=False)  # began after run-1 ended: a relaunch is due
        assert not sensor.poke({})
        store.release(store.acquire("events", "file:///ck", "run-2", 30).lease)
        with pytest.raises(AirflowException) as raised:
            sensor.poke({})
        assert str(raised.value).startswith("the run run-2 of job 'events' ended at ")
        assert str(raised.value).endswith(" while it was awaited")
    finally:
        store.close()


def test_poking_rides_out_a_database_away_for_its_retry_budget(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/db/metrics.db"
    (tmp_path / "db").mkdir()
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    use_connection(monkeypatch, host=url.removeprefix("sqlite:///"))
    add_checkpoints(url, "events", "run-1", datetime.now(UTC) - timedelta(seconds=30), "ll")
    patient = live_sensor(deferrable=False, database_retry_timeout=timedelta(minutes=1))
    impatient = live_sensor(deferrable=False, database_retry_timeout=timedelta(0))
    with database_away(tmp_path / "db"):
        assert not patient.poke({})
        assert not patient.poke({})
        with pytest.raises(OSError):
            impatient.poke({})
    assert patient.poke({}).is_done


@pytest.mark.parametrize("setting", ["True", "False"])
def test_deferring_by_default_follows_airflows_default_deferrable(setting):
    """As in the official providers; read when the module is imported, so in a fresh one."""
    script = (
        "from airflow_provider_backlog.sensors.metrics import BacklogPhaseSensor\n"
        "print(BacklogPhaseSensor(task_id='t', job_name='j', phase='live').deferrable)"
    )
    environment = os.environ | {"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == setting, result.stderr
