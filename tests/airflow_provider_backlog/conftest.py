"""Airflow reads its configuration when first imported: point it at a throwaway home, with
SQLite and no example DAGs, before any test module imports it."""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from spark_jobs.metrics.schema import make_engine, metadata


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
