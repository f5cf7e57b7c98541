"""The pages, rendered from a real metrics database (SQLite) seeded with the story of
tests/airflow_provider_backlog/hooks/story.py; what they show is counted against the tables."""

from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_reads import MAX_CHECKPOINTS
from airflow_provider_backlog.ui.pages import UnknownJob, dag_page, job_page, jobs_page
from spark_jobs.metrics.schema import (
    TransitionRow,
    backlog_control,
    backlog_leases,
    backlog_transitions,
    make_engine,
    metadata,
    row_values,
)
from tests.airflow_provider_backlog.conftest import (
    CONN_ID,
    add_checkpoints,
    insert,
    use_connection,
)
from tests.airflow_provider_backlog.hooks.story import (
    LEASES,
    LEGACY_CHECKPOINTS,
    NOW,
    REQUEST,
    T0,
    seconds,
    write_release_before,
    write_story,
)
from tests.airflow_provider_backlog.ui.markup import by_id, cells, elements, marked

ROOT = "/backlog"


def connect(monkeypatch: pytest.MonkeyPatch, path: Path) -> BacklogMetricsHook:
    use_connection(monkeypatch, host=str(path))
    return BacklogMetricsHook(CONN_ID)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/metrics.db"
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def hook(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BacklogMetricsHook:
    write_story(url)
    return connect(monkeypatch, tmp_path / "metrics.db")


def links(html: str) -> dict[str, dict]:
    return {" ".join(e.text.split()): e.attributes for e in elements(html) if e.tag == "a"}


def test_the_jobs_page_shows_where_every_job_stands(hook):
    html = jobs_page(hook, root=ROOT, conn_id=CONN_ID, now=NOW)
    assert marked(html, "data-job", "jobs") == ["legacy", "orders"]
    legacy, orders = cells(html, "jobs")
    assert orders == [
        "orders",
        "live since 2026-11-21T12:02:25Z offset-lag: events is live (kafka)",
        "last checkpoint 2026-11-21T12:02:28Z, 2.0 s ago largest gap between recent live "
        "checkpoints: 10 s interval 10 s",
        "last checkpoint by run r2 run r2 running: lease taken 2026-11-21T12:01:55Z, renewed "
        "until 2026-11-21T12:06:40Z Spark UI",
        "events: live (offset-lag), offsets_behind_latest 12",
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


def test_an_empty_database_says_so(url, tmp_path, monkeypatch):
    html = jobs_page(connect(monkeypatch, tmp_path / "metrics.db"), root="", conn_id="m", now=NOW)
    assert " ".join(by_id(html, "jobs").text.split()) == (
        "The metrics database has no job yet: no checkpoint and no lease."
    )


def test_a_job_that_took_its_lease_but_has_not_committed_is_listed(hook, url):
    insert(url, backlog_leases, LEASES[0] | {"job_name": "starting", "checkpoint_location": "x"})
    html = jobs_page(hook, root=ROOT, conn_id=CONN_ID, now=NOW)
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


def test_a_past_period_links_to_the_periods_around_it(hook):
    html = job_page(hook, root="", conn_id="m", job_name="orders", now=NOW, end=seconds(60))
    found = {label: links(html)[label]["href"] for label in ("last 15 min", "earlier", "later")}
    assert found == {
        "last 15 min": "/jobs/orders?conn_id=m&start=2026-11-21T11%3A47%3A30Z"
        "&end=2026-11-21T12%3A02%3A30Z",
        "earlier": "/jobs/orders?conn_id=m&start=2026-11-21T10%3A01%3A00Z"
        "&end=2026-11-21T11%3A01%3A00Z",
        "later": "/jobs/orders?conn_id=m&start=2026-11-21T12%3A01%3A00Z"
        "&end=2026-11-21T12%3A02%3A30Z",
    }
    assert "later" not in links(job_page(hook, root="", conn_id="m", job_name="orders", now=NOW))


@pytest.mark.parametrize(
    ("asked", "error", "message"),
    [
        ({"job_name": "nobody"}, UnknownJob, "job 'nobody' has no checkpoint and no lease in the "
         "metrics database of connection 'metrics_test'"),
        ({"run_id": "r9"}, UnknownJob, "job 'orders' has no run 'r9' in the metrics database"),
        ({"start": NOW, "end": T0}, ValueError,
         "start 2026-11-21T12:02:30Z must be before end 2026-11-21T12:00:00Z"),
        ({"start": T0 - timedelta(days=8)}, ValueError,
         "the period from 2026-11-13T12:00:00Z to 2026-11-21T12:02:30Z lasts 8 d; a page "
         "shows at most 7 d"),
        ({"start": T0.replace(tzinfo=None)}, ValueError,
         "start = 2026-11-21T12:00:00 must be timezone-aware, e.g. in UTC"),
        ({"run_id": "r1", "end": NOW}, ValueError,
         "ask for run 'r1' or for a period (start, end), not both"),
    ],
)  # fmt: skip
def test_what_a_page_cannot_show_is_refused_by_name(hook, asked, error, message):
    asked = {"job_name": "orders"} | asked
    with pytest.raises(error) as refused:
        job_page(hook, root=ROOT, conn_id=CONN_ID, now=NOW, **asked)
    assert refused.value.args == (message,)


def test_what_the_database_says_is_escaped(hook, url):
    job = "<script>alert(1)</script>"
    add_checkpoints(url, job, "<b>run</b>", T0, "l")
    change = TransitionRow(job, "<b>run</b>", seconds(1), True, "<i>because</i>")
    insert(url, backlog_transitions, row_values(change))
    insert(url, backlog_control, REQUEST | {"job_name": job, "answer": "<img src=x>"})
    pages = [
        jobs_page(hook, root=ROOT, conn_id=CONN_ID, now=NOW),
        job_page(hook, root=ROOT, conn_id=CONN_ID, job_name=job, now=NOW),
    ]
    for html in pages:
        assert not [e.tag for e in elements(html) if e.tag in ("script", "b", "i", "img")]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;i&gt;because&lt;/i&gt;" in pages[1] and "&lt;img src=x&gt;" in pages[1]
    assert links(pages[0])[job]["href"] == (
        "/backlog/jobs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E?conn_id=metrics_test"
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


def test_a_database_of_the_release_before_shows_its_costs_as_unknown(url, tmp_path, monkeypatch):
    write_release_before(url, LEGACY_CHECKPOINTS, [])
    hook = connect(monkeypatch, tmp_path / "metrics.db")
    html = job_page(hook, root=ROOT, conn_id=CONN_ID, job_name="legacy", now=NOW)
    assert marked(html, "data-checkpoint", "costs") == ["old-1:0", "old-1:1"]
    assert marked(html, "data-unknown", "costs") == ["true", "true"]
    assert cells(html, "medians") == [["live", "2 (0)", "unknown"]]
    assert " ".join(by_id(html, "state").text.split()).startswith("No checkpoint of this period")
    assert by_id(html, "operators").text == "The job has had no transition yet."


def test_a_busy_period_shows_its_newest_checkpoints_and_says_so(url, tmp_path, monkeypatch):
    add_checkpoints(url, "busy", "b1", T0, "l" * (MAX_CHECKPOINTS + 1))
    hook = connect(monkeypatch, tmp_path / "metrics.db")
    html = job_page(hook, root=ROOT, conn_id=CONN_ID, job_name="busy", now=T0 + timedelta(hours=1))
    assert len(marked(html, "data-checkpoint", "timeline")) == MAX_CHECKPOINTS
    assert " ".join(by_id(html, "cut").text.split()) == (
        "This period has more than 2,000 checkpoints: the newest 2,000 are shown, from "
        "2026-11-21T12:00:01Z."
    )
