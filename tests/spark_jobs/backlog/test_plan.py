import pytest

from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import TriggerPlan, share_rows

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


def test_one_source_takes_the_whole_batch():
    assert share_rows(50_000, {"events": 2_000}) == {"events": 50_000}
    assert share_rows(50_000, {"events": None}) == {"events": 50_000}


def test_a_live_source_gets_what_it_has_and_a_backlog_source_the_rest():
    shares = share_rows(50_000, {"history": None, "live": 2_200})
    assert shares == {"history": 47_800, "live": 2_200}
    assert sum(shares.values()) == 50_000


def test_two_sources_in_backlog_split_the_batch():
    assert share_rows(50_000, {"a": None, "b": 10**9}) == {"a": 25_000, "b": 25_000}
    assert share_rows(50_001, {"a": None, "b": None}) == {"a": 25_001, "b": 25_000}


def test_what_nobody_asked_for_is_headroom_for_everyone():
    assert share_rows(10_000, {"a": 1_000, "b": 3_000, "c": 0}) == {
        "a": 3_000,
        "b": 5_000,
        "c": 2_000,
    }


@pytest.mark.parametrize("cap", [1, 2, 3, 7, 100, 99_999])
@pytest.mark.parametrize(
    "demands",
    [{"a": None, "b": 5, "c": 0}, {"a": 40, "b": 60}, {"a": None}, {"a": 3, "b": None, "c": None}],
)
def test_the_shares_never_exceed_the_cap_and_serve_small_demands_first(cap, demands):
    shares = share_rows(cap, demands)
    assert sum(shares.values()) == cap
    fair = cap // len(demands)
    for name, demand in demands.items():
        assert shares[name] >= min(fair, demand if demand is not None else cap)


def test_a_plan_with_budgets_gives_each_source_its_share():
    plan = TriggerPlan.from_decision(1, BACKLOG, 3, budgets={"events": 6000, "orders": 3000})
    assert (plan.rows_for("events"), plan.rows_for("orders"), plan.rows_for("other")) == (
        6000,
        3000,
        0,
    )
    assert TriggerPlan.from_decision(1, BACKLOG, 3).rows_for("events") == 9000
    assert TriggerPlan.from_json(plan.to_json()) == plan
