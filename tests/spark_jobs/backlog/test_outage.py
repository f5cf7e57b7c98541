from spark_jobs.backlog.outage import Outage
from tests.spark_jobs.backlog.simulation import FakeClock


def test_failures_are_tolerated_for_the_timeout_from_the_first_of_a_run():
    clock = FakeClock()
    outage = Outage(30.0, clock)
    assert not outage.ongoing and outage.lasted_s == 0.0
    assert outage.failed()
    clock.advance(30.0)
    assert outage.failed() and outage.lasted_s == 30.0
    clock.advance(0.5)
    assert not outage.failed()
    assert outage.ongoing


def test_a_success_ends_the_run_and_says_how_long_it_lasted():
    clock = FakeClock()
    outage = Outage(10.0, clock)
    assert outage.recovered() is None
    outage.failed()
    clock.advance(8.0)
    outage.failed()
    assert outage.recovered() == 8.0
    assert not outage.ongoing
    # A new run starts afresh: the earlier failures do not count against it.
    clock.advance(100.0)
    assert outage.failed()
    clock.advance(10.0)
    assert outage.failed()
