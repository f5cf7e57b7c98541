"""Configuration read from Spark conf, validated before any query starts.

``spark-submit --conf`` and Airflow's ``SparkSubmitOperator(conf=...)`` both land in the
Spark conf, so that is the one place users set these keys.
"""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_jobs.backlog import options
from spark_jobs.backlog.lag import LagRules, Thresholds
from spark_jobs.backlog.options import KEYS, OPTIONS, PREFIX, Option
from spark_jobs.backlog.secrets import redact, redact_text
from spark_jobs.backlog.values import format_duration

#: Keys other modules set or check by name.
INTERVAL = options.CHECKPOINTING_INTERVAL.key
INTERVAL_DURING_BACKLOG = options.CHECKPOINTING_INTERVAL_DURING_BACKLOG.key
FRESHNESS_TARGET = options.CHECKPOINTING_FRESHNESS_TARGET.key
JOB_NAME = options.JOB_NAME.key
RUN_ID = options.RUN_ID.key
METRICS_URL = options.METRICS_URL.key
#: What a running job may change without a restart.
RECONFIGURABLE = tuple(option.key for option in OPTIONS if option.reconfigurable)


class ConfigError(ValueError):
    """One or more invalid settings; the message names each key, its value and what is allowed.

    Every problem is redacted here once more, so no caller can leak a URL's password."""

    def __init__(self, problems: list[str]):
        self.problems = [redact_text(problem) for problem in problems]
        super().__init__("invalid backlog configuration:\n  " + "\n  ".join(self.problems))


