"""Metrics databases with the tables, on SQLite and PostgreSQL, reachable as an Airflow
connection (tests/conftest.py points Airflow at a throwaway home)."""

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from spark_jobs.metrics.schema import backlog_checkpoints, make_engine, metadata


@pytest.fixture(params=["sqlite", "postgresql"])
def metrics_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty metrics database with the tables: a SQLite file, or the loopback PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/metrics.db"
    else:
        server = request.getfixturevalue("postgres_server")
        server.start()
        url = server.url
    engine = make_engine(url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    engine.dispose()
    yield url


def insert(url: str, table: sa.Table, *rows: dict) -> None:
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(table.insert(), list(rows))
    engine.dispose()


def checkpoint(job: str, run_id: str, batch_id: int, at: datetime, backlog: bool) -> dict:
    """A ``backlog_checkpoints`` row as the job writes it (only what sensors read varies)."""
    return {
        "job_name": job,
        "run_id": run_id,
        "batch_id": batch_id,
        "committed_at": at,
        "is_backlog": backlog,
        "effective_interval_ms": 2000,
        "num_input_rows": 10,
        "batch_duration_ms": 500,
        "sources": "[]",
    }


CONN_ID = "metrics_test"


def use_connection(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    """An Airflow connection from the environment, as a deployment's secrets would give it."""
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "backlog_metrics", **fields})
    )


@pytest.fixture
def connected(monkeypatch: pytest.MonkeyPatch, metrics_url: str) -> str:
    """The metrics database, reachable as connection ``CONN_ID``."""
    if metrics_url.startswith("sqlite:///"):
        use_connection(monkeypatch, host=metrics_url.removeprefix("sqlite:///"))
    else:
        use_connection(monkeypatch, extra={"url": metrics_url})
    return metrics_url


def add_checkpoints(
    url: str, job: str, run_id: str, start: datetime, phases: str, first_batch: int = 0
) -> None:
    """One checkpoint a second from ``start`` per letter: ``b`` backlog, ``l`` live."""
    insert(
        url,
        backlog_checkpoints,
        *(
            checkpoint(job, run_id, first_batch + i, start + timedelta(seconds=i), letter == "b")
            for i, letter in enumerate(phases)
        ),
    )
