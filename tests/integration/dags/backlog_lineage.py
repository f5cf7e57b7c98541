"""A launch whose lineage the tests read: the events pipeline from the history files and
the topic of the test's deployment, into an output directory whose name has a space and a
quote, with the task's OpenLineage run and transport passed on to Spark."""

from __future__ import annotations

import importlib.util

from airflow.sdk import DAG, Param

from airflow_provider_backlog.operators.launch import BacklogLaunchOperator
from airflow_provider_backlog.profiles import PhaseProfile

EVENTS_PIPELINE = importlib.util.find_spec("spark_jobs.jobs.events_pipeline").origin
DATA = "{{ params.data_dir }}"

with DAG(
    dag_id="backlog_lineage",
    schedule=None,
    catchup=False,
    params={
        "data_dir": Param(type="string"),
        "kafka_bootstrap_servers": Param(type="string"),
    },
):
    BacklogLaunchOperator(
        task_id="launch",
        job_name="events",
        application=EVENTS_PIPELINE,
        application_args=[
            "--history",
            f"{DATA}/history",
            "--kafka-bootstrap-servers",
            "{{ params.kafka_bootstrap_servers }}",
            "--output",
            f"{DATA}/lineage output's",
            "--checkpoint",
            f"{DATA}/checkpoint",
        ],
        profile=PhaseProfile("2s"),
        openlineage_inject_parent_job_info=True,
        openlineage_inject_transport_info=True,
    )
