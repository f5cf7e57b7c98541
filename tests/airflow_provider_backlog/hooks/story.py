"""A job's life in metrics rows, written through the schema's row types, for the reads and
the pages built on them to be checked against.

``orders`` (``NOW`` is 150 s after ``T0``):
- run ``r1`` (T0 to T0+50 s): 3 backlog checkpoints (``hybrid-phase``), a transition to
  live at T0+25 s, 3 live checkpoints; then its driver died (a later run took over);
- run ``r2`` (launched at T0+115 s, its lease live until T0+400 s, Spark UI): 2 checkpoints
  held in backlog by ``offset-lag``, a transition to live at T0+145 s, 1 live checkpoint; a
  reconfigure request at T0+130 s that it applied, and a live interval of 4 s chosen for its
  freshness target at T0+125 s;
- every checkpoint has its duration parts and state but ``r1``'s last, which its driver
  died before recording: ``r2`` rebuilt it (``recovered``, no sources, parts None).

``legacy``: 2 live checkpoints of run ``old-1`` without parts, its lease released.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy

from spark_jobs.metrics.schema import (
    CheckpointRow,
    IntervalChangeRow,
    TransitionRow,
    backlog_checkpoints,
    backlog_control,
    backlog_interval_changes,
    backlog_leases,
    backlog_transitions,
    make_engine,
    metadata,
    row_values,
)

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=150)
OPERATORS = [
    {"id": "read", "kind": "source", "source": "events", "inputs": [], "is_backlog": False},
    {"id": "count", "kind": "one-input", "source": None, "inputs": ["read"], "is_backlog": False},
]


def sources(is_backlog: bool, rule: str, behind: int, **health: str) -> str:
    source = {
        "name": "events",
        "is_backlog": is_backlog,
        "finished": False,
        "phase": "kafka",
        "lag": {"offsets_behind_latest": behind},
        "rule": rule,
    }
    return json.dumps([{**source, "health": health} if health else source])


def checkpoint(
    run_id: str, batch_id: int, at: datetime, backlog: bool, rows: int, **columns: object
) -> CheckpointRow:
    values: dict[str, object] = {
        "effective_interval_ms": 60_000 if backlog else 10_000,
        "batch_duration_ms": 1000,
        "sources": sources(backlog, "hybrid-phase", 5),
    }
    values.update(columns)
    return CheckpointRow(
        job_name="orders",
        run_id=run_id,
        batch_id=batch_id,
        committed_at=at,
        is_backlog=backlog,
        num_input_rows=rows,
        watermark=None,
        observed_metrics=None,
        **values,  # type: ignore[arg-type]
    )


def costs(batch: int) -> dict[str, int]:
    """Parts of a 1000 ms batch: 100 + 50 + 30 + 20 + 40 fixed, 700 data, 60 bookkeeping;
    state growing by 100 rows and 1 MiB a batch."""
    return {
        "latest_offset_ms": 100,
        "get_batch_ms": 50,
        "query_planning_ms": 30,
        "add_batch_ms": 700,
        "wal_commit_ms": 20,
        "commit_offsets_ms": 40,
        "sink_output_rows": 10,
        "state_rows_total": 100 * (batch + 1),
        "state_rows_updated": 100,
        "state_memory_bytes": 4096,
        "state_disk_bytes": 1_048_576 * (batch + 1),
        "state_commit_ms": 15,
    }


def seconds(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


ORDERS_CHECKPOINTS = [
    *(checkpoint("r1", i, seconds(10 * i), i < 3, 1000 * (i + 1), **costs(i)) for i in range(5)),
    checkpoint("r1", 5, seconds(50), False, 6000, sources="[]", recovered=True),
    *(
        checkpoint(
            "r2",
            6 + i,
            seconds(120 + 10 * i),
            True,
            500,
            sources=sources(True, "offset-lag", 90_000),
            **costs(6 + i),
        )
        for i in range(2)
    ),
    checkpoint(
        "r2",
        8,
        seconds(148),
        False,
        40,
        sources=sources(False, "offset-lag", 12, slot_wal_status="reserved"),
        **costs(8),
    ),
]
ORDERS_TRANSITIONS = [
    TransitionRow("orders", "r1", seconds(25), False, "hybrid-phase: events is live (kafka)"),
    TransitionRow(
        "orders",
        "r2",
        seconds(145),
        False,
        "offset-lag: events is live (kafka)",
        operators=json.dumps(OPERATORS),
    ),
]
ORDERS_INTERVAL_CHANGES = [
    IntervalChangeRow(
        "orders",
        "r2",
        seconds(125),
        4000,
        "freshness target 5s: 4.00s keeps p95 freshness at 4.70s over the last 3 live batches",
    )
]
LEGACY_CHECKPOINTS = [
    CheckpointRow(
        job_name="legacy",
        run_id="old-1",
        batch_id=i,
        committed_at=seconds(30 * i),
        is_backlog=False,
        effective_interval_ms=None,
        num_input_rows=5,
        batch_duration_ms=300,
        watermark=None,
        sources="[]",
        observed_metrics=None,
    )
    for i in range(2)
]
LEASES = [
    {
        "job_name": "orders",
        "checkpoint_location": "file:///checkpoints/orders",
        "run_id": "r2",
        "acquired_at": seconds(115),
        "expires_at": seconds(400),
        "spark_ui_url": "http://driver-2:4040",
        "released_at": None,
    },
    {
        "job_name": "legacy",
        "checkpoint_location": "file:///checkpoints/legacy",
        "run_id": "old-1",
        "acquired_at": seconds(-5),
        "expires_at": seconds(90),
        "spark_ui_url": None,
        "released_at": seconds(40),
    },
]
REQUEST = {
    "job_name": "orders",
    "requested_at": seconds(130),
    "action": "reconfigure",
    "settings": json.dumps({"spark.backlog.interval": "5s"}),
    "status": "applied",
    "answer": "interval 5 s from the next checkpoint",
    "answered_at": seconds(131),
    "answered_by_run": "r2",
    "for_run_id": None,
}


def write_story(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as connection:
        for table, rows in (
            (backlog_checkpoints, [*ORDERS_CHECKPOINTS, *LEGACY_CHECKPOINTS]),
            (backlog_transitions, ORDERS_TRANSITIONS),
            (backlog_interval_changes, ORDERS_INTERVAL_CHANGES),
        ):
            connection.execute(table.insert(), [row_values(row) for row in rows])
        connection.execute(backlog_leases.insert(), LEASES)
        connection.execute(backlog_control.insert(), [REQUEST])
    engine.dispose()


#: The columns this release added; a database of the release before lacks them.
ADDED = {
    "latest_offset_ms",
    "get_batch_ms",
    "query_planning_ms",
    "add_batch_ms",
    "wal_commit_ms",
    "commit_offsets_ms",
    "sink_output_rows",
    "sink_commit_ms",
    "state_rows_total",
    "state_rows_updated",
    "state_memory_bytes",
    "state_disk_bytes",
    "state_commit_ms",
    "state_operators",
    "operators",
}
#: The tables this release added.
ADDED_TABLES = {"backlog_interval_changes"}


def write_release_before(
    url: str, checkpoints: list[CheckpointRow], transitions: list[TransitionRow]
) -> None:
    """The tables as the release before created them (without ``ADDED`` and
    ``ADDED_TABLES``), with these rows."""
    old = sqlalchemy.MetaData()
    for table in metadata.sorted_tables:
        if table.name in ADDED_TABLES:
            continue
        sqlalchemy.Table(
            table.name,
            old,
            *(
                sqlalchemy.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
                for c in table.columns
                if c.name not in ADDED
            ),
        )
    engine = make_engine(url)
    metadata.drop_all(engine)
    old.create_all(engine)
    with engine.begin() as connection:
        for table, rows in ((backlog_checkpoints, checkpoints), (backlog_transitions, transitions)):
            values = [row_values(row) for row in rows]
            if not values:
                continue
            connection.execute(
                old.tables[table.name].insert(),
                [{k: v for k, v in row.items() if k not in ADDED} for row in values],
            )
    engine.dispose()
