from datetime import UTC, datetime, timedelta

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_poll import JobPoll, read_job, stop_reason
from spark_jobs.metrics.lease import Lease, LeaseStore
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def lease(expires_at: datetime, released_at: datetime | None = None) -> Lease:
    return Lease("events", "file:///ck", "run-1", T0, expires_at, None, released_at)


def held_at(now: datetime, expires_at: datetime) -> JobPoll:
    return JobPoll(None, lease(expires_at), now)


def test_no_lease_is_no_reason_to_stop():
    assert stop_reason("events", JobPoll(None, None, None), T0) is None


def test_a_renewed_lease_is_no_reason_to_stop():
    poll = held_at(T0 + timedelta(seconds=10), expires_at=T0 + timedelta(seconds=30))
    assert stop_reason("events", poll, T0) is None


def test_an_expired_lease_means_the_driver_died_whenever_the_wait_began():
    poll = held_at(T0 + timedelta(seconds=31), expires_at=T0 + timedelta(seconds=30))
    for since in (T0 - timedelta(hours=1), T0 + timedelta(hours=1)):
        assert stop_reason("events", poll, since) == (
            "the driver of job 'events' (run run-1) stopped renewing its lease, which expired "
            "at 2026-11-21T12:00:30+00:00: it has died"
        )


def test_a_run_that_ended_stops_only_the_waits_that_began_before_its_end():
    ended = T0 + timedelta(seconds=20)
    poll = JobPoll(None, lease(T0 + timedelta(seconds=30), released_at=ended), None)
    assert stop_reason("events", poll, ended - timedelta(seconds=1)) == (
        "the run run-1 of job 'events' ended at 2026-11-21T12:00:20+00:00 while it was awaited"
    )
    assert stop_reason("events", poll, ended) is not None
    assert stop_reason("events", poll, ended + timedelta(seconds=1)) is None


def test_one_read_gives_the_checkpoints_asked_for_and_the_lease_with_its_clock(connected):
    add_checkpoints(connected, "events", "run-1", datetime.now(UTC) - timedelta(seconds=30), "bll")
    store = LeaseStore(connected)
    held = store.acquire("events", "file:///ck", "run-1", 30.0).lease
    hook = BacklogMetricsHook(CONN_ID)

    poll = read_job(hook, "events", 3)
    assert poll.snapshot is not None and (poll.snapshot.phase, poll.snapshot.streak) == ("live", 2)
    assert poll.latest_lease is not None and poll.latest_lease.run_id == "run-1"
    assert poll.database_now is not None and poll.latest_lease.alive(poll.database_now)
    assert read_job(hook, "events", 1).snapshot.streak == 1  # type: ignore[union-attr]

    store.release(held)
    store.close()
    released = read_job(hook, "events", 1)
    assert released.latest_lease is not None and released.latest_lease.released_at is not None
    assert released.database_now is None  # not needed to judge a released lease
    assert read_job(hook, "other", 1) == JobPoll(None, None, None)
    hook.engine.dispose()


def test_a_run_that_goes_live_and_ends_between_two_polls_reads_as_live_not_as_ended(
    connected, monkeypatch
):
    """The run's last checkpoint and its lease's release land right after the poll read the
    checkpoints: the lease it read must be the one from before, so the next poll sees the
    checkpoint rather than a run that ended while it was awaited."""
    since = datetime.now(UTC) - timedelta(seconds=60)
    add_checkpoints(connected, "events", "run-1", since, "b")
    store = LeaseStore(connected)
    held = store.acquire("events", "file:///ck", "run-1", 30.0).lease
    hook = BacklogMetricsHook(CONN_ID)
    read_checkpoints = hook.job_snapshot

    def then_the_run_ends(job_name: str, checkpoints: int = 1):
        found = read_checkpoints(job_name, checkpoints)
        add_checkpoints(connected, "events", "run-1", since + timedelta(seconds=5), "l", 1)
        store.release(held)
        return found

    monkeypatch.setattr(hook, "job_snapshot", then_the_run_ends)
    poll = read_job(hook, "events", 1)
    assert poll.snapshot is not None and poll.snapshot.phase == "backlog"
    assert stop_reason("events", poll, since) is None
    monkeypatch.setattr(hook, "job_snapshot", read_checkpoints)
    after = read_job(hook, "events", 1)
    assert after.snapshot is not None and after.snapshot.phase == "live"
    store.close()
    hook.engine.dispose()
