import asyncio
from datetime import UTC, datetime, timedelta

from airflow.sdk.module_loading import import_string

from airflow_provider_backlog.triggers.metrics import JobExpectationTrigger
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import (
    CONN_ID,
    add_checkpoints,
    database_away,
    use_connection,
)

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
    assert message.startswith(
        "cannot read the metrics of job 'events' through connection 'metrics_test' (retried for 1."
    )
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
