import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from spark_jobs.metrics.lease import (
    FENCE_MARGIN,
    LeaseHeld,
    LeaseKeeper,
    LeaseStore,
    database_now,
    live_lease,
    standing_by,
)
from spark_jobs.metrics.schema import make_engine, metadata
from tests.support.prerequisites import missing
from tools.faults.chaos import faketime_library

CHECKPOINT = "file:///data/checkpoints/events"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def stores(backend):
    made = [LeaseStore(backend.url) for _ in range(2)]
    yield made
    for store in made:
        store.close()


def test_a_second_driver_is_refused_while_the_first_renews(stores):
    first, second = stores
    acquired = first.acquire("events", CHECKPOINT, "run-1", 30, spark_ui_url="http://driver:4040")
    lease = acquired.lease
    assert (lease.run_id, lease.spark_ui_url, acquired.previous_run_id) == (
        "run-1",
        "http://driver:4040",
        None,
    )
    assert lease.expires_at - lease.acquired_at == timedelta(seconds=30)
    assert first.renew(lease, 30)
    with pytest.raises(LeaseHeld) as raised:
        second.acquire("events", CHECKPOINT, "run-2", 30)
    message = str(raised.value)
    assert message.startswith(f"job 'events' at checkpoint {CHECKPOINT} is already run by run-1")
    assert message.endswith(
        "database time); stop it first, or wait for its lease to expire if its driver has died"
    )
    # another checkpoint of the same job is another lease
    assert second.acquire("events", CHECKPOINT + "-b", "run-4", 30).lease.run_id == "run-4"


def test_a_second_job_name_on_one_checkpoint_is_refused_even_after_the_first_ended(stores):
    first, second = stores
    acquired = first.acquire("events", CHECKPOINT, "run-1", 30)
    for _ in range(2):
        with pytest.raises(LeaseHeld) as raised:
            second.acquire("orders", CHECKPOINT, "run-2", 30, wait_s=0.5)
        assert str(raised.value).startswith(
            f"checkpoint {CHECKPOINT} belongs to job 'events' (its run run-1 "
        )
        assert str(raised.value).endswith(
            "not to 'orders': a checkpoint holds one job's offsets and state; use the job name "
            "it was started with, or a new checkpoint"
        )
        first.release(acquired.lease)


def test_a_dead_drivers_lease_expires_and_is_taken_over(stores):
    first, second = stores
    dead = first.acquire("events", CHECKPOINT, "run-1", 0.3).lease
    taken = second.acquire("events", CHECKPOINT, "run-2", 30, wait_s=5)
    assert (taken.lease.run_id, taken.previous_run_id) == ("run-2", "run-1")
    # the old driver, if it was only stalled, learns that it lost the lease
    assert not first.renew(dead, 30)


def test_a_released_lease_is_free_at_once(stores):
    first, second = stores
    first.release(first.acquire("events", CHECKPOINT, "run-1", 30).lease)
    assert second.acquire("events", CHECKPOINT, "run-2", 30).lease.run_id == "run-2"


def test_checking_before_a_launch_refuses_as_acquiring_would_and_takes_nothing(stores):
    first, second = stores
    acquired = first.acquire("events", CHECKPOINT, "run-1", 30)
    with pytest.raises(LeaseHeld, match="is already run by run-1"):
        second.check_free("events", CHECKPOINT, 30, wait_s=0)
    with pytest.raises(LeaseHeld, match="belongs to job 'events'"):
        second.check_free("orders", CHECKPOINT, 30, wait_s=5)
    assert second.get(CHECKPOINT) == acquired.lease, "the check wrote to the lease's row"
    second.check_free("events", CHECKPOINT + "-b", 30, wait_s=0)
    assert second.get(CHECKPOINT + "-b") is None
    first.release(acquired.lease)
    second.check_free("events", CHECKPOINT, 30, wait_s=0)


def test_checking_before_a_launch_waits_out_a_lease_that_is_no_longer_renewed(stores):
    first, second = stores
    first.acquire("events", CHECKPOINT, "run-1", 0.5)
    second.check_free("events", CHECKPOINT, 0.5, wait_s=5)
    assert second.acquire("events", CHECKPOINT, "run-2", 30).previous_run_id == "run-1"


def standby_of(store: LeaseStore, job_name: str, run_id: str):
    with store._engine.connect() as connection:
        return standing_by(connection, job_name, run_id)


