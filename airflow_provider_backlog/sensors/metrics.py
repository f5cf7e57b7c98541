"""Waiting for a phased job: until it is live (or in backlog) for some checkpoints, or until
it has committed a checkpoint recently. Deferrable as Airflow's ``[operators]
default_deferrable`` says, or as ``deferrable`` asks: the triggerer polls and no worker slot
is held; otherwise the sensor pokes (use ``mode="reschedule"``). A
metrics database that does not answer (restarting, unreachable) is asked again, with
backoff, for ``database_retry_timeout`` (default 5 minutes) before the sensor fails."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.metrics import (
    BacklogMetricsHook,
    Expectation,
    Phase,
    is_transient,
)
from airflow_provider_backlog.hooks.metrics_poll import read_job, stop_reason
from airflow_provider_backlog.triggers.metrics import (
    DEFAULT_DATABASE_RETRY_TIMEOUT_S,
    JobExpectationTrigger,
)
from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.secrets import redact_text


class _JobSensor(BaseSensorOperator):
    """Waits until the job ``job_name`` meets ``expectation``; fails if its driver died or its
    run ended while it was awaited. Its arguments are documented on ``BacklogPhaseSensor``
    (``expectation`` is what each sensor builds from its own arguments)."""

    template_fields = ("job_name",)

    def __init__(
        self,
        *,
        job_name: str,
        expectation: Expectation,
        metrics_conn_id: str = BacklogMetricsHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: timedelta | float = 30.0,
        database_retry_timeout: timedelta = timedelta(seconds=DEFAULT_DATABASE_RETRY_TIMEOUT_S),
        **kwargs: Any,
    ):
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job_name = job_name
        self.expectation = expectation
        self.metrics_conn_id = metrics_conn_id
        self.deferrable = deferrable
        self.database_retry_timeout = database_retry_timeout
        self._outage = Outage(database_retry_timeout.total_seconds())
        self._created_at = datetime.now(UTC)

    def poke(self, context: Any) -> PokeReturnValue:
        hook = BacklogMetricsHook(self.metrics_conn_id)
        now = datetime.now(UTC)
        try:
            poll = read_job(hook, self.job_name, self.expectation.checkpoints)
            snapshot = poll.snapshot
            met = self.expectation.met_by(snapshot, now)
            stopped = None if met else stop_reason(self.job_name, poll, self._since(context))
        except Exception as error:
            # Poking again is the retry; the budget bounds it (in reschedule mode, each
            # poke is a new process: the sensor's timeout bounds it).
            if not (is_transient(error) and self._outage.failed()):
                raise
            self.log.warning(
                "job %s: the metrics database did not answer (%s); poking again",
                self.job_name,
                redact_text(str(error)),
            )
            return PokeReturnValue(False)
        self._outage.recovered()
        if stopped is not None:
            raise AirflowException(stopped)
        self.log.info(
            "job %s: waiting for %s; now %s",
            self.job_name,
            self.expectation.describe(),
            snapshot if snapshot is not None else "no checkpoint yet",
        )
        return PokeReturnValue(met, snapshot.as_dict() if met and snapshot else None)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        answer = self.poke(context)
        if answer:
            return answer.xcom_value
        self.defer(
            trigger=JobExpectationTrigger(
                self.metrics_conn_id,
                self.job_name,
                asdict(self.expectation),
                self.poke_interval,
                self._since(context).isoformat(),
                self.database_retry_timeout.total_seconds(),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def _since(self, context: Any) -> datetime:
        """When this wait began: the task instance's start (outside a task, which only tests
        do, when the sensor was created)."""
        ti = context.get("ti") if isinstance(context, dict) else None
        started = getattr(ti, "start_date", None)
        return started if isinstance(started, datetime) else self._created_at

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "success":
            raise AirflowException(event.get("message", f"unexpected event {event!r}"))
        return event["snapshot"]


class BacklogPhaseSensor(_JobSensor):
    """Waits until ``job_name`` is in ``phase`` (``live`` or ``backlog``) for its last
    ``for_checkpoints`` checkpoints of one run.

    :param job_name: The job's name. (templated)
    :param phase: ``"live"`` or ``"backlog"``; anything else raises ValueError.
    :param for_checkpoints: How many of the latest checkpoints, all of one run, must be in
        ``phase``: 1 (the default) to 1000.
    :param metrics_conn_id: The ``backlog_metrics`` connection whose database the job writes
        its checkpoints to; default ``backlog_metrics_default``.
    :param deferrable: True: after a first check, defer to the triggerer, which polls
        without holding a worker slot. False: poke (use ``mode="reschedule"``). Default:
        Airflow's ``[operators] default_deferrable``.
    :param poke_interval: Seconds (or a timedelta) between checks, deferred or not; default 30.
    :param database_retry_timeout: How long a metrics database that does not answer is asked
        again before the sensor fails (default 5 minutes). When poking in reschedule mode,
        each poke starts afresh and the sensor's ``timeout`` bounds the retries instead.
    """

    def __init__(self, *, job_name: str, phase: Phase, for_checkpoints: int = 1, **kwargs: Any):
        super().__init__(
            job_name=job_name, expectation=Expectation(phase, for_checkpoints), **kwargs
        )


class BacklogFreshnessSensor(_JobSensor):
    """Waits until ``job_name`` has committed a checkpoint within ``within``. It takes
    ``metrics_conn_id``, ``deferrable``, ``poke_interval`` and ``database_retry_timeout`` as
    ``BacklogPhaseSensor`` does.

    :param job_name: The job's name. (templated)
    :param within: How recent the latest checkpoint must be: a timedelta, or seconds; above 0.
    """

    def __init__(self, *, job_name: str, within: timedelta | float, **kwargs: Any):
        seconds = within.total_seconds() if isinstance(within, timedelta) else float(within)
        super().__init__(job_name=job_name, expectation=Expectation(within_s=seconds), **kwargs)
