"""The Backlog view's web app, which the plugin (plugins/backlog_view.py) mounts under
``/backlog`` in Airflow's api-server.

Airflow does not protect a plugin's app: every route asks Airflow's auth manager itself,
for read access to plugins (the jobs and a job's page) or to the DAG (its tab), to the
connection ``conn_id`` names unless it is the default one, and for the jobs the user may
see (ui/access.py). Inside a mounted app ``request.app`` is this app, not Airflow's, so the
auth manager comes from ``get_auth_manager()`` (Airflow's own ``requires_access_*`` do
so), never from app state. The pages come from ui/pages.py; this module routes, checks
access and input, and answers errors in a form the view's iframe can show: a page with a
sign-in link rather than JSON.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from html import escape
from typing import Annotated

import sqlalchemy as sa
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    requires_access_dag,
    requires_access_view,
)
from airflow.sdk.exceptions import AirflowNotFoundException
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_backlog import METRICS_CONN_TYPE
from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook, MetricsConnectionError
from airflow_provider_backlog.ui import pages
from airflow_provider_backlog.ui.access import job_access, may_read_connection
from airflow_provider_backlog.ui.dag_jobs import DagJobs, dag_jobs
from airflow_provider_backlog.ui.links import Links

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = BacklogMetricsHook.default_conn_name
#: What Airflow accepts as a connection id. Anything else is not echoed back: it could be a
#: URL with a password pasted into the wrong field.
_CONN_ID = re.compile(r"[\w.-]{1,250}")
_CONN_ID_RULE = f"conn_id must name a connection of type {METRICS_CONN_TYPE!r}"

router = APIRouter()
_READ_PLUGINS = [Depends(requires_access_view(AccessView.PLUGINS))]


def create_app() -> FastAPI:
    """The app the plugin mounts; no API docs, since it serves pages, not an API."""
    app = FastAPI(title="Backlog view", docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(router)
    app.add_exception_handler(StarletteHTTPException, error_page)  # type: ignore[arg-type]
    return app


def readable_connection(user: GetUserDep, conn_id: str = DEFAULT_CONN_ID) -> str:
    """The ``conn_id`` of the query: a 400 unless it is a connection id at all, and a 403
    unless it is the default connection or one ``user`` may read."""
    if not _CONN_ID.fullmatch(conn_id):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"{_CONN_ID_RULE}; what was given is no connection id (letters, digits, '_', '-', '.')",
        )
    if conn_id != DEFAULT_CONN_ID and not may_read_connection(user, conn_id):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"reading the metrics of connection {conn_id!r} needs read access to that "
            f"connection; without it the view reads {DEFAULT_CONN_ID!r}",
        )
    return conn_id


ReadableConnection = Annotated[str, Depends(readable_connection)]


@router.get("/", dependencies=_READ_PLUGINS, response_class=HTMLResponse)
def jobs(request: Request, user: GetUserDep, conn_id: ReadableConnection) -> HTMLResponse:
    """The jobs of the connection's metrics database that ``user`` may see."""
    access = job_access(user, conn_id)
    with metrics_hook(conn_id) as hook:
        page = pages.jobs_page(hook, root=mount_path(request), access=access, now=_now())
    return HTMLResponse(page)


@router.get("/jobs/{job_name:path}", dependencies=_READ_PLUGINS, response_class=HTMLResponse)
def job(
    request: Request,
    user: GetUserDep,
    job_name: str,
    conn_id: ReadableConnection,
    start: str | None = None,
    end: str | None = None,
    run_id: str | None = None,
) -> HTMLResponse:
    """One job: its timeline between ``start`` and ``end``, or of one run; a 403 before
    anything is read of a job ``user`` may not see."""
    access = job_access(user, conn_id)
    if not access.may_see(job_name):
        raise HTTPException(status.HTTP_403_FORBIDDEN, access.refusal(job_name))
    window = {"start": parse_time("start", start), "end": parse_time("end", end)}
    with metrics_hook(conn_id) as hook:
        page = pages.job_page(
            hook,
            root=mount_path(request),
            conn_id=conn_id,
            job_name=job_name,
            now=_now(),
            run_id=run_id or None,
            **window,
        )
    return HTMLResponse(page)


@router.get(
    "/dags/{dag_id}",
    dependencies=[Depends(requires_access_dag("GET"))],
    response_class=HTMLResponse,
)
def dag(request: Request, dag_id: str, conn_id: ReadableConnection) -> HTMLResponse:
    """The DAG's tab: the jobs its tasks act on, and what its templates leave open. A user
    who may read the DAG may see its jobs."""
    try:
        found = dag_jobs(dag_id)
    except LookupError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from error
    root = mount_path(request)
    with metrics_hook(conn_id) as hook:
        page = pages.dag_page(
            hook,
            root=root,
            conn_id=conn_id,
            dag_id=dag_id,
            job_names=found.job_names,
            now=_now(),
        )
    # dag_page knows job names only: the note goes below its one heading.
    return HTMLResponse(page.replace("</h1>", "</h1>" + templates_note(found, root, conn_id), 1))


