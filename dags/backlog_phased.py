"""The phased DAG: launch the events pipeline with its backlog profile, wait until it is
live, relaunch it with its live profile, and watch its freshness.

The backlog profile drains historical files and a topic read from far behind in batches as
large as its cap allows, with the resources a backlog deserves; once the job has been live
for a few checkpoints it is stopped right after a committed checkpoint and launched again
from that checkpoint with the live profile: a 2 s cadence and less memory. After the
relaunch the job runs on; the last task checks it keeps committing.

Connections: ``spark_default`` (the master, e.g. host ``local[2]`` or
``spark://host:7077``) and ``backlog_metrics_default`` (the metrics database). The data
and the broker come from the run's conf (``params`` below), by default from the
environment: ``BACKLOG_DATA_DIR``, ``BACKLOG_KAFKA_BOOTSTRAP_SERVERS``, ``BACKLOG_KAFKA_TOPIC``.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_provider_backlog.operators.launch import (
    BacklogLaunchOperator,
    BacklogRelaunchOperator,
)
from airflow_provider_backlog.profiles import PhaseProfile
from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor, BacklogPhaseSensor

#: The job's spark-submit entry file, wherever the project is installed.
EVENTS_PIPELINE = importlib.util.find_spec("spark_jobs.jobs.events_pipeline").origin

#: Both phases: the topic's lag puts the job back into backlog when it falls behind.
LAG_RULES = {
    "spark.backlog.checkpointing.max-batch-rows": "100000",
    "spark.backlog.lag.offsets.enter-threshold": "50000",
    "spark.backlog.lag.offsets.leave-threshold": "10000",
}
#: Resources as spark-submit applies them: on a standalone master the executors are
#: ``total_executor_cores / executor_cores``; ``num_executors`` counts on YARN and
#: Kubernetes; in local mode only the driver's memory matters.
BACKLOG_PROFILE = PhaseProfile(
    interval="5s",
    interval_during_backlog="0",  # no periodic checkpoint: the largest batches the cap allows
    driver_memory="1g",
    executor_memory="2g",
    executor_cores=2,
    total_executor_cores=8,
    conf=LAG_RULES,
)
LIVE_PROFILE = PhaseProfile(
    interval="2s",
    interval_during_backlog="1min",
    driver_memory="768m",
    executor_memory="1g",
    executor_cores=1,
    total_executor_cores=2,
    conf=LAG_RULES,
)

JOB = "{{ params.job_name }}"
DATA = "{{ params.data_dir }}"
APPLICATION_ARGS = [
    "--history",
    f"{DATA}/history",
    "--kafka-bootstrap-servers",
    "{{ params.kafka_bootstrap_servers }}",
    "--kafka-topic",
    "{{ params.kafka_topic }}",
    "--output",
    f"{DATA}/output",
    "--checkpoint",
    f"{DATA}/checkpoint",
]

with DAG(
    dag_id="backlog_phased",
    description="Launch with the backlog profile, relaunch with the live profile once live",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["backlog", "example"],
    params={
        "job_name": Param("events", type="string"),
        "data_dir": Param(
            os.environ.get("BACKLOG_DATA_DIR", "/var/lib/backlog"),
            type="string",
            description="holds history/ (parquet), and gets output/ and checkpoint/",
        ),
        "kafka_bootstrap_servers": Param(
            os.environ.get("BACKLOG_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"), type="string"
        ),
        "kafka_topic": Param(os.environ.get("BACKLOG_KAFKA_TOPIC", "events"), type="string"),
    },
):
    launch = BacklogLaunchOperator(
        task_id="launch_backlog_profile",
        job_name=JOB,
        application=EVENTS_PIPELINE,
        application_args=APPLICATION_ARGS,
        profile=BACKLOG_PROFILE,
    )
    live = BacklogPhaseSensor(
        task_id="wait_until_live",
        job_name=JOB,
        phase="live",
        for_checkpoints=2,
        deferrable=True,  # a streaming job's wait can last hours
        poke_interval=5,
        timeout=timedelta(hours=12).total_seconds(),
    )
    relaunch = BacklogRelaunchOperator(
        task_id="relaunch_live_profile",
        job_name=JOB,
        application=EVENTS_PIPELINE,
        application_args=APPLICATION_ARGS,
        profile=LIVE_PROFILE,
    )
    fresh = BacklogFreshnessSensor(
        task_id="watch_freshness",
        job_name=JOB,
        within=timedelta(seconds=30),
        deferrable=True,
        poke_interval=5,
        timeout=timedelta(minutes=10).total_seconds(),
    )
    launch >> live >> relaunch >> fresh
