"""Reconfigure a running job without a restart: set its checkpoint intervals or its
freshness target, then check it keeps committing.

The job's coordinator validates the new settings as it validates its startup settings and
answers; a rejection fails ``reconfigure`` with the job's reason, and the job runs on with
its old settings. Trigger it with a conf such as ``{"interval": "5s"}`` or
``{"freshness_target": "10s"}`` (a setting left out stays as it is), or schedule it, e.g.
to allow staler data at night.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_provider_backlog.operators.control import BacklogReconfigureOperator
from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor

JOB = "{{ params.job_name }}"

with DAG(
    dag_id="backlog_reconfigure",
    description="Change a running job's checkpoint intervals",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    tags=["backlog", "example"],
    # So that an interval left out stays None instead of the text "None".
    render_template_as_native_obj=True,
    params={
        "job_name": Param("events", type="string"),
        "interval": Param(None, type=["string", "null"], description="e.g. 5s"),
        "interval_during_backlog": Param(
            None, type=["string", "null"], description="e.g. 2min, or 0"
        ),
        "freshness_target": Param(
            None, type=["string", "null"], description="e.g. 10s: the job chooses its interval"
        ),
    },
):
    running = BacklogFreshnessSensor(
        task_id="wait_until_running",
        job_name=JOB,
        within=timedelta(minutes=1),
        deferrable=True,
        poke_interval=5,
        timeout=timedelta(minutes=10).total_seconds(),
    )
    reconfigure = BacklogReconfigureOperator(
        task_id="reconfigure",
        job_name=JOB,
        interval="{{ params.interval }}",
        interval_during_backlog="{{ params.interval_during_backlog }}",
        freshness_target="{{ params.freshness_target }}",
    )
    fresh = BacklogFreshnessSensor(
        task_id="watch_freshness",
        job_name=JOB,
        within=timedelta(minutes=2),
        deferrable=True,
        poke_interval=5,
        timeout=timedelta(minutes=10).total_seconds(),
    )
    running >> reconfigure >> fresh
