from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import TriggerPlan

LIVE = Decision(is_backlog=False, interval_s=1.0, due_at=100.0, max_rows=500, standing=False)
BACKLOG = Decision(is_backlog=True, interval_s=30.0, due_at=100.0, max_rows=9000, standing=True)


def test_nothing_is_released_before_the_due_time():
    plan = TriggerPlan.from_decision(1, LIVE, stale_after_s=3)
    assert not plan.releases(99.9, None, None)
    assert plan.releases(100.0, None, None)


def test_a_one_shot_plan_releases_one_batch():
    plan = TriggerPlan.from_decision(7, LIVE, stale_after_s=3)
    assert plan.releases(100.5, last_seq=6, last_release_at=99.0)
    assert not plan.releases(100.6, last_seq=7, last_release_at=100.5)


def test_a_standing_plan_releases_batch_after_batch():
    plan = TriggerPlan.from_decision(7, BACKLOG, stale_after_s=3)
    assert plan.releases(100.5, last_seq=7, last_release_at=100.4)


def test_a_stale_plan_keeps_the_job_moving_at_the_fallback_cadence():
    plan = TriggerPlan.from_decision(7, LIVE, stale_after_s=3)
    assert not plan.releases(103.4, last_seq=7, last_release_at=100.5)
    assert plan.releases(103.5, last_seq=7, last_release_at=100.5)


def test_json_round_trip():
    plan = TriggerPlan.from_decision(3, BACKLOG, stale_after_s=90)
    assert TriggerPlan.from_json(plan.to_json()) == plan
