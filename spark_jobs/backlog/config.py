"""Configuration read from Spark conf, validated before any query starts.

``spark-submit --conf`` and Airflow's ``SparkSubmitOperator(conf=...)`` both land in the
Spark conf, so that is the one place users set these keys.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from spark_jobs.backlog.values import (
    DURATION_FORMAT,
    format_duration,
    parse_count,
    parse_duration,
)

PREFIX = "spark.backlog."
INTERVAL = "spark.backlog.checkpointing.interval"
INTERVAL_DURING_BACKLOG = "spark.backlog.checkpointing.interval-during-backlog"
MIN_PAUSE = "spark.backlog.checkpointing.min-pause"
MAX_BATCH_ROWS = "spark.backlog.checkpointing.max-batch-rows"
JOB_NAME = "spark.backlog.job-name"
RUN_ID = "spark.backlog.run-id"
METRICS_URL = "spark.backlog.metrics.url"
PENDING_FILES_THRESHOLD = "spark.backlog.file-source.pending-files-threshold"

DEFAULTS = {
    INTERVAL: "30s",
    MIN_PAUSE: "0",
    MAX_BATCH_ROWS: "1000000",
    METRICS_URL: "sqlite:///backlog_metrics.db",
    PENDING_FILES_THRESHOLD: "10",
}
KNOWN_KEYS = (
    INTERVAL,
    INTERVAL_DURING_BACKLOG,
    MIN_PAUSE,
    MAX_BATCH_ROWS,
    JOB_NAME,
    RUN_ID,
    METRICS_URL,
    PENDING_FILES_THRESHOLD,
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,199}$")
_NAME_RULE = "1-200 characters: letters, digits and _ . : + - (starting with a letter or digit)"
_URL = re.compile(r"^(sqlite|postgresql)(\+[a-z0-9_]+)?://")
_URL_RULE = "an SQLAlchemy URL: sqlite:///relative.db, sqlite:////absolute/path.db or postgresql://user:password@host:5432/database"


class ConfigError(ValueError):
    """One or more invalid settings; the message names each key, its value and what is allowed."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid backlog configuration:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class BacklogConfig:
    """Validated settings. Durations are in seconds.

    ``interval_during_backlog_s`` is None when unset (same as ``interval_s``) and 0 when
    periodic checkpoints are disabled during backlog.
    """

    interval_s: float
    interval_during_backlog_s: float | None
    min_pause_s: float
    max_batch_rows: int
    job_name: str
    run_id: str
    metrics_url: str
    pending_files_threshold: int

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], app_name: str | None = None) -> BacklogConfig:
        """Parse and validate every ``spark.backlog.*`` key, reporting all problems at once."""
        problems: list[str] = []
        for key in sorted(k for k in conf if k.startswith(PREFIX) and k not in KNOWN_KEYS):
            problems.append(
                f"{key} = {conf[key]!r} is not a known setting; known: {', '.join(KNOWN_KEYS)}"
            )

        def raw(key: str) -> str | None:
            value = conf.get(key, DEFAULTS.get(key))
            return None if value is None else str(value).strip()

        def duration(key: str, minimum_s: float, rule: str) -> float | None:
            value = raw(key)
            if value is None:
                return None
            try:
                seconds = parse_duration(value)
            except ValueError as error:
                problems.append(f"{key} = {value!r} is invalid: {error}")
                return None
            if seconds < minimum_s:
                problems.append(f"{key} = {value!r} is invalid: {rule}")
                return None
            return seconds

        def positive_int(key: str) -> int:
            value = raw(key) or ""
            try:
                return parse_count(value)
            except ValueError as error:
                problems.append(f"{key} = {value!r} is invalid: {error}")
                return 1

        def name(key: str, fallback: str | None) -> str:
            value = raw(key) or fallback
            if value is None:
                problems.append(
                    f"{key} is not set and there is no spark.app.name: set {_NAME_RULE}"
                )
                return ""
            if not _NAME.match(value):
                problems.append(f"{key} = {value!r} is invalid: expected {_NAME_RULE}")
            return value

        interval = duration(INTERVAL, 0.001, f"must be at least 1ms ({DURATION_FORMAT})")
        during = duration(INTERVAL_DURING_BACKLOG, 0.0, f"expected {DURATION_FORMAT}")
        if interval is not None and during is not None and 0 < during < interval:
            problems.append(
                f"{INTERVAL_DURING_BACKLOG} = {raw(INTERVAL_DURING_BACKLOG)!r} is invalid: "
                f"it must be 0 (no periodic checkpoint during backlog) or at least {INTERVAL} "
                f"({format_duration(interval)}), because checkpoints during backlog may only "
                "be rarer"
            )
        min_pause = duration(MIN_PAUSE, 0.0, f"expected {DURATION_FORMAT}")
        metrics_url = raw(METRICS_URL) or ""
        if not _URL.match(metrics_url):
            problems.append(f"{METRICS_URL} = {metrics_url!r} is invalid: expected {_URL_RULE}")
        config = cls(
            interval_s=interval or 0.0,
            interval_during_backlog_s=during,
            min_pause_s=min_pause or 0.0,
            max_batch_rows=positive_int(MAX_BATCH_ROWS),
            job_name=name(JOB_NAME, app_name),
            run_id=name(RUN_ID, uuid.uuid4().hex),
            metrics_url=metrics_url,
            pending_files_threshold=positive_int(PENDING_FILES_THRESHOLD),
        )
        if problems:
            raise ConfigError(problems)
        return config

    def describe(self) -> str:
        """One line for the driver log."""
        during = self.interval_during_backlog_s
        during_text = "same as interval" if during is None else format_duration(during)
        return (
            f"job={self.job_name} run={self.run_id} interval={format_duration(self.interval_s)} "
            f"interval-during-backlog={during_text} min-pause={format_duration(self.min_pause_s)} "
            f"max-batch-rows={self.max_batch_rows}"
        )


def checkpoint_interval(config: BacklogConfig, job_is_backlog: bool) -> float | None:
    """The one place that picks the current checkpoint interval (None: no periodic checkpoint)."""
    if not job_is_backlog or config.interval_during_backlog_s is None:
        return config.interval_s
    if config.interval_during_backlog_s == 0:
        return None
    return config.interval_during_backlog_s
