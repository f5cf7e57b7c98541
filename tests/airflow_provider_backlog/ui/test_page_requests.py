"""What a reader asks of a job's page: the periods it links to, what it refuses, and what it
escapes."""

from datetime import timedelta

import pytest

from airflow_provider_backlog.ui.pages import UnknownJob, job_page, jobs_page
from spark_jobs.metrics.schema import (
    TransitionRow,
    backlog_control,
    backlog_transitions,
    row_values,
)
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints, insert
from tests.airflow_provider_backlog.hooks.story import NOW, REQUEST, T0, seconds
from tests.airflow_provider_backlog.ui.conftest import sees_every_job
from tests.airflow_provider_backlog.ui.markup import elements, links

ROOT = "/backlog"


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
        jobs_page(hook, root=ROOT, access=sees_every_job(), now=NOW),
        job_page(hook, root=ROOT, conn_id=CONN_ID, job_name=job, now=NOW),
    ]
    for html in pages:
        assert not [e.tag for e in elements(html) if e.tag in ("script", "b", "i", "img")]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;i&gt;because&lt;/i&gt;" in pages[1] and "&lt;img src=x&gt;" in pages[1]
    assert links(pages[0])[job]["href"] == (
        "/backlog/jobs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E?conn_id=metrics_test"
    )