@dataclass(frozen=True)
class BacklogConfig:
    """Validated settings. Durations are in seconds.

    ``interval_during_backlog_s`` is None when unset (same as ``interval_s``) and 0 when
    periodic checkpoints are disabled during backlog. With ``freshness_target_s`` set, the
    live interval is chosen by the decider, at most ``interval_s``. ``lag_rules`` holds the
    FLIP-328 lag rules; each is off unless its enter threshold is set.
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
    #: How long a standby waits for the live driver to hand its lease over (None: this
    #: run takes the lease at startup, no standby).
    lease_handover_wait_s: float | None = None
    #: The p95 of live freshness the chosen live interval keeps (None: ``interval_s`` live).
    freshness_target_s: float | None = None

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], app_name: str | None = None) -> BacklogConfig:
        """Parse and validate every ``spark.backlog.*`` key, reporting all problems at once."""
        conf = {key: str(value) for key, value in conf.items() if value is not None}
        problems = [
            _unknown_key_problem(key, conf[key]) for key in sorted(conf) if _is_unknown(key)
        ]
        values: dict[str, Any] = {}
        for option in OPTIONS:
            label, text = _setting(option, conf, app_name)
            values[option.key], problem = _parse(option, label, text)
            problems += [problem] if problem else []
        if JOB_NAME not in conf and app_name is None:
            problems.append(
                f"{JOB_NAME} is not set and there is no spark.app.name: set "
                f"{options.JOB_NAME.kind.allowed()}"
            )
        problems += _backlog_interval_problems(conf, values)
        problems += _freshness_target_problems(conf, values)
        offsets, offset_problems = _thresholds(
            conf,
            values,
            options.LAG_OFFSETS_ENTER_THRESHOLD,
            options.LAG_OFFSETS_LEAVE_THRESHOLD,
            half=lambda enter: enter // 2,
            show=str,
        )
        watermark, watermark_problems = _thresholds(
            conf,
            values,
            options.LAG_WATERMARK_ENTER_THRESHOLD,
            options.LAG_WATERMARK_LEAVE_THRESHOLD,
            half=lambda enter: enter / 2,
            show=format_duration,
        )
        problems += offset_problems + watermark_problems
        if problems:
            raise ConfigError(problems)
        return cls(
            interval_s=values[INTERVAL],
            interval_during_backlog_s=values[INTERVAL_DURING_BACKLOG],
            min_pause_s=values[options.CHECKPOINTING_MIN_PAUSE.key],
            max_batch_rows=values[options.CHECKPOINTING_MAX_BATCH_ROWS.key],
            job_name=values[JOB_NAME],
            run_id=values[RUN_ID],
            metrics_url=values[METRICS_URL],
            pending_files_threshold=values[options.FILE_SOURCE_PENDING_FILES_THRESHOLD.key],
            lease_ttl_s=values[options.LEASE_TTL.key],
            lag_rules=LagRules(
                offsets=offsets,
                watermark_s=watermark,
                min_dwell_s=values[options.LAG_MIN_DWELL.key],
            ),
            metrics_retention_s=values[options.METRICS_RETENTION.key],
            lease_handover_wait_s=values[options.LEASE_WAIT_FOR_HANDOVER.key],
            freshness_target_s=values[FRESHNESS_TARGET],
        )

    def describe(self) -> str:
        """One line for the driver log."""
        during = self.interval_during_backlog_s
        during_text = "same as interval" if during is None else format_duration(during)
        line = (
            f"job={self.job_name} run={self.run_id} interval={format_duration(self.interval_s)} "
            f"interval-during-backlog={during_text} min-pause={format_duration(self.min_pause_s)} "
            f"max-batch-rows={self.max_batch_rows}"
        )
        if self.freshness_target_s is not None:
            line += f" freshness-target={format_duration(self.freshness_target_s)}"
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
        if self.lease_handover_wait_s is not None:
            line += f" wait-for-handover={format_duration(self.lease_handover_wait_s)}"
        return line


def reconfigured(
    config: BacklogConfig, conf: Mapping[str, str], changes: Mapping[str, str]
) -> BacklogConfig:
    """``config`` with ``changes`` applied over the Spark ``conf`` it came from, validated as
    at startup; raises ConfigError naming every problem, including keys that need a restart."""
    problems = [
        _unknown_key_problem(key, value)
        if _is_unknown(key)
        else f"{key} = {_shown(key, value)} cannot change while the job runs; "
        f"only {', '.join(RECONFIGURABLE)} can"
        for key, value in sorted(changes.items())
        if key not in RECONFIGURABLE
    ]
    if problems:
        raise ConfigError(problems)
    updated = {**conf, **{key: str(value) for key, value in changes.items()}}
    updated[JOB_NAME], updated[RUN_ID] = config.job_name, config.run_id
    return BacklogConfig.from_spark_conf(updated)


def checkpoint_interval(
    config: BacklogConfig, job_is_backlog: bool, chosen_live_s: float | None = None
) -> float | None:
    """The one place that picks the current checkpoint interval (None: no periodic checkpoint).

    ``chosen_live_s`` is the live interval chosen for the freshness target, which replaces
    ``interval`` in real time when a target is set."""
    if not job_is_backlog:
        if config.freshness_target_s is not None and chosen_live_s is not None:
            return chosen_live_s
        return config.interval_s
    if config.interval_during_backlog_s is None:
        return config.interval_s
    if config.interval_during_backlog_s == 0:
        return None
    return config.interval_during_backlog_s


def _is_unknown(key: str) -> bool:
    """Whether ``key`` is meant for us (in any case: Spark's keys are case-sensitive, so
    ``spark.Backlog.*`` would otherwise be ignored silently) but is not a known setting."""
    return key.lower().startswith(PREFIX) and key not in KEYS


def _unknown_key_problem(key: str, value: object) -> str:
    """The problem with an unknown key: the closest known key, then all of them."""
    tails = [known[len(PREFIX) :] for known in KEYS]
    closest = difflib.get_close_matches(key.lower()[len(PREFIX) :], tails, n=1)
    hint = f"did you mean {PREFIX}{closest[0]}? " if closest else ""
    if key.lower() in KEYS:
        hint = f"keys are case-sensitive: {hint}"
    return f"{key} = {_shown(key, value)} is not a known setting; {hint}known: {', '.join(KEYS)}"


def _shown(key: str, value: object) -> str:
    """``value`` as a message quotes it: its URL passwords hidden, and all of it when ``key``
    looks secret (``...password``, ``...token``)."""
    return repr(redact({key: value})[key])


def _setting(
    option: Option, conf: Mapping[str, str], app_name: str | None
) -> tuple[str, str | None]:
    """Where ``option``'s value comes from, for messages, and the value (None: unset): the
    conf, else Spark's app name for the job name, a new UUID for the run id, or the default."""
    if option.key in conf:
        return option.key, conf[option.key]
    if option is options.JOB_NAME and app_name is not None:
        return f"{option.key} (unset, so spark.app.name)", app_name
    if option is options.RUN_ID:
        return option.key, uuid.uuid4().hex
    return option.key, option.default


