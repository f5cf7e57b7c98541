"""Where a checkpoint's fixed cost goes: the events pipeline on many tiny batches, side by
side under several modes and settings, in one Spark session.

Tiny batches (40 of a few thousand rows by default) make each batch's time mostly the
fixed cost of a checkpoint, so the per-batch time measured here is what every batch pays
whatever its size. Every variant runs the pipeline's query (the hybrid source over the
same parquet backlog, the event-time windowed aggregation, the parquet sink) on a fresh
checkpoint; the variants take turns, round after round, so that a machine busy with
other work slows them alike, and the figures are medians over rounds.

Modes:
- ``plain``: the query alone, back to back, its batches capped by ``maxRowsPerTrigger``;
- ``recorded``: the same under the runtime's record-only coordinator (listener, decider,
  metrics rows), as the static baselines run;
- ``gated``: backlog-aware, with ``interval-during-backlog = 0`` and the same rows as the
  cap, so the coordinator releases the same batches through its plan file.

Per batch it reports the cycle (commit to commit: what a backlog drain pays per batch),
the gap between a commit and the next start (the gate's wait for the next plan, the
trigger's tick), Spark's ``durationMs`` parts, the state store's commit and, in the
coordinated modes, the driver's handling of each batch's progress. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from spark_jobs.backlog.values import count_argument
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.coordinator.runtime import NO_DATA_BATCHES, BacklogRuntime
from spark_jobs.jobs import events_pipeline
from spark_jobs.jobs.startup import JavaMissing, prepare_driver_environment, require_java
from spark_jobs.sources.hybrid import HybridDataSource
from tools.data.events import history_range, write_history
from tools.pipelines.runs import say

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
SHUFFLE = "spark.sql.shuffle.partitions"
#: The pipeline's settings before this probe: what "today" is measured as.
TODAY = {PROVIDER: ROCKSDB, CHANGELOG: "true", SHUFFLE: "4"}
#: Spark's durationMs parts, in the order a batch runs them.
PARTS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
#: Batches of each run left out: the first ones start things up (codegen, Python workers).
WARM_UP = 2


@dataclass(frozen=True)
class Variant:
    name: str
    mode: str
    conf: Mapping[str, str] = field(default_factory=dict)
    #: The pipeline's own arguments, such as ``--rows-per-partition``.
    args: tuple[str, ...] = ()


#: In a variant's arguments: half the rows of a batch, so that both cores read it.
HALF_BATCH = "HALF"
#: The settings adopted from this probe: one shuffle partition per core of local[2].
TUNED = TODAY | {SHUFFLE: "2"}

#: What the probe compares by default: the coordinator's overhead on today's settings,
#: then settings that might move the fixed cost, each on its own, then together.
VARIANTS = (
    Variant("plain", "plain", TODAY),
    Variant("recorded", "recorded", TODAY),
    Variant("gated", "gated", TODAY),
    Variant("shuffle-2", "plain", TODAY | {SHUFFLE: "2"}),
    Variant("shuffle-1", "plain", TODAY | {SHUFFLE: "1"}),
    Variant("rocksdb-no-changelog", "plain", TODAY | {CHANGELOG: "false"}),
    Variant("hdfs", "plain", TODAY | {PROVIDER: HDFS}),
    Variant("hdfs-shuffle-2", "plain", TODAY | {PROVIDER: HDFS, SHUFFLE: "2"}),
    Variant(
        "checkpoint-v2",
        "plain",
        TODAY | {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"},
    ),
    Variant("no-codegen", "plain", TODAY | {"spark.sql.codegen.wholeStage": "false"}),
    Variant("tuned", "plain", TUNED, ("--rows-per-partition", HALF_BATCH)),
    Variant("tuned-gated", "gated", TUNED, ("--rows-per-partition", HALF_BATCH)),
)


@dataclass(frozen=True)
class RunCost:
    """One run's per-batch medians, in milliseconds, over its batches after the warm-up."""

    batches: int
    cycle_ms: float
    gap_ms: float
    trigger_ms: float
    parts_ms: Mapping[str, float]
    state_commit_ms: float
    handling_ms: float | None


def run_cost(progress: Sequence[BatchProgress], handling_ms: Iterable[float] = ()) -> RunCost:
    """Medians over the batches after the warm-up: commit-to-commit cycle, the gap from a
    commit to the next start, Spark's parts, the state commit (summed over operators and
    partitions) and the driver's handling."""
    batches = sorted((p for p in progress if p.cost.add_batch_ms is not None), key=_batch_id)
    measured = batches[WARM_UP:]
    if len(measured) < 2:
        raise ValueError(f"{len(batches)} batches: too few to measure after {WARM_UP} warm-up")
    cycles, gaps = [], []
    for before, after in itertools.pairwise(measured):
        cycles.append((after.committed_at - before.committed_at).total_seconds() * 1000)
        gaps.append((after.started_at - before.committed_at).total_seconds() * 1000)
    parts = {name: statistics.median(_part(p, name) for p in measured) for name in PARTS}
    handled = list(handling_ms)
    return RunCost(
        batches=len(measured),
        cycle_ms=statistics.median(cycles),
        gap_ms=statistics.median(gaps),
        trigger_ms=statistics.median(p.duration_ms for p in measured),
        parts_ms=parts,
        state_commit_ms=statistics.median(
            sum(op.commit_ms for op in p.state_operators) for p in measured
        ),
        handling_ms=statistics.median(handled) if handled else None,
    )


