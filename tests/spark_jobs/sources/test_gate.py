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
    return channel, clock, SourceGate(channel, "events", clock)


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


def test_a_source_takes_its_share_of_a_batch_shared_with_other_sources(parts):
    channel, _, gate = parts
    budgets = {"events": 300, "orders": 200}
    channel.publish(TriggerPlan.from_decision(1, LIVE, 11, budgets=budgets))
    assert gate.allowed_rows(AT_7) == 300
    channel.publish(TriggerPlan.from_decision(2, LIVE, 11, budgets={"orders": 500, "events": 0}))
    assert gate.allowed_rows(AT_7) is None


def test_no_batch_starts_past_the_fence_until_the_lease_is_confirmed_again(tmp_path):
    channel = PlanChannel(tmp_path / "channel")
    monotonic = FakeClock(50.0)
    gate = SourceGate(channel, "events", FakeClock(1000.0), monotonic)
    channel.publish(TriggerPlan.from_decision(1, LIVE, 11))
    assert channel.read_fence() is None and gate.allowed_rows(AT_7) == 500  # no lease: no fence
    channel.publish_fence(60.0)
    assert gate.allowed_rows(AT_7) == 500
    monotonic.advance(10)
    assert gate.allowed_rows(AT_7) is None
    channel.publish_fence(70.0)
    assert gate.allowed_rows(AT_7) == 500


def test_a_stopping_run_holds_every_batch_whatever_the_plan_and_the_fence(tmp_path):
    channel = PlanChannel(tmp_path / "channel")
    gate = SourceGate(channel, "events", FakeClock(1000.0), FakeClock(50.0))
    channel.publish(TriggerPlan.from_decision(1, LIVE, 11))
    channel.publish_fence(60.0)
    assert not channel.held() and gate.allowed_rows(AT_7) == 500
    channel.hold()
    assert channel.held() and gate.allowed_rows(AT_7) is None
    channel.publish(TriggerPlan.from_decision(2, LIVE, 11))
    channel.publish_fence(70.0)  # a renewal of the lease meanwhile lifts no hold
    assert gate.allowed_rows(AT_7) is None
