"""One randomized CDC trial: a table drawn from a seed, copied while writers change it, faults
on the way, and the copy compared with the table value by value at the end.

Two drivers run the copy. ``model`` drives the source and the merge target in this process as
Spark would (``tools.faults.micro_batches``: plans, replays after a kill, kills at each point of the
protocol), so a trial takes seconds and a campaign searches thousands of interleavings.
``job`` runs ``backlog-cdc-job`` itself, SIGKILLs it at random moments and starts it again.

A trial passes when the copy equals the table, or when the job failed by name for one of
the reasons docs/limits.md lists (``REASONS``), each counted. Everything else fails it: a
value lost, wrong or extra, a failure with another message, a job that never got live.
The seed reproduces the trial: ``scripts/chaos --kinds cdc-random --cdc-seeds N`` (with
``--cdc-driver`` as it ran); the timing of threads and processes is not reproduced, so a
seed may need running a few times. Changing how a trial draws from its seed changes what
every seed means, and the seeds kept as tests would then test something else.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.coordinator.runtime import STOPPED_AT_TIMEOUT
from spark_jobs.jobs.startup import job_environment
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.child import default_slot_name
from spark_jobs.sources.cdc.connection import describe, teardown
from spark_jobs.sources.cdc.table import TableShape
from tools.faults.cdc_compare import Difference, compare
from tools.faults.cdc_copy import CdcCopy
from tools.faults.cdc_random.table import TableSpec
from tools.faults.cdc_random.workload import DDL, Workload
from tools.faults.micro_batches import Killed

#: The failures by name a trial may end with, as docs/limits.md lists them: a pattern of the
#: error, and the reason it is counted under.
TABLE_CHANGED = "the table changed while the job ran"
PUBLICATION_CHANGED = "the publication changed while the job ran"
REASONS = {
    TABLE_CHANGED: re.compile(
        r"table \S.* changed (since the copy began|in the transaction|while a snapshot chunk"
        r"|between this run's start and its copy's)"
        # A partitioned table's identity changed: its partitions keep theirs.
        r"|partition \S.* has another replica identity than the table's"
    ),
    PUBLICATION_CHANGED: re.compile(
        r"publication '\w+' on \S+ (changed since the copy began|does not publish)"
    ),
}
SOURCE = "cdc"
#: Changes of the publication (``DDL``) and the reason they fail the job for; every other
#: change of shape changes the table.
PUBLICATION_DDL = ("publish-insert-only", "table-dropped-from-publication")


def caused_by(ddl: str) -> str:
    """The reason of ``REASONS`` a change of shape fails the job for."""
    return PUBLICATION_CHANGED if ddl in PUBLICATION_DDL else TABLE_CHANGED


@dataclass
class TrialResult:
    seed: int
    driver: str
    table: TableSpec
    target: str
    chunk_rows: int
    ddl: str | None = None
    transactions: int = 0
    aborted: int = 0
    rows: int = 0
    kills: int = 0
    lost: int = 0
    wrong: int = 0
    extra: int = 0
    #: The reason of ``REASONS`` the job failed for, by name.
    failed_by_name: str | None = None
    #: What went wrong otherwise: an unnamed failure, a copy never live.
    broken: str | None = None
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.broken is None and self.lost == self.wrong == self.extra == 0

    def line(self) -> str:
        shape = (
            f"{self.table.key} key, {self.table.identity}, "
            f"{'generated, ' if self.table.generated else ''}"
            f"{'partitioned, ' if self.table.partitioned else ''}{self.target} target"
        )
        outcome = (
            f"failed by name: {self.failed_by_name}"
            if self.failed_by_name
            else f"lost {self.lost}, wrong {self.wrong}, extra {self.extra}"
        )
        if self.broken:
            outcome = f"BROKEN: {self.broken}"
        return (
            f"seed {self.seed} ({self.driver}, {self.table.name}: {shape}, {self.table.rows} "
            f"rows, chunks of {self.chunk_rows}{', ' + self.ddl if self.ddl else ''}): "
            f"{self.transactions} "
            f"transactions ({self.aborted} aborted), {self.kills} kills, {self.rows} rows "
            f"compared: {outcome}"
        )


def reason_of(error: str) -> str | None:
    return next((reason for reason, pattern in REASONS.items() if pattern.search(error)), None)


@dataclass
class Servers:
    """Where trials make their tables: a source with logical decoding (its synchronous
    commits held: ``SOURCE_SETTINGS``), a PostgreSQL target, and a directory for SQLite
    targets and state."""

    source_url: str
    target_url: str
    workdir: Path


#: The source server's settings: logical decoding, commits flushed locally before they return
#: (decoding reads flushed WAL only), and a synchronous standby that never answers, which
#: holds a commit that asks for it between its WAL record and its visibility.
SOURCE_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "10",
    "max_slot_wal_keep_size": "4GB",
    "synchronous_commit": "local",
    "synchronous_standby_names": "never_answers",
}


def draw(seed: int) -> tuple[random.Random, TableSpec, str, int, str | None]:
    """The trial's generator, table, target kind, chunk size and DDL (None: none)."""
    rng = random.Random(seed)
    spec = TableSpec.draw(rng, seed % 100_000)
    target = rng.choice(["postgresql", "sqlite"])
    chunk_rows = rng.choice([4, 9, 20, 50])
    ddl = rng.choice(sorted(DDL)) if rng.random() < 0.2 else None
    return rng, spec, target, chunk_rows, ddl