def _batch_id(progress: BatchProgress) -> int:
    return progress.batch_id


def _part(progress: BatchProgress, name: str) -> int:
    cost = progress.cost
    value = {
        "latestOffset": cost.latest_offset_ms,
        "getBatch": cost.get_batch_ms,
        "queryPlanning": cost.query_planning_ms,
        "walCommit": cost.wal_commit_ms,
        "addBatch": cost.add_batch_ms,
        "commitOffsets": cost.commit_offsets_ms,
    }[name]
    return value or 0


def combine(runs: Sequence[RunCost]) -> RunCost:
    """A variant's figures over its rounds: the median of each figure."""
    handled = [r.handling_ms for r in runs if r.handling_ms is not None]
    return RunCost(
        batches=sum(r.batches for r in runs),
        cycle_ms=statistics.median(r.cycle_ms for r in runs),
        gap_ms=statistics.median(r.gap_ms for r in runs),
        trigger_ms=statistics.median(r.trigger_ms for r in runs),
        parts_ms={name: statistics.median(r.parts_ms[name] for r in runs) for name in PARTS},
        state_commit_ms=statistics.median(r.state_commit_ms for r in runs),
        handling_ms=statistics.median(handled) if handled else None,
    )


def table(costs: Mapping[str, RunCost], baseline: str) -> list[str]:
    """One line per variant, in milliseconds per batch, and its cycle against the baseline."""
    base = costs[baseline].cycle_ms
    header = ["variant", "cycle", "x " + baseline, "gap", "batch", *PARTS, "state", "driver"]
    lines = ["  ".join(f"{h:>13}" for h in header)]
    for name, cost in costs.items():
        cells = [
            name,
            f"{cost.cycle_ms:.0f}",
            f"{cost.cycle_ms / base:.2f}",
            f"{cost.gap_ms:.0f}",
            f"{cost.trigger_ms:.0f}",
            *(f"{cost.parts_ms[p]:.0f}" for p in PARTS),
            f"{cost.state_commit_ms:.0f}",
            "-" if cost.handling_ms is None else f"{cost.handling_ms:.1f}",
        ]
        lines.append("  ".join(f"{c:>13}" for c in cells))
    return lines


def summary(costs: Mapping[str, RunCost], baseline: str) -> dict[str, object]:
    base = costs[baseline].cycle_ms
    return {
        "baseline": baseline,
        "cycle_ms": {n: round(c.cycle_ms, 1) for n, c in costs.items()},
        "cycle_ratio": {n: round(c.cycle_ms / base, 3) for n, c in costs.items()},
        "gap_ms": {n: round(c.gap_ms, 1) for n, c in costs.items()},
        "parts_ms": {n: {p: round(v, 1) for p, v in c.parts_ms.items()} for n, c in costs.items()},
        "state_commit_ms": {n: round(c.state_commit_ms, 1) for n, c in costs.items()},
        "driver_handling_ms": {
            n: None if c.handling_ms is None else round(c.handling_ms, 1) for n, c in costs.items()
        },
    }


