"""Talking to a running job through the metrics database: change its checkpoint intervals
without a restart, or stop it gracefully. The job's coordinator answers each request."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from spark_jobs.backlog.config import INTERVAL, INTERVAL_DURING_BACKLOG
from spark_jobs.metrics.schema import RECONFIGURE


class _JobRequestOperator(BaseOperator):
    template_fields: tuple[str, ...] = ("job_name",)

    def __init__(
        self,
        *,
        job_name: str,
        metrics_conn_id: str = BacklogMetricsHook.default_conn_name,
        answer_timeout: timedelta = timedelta(minutes=2),
        poll_interval_s: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.job_name = job_name
        self.metrics_conn_id = metrics_conn_id
        self.answer_timeout = answer_timeout
        self.poll_interval_s = poll_interval_s

    @property
    def hook(self) -> BacklogMetricsHook:
        return BacklogMetricsHook(self.metrics_conn_id)


class BacklogReconfigureOperator(_JobRequestOperator):
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
        interval: str | None = None,
        interval_during_backlog: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if interval is None and interval_during_backlog is None:
            raise ValueError("set interval, interval_during_backlog, or both")
        self.interval = interval
        self.interval_during_backlog = interval_during_backlog

    def execute(self, context: Any) -> str:
        # Templates may render to None (native rendering of an empty param) or a number.
        wanted = (
            (INTERVAL, self.interval),
            (INTERVAL_DURING_BACKLOG, self.interval_during_backlog),
        )
        settings = {key: str(value) for key, value in wanted if value not in (None, "")}
        if not settings:
            raise AirflowException(
                "interval and interval_during_backlog are both empty once rendered "
                f"({self.interval!r}, {self.interval_during_backlog!r}): set at least one"
            )
        answer = self.hook.ask(
            str(self.job_name),
            RECONFIGURE,
            settings,
            timeout_s=self.answer_timeout.total_seconds(),
            poll_s=self.poll_interval_s,
        )
        self.log.info("job %s: %s", self.job_name, answer)
        return answer


class BacklogStopOperator(_JobRequestOperator):
    """Stops the running job ``job_name`` gracefully, right after its next committed
    checkpoint, and waits until its driver has ended (let go of its lease) within
    ``stop_timeout``. Its checkpoint is then ready for the next launch."""

    def __init__(self, *, stop_timeout: timedelta = timedelta(minutes=5), **kwargs: Any):
        super().__init__(**kwargs)
        self.stop_timeout = stop_timeout

    def execute(self, context: Any) -> str:
        return self.hook.stop(
            self.job_name,
            answer_timeout_s=self.answer_timeout.total_seconds(),
            stop_timeout_s=self.stop_timeout.total_seconds(),
            poll_s=self.poll_interval_s,
        )
