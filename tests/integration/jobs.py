"""Running the events pipeline as users do (console command, spark-submit) and checking its
output against a batch recomputation over everything that was written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import pandas as pd
import sqlalchemy as sa

import spark_jobs.jobs.events_pipeline as events_pipeline
from spark_jobs.coordinator.runtime import STOPPED_AT_TIMEOUT
from spark_jobs.jobs.startup import job_environment, spark_submit_command
from spark_jobs.metrics.schema import as_utc, backlog_checkpoints, backlog_transitions, make_engine
from tools.data.events import (
    KafkaProducerThread,
    LiveProducer,
    history_range,
    write_history,
)
from tools.data.verify import (
    Comparison,
    Inputs,
    all_input,
    committed_output,
    compare,
    unrecorded_batches,
)

T = TypeVar("T")

KAFKA_TOPIC = "events"
KAFKA_PARTITIONS = 4


@dataclass(frozen=True)
class JobDirs:
    """Where one job keeps everything; its live phase is a topic when a broker is given,
    its metrics go to a SQLite file in ``root`` unless a database URL is given."""

    root: Path
    bootstrap_servers: str | None = None
    metrics_database: str | None = None

    @property
    def history(self) -> Path:
        return self.root / "history"

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    @property
    def output(self) -> Path:
        return self.root / "output"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def metrics_url(self) -> str:
        return self.metrics_database or f"sqlite:///{self.metrics_dir}/metrics.db"

    @property
    def inputs(self) -> Inputs:
        return Inputs(self.history, self.landing, self.bootstrap_servers, KAFKA_TOPIC)

    def args(self) -> list[str]:
        live = ["--landing", str(self.landing)]
        if self.bootstrap_servers:
            live = ["--kafka-bootstrap-servers", self.bootstrap_servers]
            live += ["--kafka-topic", KAFKA_TOPIC]
        return [
            "--history",
            str(self.history),
            *live,
            "--output",
            str(self.output),
            "--checkpoint",
            str(self.checkpoint),
        ]


def backlog_then_live(
    dirs: JobDirs, events: int, files: int, events_per_s: int, file_every_s: float
) -> LiveProducer:
    """Write a historical backlog and start producing live landing files right away."""
    start, end = history_range(now())
    first_live_id = write_history(dirs.history, events, files, start, end)
    producer = LiveProducer(dirs.landing, first_live_id, events_per_s, file_every_s)
    producer.start()
    return producer


def backlog_then_kafka(dirs: JobDirs, events: int, files: int, events_per_s: int):
    """Write a historical backlog and start sending live events to the topic right away."""
    assert dirs.bootstrap_servers
    start, end = history_range(now())
    first_live_id = write_history(dirs.history, events, files, start, end)
    producer = KafkaProducerThread(
        dirs.bootstrap_servers, KAFKA_TOPIC, KAFKA_PARTITIONS, first_live_id, events_per_s
    )
    producer.start()
    return producer


def base_conf(dirs: JobDirs, job: str, **conf: str) -> dict[str, str]:
    return {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.backlog.job-name": job,
        "spark.backlog.metrics.url": dirs.metrics_url,
        # A restart after a SIGKILL waits for the dead driver's lease to expire.
        "spark.backlog.lease.ttl": "5s",
        **{f"spark.backlog.checkpointing.{k.replace('_', '-')}": v for k, v in conf.items()},
    }


def console_job(dirs: JobDirs, conf: dict[str, str], *extra: str) -> subprocess.Popen:
    """``backlog-events-job`` in its own process group, so a kill takes its JVM too."""
    conf_args = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    command = [sys.executable, "-m", "spark_jobs.jobs.events_pipeline", *dirs.args(), *extra]
    return _popen([*command, *conf_args], dirs, "console")


def submitted_job(dirs: JobDirs, conf: dict[str, str], *extra: str) -> subprocess.Popen:
    """``spark-submit <entry file>``: how Airflow's SparkSubmitOperator launches the job."""
    command = spark_submit_command(events_pipeline.__file__, conf, *dirs.args(), *extra)
    return _popen(command, dirs, "submit")


def _popen(command: Sequence[str], dirs: JobDirs, label: str) -> subprocess.Popen:
    dirs.root.mkdir(parents=True, exist_ok=True)
    path = dirs.root / f"{label}-{time.time_ns()}.log"
    with path.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=job_environment(),
            start_new_session=True,
        )
    process.log_path = path  # type: ignore[attr-defined]
    return process


def log_of(process: subprocess.Popen) -> str:
    return process.log_path.read_text()  # type: ignore[attr-defined]


