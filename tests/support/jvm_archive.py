"""A class-data archive of the job's driver JVM, made once per installation and mapped by
every JVM the tests start.

A driver parses and verifies some fifteen thousand classes from Spark's jars at each start,
and the suite starts dozens of drivers on two cores. Read from an archive (the JDK's
application class-data sharing) those classes arrive parsed and verified: the malformed-file
test's two launches used about a quarter less CPU (docs/testing.md). The JVM checks the
archive itself (the JDK, the class path, each jar's size and time) and starts without it when
anything differs, so a stale archive costs speed, never correctness; its warnings are turned
off because ``spark-class`` reads the launcher's standard output as a command line.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyspark

from spark_jobs.jobs.startup import job_environment
from tools.data import write_history, write_landing_file

#: Options for every JVM of the suite. The client compiler alone spends about 30% less CPU
#: on JVMs that live for seconds to minutes.
BASE_OPTIONS = "-XX:TieredStopAtLevel=1"
WARM_UP_TIMEOUT_S = 300


def archive_path() -> Path:
    """Under the virtual environment, named by what the archive depends on."""
    jars = Path(pyspark.__file__).parent / "jars"
    plain = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=True, env=plain
    )
    key = "\n".join([java.stderr, pyspark.__version__, *sorted(p.name for p in jars.iterdir())])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(sys.prefix) / "jvm-archive" / f"driver-{digest}.jsa"


def java_options(archive: Path) -> str:
    return f"{BASE_OPTIONS} -XX:SharedArchiveFile={archive} -Xlog:cds*=off"


def ensure_archive() -> Path:
    """The archive, made by a short run of the events job if missing; one process makes it
    while the others wait on a lock next to it."""
    path = archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            _warm_up(path)
    return path


def _warm_up(path: Path) -> None:
    """Backlog then a landing file, aggregated into parquet: the classes most tests' drivers
    load. The JVM writes the archive when it exits normally; it is moved in only then."""
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="jvm-archive-") as scratch:
        root = Path(scratch)
        start = datetime.now(UTC) - timedelta(hours=1)
        write_history(root / "history", 2000, 2, start, start + timedelta(minutes=30))
        (root / "landing").mkdir()
        write_landing_file(root / "landing", "live-0.json", 2000, 20, datetime.now(UTC))
        command = [
            sys.executable,
            "-m",
            "spark_jobs.jobs.events_pipeline",
            *("--history", str(root / "history"), "--landing", str(root / "landing")),
            *("--output", str(root / "output"), "--checkpoint", str(root / "checkpoint")),
            *("--stop-when-idle", "1s", "--timeout", "120s"),
            *("--conf", "spark.master=local[2]", "--conf", "spark.ui.enabled=false"),
            *("--conf", f"spark.backlog.metrics.url=sqlite:///{root}/metrics.db"),
            *("--conf", "spark.backlog.checkpointing.interval=1s"),
        ]
        options = f"{BASE_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off"
        environment = {**job_environment(), "JAVA_TOOL_OPTIONS": options}
        run = subprocess.run(
            command,
            env=environment,
            capture_output=True,
            text=True,
            timeout=WARM_UP_TIMEOUT_S,
        )
    if run.returncode != 0 or not partial.exists():
        raise RuntimeError(
            f"the warm-up run for the JVM archive failed ({run.returncode}):\n{run.stdout[-3000:]}"
        )
    for stale in path.parent.glob("driver-*.jsa"):
        stale.unlink()
    os.replace(partial, path)
