from spark_jobs.sources.cdc.heartbeat import MIN_TRAILING_BYTES, HeartbeatSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_heartbeat_is_due_once_per_interval_while_the_server_writes_and_nothing_waits():
    clock = Clock()
    schedule = HeartbeatSchedule(10.0, clock)
    busy = MIN_TRAILING_BYTES
    assert schedule.due(True, busy)
    clock.now += 9.9
    assert not schedule.due(True, busy)
    clock.now += 0.1
    assert schedule.due(True, busy)


def test_no_heartbeat_while_changes_wait_or_the_server_is_idle():
    clock = Clock()
    schedule = HeartbeatSchedule(10.0, clock)
    assert not schedule.due(False, 10 * MIN_TRAILING_BYTES)
    assert not schedule.due(True, MIN_TRAILING_BYTES - 1)
    # Neither counted as a heartbeat: the first one due is not held back.
    assert schedule.due(True, MIN_TRAILING_BYTES)