def stay_alive(process: subprocess.Popen, seconds: float) -> None:
    """Let the job run on for a while, failing if it dies meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"job exited ({process.returncode}):\n{log_of(process)[-4000:]}")
        time.sleep(0.2)


def kill_hard(process: subprocess.Popen) -> None:
    """SIGKILL the job and its JVM, as a lost machine would."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def wait_for(
    condition: Callable[[], T],
    what: str,
    timeout_s: float,
    process: subprocess.Popen | None = None,
    poll_s: float = 0.5,
) -> T:
    """The condition's first true value; fails if ``process`` ends or time runs out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"job exited ({process.returncode}) before {what}:\n{log_of(process)[-4000:]}"
            )
        time.sleep(poll_s)
    tail = log_of(process)[-4000:] if process is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")


def finish(process: subprocess.Popen, timeout_s: float) -> str:
    """Wait for a job that stops on its own; returns its log, failing on a non-zero exit."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_hard(process)
        raise AssertionError(
            f"job did not stop within {timeout_s:.0f} s:\n{log_of(process)[-4000:]}"
        ) from None
    text = log_of(process)
    assert process.returncode == 0, f"job failed ({process.returncode}):\n{text[-6000:]}"
    # Stopped by its --timeout, it ended short of what the test then compares.
    assert STOPPED_AT_TIMEOUT not in text, f"job ran into its --timeout:\n{text[-4000:]}"
    return text


# --- the metrics tables ------------------------------------------------------------------


def checkpoints(dirs: JobDirs) -> list[dict]:
    return _rows(dirs, backlog_checkpoints, backlog_checkpoints.c.batch_id)


def transitions(dirs: JobDirs) -> list[dict]:
    return _rows(dirs, backlog_transitions, backlog_transitions.c.at)


def _rows(dirs: JobDirs, table: sa.Table, order: sa.Column) -> list[dict]:
    if dirs.metrics_database is None and not (dirs.metrics_dir / "metrics.db").exists():
        return []
    engine = make_engine(dirs.metrics_url)
    try:
        with engine.connect() as connection:
            if not sa.inspect(connection).has_table(table.name):
                return []
            result = connection.execute(sa.select(table).order_by(order))
            rows = [dict(r._mapping) for r in result]
    except sa.exc.OperationalError:
        return []  # the database is away for a moment
    finally:
        engine.dispose()
    for row in rows:
        for key in ("committed_at", "watermark", "at"):
            if key in row:
                row[key] = as_utc(row[key])
    return rows


def watermarks(dirs: JobDirs) -> list[datetime]:
    """The watermark each committed batch recorded, where it recorded one."""
    return [r["watermark"] for r in checkpoints(dirs) if r["watermark"] is not None]


def batch_starts(rows: list[dict]) -> list[float]:
    return [r["committed_at"].timestamp() - r["batch_duration_ms"] / 1000 for r in rows]


# --- exactly-once ------------------------------------------------------------------------


def assert_exactly_once(
    dirs: JobDirs,
    window_s: float,
    *,
    compared_at_least: float = 0.5,
    watermark_reaches_the_end: bool = True,
) -> Comparison:
    """The sink holds each closed window once, with exactly the batch recomputation's values,
    and the comparison covers most of the input: the final watermark reached the end of the
    backlog and into the live events (a job stuck early would compare nearly nothing).
    Every committed batch has its metrics row."""
    marks = watermarks(dirs)
    assert marks, "no checkpoint recorded a watermark"
    events = all_input(dirs.inputs)
    result = compare(committed_output(dirs.output), events, window_s, max(marks))
    assert result.exactly_once, result
    assert result.compared >= compared_at_least * result.produced, result
    if watermark_reaches_the_end:
        last_event = pd.Timestamp(events["event_time"].max()).to_pydatetime()
        assert result.watermark >= last_event - timedelta(minutes=1), (result, last_event)
    assert_every_commit_recorded(dirs)
    return result


def assert_every_commit_recorded(dirs: JobDirs) -> None:
    """Every committed batch has its metrics row (recorded by its run, or recovered from
    the commit log by the next one), and no batch has two."""
    recorded = [r["batch_id"] for r in checkpoints(dirs)]
    assert len(recorded) == len(set(recorded)), "a batch was recorded twice"
    missing = unrecorded_batches(dirs.checkpoint / "spark", recorded)
    assert not missing, f"committed without a metrics row: batches {missing}"


def assert_stopped_after_a_commit(dirs: JobDirs) -> None:
    """A graceful stop: the last batch Spark planned (``offsets/N``) was committed too."""
    spark = dirs.checkpoint / "spark"
    planned = max(int(p.name) for p in (spark / "offsets").iterdir() if p.name.isdigit())
    assert (spark / "commits" / str(planned)).exists(), f"batch {planned} was not committed"


def now() -> datetime:
    return datetime.now(UTC)
