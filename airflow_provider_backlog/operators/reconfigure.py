"""Changing a running job's checkpoint intervals without a restart."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from spark_jobs.metrics.schema import APPLIED, PENDING

INTERVAL = "spark.backlog.checkpointing.interval"
INTERVAL_DURING_BACKLOG = "spark.backlog.checkpointing.interval-during-backlog"


class BacklogReconfigureOperator(BaseOperator):
    """Sets ``interval`` and/or ``interval-during-backlog`` (Spark duration strings such as
    ``5s`` or ``2min``) of the running job ``job_name``, and waits for its answer.

    The job's coordinator validates the request as it validates its startup settings; a
    rejection fails the task with the coordinator's message, and the job keeps running with
    its old settings. No answer within ``answer_timeout`` (no running job of that name)
    fails the task too. Returns the settings now in force.
    """

    template_fields = ("job_name", "interval", "interval_during_backlog")

    def __init__(
        self,
        *,
        job_name: str,
        interval: str | None = None,
        interval_during_backlog: str | None = None,
        metrics_conn_id: str = BacklogMetricsHook.default_conn_name,
        answer_timeout: timedelta = timedelta(minutes=2),
        poll_interval_s: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if interval is None and interval_during_backlog is None:
            raise ValueError("set interval, interval_during_backlog, or both")
        self.job_name = job_name
        self.interval = interval
        self.interval_during_backlog = interval_during_backlog
        self.metrics_conn_id = metrics_conn_id
        self.answer_timeout = answer_timeout
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Any) -> str:
        settings = {
            key: value
            for key, value in (
                (INTERVAL, self.interval),
                (INTERVAL_DURING_BACKLOG, self.interval_during_backlog),
            )
            if value is not None
        }
        hook = BacklogMetricsHook(self.metrics_conn_id)
        request_id = hook.request_reconfiguration(self.job_name, settings)
        self.log.info("asked job %s for %s (request %s)", self.job_name, settings, request_id)
        status, answer = hook.reconfiguration_answer(
            request_id, self.answer_timeout.total_seconds(), self.poll_interval_s
        )
        if status == PENDING:
            raise AirflowException(
                f"job {self.job_name!r} did not answer reconfiguration request {request_id} "
                f"within {self.answer_timeout}: is it running?"
            )
        if status != APPLIED:
            raise AirflowException(f"job {self.job_name!r} rejected {settings}: {answer}")
        self.log.info("job %s now runs with %s", self.job_name, answer)
        return answer or ""
