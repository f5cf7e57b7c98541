import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from airflow.providers.common.sql.sensors.sql import SqlSensor
from airflow.providers_manager import ProvidersManager
from sqlalchemy.engine import make_url

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook, MetricsConnectionError
from spark_jobs.metrics.schema import backlog_transitions
from tests.airflow_provider_backlog.conftest import insert

CONN_ID = "metrics_test"


def use_connection(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """An Airflow connection from the environment, as a deployment's secrets would give it."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "backlog_metrics", **fields})
    )


def connect_to(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    if url.startswith("sqlite:///"):
        use_connection(monkeypatch, host=url.removeprefix("sqlite:///"))
    else:
        use_connection(monkeypatch, extra={"url": url})


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


def test_queries_and_sql_sensor_work_through_the_hook(monkeypatch, metrics_url):
    connect_to(monkeypatch, metrics_url)
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