def _target_url(servers: Servers, kind: str, root: Path) -> str:
    return f"sqlite:///{root / 'target.db'}" if kind == "sqlite" else servers.target_url


def _measure(result: TrialResult, found: list[Difference], source_rows: int) -> None:
    result.rows = source_rows
    result.lost = sum(d.copy is None for d in found)
    result.extra = sum(d.source is None for d in found)
    result.wrong = len(found) - result.lost - result.extra


# --- the model driver -------------------------------------------------------------------------


def run_model_trial(seed: int, servers: Servers, seconds: float = 3.0) -> TrialResult:
    """A trial of the copy driven in this process, faults at every point of the protocol."""
    rng, spec, target_kind, chunk_rows, ddl = draw(seed)
    root = _fresh(servers.workdir / f"model-{seed}")
    target_url = _target_url(servers, target_kind, root)
    result = TrialResult(seed, "model", spec, target_kind, chunk_rows, ddl)
    keys = spec.create(servers.source_url, rng)
    kills = {"chance": rng.choice([0.0, 0.02, 0.08])}
    faults = random.Random(rng.randrange(2**32))

    def fault(point: str) -> None:
        if faults.random() < kills["chance"]:
            raise Killed(point)

    copy = CdcCopy(servers.source_url, spec.name, target_url, root / "state", chunk_rows, fault)
    workload = Workload(servers.source_url, spec, keys, rng, rng.randint(2, 4), waiting=True)
    publication = default_slot_name(str(root / "state"), SOURCE)
    shape_change = _shape_change(workload, ddl, publication, rng.uniform(0.2, seconds), _now)
    try:
        copy.step()  # the first start makes the slot, before anything is written
        workload.start()
        if shape_change is not None:
            shape_change.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            copy.step(rng.choice([None, chunk_rows, 2 * chunk_rows, 7]))
            time.sleep(rng.uniform(0, 0.03))
        _stop(workload, shape_change)
        kills["chance"] = 0.0
        copy.until_live_and_idle(max_rows=rng.choice([None, 3 * chunk_rows]))
    except Exception as error:  # the copy failed: by name, or not
        _failed(result, str(error))
    finally:
        _stop(workload, shape_change)
        result.kills = copy.batches.kills
        copy.close()
    _finish(result, workload, servers, target_url, copy.target_table, copy.shape)
    return result


