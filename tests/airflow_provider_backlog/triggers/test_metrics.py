import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk.module_loading import import_string

from airflow_provider_backlog.triggers.metrics import JobExpectationTrigger
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import (
    CONN_ID,
    add_checkpoints,
    use_connection,
)
from tools.faults.chaos import database_away

LIVE_TWICE = {"phase": "live", "checkpoints": 2, "within_s": None}
SINCE = "2026-11-21T12:00:00+00:00"


def test_the_trigger_survives_serialization():
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.5, SINCE)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_backlog.triggers.metrics.JobExpectationTrigger"
    assert kwargs == {
        "metrics_conn_id": CONN_ID,
        "job_name": "events",
        "expectation": LIVE_TWICE,
        "poll_interval_s": 0.5,
        "since": SINCE,
        "database_retry_timeout_s": 300.0,
    }
    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)


def test_the_trigger_fires_once_the_job_has_been_live_long_enough(connected):
    start = datetime.now(UTC) - timedelta(seconds=30)
    add_checkpoints(connected, "events", "run-1", start, "bbl")
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE)

    async def scenario():
        waiting = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(0.5)
        assert not waiting.done(), "fired after one live checkpoint"
        await asyncio.to_thread(
            add_checkpoints, connected, "events", "run-1", start + timedelta(seconds=3), "l", 3
        )
        return await asyncio.wait_for(waiting, 10)

    event = asyncio.run(scenario())
    assert event.payload == {
        "status": "success",
        "snapshot": {
            "job_name": "events",
            "run_id": "run-1",
            "last_committed_at": (start + timedelta(seconds=3)).isoformat(),
            "phase": "live",
            "streak": 2,
        },
    }


def test_a_database_that_stays_unreachable_is_an_error_event_after_the_retries(monkeypatch):
    use_connection(monkeypatch, extra={"url": "postgresql://metrics:s3cret@127.0.0.1:1/metrics"})
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE, 1.0)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 60))
    assert event.payload["status"] == "error"
    message = event.payload["message"]
    prefix = "cannot read the metrics of job 'events' through connection 'metrics_test' "
    # The time it retried for, as long as the 1 s budget or longer on a slow machine.
    retried = re.match(re.escape(prefix) + r"\(retried for (\d+(?:\.\d+)?)s\)", message)
    assert retried and float(retried.group(1)) >= 1.0, message
    assert "127.0.0.1" in message and "s3cret" not in message


def test_a_query_that_cannot_work_is_an_error_event_at_once(monkeypatch):
    use_connection(monkeypatch, extra={"url": "nosuchdatabase://metrics@db/metrics"})
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE, 600.0)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 30))
    assert event.payload["status"] == "error"
    assert event.payload["message"].startswith(
        "cannot read the metrics of job 'events' through connection 'metrics_test': "
    )
    assert "nosuchdatabase" in event.payload["message"]


def test_the_trigger_rides_out_a_database_that_is_away_for_a_while(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/db/metrics.db"
    (tmp_path / "db").mkdir()
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    use_connection(monkeypatch, host=url.removeprefix("sqlite:///"))
    start = datetime.now(UTC) - timedelta(seconds=30)
    add_checkpoints(url, "events", "run-1", start, "ll")
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE, 60.0)

    async def scenario():
        with database_away(tmp_path / "db"):
            waiting = asyncio.ensure_future(anext(trigger.run()))
            await asyncio.sleep(1.5)
            assert not waiting.done(), "gave up on a database away for a moment"
        return await asyncio.wait_for(waiting, 30)

    event = asyncio.run(scenario())
    assert event.payload["status"] == "success"


def test_a_driver_that_died_ends_the_wait_with_an_error_naming_it(connected):
    store = LeaseStore(connected)
    store.acquire("events", "file:///ck", "run-1", 0.3)  # and its driver dies
    store.close()
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 10))
    assert event.payload["status"] == "error"
    assert event.payload["message"].startswith(
        "the driver of job 'events' (run run-1) stopped renewing its lease, which expired at "
    )
    assert event.payload["message"].endswith(": it has died")


@contextlib.contextmanager
def locked(url: str) -> Iterator[None]:
    """The SQLite database held by another connection in ``BEGIN EXCLUSIVE`` (with exclusive
    locking, which shuts out readers of a WAL database too): they get "database is locked"
    after their busy timeout of 5 s."""
    lock = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30, isolation_level=None)
    try:
        lock.execute("PRAGMA locking_mode=EXCLUSIVE")
        lock.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        lock.close()


@pytest.mark.parametrize("metrics_url", ["sqlite"], indirect=True)
def test_the_trigger_rides_out_a_locked_database_and_fires_once_it_is_free(connected, capsys):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC) - timedelta(seconds=30), "ll")
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE, 60.0)

    log = ""  # Airflow's structured log

    async def scenario():
        nonlocal log
        with locked(connected):
            waiting = asyncio.ensure_future(anext(trigger.run()))
            # Locked until a read has given up on it (past the readers' busy timeout) and
            # the trigger has said it will try again, however slowly the machine runs.
            deadline = time.monotonic() + 60
            while "did not answer" not in log and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                log += capsys.readouterr().out
            assert not waiting.done(), "gave up on a database locked for a moment"
        return await asyncio.wait_for(waiting, 30)

    event = asyncio.run(scenario())
    assert event.payload["status"] == "success"
    retry = next(line for line in log.splitlines() if "did not answer" in line)
    assert "warning" in retry and "database is locked" in retry


@pytest.mark.parametrize("metrics_url", ["sqlite"], indirect=True)
def test_a_database_locked_past_the_retry_budget_is_an_error_event_naming_it(connected):
    trigger = JobExpectationTrigger(CONN_ID, "events", LIVE_TWICE, 0.05, SINCE, 1.0)
    with locked(connected):
        event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 60))
    assert event.payload["status"] == "error"
    message = event.payload["message"]
    assert message.startswith(
        "cannot read the metrics of job 'events' through connection 'metrics_test' (retried for "
    )
    assert "database is locked" in message
