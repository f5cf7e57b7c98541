"""The jobs of a DAG, read back from its serialized form as the api-server sees it."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_backlog.ui.dag_jobs import TaskJob, UnknownDag, dag_jobs, jobs_of_dags
from tests.airflow_provider_backlog.ui.conftest import store_dags

PHASED = """
from airflow.sdk import DAG, Param, task

from airflow_provider_backlog.operators.control import BacklogStopOperator
from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor, BacklogPhaseSensor

with DAG(
    "jobs_of_every_kind",
    schedule=None,
    params={"job": Param("events", type="string"), "other": Param(type=["null", "string"])},
):
    BacklogPhaseSensor(task_id="literal", job_name="orders", phase="live")
    BacklogPhaseSensor(
        task_id="from_params", job_name="{{ params.job }}", phase="live", metrics_conn_id="m"
    )
    BacklogPhaseSensor(task_id="same_again", job_name="events", phase="backlog")
    BacklogStopOperator(task_id="by_date", job_name="daily-{{ ds }}")
    BacklogStopOperator(task_id="no_default", job_name="{{ params.other }}")
    BacklogFreshnessSensor.partial(task_id="mapped", within=30).expand(
        job_name=["clicks", "views"]
    )

    @task
    def names() -> list[str]:
        return ["a"]

    BacklogFreshnessSensor.partial(task_id="mapped_later", within=30).expand(job_name=names())
"""

NO_JOBS = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG("no_streaming_job", schedule=None):
    EmptyOperator(task_id="nothing")
"""


def test_every_way_a_dag_can_name_its_jobs(airflow_db: None, tmp_path: Path) -> None:
    store_dags(PHASED, tmp_path)
    found = dag_jobs("jobs_of_every_kind")
    assert found.tasks == (
        TaskJob("literal", "orders", "orders"),
        TaskJob("from_params", "{{ params.job }}", "events"),
        TaskJob("same_again", "events", "events"),
        TaskJob("by_date", "daily-{{ ds }}", None),
        TaskJob("no_default", "{{ params.other }}", None),
        TaskJob("mapped", "clicks", "clicks"),
        TaskJob("mapped", "views", "views"),
        TaskJob("mapped_later", "mapped over values only a run knows", None),
    )
    assert found.job_names == ("orders", "events", "clicks", "views")
    assert [t.task_id for t in found.unresolved] == ["by_date", "no_default", "mapped_later"]


def test_a_dag_without_streaming_jobs_has_none(airflow_db: None, tmp_path: Path) -> None:
    store_dags(NO_JOBS, tmp_path)
    found = dag_jobs("no_streaming_job")
    assert (found.tasks, found.job_names) == ((), ())


def test_a_dag_never_stored_is_unknown(airflow_db: None) -> None:
    with pytest.raises(UnknownDag, match="no DAG 'never_parsed'"):
        dag_jobs("never_parsed")


def test_the_jobs_of_many_dags_at_once(airflow_db: None, tmp_path: Path) -> None:
    """Of every stored DAG, or of the stored ones among some ids, each as ``dag_jobs``
    reads it alone."""
    store_dags(PHASED + NO_JOBS, tmp_path)
    every = {found.dag_id: found for found in jobs_of_dags()}
    assert every["jobs_of_every_kind"] == dag_jobs("jobs_of_every_kind")
    assert every["no_streaming_job"].tasks == ()
    some = jobs_of_dags(["no_streaming_job", "never_parsed"])
    assert [found.dag_id for found in some] == ["no_streaming_job"]