def _fresh(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root


def _stop(workload: Workload, shape_change: threading.Thread | None) -> None:
    if shape_change is not None and shape_change.ident is not None:
        shape_change.join()
    workload.stop()


def _failed(result: TrialResult, error: str) -> None:
    reason = reason_of(error)
    if reason is not None and result.ddl is not None:
        result.failed_by_name = reason
    else:
        last = error.strip().splitlines()[-1] if error.strip() else "no message"
        result.broken = last[:2000]


def _finish(
    result: TrialResult,
    workload: Workload,
    servers: Servers,
    target_url: str,
    target_table: str,
    shape: TableShape | None,
) -> None:
    """What the workload did, and the copy compared with the table if the copy went on."""
    result.transactions = workload.counts.transactions
    result.aborted = workload.counts.aborted
    if workload.errors:
        result.broken = f"a writer failed: {workload.errors[0]!r}"
    # A failure by name counts only for the change of shape made, and its own reason.
    if result.failed_by_name is not None and result.ddl is not None:
        if not workload.shape_changed:
            result.broken = (
                f"failed by name ({result.failed_by_name}), though the server refused "
                f"{result.ddl} and nothing changed"
            )
        elif result.failed_by_name != caused_by(result.ddl):
            result.broken = (
                f"failed by name ({result.failed_by_name}), where {result.ddl} fails it for "
                f"another reason ({caused_by(result.ddl)})"
            )
    if result.ddl is not None and not workload.shape_changed:
        result.ddl += " (refused by the server)"
    elif result.ddl is not None and not workload.copy_had_begun:
        result.ddl += " (before the copy began)"  # going on and failing by name both fit
    elif result.ddl is not None and result.failed_by_name is None and result.broken is None:
        result.broken = f"{result.ddl} was made and the copy went on"
    if result.failed_by_name is None and result.broken is None and shape is not None:
        found = compare(servers.source_url, result.table.name, target_url, target_table, shape)
        _measure(result, found, _count_rows(servers.source_url, result.table))
        result.examples = [d.describe(shape) for d in found[:3]]


def _count_rows(url: str, spec: TableSpec) -> int:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return int(connection.exec_driver_sql(f"SELECT count(*) FROM {spec.sql}").scalar_one())
    finally:
        engine.dispose()


# --- the job driver ---------------------------------------------------------------------------

JOB = Path(sys.executable).parent / "backlog-cdc-job"


def job_conf(chunk_rows: int) -> dict[str, str]:
    return {
        "spark.backlog.checkpointing.interval": "1s",
        "spark.backlog.checkpointing.interval-during-backlog": "30s",
        "spark.backlog.checkpointing.max-batch-rows": str(3 * chunk_rows),
        # A restart after a SIGKILL waits for the dead driver's lease to expire.
        "spark.backlog.lease.ttl": "4s",
    }


class JobRuns:
    """``backlog-cdc-job`` started, SIGKILLed (its whole process group) and started again."""

    def __init__(self, command: list[str], root: Path):
        self.command, self.root = command, root
        self.logs: list[Path] = []
        self.job: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.logs.append(self.root / f"job-{len(self.logs)}.log")
        with self.logs[-1].open("w") as out:
            self.job = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=job_environment(),
                start_new_session=True,
            )

    def kill(self) -> None:
        assert self.job is not None
        os.killpg(self.job.pid, signal.SIGKILL)
        self.job.wait(60)

    def next_commit(self, commits: Path, timeout_s: float) -> bool:
        """Wait until Spark commits a batch past those in ``commits`` now: whether it did
        while this run was alive. A kill is then dealt to a running query, not to a driver
        still starting (which takes longer than the whole workload lasts)."""
        assert self.job is not None
        committed = _batches(commits)
        deadline = time.monotonic() + timeout_s
        while _batches(commits) == committed:
            if self.job.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def finish(self, commits: Path, quiet_s: float) -> int | None:
        """The exit code once the job stops by itself (idle); None if it committed no
        batch for ``quiet_s`` and still ran. A long workload leaves a long changelog to
        catch up on in batches of a few chunks: how long is not a fault, stalling is."""
        assert self.job is not None
        last, since = _batches(commits), time.monotonic()
        while (code := self.job.poll()) is None:
            if (now := _batches(commits)) != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > quiet_s:
                self.kill()
                return None
            time.sleep(0.2)
        return code

    def errors(self) -> str:
        tail = self.logs[-1].read_text()[-8000:]
        named = [line for line in tail.splitlines() if "Error" in line or "error" in line]
        return "\n".join(named) or tail


def _batches(commits: Path) -> int:
    """The last batch Spark committed (-1: none); not a count, as Spark deletes old ones."""
    return max((int(p.name) for p in commits.glob("[0-9]*") if p.name.isdigit()), default=-1)


def _now() -> None:
    """Nothing to wait for."""


