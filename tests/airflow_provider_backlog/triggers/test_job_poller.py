"""The shared poll, with real triggers on real SQLite and PostgreSQL databases; every read
is counted where SQLAlchemy sends it to the database."""

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from airflow_provider_backlog.triggers import job_poller
from airflow_provider_backlog.triggers.job_poller import (
    MAX_RETRY_DELAY_S,
    Poll,
    Subscription,
    retry_delay,
)
from airflow_provider_backlog.triggers.metrics import JobExpectationTrigger
from spark_jobs.metrics.lease import LeaseStore
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints, use_connection

INTERVAL_S = 0.1
LIVE = {"phase": "live", "checkpoints": 1, "within_s": None}
BACKLOG = {"phase": "backlog", "checkpoints": 1, "within_s": None}
SINCE = "2026-11-21T12:00:00+00:00"


def trigger(
    expectation: dict, job: str = "events", at: str = SINCE, retry_s: float = 300.0
) -> JobExpectationTrigger:
    return JobExpectationTrigger(CONN_ID, job, expectation, INTERVAL_S, at, retry_s)


@contextlib.contextmanager
def checkpoint_reads() -> Iterator[Counter[str]]:
    """The reads of ``backlog_checkpoints`` sent to any database, by job name."""
    reads: Counter[str] = Counter()

    def count(_conn, _cursor, statement, parameters, _context, _many):
        if statement.lstrip().upper().startswith("SELECT") and "backlog_checkpoints" in statement:
            values = parameters.values() if isinstance(parameters, dict) else parameters
            reads.update(str(v) for v in values if isinstance(v, str))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", count)
    try:
        yield reads
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", count)


def pollers() -> dict:
    return job_poller._pollers.get(asyncio.get_running_loop(), {})


def test_the_wait_after_failures_doubles_from_the_interval_up_to_a_limit():
    delays = [retry_delay(None, 2.0)]
    for _ in range(6):
        delays.append(retry_delay(delays[-1], 2.0))
    assert delays == [2.0, 4.0, 8.0, 16.0, MAX_RETRY_DELAY_S, MAX_RETRY_DELAY_S, MAX_RETRY_DELAY_S]


def test_a_subscriber_takes_only_polls_that_read_enough_checkpoints():
    async def scenario():
        subscription = Subscription(checkpoints=3, interval_s=1.0)
        short = Poll(datetime.now(UTC), 2, None, None, 1.0)
        enough = Poll(datetime.now(UTC), 5, None, None, 1.0)
        subscription.offer(short)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(subscription.next(), 0.05)
        subscription.offer(enough)
        return await subscription.next()

    assert asyncio.run(scenario()).checkpoints == 5


def test_many_triggers_on_a_job_share_one_read_per_interval(connected):
    """20 triggers on each of two jobs: each job is read once a poll, not once per trigger."""
    start = datetime.now(UTC) - timedelta(seconds=30)
    add_checkpoints(connected, "events", "run-1", start, "b")
    add_checkpoints(connected, "orders", "run-9", start, "b")

    async def scenario():
        waits = [
            asyncio.ensure_future(anext(trigger(LIVE, job).run()))
            for job in ("events", "orders")
            for _ in range(20)
        ]
        began = time.monotonic()
        await asyncio.sleep(1.0)
        assert not any(w.done() for w in waits)
        assert set(pollers()) == {(CONN_ID, "events"), (CONN_ID, "orders")}
        await asyncio.to_thread(add_checkpoints, connected, "events", "run-1", start, "l", 1)
        await asyncio.to_thread(add_checkpoints, connected, "orders", "run-9", start, "l", 1)
        events = await asyncio.wait_for(asyncio.gather(*waits), 30)
        return events, time.monotonic() - began, pollers()

    with checkpoint_reads() as reads:
        events, elapsed_s, left = asyncio.run(scenario())
    assert {e.payload["status"] for e in events} == {"success"}
    most_polls = elapsed_s / INTERVAL_S + 1  # reads are at least an interval apart
    for job in ("events", "orders"):
        assert 1 <= reads[job] <= most_polls, (job, reads, elapsed_s)
    assert not left, "a poller outlived its triggers"


def test_cancelled_triggers_leave_and_the_last_one_out_ends_the_poll(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC), "b")

    async def scenario(reads: Counter[str]):
        waits = [asyncio.ensure_future(anext(trigger(LIVE).run())) for _ in range(3)]
        await asyncio.sleep(0.5)
        waits[0].cancel()
        await asyncio.sleep(0.3)
        assert (CONN_ID, "events") in pollers(), "ended while triggers still wait"
        for wait in waits[1:]:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        assert not pollers()
        after_cancel = reads["events"]
        await asyncio.sleep(10 * INTERVAL_S)
        return after_cancel

    with checkpoint_reads() as reads:
        after_cancel = asyncio.run(scenario(reads))
    # A read already in its thread as the last trigger left ends there (a thread cannot be
    # cancelled); a poll that went on would have read about ten times more.
    assert reads["events"] <= after_cancel + 1, "reads went on after every trigger left"


