"""Every ``spark.backlog.*`` setting, declared once, as Flink declares its ``ConfigOptions``.

Each option names its key, kind of value (with bounds), default and meaning. The parser in
``config.py``, its error messages and the configuration page ``docs/configuration.md`` all
read this table, so they cannot disagree. Regenerate the page after changing the table::

    python -m spark_jobs.backlog.options > docs/configuration.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_jobs.backlog.values import (
    format_duration,
    parse_count,
    parse_duration,
)

PREFIX = "spark.backlog."
#: The largest count any option takes: far above any real batch or lag, far below overflow.
MAX_COUNT = 10**12
#: Matches the ``job_name`` and ``run_id`` columns of the metrics schema.
MAX_NAME_LENGTH = 200
_HOUR_S = 3600.0
_DAY_S = 86400.0
_URL = re.compile(r"^(sqlite|postgresql)(\+[a-z0-9_]+)?://")
_URL_EXAMPLES = (
    "sqlite:///relative.db",
    "sqlite:////absolute/path.db",
    "postgresql://user@host:5432/database",
)
#: Said without ``//`` before it, so that redaction leaves the advice readable.
_URL_PASSWORD = "a password goes after the user, user:password@"


@dataclass(frozen=True)
class Duration:
    """A duration in seconds, written with a unit (``30s``), within bounds."""

    minimum_s: float
    maximum_s: float

    def parse(self, text: str) -> float:
        return parse_duration(text, minimum_s=self.minimum_s, maximum_s=self.maximum_s)

    def allowed(self) -> str:
        lowest, highest = format_duration(self.minimum_s), format_duration(self.maximum_s)
        return f"duration from `{lowest}` to `{highest}`"


@dataclass(frozen=True)
class Count:
    """A whole number (``_`` may group digits), from 1 (or 0) to ``maximum``."""

    zero_allowed: bool = False
    maximum: int = MAX_COUNT

    def parse(self, text: str) -> int:
        return parse_count(text, zero_allowed=self.zero_allowed, maximum=self.maximum)

    def allowed(self) -> str:
        return f"whole number from {0 if self.zero_allowed else 1} to {self.maximum:_}"


@dataclass(frozen=True)
class Name:
    """A name stored and shown verbatim: SQL is parameterized, so any printable text will do."""

    max_length: int = MAX_NAME_LENGTH

    def parse(self, text: str) -> str:
        rule = (
            f"expected 1-{self.max_length} characters, all printable "
            "(no control characters such as newline or tab)"
        )
        if not text.strip():
            raise ValueError(f"{rule}; it is blank")
        if len(text) > self.max_length:
            raise ValueError(f"{rule}; it has {len(text)}")
        unprintable = next((char for char in text if not char.isprintable()), None)
        if unprintable is not None:
            raise ValueError(f"{rule}; it contains {unprintable!r} (U+{ord(unprintable):04X})")
        return text

    def allowed(self) -> str:
        return f"1-{self.max_length} printable characters"


@dataclass(frozen=True)
class DatabaseUrl:
    """An SQLAlchemy URL of a database the metrics schema supports."""

    def parse(self, text: str) -> str:
        url = text.strip()
        if not _URL.match(url):
            *first, last = _URL_EXAMPLES
            raise ValueError(
                f"expected an SQLAlchemy URL: {', '.join(first)} or {last} ({_URL_PASSWORD})"
            )
        return url

    def allowed(self) -> str:
        examples = ", ".join(f"`{example}`" for example in _URL_EXAMPLES)
        return f"SQLAlchemy URL: {examples} ({_URL_PASSWORD})"


@dataclass(frozen=True)
class Option:
    """One setting. ``unset`` says what leaving it unset means when it has no default."""

    key: str
    kind: Duration | Count | Name | DatabaseUrl
    description: str
    default: str | None = None
    unset: str = "unset"
    #: Whether a running job takes a new value (``BacklogReconfigureOperator``).
    reconfigurable: bool = False


CHECKPOINTING_INTERVAL = Option(
    PREFIX + "checkpointing.interval",
    Duration(0.001, _DAY_S),
    "checkpoint interval in real time",
    default="30s",
    reconfigurable=True,
)
CHECKPOINTING_INTERVAL_DURING_BACKLOG = Option(
    PREFIX + "checkpointing.interval-during-backlog",
    Duration(0.0, _DAY_S),
    "target batch time in backlog; `0`: no time-based checkpoint, only the row cap; "
    "otherwise at least `interval`",
    unset="unset (= interval)",
    reconfigurable=True,
)
CHECKPOINTING_FRESHNESS_TARGET = Option(
    PREFIX + "checkpointing.freshness-target",
    Duration(0.001, _DAY_S),
    "once every source is live, the job chooses the live interval: the largest (from "
    "`min-pause` to `interval`) that keeps the p95 of live freshness (commit minus the oldest "
    "input row's event time) at or under this, re-chosen as batch times and arrival rates "
    "change; above `min-pause`",
    unset="unset (live interval = `interval`)",
    reconfigurable=True,
)
CHECKPOINTING_MIN_PAUSE = Option(
    PREFIX + "checkpointing.min-pause",
    Duration(0.0, _DAY_S),
    "minimum time from a commit to the next batch start",
    default="0",
)
CHECKPOINTING_MAX_BATCH_ROWS = Option(
    PREFIX + "checkpointing.max-batch-rows",
    Count(),
    "rows per batch at most, to bound memory",
    default="1000000",
)
JOB_NAME = Option(
    PREFIX + "job-name",
    Name(),
    "the job's name in metrics and the query name, stored and shown verbatim",
    unset="`spark.app.name`",
)
RUN_ID = Option(
    PREFIX + "run-id",
    Name(),
    "this run's id in metrics, stored and shown verbatim",
    unset="a new UUID",
)
METRICS_URL = Option(
    PREFIX + "metrics.url",
    DatabaseUrl(),
    "the metrics database; errors name it without its password",
    default="sqlite:///backlog_metrics.db",
)
FILE_SOURCE_PENDING_FILES_THRESHOLD = Option(
    PREFIX + "file-source.pending-files-threshold",
    Count(),
    "restart-based mode: in backlog while more files than this wait",
    default="10",
)
LAG_OFFSETS_ENTER_THRESHOLD = Option(
    PREFIX + "lag.offsets.enter-threshold",
    Count(),
    "offset-lag rule: a source is in backlog while more offsets than this (summed over "
    "partitions) are behind the latest",
    unset="unset (rule off)",
)
LAG_OFFSETS_LEAVE_THRESHOLD = Option(
    PREFIX + "lag.offsets.leave-threshold",
    Count(zero_allowed=True),
    "...and leaves backlog at or below this (at most enter)",
    unset="half of enter",
)
LAG_WATERMARK_ENTER_THRESHOLD = Option(
    PREFIX + "lag.watermark.enter-threshold",
    Duration(0.001, 30 * _DAY_S),
    "watermark-lag rule: in backlog while `now - watermark` is above this; judged only on "
    "batches that read rows (an idle query's watermark stands still); keep it above the "
    "watermark delay",
    unset="unset (rule off)",
)
LAG_WATERMARK_LEAVE_THRESHOLD = Option(
    PREFIX + "lag.watermark.leave-threshold",
    Duration(0.0, 30 * _DAY_S),
    "...and leaves backlog at or below this (at most enter)",
    unset="half of enter",
)
LAG_MIN_DWELL = Option(
    PREFIX + "lag.min-dwell",
    Duration(0.0, _DAY_S),
    "a lag rule keeps its state at least this long before it may flip again",
    default="0",
)
LEASE_TTL = Option(
    PREFIX + "lease.ttl",
    Duration(3.0, _DAY_S),
    "how long the driver's lease on its checkpoint lives unless renewed (every third of it); "
    "a new driver waits this long after a crash",
    default="30s",
)
LEASE_WAIT_FOR_HANDOVER = Option(
    PREFIX + "lease.wait-for-handover",
    Duration(1.0, _DAY_S),
    "stand by, warmed up, up to this long for the live driver to hand the lease over (a "
    "make-before-break relaunch), then take it at once; unset: take it at startup",
    unset="unset (no standby)",
)
METRICS_RETENTION = Option(
    PREFIX + "metrics.retention",
    # Sensors read a job's latest checkpoints: keep hours of them, not seconds.
    Duration(_HOUR_S, 366 * _DAY_S),
    "the driver deletes its job's checkpoint and transition rows older than this, keeping "
    "the latest of each",
    unset="unset (keep all)",
)

OPTIONS = (
    CHECKPOINTING_INTERVAL,
    CHECKPOINTING_INTERVAL_DURING_BACKLOG,
    CHECKPOINTING_FRESHNESS_TARGET,
    CHECKPOINTING_MIN_PAUSE,
    CHECKPOINTING_MAX_BATCH_ROWS,
    JOB_NAME,
    RUN_ID,
    METRICS_URL,
    FILE_SOURCE_PENDING_FILES_THRESHOLD,
    LAG_OFFSETS_ENTER_THRESHOLD,
    LAG_OFFSETS_LEAVE_THRESHOLD,
    LAG_WATERMARK_ENTER_THRESHOLD,
    LAG_WATERMARK_LEAVE_THRESHOLD,
    LAG_MIN_DWELL,
    LEASE_TTL,
    LEASE_WAIT_FOR_HANDOVER,
    METRICS_RETENTION,
)
KEYS = tuple(option.key for option in OPTIONS)


def render_page() -> str:
    """``docs/configuration.md``: the table as users read it."""
    rows = [
        f"| `{option.key}` | {_default(option)} | {option.kind.allowed()} "
        f"| {'yes' if option.reconfigurable else 'no'} | {option.description} |"
        for option in OPTIONS
    ]
    return "\n".join(
        [
            "# Configuration",
            "",
            "<!-- Generated from spark_jobs/backlog/options.py: do not edit by hand. After",
            "changing the options, run: python -m spark_jobs.backlog.options > "
            "docs/configuration.md -->",
            "",
            "[Documentation](index.md)",
            "",
            "Spark conf, so `spark-submit --conf` and Airflow's `SparkSubmitOperator(conf=...)`",
            "set it. Every invalid value fails before the query starts, with a message naming",
            "the key, the value (its secrets hidden) and what is allowed; all problems are",
            "reported at once. Unknown `spark.backlog.*` keys are refused too, in any spelling",
            "of upper and lower case, with the closest known key suggested.",
            "",
            "Durations are written with a unit: `500ms`, `30s`, `30min`, `1h`, `1d`. A bare",
            "number is refused unless it is `0`, since it could mean milliseconds (Flink) or",
            "seconds (Spark triggers). Counts are whole numbers whose digits `_` may group",
            "(`1_000_000`).",
            "",
            '"Live" keys can change while the job runs (`BacklogReconfigureOperator`); the',
            "others need a restart.",
            "",
            "| key | default | allowed | live | meaning |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def _default(option: Option) -> str:
    """The default column: the default value, or what leaving the key unset means."""
    return option.unset if option.default is None else f"`{option.default}`"


if __name__ == "__main__":
    print(render_page(), end="")
