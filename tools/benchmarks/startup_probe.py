"""How soon a new driver starts its first batch: the compiled SPARK_HOME against the
installed package as SPARK_HOME, side by side.

Each run is ``backlog-events-job`` (the console command, as a user runs it, with the
settings a user has after setup: no class-data archive) on a fresh checkpoint over the same
small history, stopping once live and idle. The two homes alternate within each
repetition, after one warm-up run of each (discarded). Per run: seconds from the command's
start to its first batch's start and to its commit (the batch's metrics row: its commit
time less its duration), and the CPU seconds of the command and every process under it
(the JVM, Spark's Python processes), sampled every 0.1 s. Reports the medians per home and
their ratios (installed over compiled: above 1 means the compiled home is faster), with the
load average; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
import sqlalchemy as sa

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.spark_home import installed_home
from spark_jobs.jobs.startup import JavaMissing, job_environment, require_java
from spark_jobs.metrics.schema import as_utc, backlog_checkpoints, make_engine
from tools.data.events import history_range, write_history
from tools.pipelines.runs import say

HOMES = ("installed", "compiled")


@dataclass(frozen=True)
class Run:
    home: str
    to_first_batch_s: float
    to_first_commit_s: float
    cpu_s: float


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/startup-benchmark",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--workdir", type=Path, default=Path("var/startup-benchmark"))
    parser.add_argument("--events", type=count_argument, default=20_000)
    parser.add_argument("--repetitions", type=count_argument, default=3)
    return parser.parse_args(argv)


def environment(home: str) -> dict[str, str]:
    """A user's environment for ``home``: SPARK_HOME unset (the command makes the compiled
    home), or set to the installed package; no JVM options of the tools."""
    unset = ("SPARK_HOME", "JAVA_TOOL_OPTIONS")
    plain = {k: v for k, v in job_environment().items() if k not in unset}
    if home == "installed":
        plain["SPARK_HOME"] = str(installed_home())
    return plain


def run_once(home: str, history: Path, root: Path) -> Run:
    shutil.rmtree(root, ignore_errors=True)
    (root / "landing").mkdir(parents=True)
    metrics = f"sqlite:///{root}/metrics.db"
    command = [
        sys.executable,
        *("-m", "spark_jobs.jobs.events_pipeline", "--history", str(history)),
        *("--landing", str(root / "landing"), "--output", str(root / "output")),
        *("--checkpoint", str(root / "checkpoint"), "--stop-when-idle", "1s"),
        *("--conf", "spark.master=local[2]", "--conf", f"spark.backlog.metrics.url={metrics}"),
        *("--conf", "spark.backlog.checkpointing.interval=1s"),
    ]
    started = time.time()
    with (root / "driver.log").open("w") as log:
        done = subprocess.Popen(command, env=environment(home), stdout=log, stderr=log)
        cpu = tree_cpu_s(done)
    if done.returncode != 0:
        raise RuntimeError(f"{home}: the job failed; its log: {root / 'driver.log'}")
    engine = make_engine(metrics)
    try:
        with engine.connect() as connection:
            first = connection.execute(
                sa.select(backlog_checkpoints).where(backlog_checkpoints.c.batch_id == 0)
            ).one()
    finally:
        engine.dispose()
    committed = as_utc(first.committed_at).timestamp()
    return Run(
        home,
        committed - first.batch_duration_ms / 1000 - started,
        committed - started,
        cpu,
    )


def tree_cpu_s(process: subprocess.Popen) -> float:
    """The CPU seconds of ``process`` and every process under it until it ends, sampled
    every 0.1 s (each process's last reading: its own time, not its children's)."""
    seen: dict[tuple[int, float], float] = {}
    top = psutil.Process(process.pid)
    while process.poll() is None:
        with contextlib.suppress(psutil.Error):
            for each in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = each.cpu_times()
                    seen[(each.pid, each.create_time())] = times.user + times.system
        time.sleep(0.1)
    return sum(seen.values())


def medians(runs: Sequence[Run], home: str) -> dict[str, float]:
    mine = [r for r in runs if r.home == home]
    keys = ("to_first_batch_s", "to_first_commit_s", "cpu_s")
    return {key: statistics.median(getattr(r, key) for r in mine) for key in keys}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        require_java()
    except JavaMissing as error:
        print(f"startup-benchmark: {error}", file=sys.stderr)
        return 2
    if installed_home() is None:
        print("startup-benchmark: needs PySpark installed with its jars", file=sys.stderr)
        return 2
    root = args.workdir.resolve()
    history = root / "history"
    shutil.rmtree(history, ignore_errors=True)
    write_history(history, args.events, 4, *history_range(datetime.now(UTC)))
    runs: list[Run] = []
    for repetition in range(args.repetitions + 1):
        for home in HOMES:
            run = run_once(home, history, root / "run")
            say(
                f"{'warm-up' if repetition == 0 else f'repetition {repetition}'}: {home} home: "
                f"first batch after {run.to_first_batch_s:.2f} s, committed after "
                f"{run.to_first_commit_s:.2f} s, {run.cpu_s:.1f} CPU-s "
                f"(load average {os.getloadavg()[0]:.1f})"
            )
            if repetition:
                runs.append(run)
    found = {home: medians(runs, home) for home in HOMES}
    ratios = {key: found["installed"][key] / found["compiled"][key] for key in found["compiled"]}
    say("")
    say(f"{'home':<10} {'to first batch (s)':>19} {'to first commit (s)':>20} {'CPU-s':>7}")
    for home in HOMES:
        m = found[home]
        say(
            f"{home:<10} {m['to_first_batch_s']:>19.2f} {m['to_first_commit_s']:>20.2f} "
            f"{m['cpu_s']:>7.1f}"
        )
    say(
        f"installed / compiled: {ratios['to_first_batch_s']:.2f}x to the first batch, "
        f"{ratios['to_first_commit_s']:.2f}x to its commit, {ratios['cpu_s']:.2f}x CPU"
    )
    summary = {
        "events": args.events,
        "medians": found,
        "ratios": ratios,
        "runs": [asdict(r) for r in runs],
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
