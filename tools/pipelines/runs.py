"""Running the events pipeline with spark-submit against synthetic data, with live progress."""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import spark_jobs.jobs.events_pipeline as events_pipeline
from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs import jvm_archive
from spark_jobs.jobs.startup import job_environment, require_java, spark_submit_command
from spark_jobs.jobs.worker_daemon import DAEMON_CONF
from tools.data.events import KafkaProducerThread, LiveProducer, history_range, write_history
from tools.pipelines.report import Checkpoint, caught_up, load


def say(message: str) -> None:
    print(message, flush=True)


def add_workspace_arguments(parser: argparse.ArgumentParser, workdir: str, events: int) -> None:
    parser.add_argument("--workdir", type=Path, default=Path(workdir))
    parser.add_argument(
        "--events", type=count_argument, default=events, help="events in the backlog"
    )
    parser.add_argument(
        "--files", type=count_argument, default=100, help="parquet files of the backlog"
    )
    parser.add_argument("--live-events-per-s", type=count_argument, default=2000)


@dataclass(frozen=True)
class Workspace:
    """A fresh backlog and an empty metrics database under one directory."""

    root: Path
    first_live_id: int
    metrics_url: str


def prepare_workspace(args: argparse.Namespace) -> Workspace:
    """Check Java, write the backlog, start a new metrics database."""
    require_java()
    root = args.workdir.resolve()
    say(f"writing a backlog of {args.events:,} events in {args.files} parquet files")
    first_live_id = prepare_history(root / "history", args.events, args.files)
    return Workspace(root, first_live_id, fresh_metrics(root))


def fresh_metrics(root: Path) -> str:
    """The URL of an empty SQLite metrics database under ``root``."""
    metrics = root / "metrics.db"
    root.mkdir(parents=True, exist_ok=True)
    metrics.unlink(missing_ok=True)
    return f"sqlite:///{metrics}"


def prepare_history(directory: Path, events: int, files: int) -> int:
    """Write the backlog once; returns the first event id free for live events."""
    shutil.rmtree(directory, ignore_errors=True)
    start, end = history_range(datetime.now(UTC))

    def progress(done: int, total: int) -> None:
        if done % max(1, total // 10) == 0 or done == total:
            say(f"  backlog: {done}/{total} files ({events * done // total:,} events)")

    return write_history(directory, events, files, start, end, progress)


def for_seconds_after(
    condition: Callable[[list[Checkpoint]], object], seconds: float
) -> Callable[[list[Checkpoint]], bool]:
    """A ``keep_going`` for ``Run.execute``: ``seconds`` more once ``condition`` first holds."""
    since: list[float] = []

    def keep_going(checkpoints: list[Checkpoint]) -> bool:
        if not since and condition(checkpoints):
            since.append(time.monotonic())
        return not since or time.monotonic() - since[0] < seconds

    return keep_going


@dataclass(frozen=True)
class KafkaTopic:
    """A topic of the embedded broker, as a run's live phase."""

    bootstrap_servers: str
    name: str
    partitions: int


class BurstAfterLive:
    """A ``keep_going`` that induces a re-entry into backlog: once the run has followed live
    data for ``live_s``, ``burst`` events arrive at once; once it is live again after that
    (or ``give_up_s`` passed), ``live_s`` more, then stop."""

    def __init__(self, run: Run, burst: int, live_s: float, give_up_s: float = 180.0):
        self._run = run
        self._burst = burst
        self._live_s = live_s
        self._give_up_s = give_up_s
        self._live_since: float | None = None
        self.burst_at: float | None = None
        self._recovered_at: float | None = None

    def __call__(self, checkpoints: list[Checkpoint]) -> bool:
        now = time.time()
        if self.burst_at is None:
            if self._live_since is None and caught_up(checkpoints):
                self._live_since = now
            if self._live_since is not None and now - self._live_since >= self._live_s:
                producer = self._run.producer
                assert isinstance(producer, KafkaProducerThread)
                say(f"[{self._run.name}] a burst of {self._burst:,} events arrives at once")
                self.burst_at = producer.burst(self._burst)
            return True
        if self._recovered_at is None:
            after = [c for c in checkpoints if c.started_at >= self.burst_at]
            reentered = any(c.is_backlog for c in after)
            if (reentered and not after[-1].is_backlog) or now - self.burst_at > self._give_up_s:
                self._recovered_at = now
            return True
        return now - self._recovered_at < self._live_s


class Feed(Protocol):
    """What feeds a run live data: a producer of events, or a writer of table changes."""

    def is_alive(self) -> bool: ...

    def stop(self) -> None: ...


def follow(
    name: str,
    command: list[str],
    log_path: Path,
    checkpoints: Callable[[], list[Checkpoint]],
    feed: Feed,
    keep_going: Callable[[list[Checkpoint]], bool],
) -> None:
    """Run a job until it stops on its own, printing each checkpoint as it commits; stop the
    feed once ``keep_going`` says enough (or on the way out: Ctrl-C ends the job too)."""
    with log_path.open("w") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=job_environment())
    shown = 0
    try:
        while job.poll() is None:
            found = checkpoints()
            for checkpoint in found[shown:]:
                say(f"[{name}] {checkpoint_line(checkpoint)}")
            shown = len(found)
            if feed.is_alive() and not keep_going(found):
                say(f"[{name}] enough seen: stopping the live feed")
                feed.stop()
            time.sleep(0.5)
    finally:
        if feed.is_alive():
            feed.stop()
        if job.poll() is None:
            job.terminate()
            job.wait(60)
    if job.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"the job failed ({job.returncode}); end of {log_path}:\n{tail}")


