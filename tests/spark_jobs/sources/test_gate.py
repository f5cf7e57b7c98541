import pytest

from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import TriggerPlan
from spark_jobs.sources.gate import PlanChannel, SourceGate
from tests.spark_jobs.backlog.simulation import FakeClock

LIVE = Decision(is_backlog=False, interval_s=1.0, due_at=0.0, max_rows=500, standing=False)
AT_7 = {"source": "events", "backlog": False, "position": 7}
AT_8 = {"source": "events", "backlog": False, "position": 8}


@pytest.fixture
def parts(tmp_path):
    channel = PlanChannel(tmp_path / "channel")
    clock = FakeClock(1000.0)
    return channel, clock, SourceGate(channel, clock)


def test_every_publication_is_seen_even_in_quick_succession(parts):
    channel, _, _ = parts
    for seq in range(1, 50):
        channel.publish(TriggerPlan.from_decision(seq, LIVE, 11))
        assert channel.read().seq == seq


def test_a_source_waits_at_a_new_offset_for_the_plan_that_follows_its_batch(parts):
    channel, clock, gate = parts
    channel.publish(TriggerPlan.from_decision(7, LIVE, 11, starts={"events": AT_7}))
    assert gate.allowed_rows(AT_7) == 500
    gate.mark_released()
    clock.advance(30)  # a long batch: the old plan is still there when it commits
    assert gate.allowed_rows(AT_8) is None
    clock.advance(10.9)
    assert gate.allowed_rows(AT_8) is None
    channel.publish(TriggerPlan.from_decision(8, LIVE, 11, starts={"events": AT_8}))
    assert gate.allowed_rows(AT_8) == 500


def test_without_any_plan_for_its_offset_a_source_goes_on_after_the_grace(parts):
    channel, clock, gate = parts
    channel.publish(TriggerPlan.from_decision(7, LIVE, 11, starts={"events": AT_7}))
    assert gate.allowed_rows(AT_8) is None
    clock.advance(11)
    assert gate.allowed_rows(AT_8) == 500
