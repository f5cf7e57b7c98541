"""A snapshot chunk's planning time over a long snapshot, with the slot following it or not.

Each chunk is merged with the changes its read missed, found by peeking the slot, and a peek
decodes every change from the slot's position on. The ``postgres-cdc`` source commits each
snapshot batch's changelog position, so its slot stays about a batch behind; until then the
slot stayed where the snapshot began, and each chunk decoded every change written since.

Two sources read one table side by side for ``--minutes``, a batch of one chunk each every
``--round-s`` seconds, while a writer changes it at ``--changes-per-s`` transactions a second:

- ``follows``: the source as it is, Spark's commit of each batch passed on;
- ``stays``: the same source with no commit before its snapshot ends, which is where the
  previous release's slot stayed.

Prints each round's planning time of both, then their medians in the first and the last
minute, the WAL after each slot and kept for it at the end, and the load average; writes a
PNG chart of planning time against minutes into the snapshot. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadMaxRows

from spark_jobs.sources.cdc.connection import change_schema, describe, teardown
from spark_jobs.sources.hybrid import HybridStreamReader
from tools.data.cdc_data import ChangeWriter, create_accounts
from tools.pipelines.report import save_chart
from tools.services.postgres import LOGICAL_DECODING, PostgresServer

TABLE = "accounts"
WAYS = ("follows", "stays")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/cdc-planning-benchmark", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="snapshot length (10)")
    parser.add_argument("--round-s", type=float, default=6.0, help="seconds between batches (6)")
    parser.add_argument("--chunk-rows", type=int, default=20_000, help="rows per chunk (20,000)")
    parser.add_argument(
        "--changes-per-s", type=float, default=50.0, help="writer transactions per second (50)"
    )
    parser.add_argument(
        "--chart", type=Path, default=Path("cdc-planning.png"), help="the PNG chart's path"
    )
    args = parser.parse_args(argv)
    for name in ("minutes", "round_s", "chunk_rows", "changes_per_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be above 0")
    return args


def source(url: str, state: Path, chunk_rows: int) -> HybridStreamReader:
    """The ``postgres-cdc`` source of the table, as a query on checkpoint ``state`` reads it."""
    spec = {
        "name": "accounts",
        "kind": "postgres-cdc",
        "connection": url,
        "table": TABLE,
        "chunkRows": chunk_rows,
    }
    shape = describe("accounts", url, TABLE)
    options = {"sources": json.dumps([spec]), "stateLocation": str(state)}
    return HybridStreamReader(options, from_arrow_schema(change_schema(shape)))


class Snapshot:
    """One source's snapshot, a batch of one chunk at a time; each plan timed."""

    def __init__(self, reader: HybridStreamReader, commits: bool, chunk_rows: int):
        self.reader, self.commits, self._limit = reader, commits, ReadMaxRows(chunk_rows)
        self.offset = reader.initialOffset()
        #: (seconds since the snapshot began, planning seconds) per batch.
        self.plans: list[tuple[float, float]] = []

    @property
    def done(self) -> bool:
        return bool(self.offset["position"].get("done"))

    def next_batch(self, began: float) -> None:
        started = time.perf_counter()
        end = self.reader.latestOffset(self.offset, self._limit)
        self.plans.append((started - began, time.perf_counter() - started))
        if self.commits:
            self.reader.commit(end)
        self.offset = end

    def wal_bytes(self) -> dict[str, int]:
        """WAL after the slot's position (what its next peek decodes), and WAL the server
        keeps for it (from its ``restart_lsn``, which follows at the server's checkpoints)."""
        health = self.reader.children[0].replication_slot.health()
        return {"to_decode": health.trailing_wal_bytes, "kept": health.retained_wal_bytes}

    def close(self) -> None:
        child = self.reader.children[0]
        self.reader.stop()
        teardown(child.url, child.slot, child.publication, child.table)


def medians(plans: list[tuple[float, float]], first: bool) -> float:
    """The median planning time of the first (or last) minute's batches."""
    end = plans[-1][0]
    chosen = [p for at, p in plans if (at < 60 if first else at >= end - 60)]
    return statistics.median(chosen)


def plot(snapshots: dict[str, Snapshot], changes_per_s: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 4.5))
    labels = {
        "follows": "slot follows the snapshot's batches (this release)",
        "stays": "slot stays where the snapshot began (previous release)",
    }
    for (way, snapshot), colour in zip(snapshots.items(), ("#2b7bb9", "#b5651d"), strict=True):
        at = [started / 60 for started, _ in snapshot.plans]
        axis.plot(at, [p for _, p in snapshot.plans], ".-", color=colour, lw=1, label=labels[way])
    axis.set_ylim(0, None)
    axis.set_xlabel("minutes into the snapshot")
    axis.set_ylabel("planning time of a chunk (s)")
    axis.set_title(f"A snapshot chunk's planning time, {changes_per_s:g} transactions/s written")
    axis.legend(fontsize="small", loc="upper left")
    return save_chart(figure, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = max(2, round(args.minutes * 60 / args.round_s))
    rows = rounds * args.chunk_rows + 1  # one row more: no round finds the snapshot done
    with PostgresServer(database="shop", settings=LOGICAL_DECODING) as server:
        print(f"creating a table of {rows:,} rows", flush=True)
        create_accounts(server.url, TABLE, rows)
        with tempfile.TemporaryDirectory(prefix="cdc-planning-probe-") as scratch:
            snapshots = {
                way: Snapshot(
                    source(server.url, Path(scratch) / way, args.chunk_rows),
                    way == "follows",
                    args.chunk_rows,
                )
                for way in WAYS
            }
            writer = ChangeWriter(server.url, TABLE, transactions_per_s=args.changes_per_s)
            try:
                writer.start()
                began = time.perf_counter()
                for index in range(rounds):
                    for snapshot in snapshots.values():
                        snapshot.next_batch(began)
                    print(
                        f"round {index + 1}/{rounds}, planning (s): "
                        + ", ".join(f"{w} {s.plans[-1][1]:.3f}" for w, s in snapshots.items())
                        + f" (load average {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                    time.sleep(max(0.0, began + (index + 1) * args.round_s - time.perf_counter()))
                wal = {way: s.wal_bytes() for way, s in snapshots.items()}
            finally:
                writer.stop()
                for snapshot in snapshots.values():
                    snapshot.close()
    summary = {
        "minutes": round(snapshots["follows"].plans[-1][0] / 60, 2),
        "chunk_rows": args.chunk_rows,
        "changes_per_s": args.changes_per_s,
        "writer_transactions": writer.transactions,
        "planning_s": {
            way: {
                "first_minute_median": round(medians(s.plans, first=True), 3),
                "last_minute_median": round(medians(s.plans, first=False), 3),
            }
            for way, s in snapshots.items()
        },
        "slot_wal_bytes": wal,
        "chart": str(plot(snapshots, args.changes_per_s, args.chart)),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