@functools.cache
def driver_java_options() -> str:
    """The driver maps its class-data archive, made once per installation, as a tuned
    deployment does (spark_jobs.jobs.jvm_archive, docs/tuning.md)."""
    if not jvm_archive.archive_path().exists():
        say("making the driver's class-data archive (once per installation, about 40 s)")
    return jvm_archive.java_options(jvm_archive.ensure_archive())


def local_spark_conf(job: str, metrics_url: str, conf: dict[str, str]) -> dict[str, str]:
    """Spark conf of a tool's run: ``local[2]``, no UI, the driver's class-data archive, our
    Python worker daemon, metrics into ``metrics_url``."""
    return {
        "spark.master": "local[2]",
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": driver_java_options(),
        DAEMON_CONF[0]: DAEMON_CONF[1],
        "spark.backlog.job-name": job,
        "spark.backlog.metrics.url": metrics_url,
        **conf,
    }


def checkpoints_so_far(metrics_url: str, job: str) -> list[Checkpoint]:
    try:
        return load(metrics_url, job)[0]
    except Exception:  # the job has not created the tables yet
        return []


def checkpoint_line(checkpoint: Checkpoint) -> str:
    phase = "backlog" if checkpoint.is_backlog else "live   "
    behind = "-" if checkpoint.behind is None else checkpoint.behind
    return (
        f"checkpoint {checkpoint.batch_id:4d}  {phase} {checkpoint.rows:>10,} rows  "
        f"{checkpoint.duration_s:6.2f} s  left behind: {behind}"
    )


@dataclass
class Run:
    """One launch of the pipeline: its directories, its Spark conf, and what it printed.

    Its live phase is ``kafka`` when given, else a landing directory under ``root``.
    """

    name: str
    root: Path
    history: Path
    metrics_url: str
    conf: dict[str, str]
    args: list[str] = field(default_factory=list)
    kafka: KafkaTopic | None = None
    producer: LiveProducer | KafkaProducerThread | None = None
    #: When spark-submit was started (epoch seconds), once it was.
    submitted_at: float | None = None

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    def live_args(self) -> list[str]:
        if self.kafka is None:
            return ["--landing", str(self.landing)]
        return [
            "--kafka-bootstrap-servers",
            self.kafka.bootstrap_servers,
            "--kafka-topic",
            self.kafka.name,
        ]

    def spark_conf(self) -> dict[str, str]:
        return local_spark_conf(self.name, self.metrics_url, self.conf)

    def job_args(self) -> list[str]:
        """The pipeline's own arguments: it stops once live and idle, or after 20 minutes."""
        return [
            "--history",
            str(self.history),
            *self.live_args(),
            "--output",
            str(self.root / "output"),
            "--checkpoint",
            str(self.root / "checkpoint"),
            "--stop-when-idle",
            "3s",
            "--timeout",
            "20min",
            *self.args,
        ]

    def command(self) -> list[str]:
        return spark_submit_command(events_pipeline.__file__, self.spark_conf(), *self.job_args())

    @classmethod
    def on(
        cls,
        workspace: Workspace,
        name: str,
        conf: dict[str, str],
        args: list[str],
        broker: KafkaTopic | None,
        partitions: int,
    ) -> Run:
        """Run ``name`` on the workspace's backlog and metrics; live, a topic ``name`` of
        ``broker`` (its ``partitions``) or, without one, a landing directory."""
        topic = None if broker is None else KafkaTopic(broker.bootstrap_servers, name, partitions)
        root = workspace.root
        return cls(name, root / name, root / "history", workspace.metrics_url, conf, args, topic)

    def checkpoints(self) -> list[Checkpoint]:
        return checkpoints_so_far(self.metrics_url, self.name)

    def execute(
        self,
        first_live_id: int,
        events_per_s: int,
        keep_going: Callable[[list[Checkpoint]], bool],
        topic_backlog: int = 0,
    ) -> list[Checkpoint]:
        """Run the job with a live producer until ``keep_going`` says enough, then let the job
        stop on its own once idle; print each checkpoint as it commits. ``topic_backlog``
        events wait in the topic before the job starts."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        producer: LiveProducer | KafkaProducerThread
        if self.kafka is None:
            producer = LiveProducer(self.landing, first_live_id, events_per_s, file_every_s=0.25)
        else:
            topic = self.kafka
            producer = KafkaProducerThread(
                topic.bootstrap_servers, topic.name, topic.partitions, first_live_id, events_per_s
            )
            if topic_backlog:
                say(f"[{self.name}] {topic_backlog:,} events wait in topic {topic.name!r}")
                producer.burst(topic_backlog)
        self.producer = producer
        log_path = self.root / "job.log"
        say(f"[{self.name}] starting the job (Spark log: {log_path})")
        producer.start()
        self.submitted_at = time.time()
        follow(self.name, self.command(), log_path, self.checkpoints, producer, keep_going)
        return self.checkpoints()
