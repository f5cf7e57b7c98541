"""Answering requests to the running job: reconfigure, or stop.

Airflow writes a ``pending`` row to ``backlog_control``; this poller, in the driver, reads
it. New settings are validated exactly as at startup and applied through the coordinator;
the answer is ``applied`` (with the settings now in force) or ``rejected`` (with the
reason), so the operator that asked can report it, and the job keeps running either way.
A stop is answered, then the run ends after its next committed checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

import sqlalchemy as sa

from spark_jobs.backlog.config import BacklogConfig, ConfigError, reconfigured
from spark_jobs.metrics.schema import (
    APPLIED,
    CLAIMED,
    PENDING,
    REJECTED,
    STOP,
    backlog_control,
    create_tables,
    make_engine,
)

logger = logging.getLogger(__name__)


def parse_settings(text: str) -> dict[str, str]:
    """The requested settings: a JSON object of Spark conf keys to values."""
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError([f"the request is not JSON ({error}): {text!r}"]) from None
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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backlog-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._engine.dispose()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.poll_once()
            except sa.exc.SQLAlchemyError as error:
                logger.warning("cannot read reconfiguration requests (will retry): %s", error)

    def poll_once(self) -> int:
        """Answer every pending request of this job, oldest first; returns how many."""
        table = backlog_control
        with self._engine.begin() as connection:
            if not self._tables_ready:  # once, not at every poll
                create_tables(connection)
                self._tables_ready = True
            pending = connection.execute(
                sa.select(table.c.id, table.c.action, table.c.settings)
                .where(table.c.job_name == self._config.job_name, table.c.status == PENDING)
                .order_by(table.c.id)
            ).all()
        answered = 0
        for request_id, action, text in pending:
            if not self._claim(request_id):
                continue  # withdrawn by whoever asked, just now
            status, answer = self._answer_stop() if action == STOP else self._answer(text)
            with self._engine.begin() as connection:
                connection.execute(
                    table.update()
                    .where(table.c.id == request_id, table.c.status == CLAIMED)
                    .values(status=status, answer=answer, answered_at=datetime.now(UTC))
                )
            logger.info("%s request %s %s: %s", action, request_id, status, answer)
            answered += 1
        return answered

    def _claim(self, request_id: int) -> bool:
        """Take the request before acting on it, unless it was withdrawn meanwhile."""
        table = backlog_control
        with self._engine.begin() as connection:
            result = connection.execute(
                table.update()
                .where(table.c.id == request_id, table.c.status == PENDING)
                .values(status=CLAIMED, answered_by_run=self._config.run_id)
            )
        return result.rowcount == 1

    def _answer_stop(self) -> tuple[str, str]:
        self._stop_run()
        return APPLIED, f"run {self._config.run_id} stops after its next committed checkpoint"

    def _answer(self, text: str) -> tuple[str, str]:
        try:
            settings = parse_settings(text)
            config = reconfigured(self._config, self._conf, settings)
        except ConfigError as error:
            return REJECTED, str(error)
        self._reconfigure(config)
        self._config = config
        self._conf.update(settings)
        return APPLIED, config.describe()
