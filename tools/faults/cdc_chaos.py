"""The fault campaign's ``cdc`` trial: the CDC pipeline copying a table that keeps changing,
through SIGKILLs, a restart of the source server and a target database that goes away.

The CDC pipeline keeps its place in three things a fault can leave out of step: Spark's
offset and commit logs, the replication slot and the snapshot's chunk files on the source's
side, and the record of merged batches in the target table. Each trial runs on a fresh
source and target server (each starts in about a second): a table of ``ROWS`` rows that a
``ChangeWriter`` changes ``TRANSACTIONS_PER_S`` times a second throughout (inserts, updates,
deletes, key moves, far-apart pairs), the job run with ``--target`` and
``--changes-output``, and these faults, in order, at positions read from the checkpoint's
logs (a batch planned in ``offsets/N`` and not yet in ``commits/N`` is in flight), after
waits drawn from the campaign's generator:

- ``cdc-sigkill-snapshot``: SIGKILL with a snapshot batch in flight, after 1-3 committed;
  restart;
- ``cdc-sigkill-switch``: SIGKILL once the first changelog batch is planned; restart;
- ``cdc-sigkill-changelog``: SIGKILL with a changelog batch in flight, 2-5 batches after the
  restart; restart;
- ``cdc-source-restart``: the source server stopped and started again 1-8 s later, the job
  left running (the source rides it out for its ``outageTimeout``);
- ``cdc-target-away``: the target server away for 1-10 s, the job left running (a merge
  waits for it for ``--target-outage-timeout``).

Then the writer stops, the job stops once idle, and ``tools.faults.cdc_check`` counts what the raw
change stream lost or duplicated and the keys where it or the merged copy is not the table.
The trial recovered if the job got through every fault, exited 0 at the end, every
batch it committed has its metrics row, and at no kill was the slot past the end of Spark's
last committed batch (where a restart reads from). A job that failed is started once more to
drain the changes before the counts, so they tell what a restart recovers from what is lost;
the trial still did not recover. The slot is torn down last.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import spark_jobs.jobs.cdc_pipeline as cdc_pipeline
from spark_jobs.jobs.startup import job_environment
from spark_jobs.sources.cdc.child import default_slot_name
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.slot import ReplicationSlot, SlotError
from tools.data.cdc_data import ChangeWriter, create_accounts, table_rows
from tools.data.verify import unrecorded_batches
from tools.faults.cdc_check import StreamCheck, check_changes, kinds_seen, read_changes
from tools.pipelines.cdc_runs import CdcRun, cdc_server, target_server
from tools.pipelines.runs import say
from tools.services.postgres import PostgresServer

T = TypeVar("T")

FAULTS = (
    "cdc-sigkill-snapshot",
    "cdc-sigkill-switch",
    "cdc-sigkill-changelog",
    "cdc-source-restart",
    "cdc-target-away",
)
TABLE = "accounts"
ROWS = 20_000
#: Two chunks per batch: the snapshot takes about ten batches, so a kill lands inside it.
CHUNK_ROWS = 1_000
CONF = {
    "spark.backlog.checkpointing.interval": "1s",
    "spark.backlog.checkpointing.interval-during-backlog": "1min",
    "spark.backlog.checkpointing.max-batch-rows": "2000",
    # A restart after a SIGKILL waits for the dead driver's lease to expire.
    "spark.backlog.lease.ttl": "5s",
}
TRANSACTIONS_PER_S = 20.0
#: Longer than the source server is away: a source that plans no batch looks idle.
IDLE = "15s"
SOURCE_AWAY_S = (1.0, 8.0)
TARGET_AWAY_S = (1.0, 10.0)
#: Batches committed after a fault before the next: the job got over it.
BATCHES_AFTER_A_FAULT = 3
STEP_TIMEOUT_S = 240.0
POLL_S = 0.05


class NotReached(RuntimeError):
    """The job failed, or did not reach a fault's position in time."""


@dataclass(frozen=True)
class CdcTrialResult:
    """What a trial found; ``faults`` are those injected (a job that failed ends its trial
    at the fault it failed on)."""

    faults: tuple[str, ...]
    recovered: bool
    check: StreamCheck
    note: str = ""


