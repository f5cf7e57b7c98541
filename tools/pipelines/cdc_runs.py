"""Running the CDC pipeline with spark-submit on throwaway PostgreSQL servers, while a writer keeps
changing the table: for the demo's ``--live postgres-cdc`` and the benchmark's CDC case.

The source table and its copy live on two throwaway servers (``tools.services.postgres``), as a
table and its copy in a warehouse would: the changelog decodes the source server's whole WAL,
so a copy written there would make every snapshot chunk, which decodes the WAL written since
the snapshot began, slower than the last.

The pipeline records no event time of its own, so a live batch's freshness is read back from
the copy afterwards: each row keeps the ``_lsn`` of the change it reflects and the source's
``updated_at`` (when the writer changed it), and Spark's offset log says up to which commit
each batch read; a row belongs to the first batch that read past its change, and is fresh by
that batch's commit minus its ``updated_at``.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

import spark_jobs.jobs.cdc_pipeline as cdc_pipeline
from spark_jobs.jobs.events_pipeline import FRESHNESS_QUANTILES
from spark_jobs.jobs.startup import spark_submit_command
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.lsn import parse_lsn
from tools.data.cdc_data import Account, ChangeWriter, create_accounts, table_rows
from tools.pipelines.report import Checkpoint
from tools.pipelines.runs import checkpoints_so_far, follow, local_spark_conf, say
from tools.services.postgres import LOGICAL_DECODING, PostgresServer

#: Logical decoding, and commits flushed before they return: the changelog reads flushed WAL
#: only, so "everything written was read" can be checked right after the writer stops.
SERVER_SETTINGS = {**LOGICAL_DECODING, "synchronous_commit": "on"}


def cdc_server() -> PostgresServer:
    """The source's throwaway server for one demo or benchmark (``with cdc_server() as
    server``); starting it raises ``PostgresUnavailable`` naming the package to install."""
    return PostgresServer(database="bank", settings=SERVER_SETTINGS)


def target_server() -> PostgresServer:
    """The copy's throwaway server."""
    return PostgresServer(database="warehouse")


class WriterFeed:
    """A ``ChangeWriter`` as the live feed of ``tools.pipelines.runs.follow``."""

    def __init__(self, writer: ChangeWriter):
        self.writer = writer

    def is_alive(self) -> bool:
        return self.writer.running

    def stop(self) -> None:
        self.writer.stop()


