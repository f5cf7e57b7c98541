"""The Backlog view's pages, rendered on the server as HTML with inline SVG.

The Airflow plugin's app calls these with a hook on the metrics connection the reader chose,
the path it is mounted at, and the time; they read, check what the reader asked for, and
render. A request the pages cannot answer raises: ``UnknownJob`` (a ``LookupError``) for a
job or run the database does not know, ``ValueError`` for a period they do not show, each
with a message that names the value and what is allowed, for the app to answer with.
Templates escape everything they are given, since job names, reasons and answers come
from the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jinja2 import Environment, PackageLoader, StrictUndefined

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_reads import MAX_CHECKPOINTS, JobHistory, aware_utc
from airflow_provider_backlog.ui import fmt
from airflow_provider_backlog.ui.costs import LABELS, SEGMENTS, costs_chart, medians, state_chart
from airflow_provider_backlog.ui.links import Links
from airflow_provider_backlog.ui.runs import boundaries, runs, spans
from airflow_provider_backlog.ui.summary import JobRow, job_row
from airflow_provider_backlog.ui.timeline import timeline

if TYPE_CHECKING:  # the rules' module asks Airflow's auth manager; the pages only apply them
    from airflow_provider_backlog.ui.access import JobAccess

#: The period a job's page shows unless asked for another, and the longest it shows.
DEFAULT_PERIOD = timedelta(hours=1)
MAX_PERIOD = timedelta(days=7)
#: The periods, ending now, a job's page offers.
PRESETS = (timedelta(minutes=15), timedelta(hours=1), timedelta(hours=6), timedelta(days=1))
#: Room left on either side of a run's life, so that its first and last marks show whole.
_RUN_MARGIN = 0.02

_templates = Environment(
    loader=PackageLoader(__package__, "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters.update(
    utc=fmt.utc,
    duration=fmt.duration,
    ms=fmt.milliseconds,
    count=fmt.count,
    size=fmt.size,
    share=fmt.share,
    breakable=fmt.breakable,
)


class UnknownJob(LookupError):
    """A job, or a run of one, that the metrics database has no rows of."""


def _render(template: str, links: Links, now: datetime, **context: object) -> str:
    return _templates.get_template(template).render(links=links, now=now, **context)


def jobs_page(hook: BacklogMetricsHook, *, root: str, access: JobAccess, now: datetime) -> str:
    """The jobs of the metrics database the reader may see (nothing is read of the others):
    where each stands at ``now``."""
    summaries = (hook.job_summary(name) for name in hook.job_names() if access.may_see(name))
    rows = [job_row(summary, now) for summary in summaries if summary is not None]
    links = Links(root, access.conn_id)
    return _render("jobs.html", links, now, rows=rows, shown=access.shown())


def dag_page(
    hook: BacklogMetricsHook,
    *,
    root: str,
    conn_id: str,
    dag_id: str,
    job_names: Sequence[str],
    now: datetime,
) -> str:
    """The jobs a DAG launches or watches (``job_names``, from its tasks), as the jobs page
    shows them; one the database does not know yet is listed as such."""
    rows = []
    for name in job_names:
        summary = hook.job_summary(name)
        rows.append(JobRow(name, None, None) if summary is None else job_row(summary, now))
    return _render("dag.html", Links(root, conn_id), now, rows=rows, dag_id=dag_id)


def _period(
    now: datetime, start: datetime | None, end: datetime | None
) -> tuple[datetime, datetime]:
    """The period asked for: ``DEFAULT_PERIOD`` up to ``end`` (default ``now``) unless
    ``start`` is given; it must start before it ends and last at most ``MAX_PERIOD``."""
    until = aware_utc(end, "end") if end is not None else aware_utc(now, "now")
    since = aware_utc(start, "start") if start is not None else until - DEFAULT_PERIOD
    if since >= until:
        raise ValueError(f"start {fmt.utc(since)} must be before end {fmt.utc(until)}")
    if until - since > MAX_PERIOD:
        raise ValueError(
            f"the period from {fmt.utc(since)} to {fmt.utc(until)} lasts "
            f"{fmt.duration((until - since).total_seconds())}; a page shows at most "
            f"{fmt.duration(MAX_PERIOD.total_seconds())}"
        )
    return since, until


def _run_period(
    hook: BacklogMetricsHook, job_name: str, run_id: str, now: datetime
) -> tuple[datetime, datetime]:
    """The run's whole life (until ``now`` while it runs), with a little room around it."""
    life = hook.run_period(job_name, run_id)
    if life is None:
        raise UnknownJob(f"job {job_name!r} has no run {run_id!r} in the metrics database")
    since, until = life[0], max(min(life[1], aware_utc(now, "now")), life[0])
    margin = max((until - since) * _RUN_MARGIN, timedelta(seconds=1))
    return since - margin, until + margin


