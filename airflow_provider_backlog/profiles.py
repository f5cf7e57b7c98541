"""What a phased job runs with in one phase: a DAG author's ``PhaseProfile`` per phase (its
checkpoint intervals and resources), checked when the DAG is parsed by the rules the job
applies at startup, so a wrong value fails the DAG rather than a launch hours later."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.backlog.config import (
    FRESHNESS_TARGET,
    INTERVAL,
    INTERVAL_DURING_BACKLOG,
    JOB_NAME,
    METRICS_URL,
    RUN_ID,
    BacklogConfig,
    ConfigError,
)

#: JVM memory sizes as spark-submit takes them: 512m, 4g, 1024k.
_MEMORY = re.compile(r"^[1-9]\d*[kmgtp]?b?$", re.IGNORECASE)
#: The profile's fields that are Spark conf keys.
_FIELD_KEYS = {
    "interval": INTERVAL,
    "interval_during_backlog": INTERVAL_DURING_BACKLOG,
    "freshness_target": FRESHNESS_TARGET,
}
#: Keys the launch sets itself, per job and run.
_LAUNCH_KEYS = (JOB_NAME, RUN_ID, METRICS_URL)


@dataclass(frozen=True)
class PhaseProfile:
    """How a job runs in one phase: its checkpoint intervals (Spark durations such as
    ``2s``, ``1min``; ``interval_during_backlog="0"`` checkpoints only as batches end) and
    the resources spark-submit asks for, plus any other Spark conf.

    Validated when the DAG is parsed, by the rules the job applies at startup.

    :param interval: The checkpoint interval (``spark.backlog.checkpointing.interval``): a
        duration with a unit (``500ms``, ``30s``, ``1min``), from ``1ms`` to ``1d``.
    :param interval_during_backlog: The checkpoint interval while the job processes a backlog
        (``spark.backlog.checkpointing.interval-during-backlog``): ``"0"``, or a duration from
        ``interval`` to ``1d``; None (the default) means the same as ``interval``.
    :param freshness_target: Once every source is live, let the job choose the live interval
        (``spark.backlog.checkpointing.freshness-target``): the largest, up to ``interval``,
        that keeps the p95 of live freshness at or under this duration; None (the default)
        checkpoints every ``interval`` live.
    :param num_executors: spark-submit's ``--num-executors``: a whole number of at least 1;
        None (the default) leaves it to Spark, as do the other resources.
    :param executor_cores: spark-submit's ``--executor-cores``, at least 1.
    :param total_executor_cores: spark-submit's ``--total-executor-cores``, at least 1.
    :param executor_memory: spark-submit's ``--executor-memory``: a JVM memory size such as
        ``512m`` or ``4g``.
    :param driver_memory: spark-submit's ``--driver-memory``, a JVM memory size too.
    :param conf: Any other Spark conf; empty by default. Not the interval keys
        (the fields above) nor ``spark.backlog.job-name``, ``run-id`` or ``metrics.url``,
        which the launch sets; ``spark.backlog.*`` keys are checked as the job checks them.
    """

    interval: str
    interval_during_backlog: str | None = None
    freshness_target: str | None = None
    num_executors: int | None = None
    executor_cores: int | None = None
    total_executor_cores: int | None = None
    executor_memory: str | None = None
    driver_memory: str | None = None
    conf: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        for name in ("num_executors", "executor_cores", "total_executor_cores"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                problems.append(f"{name} = {value!r}: expected a whole number of at least 1")
        for name in ("executor_memory", "driver_memory"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and _MEMORY.match(value)):
                problems.append(
                    f"{name} = {value!r}: expected a JVM memory size such as 512m or 4g"
                )
        for key in _FIELD_KEYS.values():
            if key in self.conf:
                problems.append(f"conf {key!r}: set it as the profile's own field instead")
        for key in _LAUNCH_KEYS:
            if key in self.conf:
                problems.append(f"conf {key!r}: the launch sets it, per job and run")
        try:  # the job's own rules, with stand-ins for what the launch adds
            BacklogConfig.from_spark_conf(self.spark_conf("profile", "check", "sqlite://"))
        except ConfigError as error:
            problems += error.problems
        if problems:
            raise ValueError("invalid phase profile:\n  " + "\n  ".join(problems))

    def spark_conf(self, job_name: str, run_id: str, metrics_url: str) -> dict[str, str]:
        """The Spark conf of one run of ``job_name`` in this profile."""
        conf = {str(key): str(value) for key, value in self.conf.items()}
        conf.update(
            {
                key: value
                for name, key in _FIELD_KEYS.items()
                if (value := getattr(self, name)) is not None
            }
        )
        conf.update({JOB_NAME: job_name, RUN_ID: run_id, METRICS_URL: metrics_url})
        return conf

    def resources(self) -> dict[str, Any]:
        """The spark-submit resource options, as ``SparkSubmitHook`` takes them."""
        names = (
            "num_executors",
            "executor_cores",
            "total_executor_cores",
            "executor_memory",
            "driver_memory",
        )
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def describe(self) -> str:
        parts = [
            f"{key.rsplit('.', 1)[1]}={value}"
            for name, key in _FIELD_KEYS.items()
            if (value := getattr(self, name)) is not None
        ]
        parts += [f"{name.replace('_', '-')}={value}" for name, value in self.resources().items()]
        return " ".join(parts)