def _first_commit(commits: Path, runs: JobRuns, timeout_s: float) -> None:
    """Until Spark has committed a batch, the job has ended (failed before its first, say),
    or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while _batches(commits) < 0 and time.monotonic() < deadline:
        if runs.job is not None and runs.job.poll() is not None:
            return
        time.sleep(0.1)


def run_job_trial(
    seed: int, servers: Servers, spark_conf: dict[str, str], seconds: float = 6.0
) -> TrialResult:
    """A trial of ``backlog-cdc-job``: SIGKILLed at random moments and started again."""
    rng, spec, target_kind, chunk_rows, ddl = draw(seed)
    root = _fresh(servers.workdir / f"job-{seed}")
    target_url = _target_url(servers, target_kind, root)
    result = TrialResult(seed, "job", spec, target_kind, chunk_rows, ddl)
    keys = spec.create(servers.source_url, rng)
    checkpoint, target_table = root / "checkpoint", f"copy_{seed}"
    conf = {**spark_conf, **job_conf(chunk_rows)}
    command = [str(JOB), "--connection", servers.source_url, "--table", spec.name]
    command += ["--target", target_url, "--target-table", target_table]
    command += ["--chunk-rows", str(chunk_rows), "--checkpoint", str(checkpoint)]
    command += ["--stop-when-idle", "3s", "--timeout", "10min"]
    command += [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    runs = JobRuns(command, root)
    workload = Workload(servers.source_url, spec, keys, rng, rng.randint(2, 3), waiting=True)
    publication = default_slot_name(f"{checkpoint}/source", SOURCE)
    commits = checkpoint / "spark" / "commits"
    # When to kill and change the shape, drawn apart: the seed's own draws stay as they
    # were before they existed, so the seeds kept as tests keep their tables and writes.
    timing = random.Random(f"{seed}:timing")
    at_s = rng.uniform(2, seconds)
    # Mostly at a running query, now and then while the first driver starts.
    if timing.random() < 0.7:
        at_s, first = timing.uniform(0, 2), lambda: _first_commit(commits, runs, 120)
    else:
        first = _now
    shape_change = _shape_change(workload, ddl, publication, at_s, first)
    runs.start()
    workload.start()
    if shape_change is not None:
        shape_change.start()
    try:
        deadline = time.monotonic() + seconds
        for _ in range(rng.choice([1, 1, 2])):
            pause_s = rng.uniform(1.0, max(1.0, deadline - time.monotonic()))
            # Mostly after a commit of this run, now and then while its driver starts.
            if timing.random() < 0.8:
                pause_s = timing.uniform(0.0, 2.0)
                if not runs.next_commit(commits, 120):
                    break
            time.sleep(pause_s)
            if runs.job is not None and runs.job.poll() is not None:
                break
            runs.kill()
            result.kills += 1
            runs.start()
            deadline = max(deadline, time.monotonic() + timing.uniform(1.0, 3.0))
        time.sleep(max(0.0, deadline - time.monotonic()))
    finally:
        _stop(workload, shape_change)
    code = runs.finish(commits, 120)
    if code is None:
        result.broken = f"the job stalled and did not stop; see {runs.logs[-1]}"
    elif STOPPED_AT_TIMEOUT in runs.logs[-1].read_text():
        result.broken = f"the job was still busy at its timeout; see {runs.logs[-1]}"
    elif code != 0:
        _failed(result, runs.errors())
    # The table as it is now, when the copy is to be compared with it: a table that failed
    # the job by name may be one that cannot be described.
    compared = result.broken is None and result.failed_by_name is None
    shape = describe(SOURCE, servers.source_url, spec.name) if compared else None
    _finish(result, workload, servers, target_url, target_table, shape)
    teardown(servers.source_url, publication, publication, spec.name)
    return result


def _shape_change(
    workload: Workload,
    ddl: str | None,
    publication: str,
    at_s: float,
    first: Callable[[], object],
) -> threading.Thread | None:
    """A thread that changes the table's shape (``ddl``) ``at_s`` after ``first`` returns,
    once started."""
    if ddl is None:
        return None

    def change() -> None:
        first()
        time.sleep(at_s)
        workload.change_shape(ddl, publication)

    return threading.Thread(target=change, daemon=True)
