"""Running the events pipeline with spark-submit against synthetic data, with live progress."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import spark_jobs.jobs.events_pipeline as events_pipeline
from spark_jobs.demo.data import LiveProducer, history_range, write_history
from spark_jobs.demo.report import Checkpoint, load
from spark_jobs.jobs.launch import job_environment, require_java, spark_submit_command


def say(message: str) -> None:
    print(message, flush=True)


def add_workspace_arguments(parser: argparse.ArgumentParser, workdir: str, events: int) -> None:
    parser.add_argument("--workdir", type=Path, default=Path(workdir))
    parser.add_argument("--events", type=int, default=events, help="events in the backlog")
    parser.add_argument("--files", type=int, default=100, help="parquet files of the backlog")
    parser.add_argument("--live-events-per-s", type=int, default=2000)


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
    metrics = root / "metrics.db"
    metrics.unlink(missing_ok=True)
    return Workspace(root, first_live_id, f"sqlite:///{metrics}")


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


@dataclass
class Run:
    """One launch of the pipeline: its directories, its Spark conf, and what it printed."""

    name: str
    root: Path
    history: Path
    metrics_url: str
    conf: dict[str, str]
    args: list[str] = field(default_factory=list)

    @property
    def landing(self) -> Path:
        return self.root / "landing"

    def command(self) -> list[str]:
        conf = {
            "spark.master": "local[2]",
            "spark.ui.enabled": "false",
            "spark.backlog.job-name": self.name,
            "spark.backlog.metrics.url": self.metrics_url,
            **self.conf,
        }
        return spark_submit_command(
            events_pipeline.__file__,
            conf,
            "--history",
            str(self.history),
            "--landing",
            str(self.landing),
            "--output",
            str(self.root / "output"),
            "--checkpoint",
            str(self.root / "checkpoint"),
            "--stop-when-idle",
            "3s",
            "--timeout",
            "20min",
            *self.args,
        )

    def checkpoints(self) -> list[Checkpoint]:
        try:
            return load(self.metrics_url, self.name)[0]
        except Exception:  # the job has not created the tables yet
            return []

    def execute(
        self,
        first_live_id: int,
        events_per_s: int,
        keep_going: Callable[[list[Checkpoint]], bool],
    ) -> list[Checkpoint]:
        """Run the job with a live producer until ``keep_going`` says enough, then let the job
        stop on its own once idle; print each checkpoint as it commits."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        producer = LiveProducer(self.landing, first_live_id, events_per_s, file_every_s=0.25)
        log_path = self.root / "job.log"
        say(f"[{self.name}] starting the job (Spark log: {log_path})")
        producer.start()
        with log_path.open("w") as log:
            job = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=job_environment()
            )
        shown = 0
        try:
            while job.poll() is None:
                checkpoints = self.checkpoints()
                for checkpoint in checkpoints[shown:]:
                    phase = "backlog" if checkpoint.is_backlog else "live   "
                    say(
                        f"[{self.name}] checkpoint {checkpoint.batch_id:4d}  {phase} "
                        f"{checkpoint.rows:>10,} rows  {checkpoint.duration_s:6.2f} s"
                    )
                shown = len(checkpoints)
                if producer.is_alive() and not keep_going(checkpoints):
                    say(f"[{self.name}] enough seen: stopping the live producer")
                    producer.stop()
                time.sleep(0.5)
        finally:
            if producer.is_alive():
                producer.stop()
            if job.poll() is None:
                job.terminate()
                job.wait(60)
        if job.returncode != 0:
            tail = log_path.read_text()[-3000:]
            raise RuntimeError(f"the job failed ({job.returncode}); end of {log_path}:\n{tail}")
        return self.checkpoints()
