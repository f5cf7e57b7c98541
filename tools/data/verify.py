"""Exactly-once, checked as a user would: the sink's committed windows against a batch
recomputation over every event that was written (history files, landing files, the topic).

The tests assert on the comparison; the fault campaign counts what it finds.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from confluent_kafka import Consumer, TopicPartition

from tools.data.events import EVENT_ARROW_SCHEMA

KEY = ["window_start", "account"]


@dataclass(frozen=True)
class Inputs:
    """Where a run's events were written."""

    history: Path
    landing: Path | None = None
    bootstrap_servers: str | None = None
    topic: str = "events"


@dataclass(frozen=True)
class Comparison:
    """The sink against the recomputation, in events: ``lost`` ones are missing from a
    window the final watermark closed, ``duplicated`` ones counted twice."""

    produced: int
    compared: int
    lost: int
    duplicated: int
    wrong_amounts: int
    watermark: datetime

    @property
    def exactly_once(self) -> bool:
        return self.lost == self.duplicated == self.wrong_amounts == 0


def committed_files(output: Path) -> list[str]:
    """The files of Spark's file sink at ``output`` that its log lists: only those hold
    committed rows (a killed batch may have left others)."""
    files: set[str] = set()
    log_dir = output / "_spark_metadata"
    for log_file in sorted(log_dir.iterdir()) if log_dir.exists() else ():
        if log_file.name.startswith("."):
            continue
        for line in log_file.read_text().splitlines()[1:]:
            files.add(json.loads(line)["path"].removeprefix("file://"))
    return sorted(files)


def committed_output(output: Path) -> pd.DataFrame:
    """The sink's rows as Spark's file sink commits them: only files its log lists."""
    files = committed_files(output)
    if not files:
        return normalise(pd.DataFrame(columns=[*KEY, "window_end", "events", "amount"]))
    table = ds.dataset(files, format="parquet").to_table()
    return normalise(table.to_pandas())


def all_input(inputs: Inputs) -> pd.DataFrame:
    """Every well-formed input event. What a job with a quarantine sets aside is left out
    by a rule of its own: history files must hold the event columns with exactly their
    types, topic values must be JSON objects with fields of those types."""
    parts = [
        table
        for path in sorted(inputs.history.glob("*.parquet"))
        if (table := _well_formed_parquet(path)) is not None
    ]
    parse = pa_json.ParseOptions(explicit_schema=EVENT_ARROW_SCHEMA)
    if inputs.landing is not None:
        for path in sorted(inputs.landing.glob("*.json")):
            parts.append(pa_json.read_json(path, parse_options=parse))
    if inputs.bootstrap_servers:
        values = b"\n".join(
            value
            for value in topic_values(inputs.bootstrap_servers, inputs.topic)
            if _is_event(value)
        )
        if values:
            parts.append(pa_json.read_json(io.BytesIO(values), parse_options=parse))
    return pa.concat_tables(
        [p.select(EVENT_ARROW_SCHEMA.names).cast(EVENT_ARROW_SCHEMA) for p in parts]
    ).to_pandas()


def _well_formed_parquet(path: Path) -> pa.Table | None:
    try:
        table = pq.read_table(path)
    except pa.ArrowException:
        return None
    for field in EVENT_ARROW_SCHEMA:
        if (
            field.name not in table.column_names
            or table.schema.field(field.name).type != field.type
        ):
            return None
    return table


#: What each event field may hold in a topic value's JSON object (null always).
_JSON_KINDS = {"event_id": int, "account": str, "amount": int | float, "event_time": str}


def _is_event(value: bytes) -> bool:
    """A JSON object whose event fields hold what their columns take."""
    try:
        event = json.loads(value)
    except ValueError:
        return False
    return isinstance(event, dict) and all(
        event.get(name) is None or isinstance(event[name], kind)
        for name, kind in _JSON_KINDS.items()
    )


def topic_values(bootstrap_servers: str, topic: str) -> list[bytes]:
    """Every record value of the topic, read with a plain consumer from the earliest offset;
    raises if the broker dropped any (its retention would make the comparison wrong)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": "backlog-verify",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {}
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if low != 0:
                raise RuntimeError(
                    f"partition {partition} lost records to retention (earliest {low})"
                )
            ends[partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes] = []
        left = sum(ends.values())
        while any(end > 0 for end in ends.values()):
            # No more than are left: consume() waits out its timeout for a batch it cannot fill.
            for message in consumer.consume(max(1, min(10_000, left)), timeout=10):
                if message.error() is not None:
                    raise RuntimeError(f"reading {topic}: {message.error()}")
                if message.offset() < ends[message.partition()]:
                    values.append(message.value())
                    left -= 1
                    if message.offset() == ends[message.partition()] - 1:
                        ends[message.partition()] = 0
        return values
    finally:
        consumer.close()


def windows(events: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """Events and amounts per account and tumbling event-time window."""
    width = pd.Timedelta(seconds=window_s)
    frame = events.assign(window_start=events["event_time"].dt.floor(width))
    grouped = (
        frame.groupby(KEY).agg(events=("event_id", "size"), amount=("amount", "sum")).reset_index()
    )
    grouped["window_end"] = grouped["window_start"] + width
    return normalise(grouped)


def closed_by(frame: pd.DataFrame, watermark: datetime) -> pd.DataFrame:
    return frame[frame["window_end"] <= pd.Timestamp(watermark)].reset_index(drop=True)


def normalise(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame[["window_start", "window_end", "account", "events", "amount"]].copy()
    for column in ("window_start", "window_end"):
        frame[column] = pd.to_datetime(frame[column], utc=True).dt.as_unit("us")
    frame["events"] = frame["events"].astype("int64")
    frame["amount"] = frame["amount"].astype("float64").round(6)
    return frame.sort_values(KEY).reset_index(drop=True)


def compare(
    output: pd.DataFrame, events: pd.DataFrame, window_s: float, watermark: datetime
) -> Comparison:
    """Every window the final ``watermark`` closed must be in ``output`` once, with the
    recomputed count and amount; a window written twice counts its events as duplicated."""
    expected = windows(events, window_s)
    written = output.groupby(KEY).agg(events=("events", "sum"), amount=("amount", "sum"))
    closed = closed_by(expected, watermark).set_index(KEY)
    both = expected.set_index(KEY).join(written, rsuffix="_written", how="outer").fillna(0)
    both = both[both.index.isin(closed.index) | (both["events_written"] > 0)]
    missing = (both["events"] - both["events_written"]).clip(lower=0)
    extra = (both["events_written"] - both["events"]).clip(lower=0)
    same_count = both["events"] == both["events_written"]
    wrong = same_count & ((both["amount"] - both["amount_written"]).abs() > 1e-6)
    return Comparison(
        produced=len(events),
        compared=int(closed["events"].sum()),
        lost=int(missing.sum()),
        duplicated=int(extra.sum()),
        wrong_amounts=int(wrong.sum()),
        watermark=watermark,
    )


def unrecorded_batches(spark_checkpoint: Path, recorded_batch_ids: Iterable[int]) -> list[int]:
    """Batches Spark committed (its commit log) that have no metrics row."""
    commits = spark_checkpoint / "commits"
    committed = (
        {int(p.name) for p in commits.iterdir() if p.name.isdigit()} if commits.exists() else set()
    )
    return sorted(committed - set(recorded_batch_ids))
