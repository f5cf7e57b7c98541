import threading
from datetime import UTC, datetime, timedelta

import pytest

from spark_jobs.metrics.lease import LeaseHeld, LeaseKeeper, LeaseStore

CHECKPOINT = "file:///data/checkpoints/events"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def stores(backend):
    clock = Clock()
    made = [LeaseStore(backend.url, clock) for _ in range(2)]
    yield (*made, clock)
    for store in made:
        store.close()


def test_a_second_driver_is_refused_while_the_first_renews(stores):
    first, second, clock = stores
    lease = first.acquire("events", CHECKPOINT, "run-1", 30, spark_ui_url="http://driver:4040")
    assert (lease.run_id, lease.expires_at, lease.spark_ui_url) == (
        "run-1",
        clock.now + timedelta(seconds=30),
        "http://driver:4040",
    )
    clock.now += timedelta(seconds=20)
    assert first.renew(lease, 30)
    clock.now += timedelta(seconds=20)
    with pytest.raises(LeaseHeld) as raised:
        second.acquire("events", CHECKPOINT, "run-2", 30)
    assert str(raised.value) == (
        f"job 'events' at checkpoint {CHECKPOINT} is already run by run-1 (lease renewed until "
        "2026-11-21T12:00:50+00:00); stop it first, or wait for its lease to expire if its "
        "driver has died"
    )
    # another job, or another checkpoint of the same job, is another lease
    assert second.acquire("orders", CHECKPOINT, "run-3", 30).run_id == "run-3"
    assert second.acquire("events", CHECKPOINT + "-b", "run-4", 30).run_id == "run-4"


def test_a_dead_drivers_lease_expires_and_is_taken_over(stores):
    first, second, clock = stores
    lease = first.acquire("events", CHECKPOINT, "run-1", 30)
    clock.now += timedelta(seconds=30)
    assert second.acquire("events", CHECKPOINT, "run-2", 30).run_id == "run-2"
    # the old driver, if it was only stalled, learns that it lost the lease
    assert not first.renew(lease, 30)


def test_a_released_lease_is_free_at_once(stores):
    first, second, _ = stores
    first.release(first.acquire("events", CHECKPOINT, "run-1", 30))
    assert not first.get("events", CHECKPOINT).alive(datetime.now(UTC))
    assert second.acquire("events", CHECKPOINT, "run-2", 30).run_id == "run-2"


def test_acquiring_waits_out_a_lease_that_is_no_longer_renewed(backend):
    store = LeaseStore(backend.url)
    try:
        store.acquire("events", CHECKPOINT, "run-1", 0.5)  # its driver then dies
        assert store.acquire("events", CHECKPOINT, "run-2", 0.5, wait_s=2).run_id == "run-2"
        with pytest.raises(LeaseHeld):
            store.acquire("events", CHECKPOINT, "run-3", 30, wait_s=0)
    finally:
        store.close()


def test_the_keeper_renews_and_reports_a_lost_lease(backend):
    store = LeaseStore(backend.url)
    lost = threading.Event()
    keeper = LeaseKeeper(store, store.acquire("events", CHECKPOINT, "run-1", 0.6), lost.set, 0.6)
    keeper.start()
    try:
        threading.Event().wait(1.5)  # past the time to live: only renewals keep it
        assert store.get("events", CHECKPOINT).alive(datetime.now(UTC))
        assert not lost.is_set()
        store.release(keeper.lease)  # as if another driver had taken it over
        assert lost.wait(2)
    finally:
        keeper.release()
        store.close()
