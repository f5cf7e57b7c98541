"""Configuration read from Spark conf, validated before any query starts.

``spark-submit --conf`` and Airflow's ``SparkSubmitOperator(conf=...)`` both land in the
Spark conf, so that is the one place users set these keys.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from spark_jobs.backlog.lag import LagRules, Thresholds
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
LEASE_TTL = "spark.backlog.lease.ttl"
OFFSET_LAG_ENTER = "spark.backlog.lag.offsets.enter-threshold"
OFFSET_LAG_LEAVE = "spark.backlog.lag.offsets.leave-threshold"
WATERMARK_LAG_ENTER = "spark.backlog.lag.watermark.enter-threshold"
WATERMARK_LAG_LEAVE = "spark.backlog.lag.watermark.leave-threshold"
LAG_MIN_DWELL = "spark.backlog.lag.min-dwell"
METRICS_RETENTION = "spark.backlog.metrics.retention"

DEFAULTS = {
    INTERVAL: "30s",
    MIN_PAUSE: "0",
    MAX_BATCH_ROWS: "1000000",
    METRICS_URL: "sqlite:///backlog_metrics.db",
    PENDING_FILES_THRESHOLD: "10",
    LEASE_TTL: "30s",
    LAG_MIN_DWELL: "0",
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
    OFFSET_LAG_ENTER,
    OFFSET_LAG_LEAVE,
    WATERMARK_LAG_ENTER,
    WATERMARK_LAG_LEAVE,
    LAG_MIN_DWELL,
    LEASE_TTL,
    METRICS_RETENTION,
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
    periodic checkpoints are disabled during backlog. ``lag_rules`` holds the FLIP-328 lag
    rules; each is off unless its enter threshold is set.
    """

    interval_s: float
    interval_during_backlog_s: float | None
    min_pause_s: float
    max_batch_rows: int
    job_name: str
    run_id: str
    metrics_url: str
    pending_files_threshold: int
    #: How long the driver's lease lives unless renewed (renewed every third of it).
    lease_ttl_s: float
    lag_rules: LagRules
    #: The job's checkpoint and transition rows older than this are deleted (None: kept).
    metrics_retention_s: float | None = None

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

        def count(key: str, *, zero_allowed: bool = False) -> int | None:
            value = raw(key)
            if value is None:
                return None
            if zero_allowed and value == "0":
                return 0
            try:
                return parse_count(value)
            except ValueError as error:
                allowed = "expected 0 or a whole number above 0" if zero_allowed else str(error)
                problems.append(f"{key} = {value!r} is invalid: {allowed}")
                return None

        def thresholds(
            enter_key: str,
            enter: float | None,
            leave_key: str,
            leave: float | None,
            half: Callable[[float], float],
            show: Callable[[float], str],
        ) -> Thresholds | None:
            """A lag rule's thresholds; None when it is off or a value was refused."""
            if raw(enter_key) is None:
                if raw(leave_key) is not None:
                    problems.append(
                        f"{leave_key} = {raw(leave_key)!r} is invalid: it applies only with "
                        f"{enter_key} set, which turns the rule on"
                    )
                return None
            if enter is None or (leave is None and raw(leave_key) is not None):
                return None
            leave = half(enter) if leave is None else leave
            if leave > enter:
                problems.append(
                    f"{leave_key} = {raw(leave_key)!r} is invalid: it must be at most "
                    f"{enter_key} ({show(enter)}), since lag leaves backlog at or below it"
                )
                return None
            return Thresholds(enter=enter, leave=leave)

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
        offset_lag = thresholds(
            OFFSET_LAG_ENTER,
            count(OFFSET_LAG_ENTER),
            OFFSET_LAG_LEAVE,
            count(OFFSET_LAG_LEAVE, zero_allowed=True),
            half=lambda enter: enter // 2,
            show=str,
        )
        watermark_lag = thresholds(
            WATERMARK_LAG_ENTER,
            duration(WATERMARK_LAG_ENTER, 0.001, f"must be at least 1ms ({DURATION_FORMAT})"),
            WATERMARK_LAG_LEAVE,
            duration(WATERMARK_LAG_LEAVE, 0.0, f"expected {DURATION_FORMAT}"),
            half=lambda enter: enter / 2,
            show=format_duration,
        )
        min_dwell = duration(LAG_MIN_DWELL, 0.0, f"expected {DURATION_FORMAT}")
        metrics_url = raw(METRICS_URL) or ""
        if not _URL.match(metrics_url):
            problems.append(f"{METRICS_URL} = {metrics_url!r} is invalid: expected {_URL_RULE}")
        config = cls(
            interval_s=interval or 0.0,
            interval_during_backlog_s=during,
            min_pause_s=min_pause or 0.0,
            max_batch_rows=count(MAX_BATCH_ROWS) or 1,
            job_name=name(JOB_NAME, app_name),
            run_id=name(RUN_ID, uuid.uuid4().hex),
            metrics_url=metrics_url,
            pending_files_threshold=count(PENDING_FILES_THRESHOLD) or 1,
            lease_ttl_s=duration(LEASE_TTL, 3.0, f"must be at least 3s ({DURATION_FORMAT})")
            or 30.0,
            lag_rules=LagRules(
                offsets=offset_lag, watermark_s=watermark_lag, min_dwell_s=min_dwell or 0.0
            ),
            # Sensors read a job's latest checkpoints: keep hours of them, not seconds.
            metrics_retention_s=duration(
                METRICS_RETENTION, 3600.0, f"must be at least 1h ({DURATION_FORMAT})"
            ),
        )
        if problems:
            raise ConfigError(problems)
        return config

    def describe(self) -> str:
        """One line for the driver log."""
        during = self.interval_during_backlog_s
        during_text = "same as interval" if during is None else format_duration(during)
        line = (
            f"job={self.job_name} run={self.run_id} interval={format_duration(self.interval_s)} "
            f"interval-during-backlog={during_text} min-pause={format_duration(self.min_pause_s)} "
            f"max-batch-rows={self.max_batch_rows}"
        )
        lag = self.lag_rules
        if lag.offsets is not None:
            line += f" offset-lag=enter>{lag.offsets.enter},leave<={lag.offsets.leave}"
        if lag.watermark_s is not None:
            enter, leave = lag.watermark_s.enter, lag.watermark_s.leave
            line += f" watermark-lag=enter>{format_duration(enter)},leave<={format_duration(leave)}"
        if lag.offsets is not None or lag.watermark_s is not None:
            line += f" lag-min-dwell={format_duration(lag.min_dwell_s)}"
        if self.metrics_retention_s is not None:
            line += f" metrics-retention={format_duration(self.metrics_retention_s)}"
        return line


#: What a running job may change without a restart.
RECONFIGURABLE = (INTERVAL, INTERVAL_DURING_BACKLOG)


def reconfigured(
    config: BacklogConfig, conf: Mapping[str, str], changes: Mapping[str, str]
) -> BacklogConfig:
    """``config`` with ``changes`` applied over the Spark ``conf`` it came from, validated as
    at startup; raises ConfigError naming every problem, including keys that need a restart."""
    problems = [
        f"{key} = {value!r} cannot change while the job runs; only {', '.join(RECONFIGURABLE)} can"
        for key, value in sorted(changes.items())
        if key not in RECONFIGURABLE
    ]
    if problems:
        raise ConfigError(problems)
    updated = {**conf, **{key: str(value) for key, value in changes.items()}}
    updated[JOB_NAME], updated[RUN_ID] = config.job_name, config.run_id
    return BacklogConfig.from_spark_conf(updated)


def checkpoint_interval(config: BacklogConfig, job_is_backlog: bool) -> float | None:
    """The one place that picks the current checkpoint interval (None: no periodic checkpoint)."""
    if not job_is_backlog or config.interval_during_backlog_s is None:
        return config.interval_s
    if config.interval_during_backlog_s == 0:
        return None
    return config.interval_during_backlog_s