# --- running --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    spark: SparkSession
    root: Path
    history: Path
    batches: int
    batch_rows: int

    def run(self, variant: Variant, label: str) -> RunCost:
        """One run of ``variant`` on a fresh checkpoint until the backlog is read."""
        base = self.root / label
        shutil.rmtree(base, ignore_errors=True)
        (base / "landing").mkdir(parents=True)
        args = events_pipeline.parse_args(
            [
                "--history",
                str(self.history),
                "--landing",
                str(base / "landing"),
                "--output",
                str(base / "output"),
                "--checkpoint",
                str(base / "checkpoint"),
                *(
                    []
                    if variant.mode == "gated"
                    else ["--static-trigger", "0", "--static-max-rows", str(self.batch_rows)]
                ),
                *(
                    str(max(1, self.batch_rows // 2)) if arg == HALF_BATCH else arg
                    for arg in variant.args
                ),
            ]
        )
        backlog = {
            "spark.backlog.job-name": label,
            "spark.backlog.metrics.url": f"sqlite:///{base}/metrics.db",
            "spark.backlog.checkpointing.interval": "1s",
            "spark.backlog.checkpointing.interval-during-backlog": "0",
            "spark.backlog.checkpointing.max-batch-rows": str(self.batch_rows),
        }
        conf = {**variant.conf, NO_DATA_BATCHES: "false"}
        if variant.mode != "plain":
            conf |= backlog
        for key, value in conf.items():
            self.spark.conf.set(key, value)
        runtime: BacklogRuntime | None = None
        query: StreamingQuery | None = None
        try:
            if variant.mode == "plain":
                self.spark.dataSource.register(HybridDataSource)
                query = self._writer(None, args).trigger(processingTime="0 seconds").start()
            else:
                runtime = BacklogRuntime(self.spark)
                runtime.hold_lease(str(base / "checkpoint"))
                writer = self._writer(runtime, args)
                if variant.mode == "gated":
                    query = runtime.start_gated(writer)
                else:
                    query = runtime.start_static(writer, 0.0)
            progress = self._until_read(query, label)
        finally:
            if runtime is not None:
                runtime.close()
            elif query is not None:
                query.stop()
            for key in conf:
                self.spark.conf.unset(key)
        coordinator = runtime.coordinator if runtime is not None else None
        handling = [ms for _, ms in coordinator.handling_ms] if coordinator else []
        return run_cost(progress, handling[WARM_UP:])

    def _writer(self, runtime: BacklogRuntime | None, args: argparse.Namespace) -> DataStreamWriter:
        events = events_pipeline.read_events(self.spark, runtime, args)  # type: ignore[arg-type]
        return (
            events_pipeline.windowed_totals(events, args)
            .writeStream.format("parquet")
            .outputMode("append")
            .option("path", args.output)
            .option("checkpointLocation", f"{args.checkpoint}/spark")
        )

    def _until_read(self, query: StreamingQuery, label: str) -> list[BatchProgress]:
        """Wait until every backlog row was read; the query's own progress, parsed."""
        total = self.batches * self.batch_rows
        # Generous: a machine busy with other work may read no more than 1,000 rows a second.
        deadline = time.monotonic() + 120 + total / 1000
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"{label}: the query failed: {query.exception()}")
            progress = [BatchProgress.from_json(p.json) for p in query.recentProgress]
            if sum(p.num_input_rows for p in progress) >= total:
                return [p for p in progress if p.num_input_rows > 0]
            time.sleep(0.2)
        raise RuntimeError(f"{label}: the backlog was not read within the time allowed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/cost-benchmark", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("var/cost-benchmark"))
    parser.add_argument("--batches", type=count_argument, default=40)
    parser.add_argument("--batch-rows", type=count_argument, default=4000)
    parser.add_argument("--rounds", type=count_argument, default=2)
    names = [v.name for v in VARIANTS]
    parser.add_argument(
        "--variants", nargs="+", choices=names, default=names, help="which to run, in turn"
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="for the session"
    )
    args = parser.parse_args(argv)
    prepare_driver_environment()
    try:
        require_java()
    except JavaMissing as error:
        print(f"scripts/cost-benchmark: {error}", file=sys.stderr)
        return 2
    root = args.workdir.resolve()
    history = root / "history"
    shutil.rmtree(history, ignore_errors=True)
    total = args.batches * args.batch_rows
    say(f"writing a backlog of {total:,} events ({args.batches} batches of {args.batch_rows:,})")
    write_history(history, total, max(1, args.batches // 5), *history_range(datetime.now(UTC)))
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("cost-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    probe = Probe(spark, root, history, args.batches, args.batch_rows)
    chosen = [v for v in VARIANTS if v.name in args.variants]
    runs: dict[str, list[RunCost]] = {v.name: [] for v in chosen}
    try:
        # A first run nobody measures: the JVM's and the Python workers' warm-up.
        say("warming up")
        probe.run(chosen[0], "warm-up")
        for round_no in range(1, args.rounds + 1):
            # Every other round in reverse order, so that a load rising or falling through
            # a round weighs on all variants alike.
            for variant in chosen if round_no % 2 else reversed(chosen):
                cost = probe.run(variant, f"{variant.name}-{round_no}")
                runs[variant.name].append(cost)
                say(
                    f"round {round_no} {variant.name:>22}: {cost.cycle_ms:6.0f} ms a batch "
                    f"(gap {cost.gap_ms:.0f}, addBatch {cost.parts_ms['addBatch']:.0f}, "
                    f"state commit {cost.state_commit_ms:.0f})"
                )
    finally:
        spark.stop()
    costs = {name: combine(found) for name, found in runs.items()}
    baseline = "plain" if "plain" in costs else chosen[0].name
    say("")
    say(f"median ms per batch over {args.rounds} round(s) of {args.batches} batches:")
    for line in table(costs, baseline):
        say(line)
    say(json.dumps(summary(costs, baseline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
