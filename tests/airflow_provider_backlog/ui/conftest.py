"""Airflow's own database in the session's throwaway home (tests/conftest.py), holding DAGs
serialized as the DAG processor stores them: what the Backlog view reads besides metrics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


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
