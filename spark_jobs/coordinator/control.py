"""Answering requests to the running job: reconfigure, or stop.

Airflow writes a ``pending`` row to ``backlog_control``; this poller, in the driver, reads
it. New settings are validated exactly as at startup and applied through the coordinator;
the answer is ``applied`` (with the settings now in force) or ``rejected`` (with the
reason), so the operator that asked can report it, and the job keeps running either way.
Whatever goes wrong while acting on one request (a request too deeply nested to parse, an
error nobody foresaw) is that request's answer, not the poller's end: every request taken
is answered, and the next one is served.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping

import sqlalchemy as sa

from spark_jobs.backlog.config import BacklogConfig, ConfigError, reconfigured
from spark_jobs.metrics import control
from spark_jobs.metrics.periodic import PeriodicThread
from spark_jobs.metrics.schema import (
    APPLIED,
    RECONFIGURE,
    REJECTED,
    STOP,
    create_tables,
    make_engine,
)

logger = logging.getLogger(__name__)


def parse_settings(text: str) -> dict[str, str]:
    """The requested settings: a JSON object of Spark conf keys to values."""
    try:
        settings = json.loads(text)
    except (ValueError, RecursionError) as error:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise ConfigError([f"the request is not JSON ({error}): {shown!r}"]) from None
    if not isinstance(settings, dict) or not settings:
        raise ConfigError([f"the request must be a non-empty JSON object of settings: {text!r}"])
    return {str(key): str(value) for key, value in settings.items()}


class ControlPoller:
    """Polls ``backlog_control`` for this job every ``every_s`` on its own thread."""

    def __init__(
        self,
        config: BacklogConfig,
        conf: Mapping[str, str],
        reconfigure: Callable[[BacklogConfig], object],
        stop: Callable[[], object],
        every_s: float = 1.0,
    ):
        self._config = config
        self._conf = dict(conf)
        self._reconfigure = reconfigure
        self._stop_run = stop
        self._every_s = every_s
        self._engine = make_engine(config.metrics_url)
        self._tables_ready = False
        #: Answers decided but not yet written (the database went away meanwhile).
        self._owed: dict[int, tuple[str, str]] = {}
        self._thread = PeriodicThread("backlog-control", self._step, first_delay_s=every_s)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._thread.stop()
        self._engine.dispose()

    def _step(self) -> float:
        try:
            self.poll_once()
        except sa.exc.SQLAlchemyError as error:
            logger.warning("cannot read requests to the job (will retry): %s", error)
        return self._every_s

    def poll_once(self) -> int:
        """Answer every pending request of this job, oldest first; returns how many."""
        run_id = self._config.run_id
        with self._engine.begin() as connection:
            if not self._tables_ready:  # once, not at every poll
                create_tables(connection)
                control.answer_orphans(connection, self._config.job_name, run_id)
                self._tables_ready = True
            self._write_owed(connection)
            requests = control.pending(connection, self._config.job_name)
        answered = 0
        for request in requests:
            with self._engine.begin() as connection:
                if not control.claim(connection, request.id, run_id):
                    continue  # withdrawn by whoever asked, just now
            self._owed[request.id] = self._act(request)
            with self._engine.begin() as connection:
                self._write_owed(connection)
            answered += 1
        return answered

    def _write_owed(self, connection: sa.Connection) -> None:
        for request_id, (status, text) in list(self._owed.items()):
            control.answer(connection, request_id, status, text)
            del self._owed[request_id]
            logger.info("request %s %s: %s", request_id, status, text)

    def _act(self, request: control.Request) -> tuple[str, str]:
        run_id = self._config.run_id
        if request.for_run_id not in (None, run_id):
            return REJECTED, (
                f"this request is for run {request.for_run_id}, but run {run_id} runs job "
                f"{self._config.job_name!r} now"
            )
        try:
            if request.action == STOP:
                self._stop_run()
                return APPLIED, f"run {run_id} stops after its next committed checkpoint"
            if request.action != RECONFIGURE:
                return (
                    REJECTED,
                    f"unknown action {request.action!r}: expected {RECONFIGURE} or {STOP}",
                )
            settings = parse_settings(request.settings)
            config = reconfigured(self._config, self._conf, settings)
            self._reconfigure(config)
        except ConfigError as error:
            return REJECTED, str(error)
        except Exception as error:
            logger.exception("request %s failed", request.id)
            return REJECTED, f"the job could not act on it: {type(error).__name__}: {error}"
        self._config = config
        self._conf.update(settings)
        return APPLIED, config.describe()