def templates_note(found: DagJobs, root: str, conn_id: str) -> str:
    """What the tab says of job names given as templates: one rendered with the DAG's
    default params may differ in a run given others, and one only a run renders is not
    listed at all."""
    every_job = escape(Links(root, conn_id).jobs())
    items = []
    for task in found.tasks:
        if task.job_name == task.written:
            continue
        if task.job_name is None:
            meaning = (
                f'is known only to a run, so it is not listed here; <a href="{every_job}">'
                "every job</a> of the database shows it once it runs"
            )
        else:
            meaning = (
                f"is <code>{escape(task.job_name)}</code> with the DAG's default params; a "
                "run given other params acts on another job"
            )
        items.append(
            f"<li>task <code>{escape(task.task_id)}</code>: "
            f"<code>{escape(task.written)}</code> {meaning}</li>"
        )
    if not items:
        return ""
    listed = "".join(items)
    return (
        f'<div class="note" id="templates"><p>Jobs named by templates:</p><ul>{listed}</ul></div>'
    )


@contextmanager
def metrics_hook(conn_id: str) -> Iterator[BacklogMetricsHook]:
    """The hook of a ``backlog_metrics`` connection, its engine disposed of afterwards.

    Errors become answers that leak nothing of the connection: a bad ``conn_id`` or
    connection is a 400, an unknown job a 404, bad input a 400 with the page's message, a
    database that cannot be read a 503 whose details go to the api-server's log only.
    """
    require_metrics_connection(conn_id)
    hook = BacklogMetricsHook(conn_id)
    try:
        hook.sqlalchemy_url  # noqa: B018 - resolved here, where its errors are not echoed
    except MetricsConnectionError as error:  # names no database; says what to set
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from error
    except (ValueError, sa.exc.ArgumentError) as error:  # their text may quote the URL
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"connection {conn_id!r} has a URL SQLAlchemy cannot read: fix its url field",
        ) from error
    try:
        yield hook
    except LookupError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error)) from error
    except ValueError as error:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(error)) from error
    except (sa.exc.SQLAlchemyError, OSError) as error:
        log.exception("reading the metrics database of connection %s", conn_id)
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the metrics database of connection {conn_id!r} cannot be read now "
            f"({type(error).__name__}); the api-server's log has the details",
        ) from error
    finally:
        if "engine" in vars(hook):  # built by the first read, if there was one
            hook.engine.dispose()


def require_metrics_connection(conn_id: str) -> None:
    """A 400 unless ``conn_id`` (a connection id, see ``readable_connection``) names a
    connection of the metrics database's type."""
    try:
        connection = BacklogMetricsHook.get_connection(conn_id)
    except AirflowNotFoundException as error:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"{_CONN_ID_RULE}; there is no connection {conn_id!r}"
        ) from error
    if connection.conn_type != METRICS_CONN_TYPE:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"{_CONN_ID_RULE}; {conn_id!r} is of type {connection.conn_type!r}",
        )


def parse_time(name: str, text: str | None) -> datetime | None:
    """An ISO 8601 time from the query; without a zone it is taken as UTC."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError as error:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            f"{name} = {text[:40]!r} is no ISO 8601 time (e.g. 2026-01-31T12:00:00Z)",
        ) from error
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def mount_path(request: Request) -> str:
    """Where the browser sees this app: Airflow's root and the plugin's prefix."""
    return request.scope.get("root_path", "").rstrip("/")


async def error_page(request: Request, error: StarletteHTTPException) -> Response:
    """Errors as JSON for API clients, and as a page for a browser (the view's iframe);
    a 401 or 403 with a link to sign in."""
    if "text/html" not in request.headers.get("accept", ""):
        return await http_exception_handler(request, error)
    body = f"<p>{escape(str(error.detail))}</p>"
    if error.status_code == status.HTTP_401_UNAUTHORIZED:
        body += sign_in(request, "to see the Backlog view.")
    elif error.status_code == status.HTTP_403_FORBIDDEN:
        body += sign_in(request, "as a user who may see it.")
    return HTMLResponse(
        ERROR_PAGE.format(status=error.status_code, body=body),
        status_code=error.status_code,
        headers=error.headers,
    )


def sign_in(request: Request, why: str) -> str:
    """A link to Airflow's sign-in page that comes back to this page. It opens where the
    page is: Airflow 3.3's iframe sandbox has no allow-top-navigation, so a link meant
    for the whole window (target=_top) would do nothing there."""
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    login = get_auth_manager().get_url_login(next_url=here)
    return f'<p><a id="sign-in" href="{escape(login)}">Sign in</a> {why}</p>'


ERROR_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Backlog: {status}</title>
<style>:root {{ color-scheme: light dark; font-family: system-ui, sans-serif; }}</style>
</head><body><h1>Backlog</h1>{body}</body></html>
"""


def _now() -> datetime:
    return datetime.now(UTC)
