"""A fault campaign: the events pipeline under faults injected for real, with numbers.

    scripts/chaos --trials 10                    # every kind of trial, 10 of each
    scripts/chaos --trials 2 --kinds kills,database

Each trial runs the pipeline on a fresh workspace (historical parquet files, then a topic of
the embedded broker that piles up meanwhile, so the job goes through a file phase, a Kafka
backlog and live data), injects its faults, lets the job finish, and compares the sink with
a batch recomputation over every event written. A fault counts a trial's lost and
duplicated events, and whether the job recovered (it finished cleanly and every batch it
committed has its metrics row). The last line printed is one JSON object, per fault:
``trials``, ``lost``, ``duplicated``, ``recovered``. The campaign exits non-zero if a trial
did not recover, lost or duplicated an event, or left a window with a wrong sum of amounts.

Kinds of trials and their faults:

- ``kills``: SIGKILL of the driver at a random point of the file phase, of the Kafka
  backlog and of the live phase, each followed by a restart;
- ``database``: the metrics database away for a random while (up to twice the lease's
  time to live) while the job runs, and again while it stops;
- ``skew``: a second driver whose clock runs ahead by more than the lease's time to live
  tries to take the checkpoint over (needs ``--postgres-url``: SQLite's clock is the
  clock of each process using it, so a skewed process skews it too);
- ``broker``: the embedded broker's own faults, on a cluster of three brokers: all of them
  down for a random while during the Kafka backlog, every partition's leader moved, and
  fetch and offset requests answered with errors while the job follows live data;
- ``malformed``: with the quarantine on (``--bad-records-path``), two history files
  broken (one not parquet, one with a column of another type) and topic values that are
  no event; the trial recovers when every one of them is counted as set aside;
- ``cdc``: the CDC pipeline instead (``tools/faults/cdc_chaos.py``), copying a table that keeps
  changing: SIGKILLs in the snapshot, at the switch and in the changelog, the source server
  restarted and the target database away. Its counts are versions lost and changes
  duplicated in the raw change stream, and keys where the merged copy or the replayed
  stream is not the table.
- ``cdc-random``: randomized CDC trials (``tools/faults/cdc_random``), one seed each: a table drawn
  from the seed, writers changing it at random moments, kills at random points, the copy
  compared with the table value by value. ``--cdc-driver`` runs them in this process
  (``model``, seconds a trial), as ``backlog-cdc-job`` (``job``), or mostly the first
  (``both``); ``--cdc-seeds`` runs given seeds again. Its figures are printed apart: seeds,
  transactions, rows compared, lost, wrong, extra, failures by name per reason, and the
  seeds of trials that broke.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import KafkaError, Producer

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import job_environment
from tools.data.events import KafkaProducerThread
from tools.data.verify import (
    Inputs,
    all_input,
    committed_output,
    compare,
    unrecorded_batches,
)
from tools.faults import cdc_chaos
from tools.faults.cdc_random import campaign as cdc_campaign
from tools.pipelines.report import Checkpoint
from tools.pipelines.runs import KafkaTopic, Run, prepare_history, say
from tools.services.broker import FETCH, LIST_OFFSETS, EmbeddedBroker

TOPIC = "events"
PARTITIONS = 4
WINDOW_S = 10.0
LEASE_TTL_S = 5.0
CONF = {
    "spark.backlog.checkpointing.interval": "1s",
    "spark.backlog.checkpointing.interval-during-backlog": "1min",
    # Small batches, so that each phase takes several and a kill lands inside one.
    "spark.backlog.checkpointing.max-batch-rows": "10000",
    "spark.backlog.lease.ttl": f"{LEASE_TTL_S:g}s",
    "spark.backlog.lag.offsets.enter-threshold": "3000",
    "spark.backlog.lag.offsets.leave-threshold": "1000",
}
PHASE_TIMEOUT_S = 240.0
#: Events waiting in the topic before a trial with faults in the Kafka backlog starts:
#: several batches of it whatever the timing (live events alone pile up only while the
#: file phase runs, which a fast run or a late kill there makes too short for a batch).
TOPIC_BACKLOG = 40_000
TOPIC_BACKLOG_KINDS = ("kills", "broker")
#: The broker trials' cluster: enough brokers for a leader to move to another.
BROKERS = 3
#: How long the brokers stay away, at most: well within the Kafka child's outageTimeout.
BROKERS_DOWN_S = 12.0
#: The broker trials' job stops once idle this long: a pause while brokers refuse requests
#: is not idleness, though the job cannot tell the two apart.
BROKER_TRIAL_IDLE = "20s"
#: Topic values that are no event: not an object, null, not JSON, a field of another type.
BAD_VALUES = (b"[1, 2]", b"null", b"garbage", b'{"event_id": "seven"}')
#: Errors a broker answers with while a leader moves or it is overloaded.
REQUEST_ERRORS = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT,
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TrialFailed(RuntimeError):
    """The job did not get where the trial needed it."""


@dataclass(frozen=True)
class TrialResult:
    kind: str
    faults: tuple[str, ...]
    recovered: bool
    lost: int
    duplicated: int
    compared: int
    _: KW_ONLY
    produced: int = 0
    #: Events in windows the sink holds once but with another sum of amounts.
    wrong_amounts: int = 0
    #: How far the final watermark stayed behind the last event written.
    watermark_behind_s: float = 0.0
    #: For cdc: keys where the merged copy or the replayed change stream is not the table.
    differs: int = 0
    note: str = ""


@dataclass
class Trial:
    """One workspace, one broker, one job name: the job's launches and what became of them."""

    kind: str
    run: Run
    producer: KafkaProducerThread
    rng: random.Random
    broker: EmbeddedBroker
    logs: list[Path] = field(default_factory=list)
    job: subprocess.Popen[bytes] | None = None

    def launch(self, command: list[str] | None = None, env: dict[str, str] | None = None):
        log = self.run.root / f"job-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("w") as out:
            return subprocess.Popen(
                command or self.run.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or job_environment(),
                start_new_session=True,  # a kill takes the JVM and the Python workers too
            )

    def start(self) -> None:
        self.job = self.launch()

    def kill(self) -> None:
        assert self.job is not None
        os.killpg(self.job.pid, signal.SIGKILL)
        self.job.wait(60)

    def terminate(self) -> None:
        """SIGTERM to the driver's Python process (spark-submit's child), which stops the
        run after a commit; returns once the job has exited, failing if it did not cleanly."""
        assert self.job is not None
        for process in psutil.Process(self.job.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):  # gone, or a zombie worker
                if "spark_jobs/jobs/events_pipeline.py" in " ".join(process.cmdline()):
                    process.terminate()
        code = self.job.wait(PHASE_TIMEOUT_S)
        if code != 0:
            raise TrialFailed(f"the job failed on SIGTERM ({code}); see {self.logs[-1]}")

    def checkpoints(self) -> list[Checkpoint]:
        return self.run.checkpoints()

    def wait_for(self, what: str, reached: Callable[[list[Checkpoint]], bool]) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not reached(self.checkpoints()):
            if self.job is not None and self.job.poll() is not None:
                raise TrialFailed(f"the job exited ({self.job.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise TrialFailed(f"{what}: not reached within {PHASE_TIMEOUT_S:.0f} s")
            time.sleep(0.3)

    def pause(self, at_most_s: float) -> None:
        """A random point: the fault lands anywhere in a batch or between two."""
        time.sleep(self.rng.uniform(0, at_most_s))

    def finish(self) -> None:
        """Stop the producer; the job stops by itself once live and idle."""
        self.producer.stop()
        assert self.job is not None
        try:
            code = self.job.wait(PHASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TrialFailed("the job did not stop once idle") from None
        if code != 0:
            raise TrialFailed(f"the job failed ({code}); see {self.logs[-1]}")


def in_phase(phase: str, backlog: bool, after: int = 0) -> Callable[[list[Checkpoint]], bool]:
    """Reached once a batch after the first ``after`` ones ran in this phase."""
    return lambda rows: any(c.phase == phase and c.is_backlog == backlog for c in rows[after:])


def live_for(batches: int, after: int) -> Callable[[list[Checkpoint]], bool]:
    def reached(rows: list[Checkpoint]) -> bool:
        recent = [c for c in rows[after:] if c.phase is not None]
        return len(recent) >= batches and not any(c.is_backlog for c in recent[-batches:])

    return reached


# --- the kinds of trials -----------------------------------------------------------------


def kills(trial: Trial) -> tuple[str, ...]:
    phases = (
        ("sigkill-files", "history", True),
        ("sigkill-kafka-backlog", "kafka", True),
        ("sigkill-live", "kafka", False),
    )
    trial.start()
    for fault, phase, backlog in phases:
        seen = len(trial.checkpoints())
        trial.wait_for(f"a {phase} checkpoint", in_phase(phase, backlog, after=seen))
        trial.pause(2.0)
        say(f"  {fault}: batch {len(trial.checkpoints())}")
        trial.kill()
        trial.start()
    trial.wait_for("live data after the last restart", live_for(3, len(trial.checkpoints())))
    trial.finish()
    return tuple(fault for fault, _, _ in phases)


def metrics_directory(trial: Trial) -> Path:
    return Path(trial.run.metrics_url.removeprefix("sqlite:///")).parent


@contextlib.contextmanager
def database_away(directory: Path) -> Iterator[None]:
    """A SQLite database's ``directory`` gone (a plain file in its place, so nothing can
    create a fresh one there), then back."""
    away = directory.with_name(directory.name + "-away")
    directory.rename(away)
    directory.write_text("away\n")
    try:
        yield
    finally:
        directory.unlink()
        away.rename(directory)


def database(trial: Trial) -> tuple[str, ...]:
    trial.start()
    trial.wait_for("a checkpoint", lambda rows: len(rows) >= 1 + trial.rng.randrange(8))
    away_s = trial.rng.uniform(1.0, 2 * LEASE_TTL_S)
    say(f"  database-away: {away_s:.1f} s")
    metrics = metrics_directory(trial)
    with database_away(metrics):
        time.sleep(away_s)
    trial.wait_for("live data", live_for(3, 0))
    say("  database-away-at-shutdown")
    with database_away(metrics):
        trial.producer.stop()
        trial.terminate()
    # The rows the stopped run could not deliver wait in its journal for the next run,
    # which follows new live events.
    trial.producer = trial.producer.successor()
    trial.producer.start()
    seen = len(trial.checkpoints())
    trial.start()
    trial.wait_for("live data after the restart", live_for(3, seen))
    trial.finish()
    return ("database-away", "database-away-at-shutdown")


def skew(trial: Trial) -> tuple[str, ...]:
    trial.start()
    trial.wait_for("a Kafka checkpoint", lambda rows: any(c.phase == "kafka" for c in rows))
    skewed = trial.launch(skewed_command(trial.run), skewed_environment(2 * LEASE_TTL_S + 60))
    code = skewed.wait(PHASE_TIMEOUT_S)
    if code != 2 or "is already run by" not in trial.logs[-1].read_text():
        raise TrialFailed(f"the skewed driver was not refused (exit {code}): {trial.logs[-1]}")
    trial.wait_for("live data", live_for(3, 0))
    trial.finish()
    return ("skewed-second-driver",)


def broker(trial: Trial) -> tuple[str, ...]:
    """Faults during the Kafka backlog (when a pause is not idleness) and in live data."""
    trial.start()
    trial.wait_for("a Kafka backlog checkpoint", in_phase("kafka", True))
    trial.pause(2.0)
    down_s = trial.rng.uniform(2.0, BROKERS_DOWN_S)
    say(f"  brokers-down: {down_s:.1f} s at batch {len(trial.checkpoints())}")
    trial.broker.take_down()
    time.sleep(down_s)
    trial.broker.bring_up()
    trial.wait_for("live data", live_for(3, 0))
    leaders = [trial.rng.randrange(1, BROKERS + 1) for _ in range(PARTITIONS)]
    say(f"  leaders-moved: to brokers {leaders}")
    for partition, leader in enumerate(leaders):
        trial.broker.move_leader(TOPIC, partition, leader)
    seen = len(trial.checkpoints())
    trial.wait_for("live data after the leaders moved", live_for(3, seen))
    errors = [trial.rng.choice(REQUEST_ERRORS) for _ in range(6)]
    say(f"  request-errors: {errors}")
    trial.broker.fail_requests(FETCH, errors)
    trial.broker.fail_requests(LIST_OFFSETS, errors)
    seen = len(trial.checkpoints())
    trial.wait_for("live data after the request errors", live_for(3, seen))
    trial.finish()
    return FAULTS["broker"]


def malformed(trial: Trial) -> tuple[str, ...]:
    """Bad history files before the start, bad topic values in live data."""
    broken, mistyped = trial.rng.sample(sorted(trial.run.history.glob("*.parquet")), 2)
    say(f"  malformed-files: {broken.name} (not parquet), {mistyped.name} (amount as text)")
    broken.write_bytes(b"PAR1 this is not a parquet file")
    table = pq.read_table(mistyped)
    column = table.schema.get_field_index("amount")
    pq.write_table(table.set_column(column, "amount", table["amount"].cast(pa.string())), mistyped)
    trial.start()
    trial.wait_for("live data", live_for(3, 0))
    producer = Producer({"bootstrap.servers": trial.broker.bootstrap_servers})
    for value in BAD_VALUES:
        producer.produce(TOPIC, value=value, partition=trial.rng.randrange(PARTITIONS))
    if producer.flush(30) != 0:
        raise TrialFailed("the bad topic values were not delivered")
    say(f"  malformed-records: {len(BAD_VALUES)} values")
    seen = len(trial.checkpoints())
    trial.wait_for("live data after the bad values", live_for(3, seen))
    trial.finish()
    counted = sum(c.quarantined or 0 for c in trial.checkpoints())
    if counted != 2 + len(BAD_VALUES):
        raise TrialFailed(f"{counted} set aside in the metrics, not {2 + len(BAD_VALUES)}")
    return FAULTS["malformed"]


#: The events pipeline's kinds of trials; ``cdc`` runs whole in tools/faults/cdc_chaos.py.
KINDS: dict[str, Callable[[Trial], tuple[str, ...]]] = {
    "kills": kills,
    "database": database,
    "skew": skew,
    "broker": broker,
    "malformed": malformed,
}
FAULTS = {
    "kills": ("sigkill-files", "sigkill-kafka-backlog", "sigkill-live"),
    "database": ("database-away", "database-away-at-shutdown"),
    "skew": ("skewed-second-driver",),
    "broker": ("brokers-down", "leaders-moved", "request-errors"),
    "malformed": ("malformed-files", "malformed-records"),
    "cdc": cdc_chaos.FAULTS,
    # Not faults of their own: seeds (tools/faults/cdc_random), counted apart.
    "cdc-random": (),
}


def faketime_library() -> str | None:
    """Debian's libfaketime (package ``faketime``), if installed."""
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    return found[0] if found else None


def skewed_environment(ahead_s: float) -> dict[str, str]:
    library = faketime_library()
    if library is None:
        raise TrialFailed("libfaketime is missing (apt-get install faketime)")
    return job_environment() | {"LD_PRELOAD": library, "FAKETIME": f"+{ahead_s:g}s"}


def skewed_command(run: Run) -> list[str]:
    """The pipeline in this interpreter, its clock skewed; the JVM it starts is not (the
    preload is dropped before, as libfaketime stalls the JVM), nor needs to be: the lease
    is the driver's Python."""
    boot = (
        "import os, runpy, sys; os.environ.pop('LD_PRELOAD'); sys.argv[0] = 'backlog-events-job'; "
        "runpy.run_module('spark_jobs.jobs.events_pipeline', run_name='__main__')"
    )
    conf = [arg for key, value in run.spark_conf().items() for arg in ("--conf", f"{key}={value}")]
    return [sys.executable, "-c", boot, *run.job_args(), *conf]


# --- running the campaign -----------------------------------------------------------------


def extra_job_args(kind: str, root: Path) -> list[str]:
    if kind == "broker":
        return ["--stop-when-idle", BROKER_TRIAL_IDLE]
    if kind == "malformed":
        return ["--bad-records-path", str(root / "bad")]
    return []


def run_trial(
    kind: str, index: int, workdir: Path, events: int, rng: random.Random, metrics_url: str | None
) -> TrialResult:
    root = workdir / f"{kind}-{index}"
    shutil.rmtree(root, ignore_errors=True)  # a campaign run again starts afresh
    name = f"chaos-{kind}-{index}-{time.time_ns()}"
    brokers = BROKERS if kind == "broker" else 1
    with EmbeddedBroker(root / "broker", {TOPIC: PARTITIONS}, brokers=brokers) as broker:
        first_live_id = prepare_history(root / "history", events, 8)
        run = Run(
            name=name,
            root=root / "job",
            history=root / "history",
            metrics_url=metrics_url or f"sqlite:///{root / 'metrics' / 'metrics.db'}",
            conf=CONF,
            kafka=KafkaTopic(broker.bootstrap_servers, TOPIC, PARTITIONS),
            args=extra_job_args(kind, root),
        )
        run.root.mkdir(parents=True)
        (root / "metrics").mkdir()
        producer = KafkaProducerThread(
            broker.bootstrap_servers, TOPIC, PARTITIONS, first_live_id, events_per_s=600
        )
        trial = Trial(kind, run, producer, rng, broker)
        if kind in TOPIC_BACKLOG_KINDS:
            producer.burst(TOPIC_BACKLOG)
        producer.start()
        note = ""
        try:
            faults = KINDS[kind](trial)
            recovered = True
        except TrialFailed as failure:
            faults, recovered, note = FAULTS[kind], False, str(failure)
        finally:
            trial.producer.stop()
            if trial.job is not None and trial.job.poll() is None:
                trial.kill()
        inputs = Inputs(run.history, None, broker.bootstrap_servers, TOPIC)
        marks = [c.watermark for c in run.checkpoints() if c.watermark is not None]
        output = committed_output(run.root / "output")
        events = all_input(inputs)
        result = compare(output, events, WINDOW_S, max(marks, default=EPOCH))
        last_event = pd.Timestamp(events["event_time"].max()).to_pydatetime()
        watermark_behind_s = (last_event - result.watermark).total_seconds()
    recorded = [c.batch_id for c in run.checkpoints()]
    unrecorded = unrecorded_batches(run.root / "checkpoint" / "spark", recorded)
    if unrecorded:
        missing = f"committed without a metrics row: batches {unrecorded}"
        recovered, note = False, f"{note}; {missing}" if note else missing
    return TrialResult(
        kind,
        faults,
        recovered,
        result.lost,
        result.duplicated,
        result.compared,
        produced=result.produced,
        wrong_amounts=result.wrong_amounts,
        watermark_behind_s=watermark_behind_s,
        note=note,
    )


def run_cdc_trial(index: int, workdir: Path, rng: random.Random) -> TrialResult:
    """A ``cdc`` trial: ``compared`` counts the source table's rows, ``produced`` the
    versions in the change stream; a trial that failed counts for the faults it reached."""
    trial = cdc_chaos.run_trial(workdir / f"cdc-{index}", rng)
    check = trial.check
    return TrialResult(
        "cdc",
        trial.faults,
        trial.recovered,
        check.lost,
        check.duplicated,
        check.rows,
        produced=check.versions,
        differs=check.copy_differs + check.stream_differs,
        note=trial.note,
    )


def outcome_line(result: TrialResult) -> str:
    outcome = "recovered" if result.recovered else f"NOT recovered: {result.note}"
    if result.kind == "cdc":
        return (
            f"  {result.compared:,} rows and {result.produced:,} versions compared: lost "
            f"{result.lost} versions, duplicated {result.duplicated} changes, copy or stream "
            f"differs in {result.differs} keys, {outcome}"
        )
    return (
        f"  {result.compared:,} of {result.produced:,} events compared: lost "
        f"{result.lost}, duplicated {result.duplicated}, wrong amounts "
        f"{result.wrong_amounts}, final watermark {result.watermark_behind_s:.0f} s "
        f"before the last event, {outcome}"
    )


def summary(results: Sequence[TrialResult]) -> dict[str, dict[str, int]]:
    """Per fault: trials, events lost and duplicated (cdc: versions and changes), trials
    the job recovered from."""
    faults: dict[str, dict[str, int]] = {}
    for result in results:
        for fault in result.faults:
            counts = faults.setdefault(
                fault, {"trials": 0, "lost": 0, "duplicated": 0, "recovered": 0}
            )
            counts["trials"] += 1
            counts["lost"] += result.lost
            counts["duplicated"] += result.duplicated
            counts["recovered"] += result.recovered
    return faults


def table(faults: dict[str, dict[str, int]]) -> list[str]:
    lines = [f"{'fault':<28}{'trials':>8}{'lost':>8}{'duplicated':>12}{'recovered':>11}"]
    for fault, counts in faults.items():
        lines.append(
            f"{fault:<28}{counts['trials']:>8}{counts['lost']:>8}"
            f"{counts['duplicated']:>12}{counts['recovered']:>11}"
        )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=count_argument, default=10, help="trials of each kind")
    parser.add_argument(
        "--kinds",
        default="kills,database,broker,malformed,cdc",
        help=f"comma-separated kinds of trials, of {', '.join(FAULTS)} (default: all but skew)",
    )
    parser.add_argument("--events", type=count_argument, default=30_000, help="backlog events")
    parser.add_argument("--workdir", type=Path, default=Path("var/chaos"))
    parser.add_argument("--seed", type=int, default=None, help="for repeatable fault points")
    parser.add_argument(
        "--postgres-url", help="a PostgreSQL metrics database (needed by the 'skew' trials)"
    )
    parser.add_argument(
        "--cdc-driver",
        choices=cdc_campaign.DRIVERS,
        default="both",
        help="how cdc-random trials run the copy (default: both, one in five as the job)",
    )
    parser.add_argument(
        "--cdc-seeds",
        type=lambda text: [int(seed) for seed in text.split(",")],
        default=[],
        metavar="SEED,...",
        help="cdc-random: these seeds instead of --trials drawn ones",
    )
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        parser.error(f"--kinds {args.kinds!r}: choose among {', '.join(FAULTS)}")
    if "skew" in kinds and not args.postgres_url:
        parser.error("--kinds skew needs --postgres-url (SQLite's clock is each process's)")
    args.kinds = kinds
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    say(f"fault campaign: {args.trials} trial(s) of {', '.join(args.kinds)} (seed {seed})")
    results = []
    workdir = args.workdir.resolve()
    random_cdc: cdc_campaign.Summary | None = None
    for kind in args.kinds:
        if kind == "cdc-random":
            say(f"[cdc-random: {len(args.cdc_seeds) or args.trials} seed(s)]")
            random_results = cdc_campaign.run(
                args.trials, rng, workdir / "cdc-random", args.cdc_driver, args.cdc_seeds
            )
            random_cdc = cdc_campaign.Summary.of(random_results)
            continue
        for index in range(args.trials):
            say(f"[{kind} {index + 1}/{args.trials}]")
            if kind == "cdc":
                result = run_cdc_trial(index, workdir, rng)
            else:
                url = args.postgres_url if kind == "skew" else None
                result = run_trial(kind, index, workdir, args.events, rng, url)
            say(outcome_line(result))
            results.append(result)
    faults = summary(results)
    for line in table(faults):
        say(line)
    if random_cdc is not None:
        for line in cdc_campaign.table(random_cdc):
            say(line)
        faults["cdc-random"] = random_cdc.as_json()  # type: ignore[assignment]
    print(json.dumps(faults, sort_keys=True), flush=True)
    clean = all(
        r.recovered and r.lost == r.duplicated == r.wrong_amounts == r.differs == 0 for r in results
    )
    return 0 if clean and not (random_cdc and random_cdc.broken) else 1


if __name__ == "__main__":
    sys.exit(main())
