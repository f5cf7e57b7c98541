"""Polling the metrics database from the triggerer, so a waiting sensor holds no worker slot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_backlog.hooks.metrics import Expectation, is_transient
from airflow_provider_backlog.hooks.metrics_poll import stop_reason
from airflow_provider_backlog.triggers.job_poller import subscribed
from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.secrets import redact_text
from spark_jobs.backlog.values import format_duration

DEFAULT_DATABASE_RETRY_TIMEOUT_S = 300.0


class JobExpectationTrigger(BaseTrigger):
    """Fires once the job's latest checkpoints meet the expectation; fires an error event
    (which fails the task, naming the cause) if the job's driver died or its run ended after
    ``since`` (ISO time the wait began), or if the database cannot be read: at once for an
    error of the query, after ``database_retry_timeout_s`` of retries with backoff for a
    database that does not answer (restarting, unreachable, locked).

    The triggers of one triggerer that wait on the same job through the same connection
    share one poll of it per interval (``job_poller``): the database's load grows with the
    jobs awaited, not with the sensors.

    :param metrics_conn_id: The ``backlog_metrics`` connection to read.
    :param job_name: The job's name.
    :param expectation: The ``Expectation``'s fields, as ``dataclasses.asdict`` gives them.
    :param poll_interval_s: Seconds between polls (a job's shared poll follows the shortest
        interval of its triggers); also the first wait before asking a database that did not
        answer again, doubled on each try up to 30 seconds.
    :param since: When the wait began, as an ISO 8601 time with its offset.
    :param database_retry_timeout_s: Seconds a database that does not answer is asked again
        before the error event; default 300.
    """

    def __init__(
        self,
        metrics_conn_id: str,
        job_name: str,
        expectation: dict[str, Any],
        poll_interval_s: float,
        since: str,
        database_retry_timeout_s: float = DEFAULT_DATABASE_RETRY_TIMEOUT_S,
    ):
        super().__init__()
        self.metrics_conn_id = metrics_conn_id
        self.job_name = job_name
        self.expectation = Expectation(**expectation)
        self.poll_interval_s = poll_interval_s
        self.since = since
        self.database_retry_timeout_s = database_retry_timeout_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "metrics_conn_id": self.metrics_conn_id,
                "job_name": self.job_name,
                "expectation": asdict(self.expectation),
                "poll_interval_s": self.poll_interval_s,
                "since": self.since,
                "database_retry_timeout_s": self.database_retry_timeout_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield await self._outcome()

    async def _outcome(self) -> TriggerEvent:
        """The event that ends the wait, judged on each poll of the job's shared poller."""
        since = datetime.fromisoformat(self.since)
        outage = Outage(self.database_retry_timeout_s)
        with subscribed(
            self.metrics_conn_id, self.job_name, self.expectation.checkpoints, self.poll_interval_s
        ) as polls:
            while True:
                poll = await polls.next()
                if poll.found is None:
                    assert poll.error is not None
                    problem = redact_text(str(poll.error))
                    if is_transient(poll.error) and outage.failed():
                        self.log.warning(
                            "job %s: the metrics database did not answer (%s); trying again in %s",
                            self.job_name,
                            problem,
                            format_duration(poll.next_in_s),
                        )
                        continue
                    retried = (
                        f" (retried for {format_duration(outage.lasted_s)})"
                        if outage.ongoing
                        else ""
                    )
                    return TriggerEvent(
                        {
                            "status": "error",
                            "message": f"cannot read the metrics of job {self.job_name!r} "
                            f"through connection {self.metrics_conn_id!r}{retried}: {problem}",
                        }
                    )
                outage.recovered()
                snapshot = poll.found.snapshot
                if self.expectation.met_by(snapshot, poll.at):
                    assert snapshot is not None
                    return TriggerEvent({"status": "success", "snapshot": snapshot.as_dict()})
                stopped = stop_reason(self.job_name, poll.found, since)
                if stopped is not None:
                    return TriggerEvent({"status": "error", "message": stopped})
