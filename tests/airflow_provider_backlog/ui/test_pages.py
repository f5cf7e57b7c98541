"""The pages, rendered from a real metrics database (SQLite) seeded with the story of
tests/airflow_provider_backlog/hooks/story.py; what they show is counted against the tables."""

from datetime import timedelta

import pytest

from airflow_provider_backlog.hooks.metrics_reads import MAX_CHECKPOINTS
from airflow_provider_backlog.ui.access import JobAccess
from airflow_provider_backlog.ui.pages import dag_page, job_page, jobs_page
from spark_jobs.metrics.schema import backlog_leases
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints, insert
from tests.airflow_provider_backlog.hooks.story import (
    LEASES,
    LEGACY_CHECKPOINTS,
    NOW,
    T0,
    write_release_before,
)
from tests.airflow_provider_backlog.ui.conftest import sees_every_job
from tests.airflow_provider_backlog.ui.markup import by_id, cells, links, marked

ROOT = "/backlog"


def test_the_jobs_page_shows_where_every_job_stands(hook):
    html = jobs_page(hook, root=ROOT, access=sees_every_job(), now=NOW)
    assert marked(html, "data-job", "jobs") == ["legacy", "orders"]
    legacy, orders = cells(html, "jobs")
    assert orders == [
        "orders",
        "live since 2026-11-21T12:02:25Z offset-lag: events is live (kafka)",
        "last checkpoint 2026-11-21T12:02:28Z, 2.0 s ago largest gap between recent live "
        "checkpoints: 10 s interval 10 s",
        "last checkpoint by run r2 run r2 running: lease taken 2026-11-21T12:01:55Z, renewed "
        "until 2026-11-21T12:06:40Z Spark UI",
        "events: live (offset-lag), offsets_behind_latest 12, slot_wal_status reserved",
    ]
    assert legacy[1:4] == [
        "live since 2026-11-21T12:00:00Z since its run started",
        "last checkpoint 2026-11-21T12:00:30Z, 2 min ago largest gap between recent live "
        "checkpoints: 30 s interval off",
        "last checkpoint by run old-1 run old-1 ended: lease taken 2026-11-21T11:59:55Z, "
        "released 2026-11-21T12:00:40Z",
    ]
    found = links(html)
    assert found["Streaming jobs"]["href"] == "/backlog/?conn_id=metrics_test"
    assert found["orders"]["href"] == "/backlog/jobs/orders?conn_id=metrics_test"
    assert found["r2"]["href"] == "/backlog/jobs/orders?conn_id=metrics_test&run_id=r2"
    assert found["Spark UI"] == {
        "href": "http://driver-2:4040",
        "target": "_blank",
        "rel": "noopener",
    }


def test_an_empty_database_says_so(empty):
    html = jobs_page(empty, root="", access=sees_every_job("m"), now=NOW)
    assert " ".join(by_id(html, "jobs").text.split()) == (
        "No job to show: none of them has a checkpoint or a lease yet."
    )


@pytest.mark.parametrize(
    ("readable", "named", "shown", "says"),
    [
        ({"orders"}, None, ["orders"], "The jobs named by the DAGs you may read. A job no DAG "
         "names is shown to users who may read connection 'metrics_test'."),
        (set(), None, [], "The jobs named by the DAGs you may read. A job no DAG names is "
         "shown to users who may read connection 'metrics_test'."),
        (set(), {"orders"}, ["legacy"], "The jobs named by the DAGs you may read, and the "
         "jobs no DAG names."),
        ({"orders"}, {"orders", "legacy"}, ["orders"], "The jobs named by the DAGs you may "
         "read, and the jobs no DAG names."),
    ],
)  # fmt: skip
def test_the_jobs_page_lists_only_the_jobs_the_reader_may_see(hook, readable, named, shown, says):
    """``orders`` and ``legacy`` are in the database; a DAG the reader may read names
    ``readable``, any DAG ``named`` (None: the reader may not read the connection)."""
    access = JobAccess(CONN_ID, frozenset(readable), None if named is None else frozenset(named))
    html = jobs_page(hook, root=ROOT, access=access, now=NOW)
    assert marked(html, "data-job", "jobs") == shown
    assert " ".join(by_id(html, "shown").text.split()) == says
    for hidden in {"orders", "legacy"} - set(shown):
        assert hidden not in html


def test_a_job_that_took_its_lease_but_has_not_committed_is_listed(hook, url):
    insert(url, backlog_leases, LEASES[0] | {"job_name": "starting", "checkpoint_location": "x"})
    html = jobs_page(hook, root=ROOT, access=sees_every_job(), now=NOW)
    assert cells(html, "jobs")[2][:3] == ["starting", "no checkpoint yet", ""]


