import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from airflow.providers.common.sql.sensors.sql import SqlSensor
from airflow.providers_manager import ProvidersManager
from sqlalchemy.engine import make_url

from airflow_provider_backlog.hooks.metrics import (
    BacklogMetricsHook,
    Expectation,
    JobSnapshot,
    MetricsConnectionError,
    RunStart,
)
from airflow_provider_backlog.hooks.metrics_poll import read_job, stop_reason
from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.coordinator.control import ControlPoller
from spark_jobs.metrics.lease import LeaseStore, offer_standby
from spark_jobs.metrics.schema import backlog_leases, backlog_transitions
from tests.airflow_provider_backlog.conftest import (
    CONN_ID,
    add_checkpoints,
    insert,
    use_connection,
)

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_the_provider_is_listed_by_airflow():
    listed = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", "list", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    providers = {p["package_name"]: p for p in json.loads(listed.stdout)}
    assert providers["airflow-provider-backlog"]["version"] == "0.1.0"


def test_the_connection_type_reaches_the_connection_form():
    manager = ProvidersManager()
    hook = manager.hooks["backlog_metrics"]
    assert hook.hook_class_name == "airflow_provider_backlog.hooks.metrics.BacklogMetricsHook"
    assert hook.hook_name == "Backlog metrics database"
    behaviour = manager.field_behaviours["backlog_metrics"]
    assert behaviour["hidden_fields"] == ["schema", "login", "port", "extra"]
    assert behaviour["relabeling"]["host"] == "SQLite file (when no URL is given)"
    assert "extra__backlog_metrics__url" in manager.connection_form_widgets


def test_queries_and_sql_sensor_work_through_the_hook(connected):
    metrics_url = connected
    at = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    insert(
        metrics_url,
        backlog_transitions,
        {"job_name": "events", "run_id": "r1", "at": at, "is_backlog": False, "reason": "x"},
    )
    hook = BacklogMetricsHook(CONN_ID)
    sql = (
        f"SELECT job_name, is_backlog FROM backlog_transitions WHERE job_name = {hook.placeholder}"
    )
    records = hook.get_records(sql, parameters=("events",))
    # SQLite has no boolean type: it answers 0 where PostgreSQL answers false.
    assert [(job, bool(backlog)) for job, backlog in records] == [("events", False)]

    def live(job: str) -> bool:
        sensor = SqlSensor(
            task_id="live",
            conn_id=CONN_ID,
            sql="SELECT COUNT(*) FROM backlog_transitions "
            f"WHERE job_name = '{job}' AND is_backlog = false",
        )
        return sensor.poke({})

    assert live("events") is True
    assert live("other") is False


def test_a_url_without_password_takes_the_connection_password(monkeypatch):
    use_connection(
        monkeypatch, password="s3cret", extra={"url": "postgresql://metrics@db:5432/metrics"}
    )
    url = make_url(BacklogMetricsHook(CONN_ID).get_uri())
    assert (url.username, url.password, url.host, url.database) == (
        "metrics",
        "s3cret",
        "db",
        "metrics",
    )


def test_a_sqlite_file_as_host_is_a_sqlite_url(monkeypatch, tmp_path):
    use_connection(monkeypatch, host=str(tmp_path / "m.db"))
    hook = BacklogMetricsHook(CONN_ID)
    assert (hook.get_uri(), hook.placeholder) == (f"sqlite:///{tmp_path}/m.db", "?")


def test_a_connection_naming_no_database_is_a_clear_error(monkeypatch):
    use_connection(monkeypatch)
    with pytest.raises(MetricsConnectionError) as raised:
        BacklogMetricsHook(CONN_ID).get_uri()
    assert str(raised.value) == (
        "connection 'metrics_test' names no metrics database: set its SQLAlchemy URL "
        "(e.g. postgresql://user@host:5432/metrics) or, for SQLite, its file as host"
    )


def test_the_snapshot_counts_the_latest_run_in_the_phase_of_its_last_checkpoint(connected):
    add_checkpoints(connected, "events", "run-1", T0, "bbbll")
    add_checkpoints(connected, "events", "run-2", T0 + timedelta(minutes=1), "lblll")
    add_checkpoints(connected, "other", "run-9", T0 + timedelta(minutes=2), "b")
    hook = BacklogMetricsHook(CONN_ID)
    last = T0 + timedelta(minutes=1, seconds=4)
    assert hook.job_snapshot("events", 10) == JobSnapshot("events", "run-2", last, "live", 3)
    # asked for fewer, it reads no further
    assert hook.job_snapshot("events", 2) == JobSnapshot("events", "run-2", last, "live", 2)
    assert hook.job_snapshot("missing") is None


def test_a_new_run_starts_its_streak_afresh(connected):
    add_checkpoints(connected, "events", "run-1", T0, "lll")
    add_checkpoints(connected, "events", "run-2", T0 + timedelta(minutes=1), "l")
    snapshot = BacklogMetricsHook(CONN_ID).job_snapshot("events", 5)
    assert (snapshot.run_id, snapshot.streak) == ("run-2", 1)