@pytest.mark.parametrize("outcome", ["returns", "raises"])
def test_the_last_one_out_closes_the_connections_only_after_the_read_under_way(outcome):
    """Disposing the engine while a read still runs in its thread would close the
    connection under it; the poller ends once that read has ended, however it ends."""
    entered, release = threading.Event(), threading.Event()
    ended: list[bool] = []

    def read(_count: int):
        entered.set()
        release.wait(10)
        if outcome == "raises":
            raise ConnectionError("the database went away")
        return None

    async def scenario():
        poller = job_poller.JobPoller(read, lambda: ended.append(release.is_set()))
        subscription = poller.subscribe(1, INTERVAL_S)
        await asyncio.to_thread(entered.wait, 10)
        assert poller.unsubscribe(subscription)
        await asyncio.sleep(0.2)
        assert ended == [], "ended while its read was still under way"
        release.set()
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert ended == [True]


def test_a_triggerer_shutting_down_mid_read_closes_the_connections_after_the_read():
    """The triggerer ends with ``asyncio.run``, which cancels the poll while its read goes on
    in a thread, and waits for that thread: the poller ends once, after the read."""
    entered, release = threading.Event(), threading.Event()
    timeline: list[str] = []

    def read(_count: int):
        entered.set()
        release.wait(10)
        timeline.append("read ended")

    async def triggerer():
        poller = job_poller.JobPoller(read, lambda: timeline.append("ended"))
        poller.subscribe(1, INTERVAL_S)
        await asyncio.to_thread(entered.wait, 10)
        threading.Timer(0.3, release.set).start()

    asyncio.run(triggerer())
    assert timeline == ["read ended", "ended"]


def test_a_poller_whose_last_subscriber_left_takes_no_new_one():
    async def scenario():
        poller = job_poller.JobPoller(lambda _count: None, lambda: None)
        assert poller.unsubscribe(poller.subscribe(1, INTERVAL_S))
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="this poller has stopped"):
            poller.subscribe(1, INTERVAL_S)

    asyncio.run(scenario())


def test_a_trigger_that_comes_while_the_last_read_ends_gets_a_poller_of_its_own(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC), "l")

    async def scenario():
        with job_poller.subscribed(CONN_ID, "events", 1, INTERVAL_S) as first:
            await first.next()
            old = pollers()[(CONN_ID, "events")]
        with job_poller.subscribed(CONN_ID, "events", 1, INTERVAL_S) as second:
            assert pollers()[(CONN_ID, "events")] is not old
            poll = await asyncio.wait_for(second.next(), 30)
        assert not pollers()
        return poll

    poll = asyncio.run(scenario())
    assert poll.error is None and poll.found is not None


def test_a_trigger_asking_for_more_checkpoints_gets_a_read_of_as_many(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC) - timedelta(seconds=9), "lll")
    live_thrice = {**LIVE, "checkpoints": 3}

    async def scenario():
        never = asyncio.ensure_future(anext(trigger(BACKLOG).run()))
        await asyncio.sleep(3 * INTERVAL_S)  # its poller reads one checkpoint a poll
        event = await asyncio.wait_for(anext(trigger(live_thrice).run()), 10)
        assert not never.done()
        never.cancel()
        return event

    event = asyncio.run(scenario())
    assert event.payload["status"] == "success"
    assert event.payload["snapshot"]["streak"] == 3


def test_each_trigger_judges_the_shared_read_by_when_its_own_wait_began(connected):
    """A run that ended fails the sensors that were waiting for it, not one that began after."""
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC) - timedelta(seconds=9), "b")
    store = LeaseStore(connected)
    held = store.acquire("events", "file:///ck", "run-1", 30.0).lease
    before = datetime.now(UTC) - timedelta(minutes=5)
    store.release(held)
    store.close()
    after = datetime.now(UTC) + timedelta(seconds=1)

    async def scenario():
        later = asyncio.ensure_future(anext(trigger(LIVE, at=after.isoformat()).run()))
        event = await asyncio.wait_for(anext(trigger(LIVE, at=before.isoformat()).run()), 10)
        await asyncio.sleep(3 * INTERVAL_S)
        assert not later.done(), "a wait that began after the run ended was failed by it"
        later.cancel()
        return event

    event = asyncio.run(scenario())
    assert event.payload["status"] == "error"
    assert event.payload["message"].startswith("the run run-1 of job 'events' ended at ")


def test_an_outage_fails_each_trigger_after_its_own_retry_budget(monkeypatch):
    use_connection(monkeypatch, extra={"url": "postgresql://metrics:s3cret@127.0.0.1:1/metrics"})

    async def scenario():
        patient = asyncio.ensure_future(anext(trigger(LIVE, retry_s=600.0).run()))
        event = await asyncio.wait_for(anext(trigger(LIVE, retry_s=0.5).run()), 60)
        assert not patient.done(), "the patient trigger gave up with the impatient one"
        patient.cancel()
        return event

    event = asyncio.run(scenario())
    assert event.payload["status"] == "error"
    assert "(retried for " in event.payload["message"]
    assert "s3cret" not in event.payload["message"]
