"""Talking to a running job through the metrics database: change its checkpoint intervals
(or freshness target) without a restart, or stop it gracefully. The job's coordinator
answers each request."""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from spark_jobs.backlog.config import FRESHNESS_TARGET, INTERVAL, INTERVAL_DURING_BACKLOG
from spark_jobs.metrics.schema import RECONFIGURE

#: What a reconfiguration may set, as its parameters are named.
_SETTINGS = "interval, interval_during_backlog, freshness_target"


class _JobRequestOperator(BaseOperator):
    """Sends a request to the running job ``job_name`` and waits for its answer. Its
    arguments are documented on ``BacklogReconfigureOperator``, where users read them."""

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

    @cached_property
    def hook(self) -> BacklogMetricsHook:
        return BacklogMetricsHook(self.metrics_conn_id)


class BacklogReconfigureOperator(_JobRequestOperator):
    """Sets ``interval``, ``interval-during-backlog`` and/or ``freshness-target`` (Spark
    duration strings such as ``5s`` or ``2min``) of the running job ``job_name``, and waits
    for its answer.

    The job's coordinator validates the request as it validates its startup settings; a
    rejection fails the task with the coordinator's message, and the job keeps running with
    its old settings. No answer within ``answer_timeout`` (no running job of that name)
    fails the task too. Returns the settings now in force.

    :param interval: The new ``spark.backlog.checkpointing.interval``: a duration with a
        unit, from ``1ms`` to ``1d``; None (the default) keeps the current one. (templated)
    :param interval_during_backlog: The new ``interval-during-backlog``: ``0`` (no periodic
        checkpoint during backlog) or a duration from ``interval`` to ``1d``; None (the
        default) keeps the current one. (templated)
    :param freshness_target: The new ``freshness-target``: a duration above ``min-pause``;
        the job then chooses its live interval for it at once. None (the default) keeps the
        current one. At least one of the three must be set. (templated)
    :param job_name: The running job's name. (templated)
    :param metrics_conn_id: The ``backlog_metrics`` connection whose database the job
        reads requests from; default ``backlog_metrics_default``.
    :param answer_timeout: How long a run of the job has to take the request (default
        2 minutes); if none does, the request is withdrawn and the task fails. A run that
        took it has 30 seconds more to answer.
    :param poll_interval_s: Seconds between reads of the request's status; default 1.
    """

    template_fields = ("job_name", "interval", "interval_during_backlog", "freshness_target")

    def __init__(
        self,
        *,
        interval: str | None = None,
        interval_during_backlog: str | None = None,
        freshness_target: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if interval is None and interval_during_backlog is None and freshness_target is None:
            raise ValueError(f"set at least one of {_SETTINGS}")
        self.interval = interval
        self.interval_during_backlog = interval_during_backlog
        self.freshness_target = freshness_target

    def execute(self, context: Any) -> str:
        # Templates may render to None (native rendering of an empty param) or a number.
        wanted = (
            (INTERVAL, self.interval),
            (INTERVAL_DURING_BACKLOG, self.interval_during_backlog),
            (FRESHNESS_TARGET, self.freshness_target),
        )
        settings = {key: str(value) for key, value in wanted if value not in (None, "")}
        if not settings:
            rendered = (self.interval, self.interval_during_backlog, self.freshness_target)
            raise AirflowException(
                f"{_SETTINGS} are all empty once rendered ({', '.join(map(repr, rendered))}): "
                "set at least one"
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
    ``stop_timeout``. Its checkpoint is then ready for the next launch.

    It takes ``job_name``, ``metrics_conn_id``, ``answer_timeout`` and ``poll_interval_s`` as
    ``BacklogReconfigureOperator`` does.

    :param stop_timeout: How long its driver may take, once it has agreed to stop, to end and
        let go of its lease (default 5 minutes); past it the task fails.
    """

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
