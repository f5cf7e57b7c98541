"""The hook's reads for the Backlog view and for DAGs, against real metrics databases."""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_reads import MAX_CHECKPOINTS
from airflow_provider_backlog.hooks.metrics_values import OperatorStatus, SourceReport
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints, use_connection
from tests.airflow_provider_backlog.hooks.story import (
    ADDED,
    LEGACY_CHECKPOINTS,
    ORDERS_TRANSITIONS,
    T0,
    seconds,
    write_release_before,
    write_story,
)


@pytest.fixture
def story(connected: str) -> BacklogMetricsHook:
    write_story(connected)
    return BacklogMetricsHook(CONN_ID)


def test_jobs_are_named_by_their_checkpoints_and_leases(story, connected):
    add_checkpoints(connected, "clicks", "c1", T0, "l")
    assert story.job_names() == ["clicks", "legacy", "orders"]


def test_a_summary_says_since_when_the_job_is_in_its_phase(story):
    summary = story.job_summary("orders")
    assert [c.batch_id for c in summary.recent] == list(range(9))
    latest = summary.recent[-1]
    assert (latest.run_id, latest.is_backlog, latest.committed_at) == ("r2", False, seconds(148))
    assert latest.sources == (
        SourceReport(
            "events",
            False,
            "offset-lag",
            (("offsets_behind_latest", 12.0),),
            (("slot_wal_status", "reserved"),),
        ),
    )
    assert (summary.phase_since.at, summary.phase_since.reason) == (
        seconds(145),
        "offset-lag: events is live (kafka)",
    )
    assert summary.run_started_at == seconds(120)
    assert summary.latest_transition.operators == (
        OperatorStatus("read", "source", "events", (), False),
        OperatorStatus("count", "one-input", None, ("read",), False),
    )
    assert (summary.lease.run_id, summary.lease.released_at) == ("r2", None)


def test_a_run_that_started_in_its_phase_has_no_transition_into_it(story):
    summary = story.job_summary("legacy")
    assert (summary.phase_since, summary.latest_transition) == (None, None)
    assert summary.run_started_at == T0
    assert summary.lease.released_at == seconds(40)
    assert story.job_summary("nobody") is None


def test_a_history_holds_the_period_and_names_the_runs_around_it(story):
    history = story.job_history("orders", seconds(15), seconds(130))
    assert [(c.run_id, c.batch_id) for c in history.checkpoints] == [
        ("r1", 2),
        ("r1", 3),
        ("r1", 4),
        ("r1", 5),
        ("r2", 6),
        ("r2", 7),
    ]
    assert (history.run_before, history.run_after) == ("r1", "r2")
    assert [t.at for t in history.transitions] == [seconds(25)]
    assert [(r.action, r.status, r.answered_by_run) for r in history.requests] == [
        ("reconfigure", "applied", "r2")
    ]
    assert (history.checkpoints_cut, history.transitions_cut, history.requests_cut) == (
        False,
        False,
        False,
    )
    assert history.lease.run_id == "r2"
    assert [(c.run_id, c.at, c.interval_ms) for c in history.interval_changes] == [
        ("r2", seconds(125), 4000)
    ]
    assert history.interval_changes[0].reason.startswith("freshness target 5s: 4.00s keeps")
    empty = story.job_history("orders", seconds(60), seconds(110))
    assert (empty.checkpoints, empty.run_before, empty.run_after) == ((), "r1", "r2")


def test_a_busy_period_keeps_its_newest_checkpoints_and_says_so(connected):
    add_checkpoints(connected, "busy", "b1", T0, "l" * (MAX_CHECKPOINTS + 1))
    history = BacklogMetricsHook(CONN_ID).job_history("busy", T0, T0 + timedelta(hours=1))
    assert len(history.checkpoints) == MAX_CHECKPOINTS
    assert (history.checkpoints[0].batch_id, history.checkpoints[-1].batch_id) == (
        1,
        MAX_CHECKPOINTS,
    )
    assert (history.checkpoints_cut, history.run_before) == (True, "b1")


def test_checkpoint_costs_split_fixed_cost_from_data_work(story):
    costs = story.checkpoint_costs("orders", seconds(40), seconds(50))
    assert [(c.batch_id, c.fixed_ms, c.add_batch_ms, c.other_ms) for c in costs] == [
        (4, 300, 700, 60),
        (5, None, None, None),
    ]
    assert (costs[0].state_rows_total, costs[0].state_disk_bytes) == (500, 5 * 1_048_576)
    assert costs[1].recovered
    assert [c.batch_id for c in story.checkpoint_costs("orders", seconds(140))] == [8]


def test_a_naive_time_is_refused_by_name(story):
    with pytest.raises(ValueError, match=r"since = 2026-11-21T12:00:00 must be timezone-aware"):
        story.checkpoint_costs("orders", T0.replace(tzinfo=None))


def test_a_run_lasts_from_its_launch_to_its_end(story):
    assert story.run_period("orders", "r2") == (seconds(115), seconds(400))
    assert story.run_period("orders", "r1") == (T0, seconds(50))
    assert story.run_period("legacy", "old-1") == (seconds(-5), seconds(40))
    assert story.run_period("orders", "r9") is None


def test_a_database_of_the_release_before_is_migrated_and_read(metrics_url, monkeypatch):
    write_release_before(metrics_url, LEGACY_CHECKPOINTS, ORDERS_TRANSITIONS[:1])
    use_connection(monkeypatch, extra={"url": metrics_url})
    hook = BacklogMetricsHook(CONN_ID)
    costs = hook.checkpoint_costs("legacy", T0)
    assert [(c.batch_id, c.latest_offset_ms, c.fixed_ms, c.state_disk_bytes) for c in costs] == [
        (0, None, None, None),
        (1, None, None, None),
    ]
    history = hook.job_history("orders", T0, seconds(60))
    assert history.transitions[0].operators is None
    assert history.interval_changes == ()  # the table is created where missing
    columns = {c["name"] for c in sa.inspect(hook.engine).get_columns("backlog_checkpoints")}
    assert ADDED - {"operators"} <= columns


@contextmanager
def statements_sent() -> Iterator[list[tuple[str, object]]]:
    seen: list[tuple[str, object]] = []

    def record(_connection, _cursor, statement, parameters, _context, executemany):
        if not executemany and statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def test_the_reads_are_answered_from_indexes(postgres_server, monkeypatch):
    """As the statements the hook sends are compiled for PostgreSQL; tables are small here,
    so sequential scans are turned off to ask whether an index fits."""
    postgres_server.start()
    engine = make_engine(postgres_server.url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    write_story(postgres_server.url)
    use_connection(monkeypatch, extra={"url": postgres_server.url})
    hook = BacklogMetricsHook(CONN_ID)
    with statements_sent() as seen:
        hook.job_names()
        hook.job_summary("orders")
        hook.job_history("orders", T0, seconds(60))
        hook.run_period("orders", "r1")
    plans = []
    with engine.begin() as connection:
        connection.execute(sa.text("SET LOCAL enable_seqscan = off"))
        for statement, parameters in seen:
            if " backlog_" in statement:
                lines = connection.exec_driver_sql(f"EXPLAIN {statement}", parameters)
                plans.append((statement, "\n".join(lines.scalars())))
    engine.dispose()
    assert len(plans) == 15
    for statement, plan in plans:
        assert "Seq Scan" not in plan, f"{statement}\n{plan}"
        # A job's requests are few: sorting them is cheap (no index orders them by time).
        assert "Sort" not in plan or "FROM backlog_control" in statement, f"{statement}\n{plan}"