@dataclass
class CdcTrial:
    """One table, its copy and one checkpoint: the job's launches and what became of them."""

    run: CdcRun
    source: PostgresServer
    target: PostgresServer
    writer: ChangeWriter
    rng: random.Random
    logs: list[Path] = field(default_factory=list)
    job: subprocess.Popen[bytes] | None = None
    #: The faults injected so far.
    faults: list[str] = field(default_factory=list)
    #: What was wrong at a kill, though the job went on.
    problems: list[str] = field(default_factory=list)

    def start(self) -> None:
        log = self.run.root / f"job-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("w") as out:
            self.job = subprocess.Popen(
                self.run.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=job_environment(),
                start_new_session=True,  # a kill takes the JVM and the Python workers too
            )

    def kill(self) -> None:
        assert self.job is not None
        os.killpg(self.job.pid, signal.SIGKILL)
        self.job.wait(60)

    def restart_after_kill(self, fault: str, batch: int) -> None:
        say(f"  {fault}: batch {batch} in flight")
        self.faults.append(fault)
        self.kill()
        if ahead := self.slot_ahead():
            self.problems.append(f"{fault}: {ahead}")
        self.start()

    def slot_ahead(self) -> str | None:
        """What is wrong if the slot is past the end of Spark's last committed batch;
        None if it is not, or if there is no slot or commit yet."""
        name = default_slot_name(f"{self.run.checkpoint}/source", cdc_pipeline.SOURCE_NAME)
        slot = ReplicationSlot(self.source.url, name, name, TABLE)
        try:
            confirmed = slot.confirmed_flush_lsn()
        except SlotError:  # no slot yet (a lost one fails the job by name)
            return None
        finally:
            slot.close()
        done = self.batches("commits")
        end = self.position(done[-1]) if done else None
        if end is None or confirmed <= parse_lsn(end["lsn"]):
            return None
        return (
            f"slot {name} at {format_lsn(confirmed)}, past the last committed batch's end "
            f"{end['lsn']}"
        )

    def take_away(self, fault: str, server: PostgresServer, seconds: float) -> None:
        """``server`` stopped (sessions cut, data kept) for ``seconds``, then started again."""
        say(f"  {fault}: away {seconds:.1f} s after batch {self.batches('commits')[-1]}")
        self.faults.append(fault)
        server.stop()
        try:
            time.sleep(seconds)
        finally:
            server.start()

    def batches(self, log: str) -> list[int]:
        """Batch ids in the checkpoint's ``offsets`` (planned) or ``commits`` log."""
        directory = self.run.checkpoint / "spark" / log
        names = os.listdir(directory) if directory.is_dir() else ()
        return sorted(int(name) for name in names if name.isdigit())

    def position(self, batch: int) -> dict[str, Any] | None:
        """The source's end position of a planned batch; None while its file is written."""
        path = self.run.checkpoint / "spark" / "offsets" / str(batch)
        with contextlib.suppress(OSError, IndexError, json.JSONDecodeError):
            return json.loads(path.read_text().splitlines()[2])["position"]
        return None

    def in_flight(self, phase: str) -> int | None:
        """The batch planned and not committed yet, if its position is in ``phase``."""
        planned, committed = self.batches("offsets"), self.batches("commits")
        if planned and planned[-1] not in committed:
            found = self.position(planned[-1])
            if found is not None and found["phase"] == phase and not found.get("done"):
                return planned[-1]
        return None

    def wait_for(self, what: str, reached: Callable[[], T | None]) -> T:
        """``reached()``'s first value that is not None; NotReached if the job ends first."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while (found := reached()) is None:
            if self.job is not None and self.job.poll() is not None:
                raise NotReached(
                    f"the job exited ({self.job.returncode}) before {what}; see {self.logs[-1]}"
                )
            if time.monotonic() > deadline:
                raise NotReached(f"{what}: not reached within {STEP_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
        return found

    def first_planned(self, phase: str) -> int | None:
        """The first batch planned with its position in ``phase``."""
        for batch in self.batches("offsets"):
            if (self.position(batch) or {}).get("phase") == phase:
                return batch
        return None

    def commits(self, count: int) -> int | None:
        done = len(self.batches("commits"))
        return done if done >= count else None

    def after_commits(self, more: int, since: str) -> None:
        target = len(self.batches("commits")) + more
        self.wait_for(f"{more} more committed batches {since}", lambda: self.commits(target))

    def pause(self, at_most_s: float) -> None:
        time.sleep(self.rng.uniform(0, at_most_s))

    def finish(self) -> None:
        """Stop the writer; the job stops by itself once live and idle."""
        self.writer.stop()
        assert self.job is not None
        try:
            code = self.job.wait(STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise NotReached(f"the job did not stop once idle; see {self.logs[-1]}") from None
        if code != 0:
            raise NotReached(f"the job failed ({code}) at the end; see {self.logs[-1]}")


def inject_faults(trial: CdcTrial) -> None:
    """The five faults in order, then the job's stop once idle; NotReached if it fails."""
    trial.start()
    trial.after_commits(trial.rng.randint(1, 3), "in the snapshot")
    trial.pause(1.5)
    batch = trial.wait_for("a snapshot batch in flight", lambda: trial.in_flight("snapshot"))
    trial.restart_after_kill("cdc-sigkill-snapshot", batch)

    batch = trial.wait_for("the first changelog batch", lambda: trial.first_planned("changelog"))
    trial.restart_after_kill("cdc-sigkill-switch", batch)

    trial.after_commits(trial.rng.randint(2, 5), "after cdc-sigkill-switch")
    batch = trial.wait_for("a changelog batch in flight", lambda: trial.in_flight("changelog"))
    trial.restart_after_kill("cdc-sigkill-changelog", batch)

    trial.after_commits(BATCHES_AFTER_A_FAULT, "after cdc-sigkill-changelog")
    trial.pause(2.0)
    trial.take_away("cdc-source-restart", trial.source, trial.rng.uniform(*SOURCE_AWAY_S))
    trial.after_commits(BATCHES_AFTER_A_FAULT, "after cdc-source-restart")
    trial.pause(2.0)
    trial.take_away("cdc-target-away", trial.target, trial.rng.uniform(*TARGET_AWAY_S))
    trial.after_commits(BATCHES_AFTER_A_FAULT, "after cdc-target-away")
    trial.finish()


