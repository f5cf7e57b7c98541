from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import TriggerPlan

LIVE = Decision(is_backlog=False, interval_s=1.0, due_at=100.0, max_rows=500, standing=False)
BACKLOG = Decision(is_backlog=True, interval_s=30.0, due_at=100.0, max_rows=9000, standing=True)
AT_7 = {"source": "events", "backlog": False, "position": 7}
AT_8 = {"source": "events", "backlog": False, "position": 8}


def test_nothing_is_released_before_the_due_time():
    plan = TriggerPlan.from_decision(1, LIVE, stale_after_s=3)
    assert not plan.releases(99.9, AT_7, None, waiting_since=99.0)
    assert plan.releases(100.0, AT_7, None, waiting_since=99.0)


def test_the_first_plan_releases_one_batch_per_source():
    plan = TriggerPlan.from_decision(1, LIVE, stale_after_s=3)
    assert plan.releases(100.5, AT_7, last_seq=None, waiting_since=100.0)
    assert not plan.releases(100.6, AT_8, last_seq=1, waiting_since=100.6)


def test_a_plan_after_a_commit_releases_only_from_where_that_batch_ended():
    plan = TriggerPlan.from_decision(7, LIVE, stale_after_s=3, starts={"events": AT_7})
    assert plan.releases(100.5, AT_7, last_seq=6, waiting_since=99.0)
    # A batch the coordinator has not seen yet moved the source on: wait for its plan,
    # even though this plan's number was never used.
    assert not plan.releases(100.5, AT_8, last_seq=5, waiting_since=100.4)


def test_a_standing_plan_releases_batch_after_batch_while_in_backlog():
    plan = TriggerPlan.from_decision(7, BACKLOG, stale_after_s=3, starts={"events": AT_7})
    in_backlog = {**AT_8, "backlog": True}
    assert plan.releases(100.5, in_backlog, last_seq=7, waiting_since=100.5)
    # ...but not once the source itself is live: the next plan decides the live cadence.
    assert not plan.releases(100.5, AT_8, last_seq=7, waiting_since=100.5)


def test_a_long_batch_does_not_make_its_own_plan_look_stale():
    plan = TriggerPlan.from_decision(7, LIVE, stale_after_s=11, starts={"events": AT_7})
    # released at 100 from AT_7; the batch took 30 s and ended at AT_8; the listener has
    # not yet published the plan that follows it
    assert not plan.releases(130.0, AT_8, last_seq=7, waiting_since=130.0)
    assert not plan.releases(140.9, AT_8, last_seq=7, waiting_since=130.0)


def test_without_a_new_plan_a_waiting_source_goes_on_at_the_fallback_cadence():
    plan = TriggerPlan.from_decision(7, LIVE, stale_after_s=11, starts={"events": AT_7})
    assert plan.releases(141.0, AT_8, last_seq=7, waiting_since=130.0)


def test_json_round_trip():
    plan = TriggerPlan.from_decision(3, BACKLOG, stale_after_s=90, starts={"events": AT_7})
    assert TriggerPlan.from_json(plan.to_json()) == plan