def _newest_kept(history: JobHistory) -> JobHistory:
    """A history whose checkpoints a cap cut, from its oldest kept one on."""
    if not history.checkpoints_cut:
        return history
    since = history.checkpoints[0].committed_at
    return replace(
        history,
        since=since,
        transitions=tuple(t for t in history.transitions if t.at >= since),
        requests=tuple(r for r in history.requests if r.requested_at >= since),
    )


def job_page(
    hook: BacklogMetricsHook,
    *,
    root: str,
    conn_id: str,
    job_name: str,
    now: datetime,
    start: datetime | None = None,
    end: datetime | None = None,
    run_id: str | None = None,
) -> str:
    """One job: where it stands, its timeline over a period (the last ``DEFAULT_PERIOD``
    unless ``start`` and ``end`` say otherwise, or the whole life of ``run_id``), its runs,
    its operators' status, and where its checkpoints' time went."""
    summary = hook.job_summary(job_name)
    if summary is None:
        raise UnknownJob(
            f"job {job_name!r} has no checkpoint and no lease in the metrics database of "
            f"connection {conn_id!r}"
        )
    if run_id is not None and (start is not None or end is not None):
        raise ValueError(f"ask for run {run_id!r} or for a period (start, end), not both")
    if run_id is not None:
        since, until = _run_period(hook, job_name, run_id, now)
    else:
        since, until = _period(now, start, end)
    history = _newest_kept(hook.job_history(job_name, since, until))
    phases = spans(history)
    run_rows = runs(history, phases)
    links = Links(root, conn_id)
    return _render(
        "job.html",
        links,
        now,
        row=job_row(summary, now),
        history=history,
        cut=MAX_CHECKPOINTS if history.checkpoints_cut else None,
        periods=_period_links(links, job_name, history, now),
        max_period=MAX_PERIOD,
        run_id=run_id,
        timeline=timeline(history, phases, boundaries(history, run_rows)),
        runs=run_rows,
        transition=summary.latest_transition,
        costs=costs_chart(history.checkpoints, job_name) if history.checkpoints else None,
        segments=[(segment, LABELS[segment]) for segment in SEGMENTS],
        medians=medians(history.checkpoints),
        state=state_chart(history.checkpoints, history.since, history.until, job_name),
    )


def _period_links(
    links: Links, job_name: str, history: JobHistory, now: datetime
) -> list[tuple[str, str]]:
    """Links to the periods ending now, and to the periods just before and after this one."""

    def to(since: datetime, until: datetime) -> str:
        return links.job(job_name, start=fmt.utc(since), end=fmt.utc(until))

    shown = min(history.until - history.since, MAX_PERIOD)
    offered = [(f"last {fmt.duration(p.total_seconds())}", to(now - p, now)) for p in PRESETS]
    offered.append(("earlier", to(history.since - shown, history.since)))
    if now - history.until >= timedelta(seconds=1):  # what a link's time can tell apart
        offered.append(("later", to(history.until, min(history.until + shown, now))))
    return offered
