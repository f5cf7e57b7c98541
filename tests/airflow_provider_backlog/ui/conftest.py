"""A metrics database (SQLite) for the pages, empty or seeded with the story of
tests/airflow_provider_backlog/hooks/story.py, reachable as connection ``CONN_ID``."""

from pathlib import Path

import pytest

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import CONN_ID, use_connection
from tests.airflow_provider_backlog.hooks.story import write_story


@pytest.fixture
def url(tmp_path: Path) -> str:
    """An empty metrics database, with the tables."""
    url = f"sqlite:///{tmp_path}/metrics.db"
    engine = make_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    return url


@pytest.fixture
def empty(url: str, monkeypatch: pytest.MonkeyPatch) -> BacklogMetricsHook:
    """A hook on it; a test may write rows before its first read."""
    use_connection(monkeypatch, host=url.removeprefix("sqlite:///"))
    return BacklogMetricsHook(CONN_ID)


@pytest.fixture
def hook(empty: BacklogMetricsHook, url: str) -> BacklogMetricsHook:
    """A hook on the database of the story."""
    write_story(url)
    return empty