def test_a_standby_is_named_on_the_holders_row_and_takes_over_at_its_release(stores):
    first, second = stores
    holder = first.acquire("events", CHECKPOINT, "run-1", 30).lease
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        # The holder serves on for three polls, then lets go.
        sleeps.append(seconds)
        assert standby_of(first, "events", "run-2").run_id == "run-1"
        if len(sleeps) == 3:
            first.release(holder)

    taken = second.take_over("events", CHECKPOINT, "run-2", 30, wait_s=60, sleep=sleep)
    assert sleeps == [0.15] * 3
    assert (taken.lease.run_id, taken.previous_run_id) == ("run-2", "run-1")
    row = first.get(CHECKPOINT)
    assert (row.run_id, row.released_at, row.standby_run_id, row.standby_since) == (
        "run-2",
        None,
        None,
        None,
    )
    # the holder that let go cannot renew what is now the standby's
    assert not first.renew(holder, 30)


def test_a_standby_takes_a_free_lease_at_once_without_waiting(stores):
    first, second = stores
    first.release(first.acquire("events", CHECKPOINT, "run-1", 30).lease)
    taken = second.take_over("events", CHECKPOINT, "run-2", 30, wait_s=60, sleep=pytest.fail)
    assert (taken.lease.run_id, taken.previous_run_id) == ("run-2", "run-1")
    fresh = first.take_over("events", CHECKPOINT + "-b", "run-3", 30, wait_s=0, sleep=pytest.fail)
    assert (fresh.lease.run_id, fresh.previous_run_id) == ("run-3", None)


def test_a_standby_that_is_not_handed_the_lease_in_time_gives_up_and_the_holder_serves_on(
    stores,
):
    first, second = stores
    clock = [0.0]
    holder = first.acquire("events", CHECKPOINT, "run-1", 30).lease
    waiting = LeaseStore(second._engine.url.render_as_string(False), monotonic=lambda: clock[0])
    try:

        def sleep(seconds: float) -> None:
            clock[0] += seconds

        with pytest.raises(LeaseHeld) as raised:
            waiting.take_over("events", CHECKPOINT, "run-2", 30, wait_s=1, sleep=sleep)
    finally:
        waiting.close()
    assert str(raised.value).startswith(
        f"run run-2 stood by 1 s for the lease of {CHECKPOINT}, which was not handed over: "
        "job 'events' at checkpoint"
    )
    assert "is already run by run-1" in str(raised.value)
    assert 1.0 <= clock[0] < 1.2
    row = first.get(CHECKPOINT)
    assert (row.run_id, row.standby_run_id, row.standby_since) == ("run-1", None, None)
    assert first.renew(holder, 30)


def test_a_standby_on_another_jobs_checkpoint_is_refused_at_once(stores):
    first, second = stores
    first.acquire("events", CHECKPOINT, "run-1", 30)
    with pytest.raises(LeaseHeld, match="belongs to job 'events'"):
        second.take_over("orders", CHECKPOINT, "run-2", 30, wait_s=60, sleep=pytest.fail)
    assert first.get(CHECKPOINT).standby_run_id is None


def test_a_standby_waits_out_a_dead_holders_lease(stores):
    first, second = stores
    first.acquire("events", CHECKPOINT, "run-1", 0.5)
    taken = second.take_over("events", CHECKPOINT, "run-2", 30, wait_s=10)
    assert (taken.lease.run_id, taken.previous_run_id) == ("run-2", "run-1")


def test_acquiring_waits_out_a_lease_that_is_no_longer_renewed(backend):
    store = LeaseStore(backend.url)
    try:
        store.acquire("events", CHECKPOINT, "run-1", 0.5)  # its driver then dies
        assert store.acquire("events", CHECKPOINT, "run-2", 0.5, wait_s=3).lease.run_id == "run-2"
        with pytest.raises(LeaseHeld):
            store.acquire("events", CHECKPOINT, "run-3", 30, wait_s=0)
    finally:
        store.close()


def faketime() -> str:
    library = faketime_library()
    if library is None:
        missing("libfaketime is missing (scripts/install-test-tools installs it)")
    return library


TAKE_IN_A_SKEWED_PROCESS = """
import sys
from datetime import UTC, datetime
from tools.faults.chaos import faketime_library
from spark_jobs.metrics.lease import LeaseHeld, LeaseStore
print("local clock", datetime.now(UTC).isoformat(), file=sys.stderr)
try:
    LeaseStore(sys.argv[1]).acquire("events", sys.argv[2], "skewed-run", 3)
except LeaseHeld as error:
    print(error)
    sys.exit(3)
"""