def drain(trial: CdcTrial) -> str:
    """After a failure, the writer stopped and the job run once more until idle, so that
    the counts tell what a restart recovers from what is lost; says how that went."""
    trial.writer.stop()
    if trial.job is not None and trial.job.poll() is None:
        trial.kill()
    trial.start()
    try:
        trial.finish()
    except NotReached as failure:
        return f"restarted to drain, which failed too: {failure}"
    return f"restarted to drain ({trial.logs[-1]})"


def run_trial(root: Path, rng: random.Random) -> CdcTrialResult:
    """One ``cdc`` trial in ``root`` (emptied first), its faults at ``rng``'s points."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    changes = root / "changes"
    with cdc_server() as source, target_server() as target:
        create_accounts(source.url, TABLE, ROWS)
        run = CdcRun(
            name=f"chaos-cdc-{time.time_ns()}",
            root=root,
            url=source.url,
            target_url=target.url,
            table=TABLE,
            metrics_url=f"sqlite:///{root / 'metrics.db'}",
            conf=CONF,
            # The last --stop-when-idle counts: CdcRun's own 3s would stop the job while
            # the source server is away.
            args=[
                *("--chunk-rows", str(CHUNK_ROWS), "--changes-output", str(changes)),
                *("--stop-when-idle", IDLE),
            ],
        )
        writer = ChangeWriter(
            source.url, TABLE, transactions_per_s=TRANSACTIONS_PER_S, seed=rng.randrange(2**32)
        )
        trial = CdcTrial(run, source, target, writer.start(), rng)
        note = ""
        try:
            inject_faults(trial)
        except NotReached as failure:
            note = f"{failure}; {drain(trial)}"
        finally:
            if writer.running:
                writer.stop()
            if trial.job is not None and trial.job.poll() is None:
                trial.kill()
        say(f"  the writer committed {writer.counts}, {writer.failures} failed meanwhile")
        stream = read_changes(changes)
        check = check_changes(
            stream, table_rows(source.url, TABLE), table_rows(target.url, run.copy_table)
        )
        say(f"  the change stream: {kinds_seen(stream)}")
        for example in check.examples:
            say(f"    {example}")
        note = "; ".join(filter(None, (note, *trial.problems)))
        recorded = [c.batch_id for c in run.checkpoints()]
        unrecorded = unrecorded_batches(run.checkpoint / "spark", recorded)
        if unrecorded:
            missing = f"committed without a metrics row: batches {unrecorded}"
            note = "; ".join(filter(None, (note, missing)))
        say(f"  teardown: {teardown(run)}")
    return CdcTrialResult(tuple(trial.faults), not note, check, note)


def teardown(run: CdcRun) -> str:
    """Drop the job's slot and publication, as ``backlog-cdc-job --teardown`` does."""
    args = ["--connection", run.url, "--table", run.table, "--checkpoint", str(run.checkpoint)]
    return cdc_pipeline.drop_slot(cdc_pipeline.parse_args([*args, "--teardown"]))
