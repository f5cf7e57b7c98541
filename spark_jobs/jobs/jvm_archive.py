"""A class-data archive of the job's driver JVM, so that Spark's classes arrive parsed.

A driver parses and verifies some fifteen thousand classes from Spark's jars while it starts
and while its first batch plans and runs: on a 2-core machine about 3 s before the first
batch and 1.3 s inside it (docs/tuning.md). The JDK's application class-data sharing keeps
them in an archive, made once per installation by one short run of the events job, that a
driver started with ``-XX:SharedArchiveFile`` maps instead. The JVM checks the archive itself
(the JDK, the class path, each jar's size and time) and starts without it when anything
differs, so a stale archive costs speed, never correctness; its warnings are turned off
because ``spark-class`` reads the launcher's standard output as a command line.

    backlog-jvm-archive     # makes it if missing; prints the Spark conf that maps it
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.jobs.startup import job_environment
from spark_jobs.storage import lock_files

#: The archive's home unless told otherwise: beside the installation it depends on.
DEFAULT_DIRECTORY = Path(sys.prefix) / "jvm-archive"
BUILD_TIMEOUT_S = 300
#: Rows of the short run's history: enough for every operator of the query to run.
BUILD_EVENTS = 2000


def archive_path(directory: Path = DEFAULT_DIRECTORY) -> Path:
    """Named by what the archive depends on: the JDK, pyspark's release and its jars."""
    return directory / f"driver-{_installation()}.jsa"


@functools.cache
def _installation() -> str:
    """A digest of the JDK's version banner, pyspark's release, the SPARK_HOME its drivers
    start from (the class path names it) and its jars' names: asked once per process
    (``java -version`` starts a JVM)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    plain = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=True, env=plain
    )
    home = job_environment().get("SPARK_HOME", str(jars.parent))
    names = sorted(p.name for p in jars.iterdir())
    key = "\n".join([java.stderr, pyspark.__version__, home, *names])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def java_options(archive: Path, base: str = "") -> str:
    """JVM options that map ``archive`` (after ``base``, options of the caller's own)."""
    return " ".join(filter(None, [base, f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=off"]))


def ensure_archive(directory: Path = DEFAULT_DIRECTORY, base: str = "") -> Path:
    """The archive, made by a short run of the events job if missing; one process makes it
    while the others wait on a lock beside it."""
    path = archive_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_files.acquire(path.with_suffix(".lock"), fcntl.LOCK_EX, math.inf)
    assert lock is not None
    with lock:
        if not path.exists():
            _build(path, base)
    return path


def _build(path: Path, base: str) -> None:
    """Parquet history, then a landing file, aggregated into parquet: the classes a driver
    of the pipelines loads. The JVM writes the archive when it exits normally; it is moved
    in only then, and older archives of other installations go."""
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="jvm-archive-") as scratch:
        root = Path(scratch)
        _write_history(root / "history" / "part-0.parquet", datetime.now(UTC) - timedelta(hours=1))
        _write_landing(root / "landing" / "live-0.json", datetime.now(UTC))
        command = [
            sys.executable,
            "-m",
            "spark_jobs.jobs.events_pipeline",
            *("--history", str(root / "history"), "--landing", str(root / "landing")),
            *("--output", str(root / "output"), "--checkpoint", str(root / "checkpoint")),
            *("--stop-when-idle", "1s", "--timeout", f"{BUILD_TIMEOUT_S - 60}s"),
            *("--conf", "spark.master=local[2]", "--conf", "spark.ui.enabled=false"),
            *("--conf", f"spark.backlog.metrics.url=sqlite:///{root}/metrics.db"),
            *("--conf", "spark.backlog.checkpointing.interval=1s"),
        ]
        options = f"{base} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off".strip()
        environment = {**job_environment(), "JAVA_TOOL_OPTIONS": options}
        run = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    if run.returncode != 0 or not partial.exists():
        raise RuntimeError(
            f"the short run that makes the JVM archive failed ({run.returncode}):\n"
            f"{run.stdout[-3000:]}"
        )
    _install(partial, path)


def _install(partial: Path, path: Path) -> None:
    """Move the new archive in; other installations' archives, partial archives and locks
    go, each installation's under its own lock, and only when no process holds it (one may
    be making its archive beside this one: two JDKs, one directory)."""
    os.replace(partial, path)
    for other in sorted({p.stem for p in path.parent.glob("driver-*")} - {path.stem}):
        lock = lock_files.acquire(path.parent / f"{other}.lock", fcntl.LOCK_EX, 0)
        if lock is None:
            continue
        with lock:
            for suffix in (".jsa", ".partial", ".lock"):
                (path.parent / f"{other}{suffix}").unlink(missing_ok=True)


def _write_history(path: Path, start: datetime) -> None:
    """``BUILD_EVENTS`` events of the pipelines' schema, a second apart from ``start``."""
    path.parent.mkdir(parents=True)
    ids = range(BUILD_EVENTS)
    table = pa.table(
        {
            "event_id": pa.array(ids, pa.int64()),
            "account": pa.array([f"account-{i % 20}" for i in ids]),
            "amount": pa.array([float(i % 100) for i in ids]),
            "event_time": pa.array(
                [start + timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")
            ),
        }
    )
    pq.write_table(table, path)


def _write_landing(path: Path, at: datetime) -> None:
    """A few live events as JSON lines, the landing directory's default format."""
    path.parent.mkdir(parents=True)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    events = [
        {"event_id": BUILD_EVENTS + i, "account": "live", "amount": 1.0, "event_time": stamp}
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(event) + "\n" for event in events))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="backlog-jvm-archive", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--directory", type=Path, default=DEFAULT_DIRECTORY)
    args = parser.parse_args(argv)
    print(f"the driver's class-data archive in {args.directory} (made once, about 40 s)")
    archive = ensure_archive(args.directory)
    print(f"--conf spark.driver.extraJavaOptions={java_options(archive)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