def _parse(option: Option, label: str, value: str | None) -> tuple[Any, str | None]:
    """The parsed value (None when unset or refused) and the problem with it, if any."""
    if value is None:
        return None, None
    try:
        return option.kind.parse(value), None
    except ValueError as error:
        return None, f"{label} = {_shown(option.key, value)} is invalid: {error}"


def _backlog_interval_problems(conf: Mapping[str, str], values: Mapping[str, Any]) -> list[str]:
    """Flink's rule: checkpoints during backlog may only be rarer (or off, with 0)."""
    interval, during = values[INTERVAL], values[INTERVAL_DURING_BACKLOG]
    if interval is None or during is None or not 0 < during < interval:
        return []
    value = _shown(INTERVAL_DURING_BACKLOG, conf[INTERVAL_DURING_BACKLOG])
    return [
        f"{INTERVAL_DURING_BACKLOG} = {value} is invalid: it must be 0 (no periodic checkpoint "
        f"during backlog) or at least {INTERVAL} ({format_duration(interval)}), because "
        "checkpoints during backlog may only be rarer"
    ]


def _freshness_target_problems(conf: Mapping[str, str], values: Mapping[str, Any]) -> list[str]:
    """A target no longer than ``min-pause`` could never be met: every batch waits that long."""
    target, pause = values[FRESHNESS_TARGET], values[options.CHECKPOINTING_MIN_PAUSE.key]
    if target is None or pause is None or target > pause:
        return []
    value = _shown(FRESHNESS_TARGET, conf[FRESHNESS_TARGET])
    return [
        f"{FRESHNESS_TARGET} = {value} is invalid: it must be longer than "
        f"{options.CHECKPOINTING_MIN_PAUSE.key} ({format_duration(pause)}), the least time "
        "between a commit and the next batch"
    ]


def _thresholds(
    conf: Mapping[str, str],
    values: Mapping[str, Any],
    enter: Option,
    leave: Option,
    half: Callable[[float], float],
    show: Callable[[float], str],
) -> tuple[Thresholds | None, list[str]]:
    """A lag rule's thresholds (None when it is off or a value was refused) and the problems
    between them."""
    if enter.key not in conf:
        if leave.key not in conf:
            return None, []
        return None, [
            f"{leave.key} = {_shown(leave.key, conf[leave.key])} is invalid: it applies only "
            f"with {enter.key} set, which turns the rule on"
        ]
    enter_value, leave_value = values[enter.key], values[leave.key]
    if enter_value is None or (leave_value is None and leave.key in conf):
        return None, []
    leave_value = half(enter_value) if leave_value is None else leave_value
    if leave_value > enter_value:
        return None, [
            f"{leave.key} = {_shown(leave.key, conf[leave.key])} is invalid: it must be at most "
            f"{enter.key} ({show(enter_value)}), since lag leaves backlog at or below it"
        ]
    return Thresholds(enter=enter_value, leave=leave_value), []
