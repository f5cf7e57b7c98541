"""Requests to a running job through the metrics database: both sides of the protocol.

Airflow inserts a ``pending`` request; the job's driver takes it (``claimed``) before acting
on it, acts, and answers ``applied`` or ``rejected`` with its message. Taking it first means
a request is either acted on and answered, or withdrawn by the asker who gave up waiting,
never both. A request may name the run it is meant for; another run rejects it, saying
which run it is. A request claimed by a run that ended before answering is answered by the
next run of the job, so no request stays claimed forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from spark_jobs.metrics.schema import (
    CLAIMED,
    PENDING,
    REJECTED,
    WITHDRAWN,
    backlog_control,
)

table = backlog_control


@dataclass(frozen=True)
class Request:
    id: int
    action: str
    settings: str
    for_run_id: str | None


def send(
    connection: sa.Connection,
    job_name: str,
    action: str,
    settings: dict[str, str] | None = None,
    for_run_id: str | None = None,
) -> int:
    """Insert a pending request; returns its id."""
    result = connection.execute(
        table.insert().values(
            job_name=job_name,
            requested_at=datetime.now(UTC),
            action=action,
            settings=json.dumps(settings or {}, sort_keys=True),
            status=PENDING,
            for_run_id=for_run_id,
        )
    )
    (request_id,) = result.inserted_primary_key
    return int(request_id)


def status_of(connection: sa.Connection, request_id: int) -> tuple[str, str | None]:
    """The request's status and the job's answer (None until answered)."""
    query = sa.select(table.c.status, table.c.answer).where(table.c.id == request_id)
    status, answer = connection.execute(query).one()
    return status, answer


def withdraw(connection: sa.Connection, request_id: int) -> bool:
    """Take back a request no run has taken; False if one took it meanwhile."""
    result = connection.execute(
        table.update()
        .where(table.c.id == request_id, table.c.status == PENDING)
        .values(status=WITHDRAWN, answered_at=datetime.now(UTC))
    )
    return result.rowcount == 1


def pending(connection: sa.Connection, job_name: str) -> list[Request]:
    """The job's pending requests, oldest first."""
    rows = connection.execute(
        sa.select(table.c.id, table.c.action, table.c.settings, table.c.for_run_id)
        .where(table.c.job_name == job_name, table.c.status == PENDING)
        .order_by(table.c.id)
    ).all()
    return [Request(row.id, row.action, row.settings, row.for_run_id) for row in rows]


def claim(connection: sa.Connection, request_id: int, run_id: str) -> bool:
    """Take the request before acting on it, unless it was withdrawn meanwhile."""
    result = connection.execute(
        table.update()
        .where(table.c.id == request_id, table.c.status == PENDING)
        .values(status=CLAIMED, answered_by_run=run_id)
    )
    return result.rowcount == 1


def answer(connection: sa.Connection, request_id: int, status: str, text: str) -> None:
    connection.execute(
        table.update()
        .where(table.c.id == request_id, table.c.status == CLAIMED)
        .values(status=status, answer=text, answered_at=datetime.now(UTC))
    )


def answer_orphans(connection: sa.Connection, job_name: str, run_id: str) -> int:
    """Reject the job's requests that another run claimed and never answered: only the
    live run acts on requests, so whatever another run took, it took before it ended."""
    orphans = connection.execute(
        sa.select(table.c.id, table.c.answered_by_run).where(
            table.c.job_name == job_name,
            table.c.status == CLAIMED,
            table.c.answered_by_run != run_id,
        )
    ).all()
    for request_id, by_run in orphans:
        answer(
            connection,
            request_id,
            REJECTED,
            f"run {by_run} took this request but ended before answering it; run {run_id} "
            "now runs the job: ask again if it still applies",
        )
    return len(orphans)