@dataclass(frozen=True)
class Exactness:
    """The copy against the source table, key by key."""

    rows: int
    missing: int
    extra: int
    different: int

    @property
    def exact(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def verdict(self) -> str:
        if self.exact:
            return f"exact: the copy equals the source table ({self.rows:,} rows)"
        return (
            f"NOT exact: of {self.rows:,} source rows, {self.missing:,} missing from the copy, "
            f"{self.different:,} different; {self.extra:,} extra rows in the copy"
        )


def compare(source: Mapping[int, Account], copy: Mapping[int, Account]) -> Exactness:
    return Exactness(
        rows=len(source),
        missing=len(source.keys() - copy.keys()),
        extra=len(copy.keys() - source.keys()),
        different=sum(1 for key, row in source.items() if key in copy and copy[key] != row),
    )


def batch_ends(offsets: Path) -> dict[int, int]:
    """Per batch in Spark's offset log, the LSN its changelog read up to (its source
    position's ``lsn``; in the snapshot phase, where the changelog will start)."""
    ends = {}
    for path in offsets.iterdir() if offsets.is_dir() else ():
        if path.name.isdigit():
            position = json.loads(path.read_text().splitlines()[-1])["position"]
            ends[int(path.name)] = parse_lsn(position["lsn"])
    return ends


def live_event_times(
    checkpoints: Sequence[Checkpoint], ends: Mapping[int, int], changes: Iterable[tuple[int, float]]
) -> dict[int, list[float]]:
    """The ``(lsn, changed at)`` of rows in the copy, by the live batch that read each: the
    first whose end is at or after the change. Changes before the first live batch's start
    (the snapshot's) or after the last batch are left out."""
    live = [c.batch_id for c in checkpoints if not c.is_backlog and c.batch_id in ends]
    if not live:
        return {}
    before = ends.get(live[0] - 1)
    uppers = [ends[batch] for batch in live]
    found: dict[int, list[float]] = {batch: [] for batch in live}
    for lsn, changed_at in changes:
        if before is not None and lsn <= before:
            continue
        index = bisect.bisect_left(uppers, lsn)
        if index < len(live):
            found[live[index]].append(changed_at)
    return found


def quantiles(values: Sequence[float], fractions: Sequence[float] = FRESHNESS_QUANTILES) -> tuple:
    """Nearest-rank quantiles, as the pipeline's observed event-time quantiles (empty for
    no values)."""
    ordered = sorted(values)
    if not ordered:
        return ()
    return tuple(ordered[min(len(ordered) - 1, int(f * len(ordered)))] for f in fractions)


def with_freshness(
    checkpoints: Sequence[Checkpoint], times: Mapping[int, list[float]]
) -> list[Checkpoint]:
    """The checkpoints with the event-time quantiles of the changes each live batch read, so
    ``tools.pipelines.report``'s freshness and charts read them as the events pipeline's."""
    return [
        dataclasses.replace(c, event_time_quantiles_s=quantiles(times[c.batch_id]))
        if times.get(c.batch_id)
        else c
        for c in checkpoints
    ]


@dataclass
class CdcRun:
    """One launch of the CDC pipeline on a fresh table of ``url``'s database, copied into
    ``<table>_copy`` of ``target_url``'s."""

    name: str
    root: Path
    url: str
    target_url: str
    table: str
    metrics_url: str
    conf: dict[str, str]
    args: list[str] = field(default_factory=list)
    writer: ChangeWriter | None = None

    @property
    def copy_table(self) -> str:
        return f"{self.table}_copy"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    def command(self) -> list[str]:
        return spark_submit_command(
            cdc_pipeline.__file__,
            local_spark_conf(self.name, self.metrics_url, self.conf),
            *("--connection", self.url, "--table", self.table),
            *("--target", self.target_url, "--target-table", self.copy_table),
            *("--checkpoint", str(self.checkpoint)),
            *("--stop-when-idle", "3s", "--timeout", "20min"),
            *self.args,
        )

    def checkpoints(self) -> list[Checkpoint]:
        return checkpoints_so_far(self.metrics_url, self.name)

    def execute(
        self,
        rows: int,
        changes_per_s: float,
        seed: int,
        keep_going: Callable[[list[Checkpoint]], bool],
        rows_per_update: int = 1,
    ) -> list[Checkpoint]:
        """Create the table, start the writer (``rows_per_update`` rows in each of its
        updates), run the job until ``keep_going`` says enough; then stop the writer and let
        the job stop once it has read all and is idle. Returns the checkpoints with the live
        batches' freshness."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        started = time.monotonic()
        create_accounts(self.url, self.table, rows)
        say(
            f"[{self.name}] table {self.table}: {rows:,} rows in {time.monotonic() - started:.1f} s"
        )
        self.writer = ChangeWriter(
            self.url,
            self.table,
            transactions_per_s=changes_per_s,
            seed=seed,
            rows_per_update=rows_per_update,
        )
        log_path = self.root / "job.log"
        say(
            f"[{self.name}] a writer changes it {changes_per_s:g} times a second; "
            f"starting the job (Spark log: {log_path})"
        )
        feed = WriterFeed(self.writer.start())
        writing_since = time.monotonic()
        follow(self.name, self.command(), log_path, self.checkpoints, feed, keep_going)
        self.writer.stop()  # raises what ended it early, if anything
        writer_s = time.monotonic() - writing_since
        say(
            f"[{self.name}] the writer committed {self.writer.counts}: "
            f"{self.writer.rows_changed:,} rows changed, "
            f"{self.writer.rows_changed / writer_s:,.0f} a second"
        )
        return self.freshness(self.checkpoints())

    def freshness(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
        engine = make_engine(self.target_url)
        try:
            with engine.connect() as connection:
                changes = [
                    (lsn, changed_at.timestamp())
                    for lsn, changed_at in connection.execute(
                        sa.text(
                            f"SELECT _lsn, updated_at FROM {self.copy_table} WHERE _lsn IS NOT NULL"
                        )
                    )
                ]
        finally:
            engine.dispose()
        ends = batch_ends(self.checkpoint / "spark" / "offsets")
        return with_freshness(checkpoints, live_event_times(checkpoints, ends, changes))

    def verify(self) -> Exactness:
        """The copy against the table, once the writer stopped and the job stopped idle."""
        source = table_rows(self.url, self.table)
        return compare(source, table_rows(self.target_url, self.copy_table))

    def drop(self) -> None:
        """Drop the table and its copy, and remove the run's checkpoint."""
        for url, table in ((self.target_url, self.copy_table), (self.url, self.table)):
            engine = make_engine(url)
            try:
                with engine.begin() as connection:
                    connection.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))
            finally:
                engine.dispose()
        self.remove_checkpoint()

    def remove_checkpoint(self) -> None:
        """The checkpoint holds the snapshot's chunk files: useless once the server is gone."""
        shutil.rmtree(self.checkpoint, ignore_errors=True)