def test_expectations():
    snapshot = JobSnapshot("events", "r", T0, "live", 3)
    assert Expectation("live", 3).met_by(snapshot, T0)
    assert not Expectation("live", 4).met_by(snapshot, T0)
    assert not Expectation("backlog").met_by(snapshot, T0)
    assert Expectation(within_s=60).met_by(snapshot, T0 + timedelta(seconds=60))
    assert not Expectation(within_s=60).met_by(snapshot, T0 + timedelta(seconds=61))
    assert not Expectation("live", within_s=60).met_by(None, T0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "expect a phase ('live' or 'backlog'), a freshness, or both"),
        ({"phase": "caught-up"}, "phase 'caught-up' must be one of ['live', 'backlog']"),
        ({"phase": "live", "checkpoints": 0}, "checkpoints = 0 must be 1 to 1000"),
        ({"within_s": -5}, "freshness = -5 s must be above 0"),
    ],
)
def test_impossible_expectations_are_refused_by_name(fields, message):
    with pytest.raises(ValueError) as raised:
        Expectation(**fields)
    assert str(raised.value) == message


def test_a_database_the_job_has_not_written_yet_has_no_snapshot(monkeypatch, tmp_path):
    use_connection(monkeypatch, host=str(tmp_path / "not-yet" / "metrics.db"))
    assert BacklogMetricsHook(CONN_ID).job_snapshot("events") is None


def test_the_live_run_is_the_one_whose_lease_is_renewed_and_not_released(connected):
    leases = LeaseStore(connected)
    hook = BacklogMetricsHook(CONN_ID)
    assert hook.live_run("events") is None
    held = leases.acquire("events", "file:///ck", "r1", 30, spark_ui_url="http://driver:4040")
    live = hook.live_run("events")
    assert live is not None
    assert live.describe() == (
        f"run r1 of job 'events' at file:///ck (lease renewed until "
        f"{held.lease.expires_at.isoformat()}, Spark UI http://driver:4040)"
    )
    # Its driver dies: the lease is renewed no more and runs out (here at once, by the
    # database's clock, rather than after a time to live the machine may not keep to).
    with hook.engine.begin() as connection:
        ends = backlog_leases.update().where(backlog_leases.c.run_id == "r1")
        connection.execute(ends.values(expires_at=hook.database_now()))
    expired = hook.database_now()
    while hook.database_now() <= expired:
        time.sleep(0.01)
    assert hook.live_run("events") is None, "expired by the database's clock: driver died"
    assert "stopped renewing its lease" in stop_reason("events", read_job(hook, "events", 1), T0)
    retaken = leases.acquire("events", "file:///ck", "r2", 30).lease
    assert hook.live_run("events").run_id == "r2"
    leases.release(retaken)
    assert hook.live_run("events") is None
    assert hook.run_released("events", "r2", wait_s=0, poll_s=0.1)
    leases.close()


def test_a_run_has_started_once_it_holds_its_lease_and_has_committed(connected):
    hook = BacklogMetricsHook(CONN_ID)
    leases = LeaseStore(connected)
    leases.acquire("events", "file:///ck", "r2", 30, spark_ui_url="http://driver:4041")
    assert hook.run_start("events", "r2") is None
    add_checkpoints(connected, "events", "r1", T0 - timedelta(minutes=5), "bb")
    assert hook.run_start("events", "r2") is None, "another run's checkpoints do not count"
    add_checkpoints(connected, "events", "r2", T0 + timedelta(seconds=5), "bl", first_batch=2)
    start = hook.run_start("events", "r2")
    assert start == RunStart("r2", T0 + timedelta(seconds=5), "http://driver:4041")
    leases.close()


def test_a_request_the_job_took_is_answered_even_after_the_timeout(connected):
    """The job takes a request before acting on it: one it took while the asker gave up
    waiting is not withdrawn but answered, so the asker reports what the job did."""
    config = BacklogConfig.from_spark_conf(
        {"spark.backlog.job-name": "events", "spark.backlog.metrics.url": connected}
    )
    # The job polls every 0.05 s, so it takes the request well within the asker's 2 s
    # (however slowly the machine runs), then acts on it for longer than that from then on.
    asker_waits_s = 2.0
    poller = ControlPoller(
        config, {}, lambda new: time.sleep(asker_waits_s + 0.5), lambda: None, every_s=0.05
    )
    poller.start()
    try:
        answer = BacklogMetricsHook(CONN_ID).ask(
            "events",
            "reconfigure",
            {"spark.backlog.checkpointing.interval": "5s"},
            timeout_s=asker_waits_s,
            poll_s=0.05,
        )
    finally:
        poller.close()
    assert "interval=5s" in answer


def test_a_run_standing_by_is_seen_until_the_lease_changes_hands(connected):
    store = LeaseStore(connected)
    held = store.acquire("events", "file:///ck", "r1", 30).lease
    hook = BacklogMetricsHook(CONN_ID)
    assert not hook.standing_by("events", "r2")
    with hook.engine.begin() as connection:
        assert offer_standby(connection, held, "r2")
    assert hook.standing_by("events", "r2")
    assert not hook.standing_by("events", "r3")
    assert not hook.standing_by("orders", "r2")
    store.release(held)
    assert not hook.standing_by("events", "r2"), "the lease it stood by for is no longer live"
    store.close()