def test_the_job_page_draws_what_the_tables_hold(hook):
    html = job_page(hook, root=ROOT, conn_id=CONN_ID, job_name="orders", now=NOW)
    (checkpoints, runs), *_ = hook.get_records(
        "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM backlog_checkpoints WHERE job_name = ?",
        parameters=("orders",),
    )
    ((transitions,),) = hook.get_records(
        "SELECT COUNT(*) FROM backlog_transitions WHERE job_name = 'orders'"
    )
    drawn = marked(html, "data-checkpoint", "timeline")
    assert (len(drawn), len(marked(html, "data-run", "runs"))) == (checkpoints, runs) == (9, 2)
    assert drawn == [f"r1:{b}" for b in range(6)] + [f"r2:{b}" for b in range(6, 9)]
    assert (
        marked(html, "data-transition", "timeline")
        == ["1", "2"]
        == [str(n) for n in range(1, transitions + 1)]
    )
    assert marked(html, "data-transition", "transitions") == ["1", "2"]
    assert marked(html, "data-boundary", "timeline") == ["launch", "takeover", "launch"]
    assert marked(html, "data-span", "timeline") == ["backlog", "lag"]
    assert marked(html, "data-request", "timeline") == ["reconfigure"]
    assert cells(html, "runs") == [
        [
            "r1",
            "2026-11-21T12:00:00Z",
            "2026-11-21T12:00:50Z the last checkpoint of run r1; run r2 took over after it",
            "6",
            "3 (50%), 41%",
            "21,000",
            "backlog: 1 min; live: 10 s",
        ],
        [
            "r2",
            "2026-11-21T12:01:55Z",
            "running, or after this period",
            "3",
            "2 (67%), 38%",
            "1,040",
            "backlog: 1 min; live: 10 s",
        ],
    ]
    assert cells(html, "operators") == [
        ["read", "source", "events", "live"],
        ["count", "one-input", "read", "live"],
    ]
    assert marked(html, "data-checkpoint", "costs") == drawn
    assert marked(html, "data-unknown", "costs") == ["true"], "r1's last, rebuilt after a crash"
    assert cells(html, "medians") == [
        ["backlog", "5 (5)", "1.0 s", "300 ms", "700 ms", "30%"],
        ["live", "4 (3)", "1.0 s", "300 ms", "700 ms", "30%"],
    ]
    assert len(marked(html, "data-state", "state")) == 2 * 8


def test_a_run_page_shows_that_run_s_whole_life(hook):
    html = job_page(hook, root=ROOT, conn_id=CONN_ID, job_name="orders", now=NOW, run_id="r1")
    assert marked(html, "data-checkpoint", "timeline") == [f"r1:{b}" for b in range(6)]
    assert marked(html, "data-run", "runs") == ["r1"]
    assert marked(html, "data-boundary", "timeline") == ["launch", "takeover"]
    assert links(html)["earlier"]["href"] == (
        "/backlog/jobs/orders?conn_id=metrics_test&start=2026-11-21T11%3A59%3A07Z"
        "&end=2026-11-21T11%3A59%3A59Z"
    )


def test_a_dag_tab_lists_the_jobs_of_its_tasks(hook):
    html = dag_page(
        hook, root=ROOT, conn_id=CONN_ID, dag_id="etl", job_names=["orders", "nope"], now=NOW
    )
    assert marked(html, "data-job", "jobs") == ["orders", "nope"]
    assert cells(html, "jobs")[1] == [
        "nope no checkpoint and no lease yet",
        "",
        "",
        "no lease",
        "lag unknown",
    ]
    assert "nope" not in links(html), "no page to link to yet"
    assert links(html)["orders"]["href"] == "/backlog/jobs/orders?conn_id=metrics_test"
    idle = dag_page(hook, root=ROOT, conn_id=CONN_ID, dag_id="etl", job_names=[], now=NOW)
    assert " ".join(by_id(idle, "jobs").text.split()) == (
        "DAG etl launches or watches no streaming job."
    )


def test_a_database_of_the_release_before_shows_its_costs_as_unknown(url, empty):
    write_release_before(url, LEGACY_CHECKPOINTS, [])
    html = job_page(empty, root=ROOT, conn_id=CONN_ID, job_name="legacy", now=NOW)
    assert marked(html, "data-checkpoint", "costs") == ["old-1:0", "old-1:1"]
    assert marked(html, "data-unknown", "costs") == ["true", "true"]
    assert cells(html, "medians") == [["live", "2 (0)", "unknown"]]
    assert " ".join(by_id(html, "state").text.split()).startswith("No checkpoint of this period")
    assert by_id(html, "operators").text == "The job has had no transition yet."


def test_a_busy_period_shows_its_newest_checkpoints_and_says_so(url, empty):
    add_checkpoints(url, "busy", "b1", T0, "l" * (MAX_CHECKPOINTS + 1))
    html = job_page(empty, root=ROOT, conn_id=CONN_ID, job_name="busy", now=T0 + timedelta(hours=1))
    assert len(marked(html, "data-checkpoint", "timeline")) == MAX_CHECKPOINTS
    assert " ".join(by_id(html, "cut").text.split()) == (
        "This period has more than 2,000 checkpoints: the newest 2,000 are shown, from "
        "2026-11-21T12:00:01Z."
    )