def test_a_driver_whose_clock_runs_ahead_cannot_take_a_renewed_lease(postgres_server):
    """Lease times are the database's: a host clock 40 s ahead, more than the time to live,
    does not make a lease that was just renewed look expired. The time to live (30 s) is
    long enough for the skewed process to start on a loaded machine: with 3 s, it found the
    lease really expired now and then."""
    postgres_server.start()
    engine = make_engine(postgres_server.url)
    metadata.drop_all(engine)
    engine.dispose()
    store = LeaseStore(postgres_server.url)
    try:
        store.acquire("events", CHECKPOINT, "run-1", 30)
        env = {
            **os.environ,
            "LD_PRELOAD": faketime(),
            "FAKETIME": "+40s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        result = subprocess.run(
            [sys.executable, "-c", TAKE_IN_A_SKEWED_PROCESS, postgres_server.url, CHECKPOINT],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        skewed = datetime.fromisoformat(result.stderr.split("local clock ")[1].split()[0])
        assert skewed - datetime.now(UTC) > timedelta(seconds=30), "the clock was not skewed"
        assert result.returncode == 3, result.stderr
        assert "is already run by run-1" in result.stdout
    finally:
        store.close()


def test_the_keeper_fences_while_it_cannot_renew_and_resumes_once_it_can(backend):
    store = LeaseStore(backend.url)
    confirmed: list[float] = []
    lost: list[str] = []
    ttl = 3.0
    keeper = LeaseKeeper(
        store, store.acquire("events", CHECKPOINT, "run-1", ttl), ttl, confirmed.append, lost.append
    )
    keeper.start()
    try:
        assert keeper.confirmed() and len(confirmed) == 1
        wait_until(lambda: len(confirmed) >= 3, "two renewals", 10)
        backend.go_away()
        # No renewal can confirm it: the run stops starting batches before it could expire.
        wait_until(lambda: not keeper.confirmed(), "the fence", ttl + 2)
        assert confirmed[-1] - confirmed[-2] <= ttl
        backend.come_back()
        wait_until(keeper.confirmed, "the lease confirmed again", 15)
        assert not lost
    finally:
        keeper.release()
        store.close()


def test_the_keeper_reports_a_lost_lease_once(backend):
    store = LeaseStore(backend.url)
    lost = threading.Event()
    messages: list[str] = []

    def on_lost(message: str) -> None:
        messages.append(message)
        lost.set()

    acquired = store.acquire("events", CHECKPOINT, "run-1", 3)
    keeper = LeaseKeeper(store, acquired, 3, lambda _: None, on_lost)
    keeper.start()
    try:
        store.release(acquired.lease)  # as if another driver had taken it over
        assert lost.wait(5)
        assert messages == [
            f"run run-1 lost the lease of {CHECKPOINT}: another run took it over after this "
            "one failed to renew it"
        ]
    finally:
        keeper.release()
        store.close()


def test_the_fence_falls_before_the_lease_could_expire(backend):
    store = LeaseStore(backend.url)
    try:
        acquired = store.acquire("events", CHECKPOINT, "run-1", 10)
        keeper = LeaseKeeper(store, acquired, 10, lambda _: None, lambda _: None)
        assert keeper.confirmed_until == acquired.confirmed_until - FENCE_MARGIN * 10
        engine = make_engine(backend.url)
        with engine.connect() as connection:
            live = live_lease(connection, "events")
            now = database_now(connection)
        engine.dispose()
        # A whole time to live by the database's clock, from when the database granted it.
        assert live is not None and live.alive(now)
        assert live.expires_at - live.acquired_at == timedelta(seconds=10)
    finally:
        store.close()


def wait_until(condition, what: str, timeout_s: float) -> None:
    deadline = datetime.now(UTC) + timedelta(seconds=timeout_s)
    while datetime.now(UTC) < deadline:
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_database_time_comes_from_the_database(backend):
    engine = make_engine(backend.url)
    try:
        with engine.connect() as connection:
            now = database_now(connection)
            assert now.tzinfo is not None
            assert abs((now - datetime.now(UTC)).total_seconds()) < 5
            connection.execute(sa.text("SELECT 1"))
    finally:
        engine.dispose()
