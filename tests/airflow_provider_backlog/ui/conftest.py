"""What the Backlog view reads: a metrics database (SQLite) for the pages, empty or seeded
with the story of tests/airflow_provider_backlog/hooks/story.py, reachable as connection
``CONN_ID``; and Airflow's own database in the session's throwaway home
(tests/conftest.py), holding DAGs serialized as the DAG processor stores them."""

import os
from pathlib import Path

import pytest

from airflow_provider_backlog.hooks import metrics_reads
from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.ui.access import JobAccess
from spark_jobs.metrics.schema import make_engine, metadata
from tests.airflow_provider_backlog.conftest import CONN_ID, use_connection
from tests.airflow_provider_backlog.hooks.story import NOW, write_story


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
def hook(
    empty: BacklogMetricsHook, url: str, monkeypatch: pytest.MonkeyPatch
) -> BacklogMetricsHook:
    """A hook on the database of the story, whose clock reads the story's ``NOW``: leases
    are judged by the database's clock, and the story's are set in a fixed past
    (test_database_clock.py reads real clocks)."""
    write_story(url)
    monkeypatch.setattr(metrics_reads, "database_now", lambda connection: NOW)
    return empty


def sees_every_job(conn_id: str = CONN_ID) -> JobAccess:
    """A reader of connection ``conn_id`` where no DAG names a job: every job is shown."""
    return JobAccess(conn_id, frozenset(), frozenset())


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Airflow's tables, created once, and the DAG bundle DAGs are stored under."""
    if not Path(os.environ["AIRFLOW_HOME"]).name.startswith("airflow-home-"):
        pytest.fail("AIRFLOW_HOME is set: unset it, so that tests keep off a real Airflow")
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.utils.db import initdb

    initdb()
    DagBundlesManager().sync_bundles_to_db()


def store_dags(source: str, folder: Path) -> None:
    """Parse a DAG file's source (in ``folder``) and store its DAGs as the DAG processor
    does; needs ``airflow_db``."""
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dag.py").write_text(source, encoding="utf-8")
    bag = DagBag(str(folder))
    assert not bag.import_errors, bag.import_errors
    sync_bag_to_db(bag, "dags-folder", None)
