import base64
import json
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from pyspark.sql.pandas.types import to_arrow_schema

from spark_jobs.sources import kafka, kafka_ranges
from spark_jobs.sources.children import ChildSpecError, Limits, SourceContext
from spark_jobs.sources.kafka import KafkaChild, _share, parse_starting_offsets
from spark_jobs.sources.kafka_ranges import (
    JSON_METADATA_PREFIX,
    RECORD_COLUMNS,
    KafkaRangePartition,
    KafkaReadError,
)
from spark_jobs.sources.quarantine import OFFSET_FIELD, count_set_aside
from spark_jobs.storage.files import resolve_uri
from tests.spark_jobs.sources.conftest import SPARK_SCHEMA, rows
from tools.services.broker import FETCH, LIST_OFFSETS, EmbeddedBroker

REPO = Path(__file__).resolve().parents[3]
EVENTS = "events"
EVENT_PARTITIONS = 4
#: One partition that is overflowed past the broker's retention to lose data.
SMALL = "small"
EVENT_COLUMNS = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")
JSON_SCHEMA = pa.schema(
    [
        *EVENT_COLUMNS,
        pa.field("kafka_offset", pa.int64()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_topic", pa.string()),
    ]
)
PRODUCED_AT = datetime(2026, 11, 1, tzinfo=UTC)
NO_EVENT = {"event_id": None, "account": None, "amount": None, "event_time": None}


# --- brokers, records and children -----------------------------------------------------------


@pytest.fixture
def embedded_broker(tmp_path):
    with EmbeddedBroker(tmp_path / "broker", {EVENTS: EVENT_PARTITIONS, SMALL: 1}) as running:
        yield running


@pytest.fixture
def broker(embedded_broker):
    return embedded_broker.bootstrap_servers


def produce(
    servers: str,
    partition: int,
    values: list[bytes | None],
    topic: str = EVENTS,
    keys: list[bytes | None] | None = None,
    timestamps: list[int] | None = None,
) -> None:
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    for i, value in enumerate(values):
        extra = {"timestamp": timestamps[i]} if timestamps else {}
        key = keys[i] if keys else None
        producer.produce(topic, value=value, key=key, partition=partition, **extra)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def event_values(first: int, count: int) -> list[bytes]:
    return [
        json.dumps(
            {**row, "event_time": row["event_time"].isoformat().replace("+00:00", "Z")},
            separators=(",", ":"),
        ).encode()
        for row in rows(first, count)
    ]


def produce_events(servers: str, partition: int, first: int, count: int) -> None:
    """Events ``first..first+count`` as JSON values into one partition of ``events``."""
    produce(servers, partition, event_values(first, count))


def expected_rows(partition: int, first: int, count: int) -> list[dict]:
    """The rows of ``produce_events(servers, partition, first, count)`` into an empty partition."""
    return [
        {**row, "kafka_offset": offset, "kafka_partition": partition, "kafka_topic": EVENTS}
        for offset, row in enumerate(rows(first, count))
    ]


def watermarks(servers: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "watermarks"})
    try:
        return consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
    finally:
        consumer.close()


def overflow_small_topic(servers: str) -> int:
    """Produce past the broker's ~5 MiB per partition; returns the new earliest offset."""
    produce(servers, 0, [b"x" * 100] * 60_000, topic=SMALL)
    low, high = watermarks(servers, SMALL, 0)
    assert 0 < low < high == 60_000
    return low


def spec(servers: str = "127.0.0.1:9", **fields) -> dict:
    return {
        "name": "live",
        "bootstrapServers": servers,
        "topics": [EVENTS],
        "startingOffsets": "earliest",
        "valueFormat": "json",
        **fields,
    }


def context(state: Path | None, schema: pa.Schema = JSON_SCHEMA, rows_per_partition: int = 1000):
    return SourceContext(schema, str(state) if state else None, rows_per_partition)


@pytest.fixture
def make_child(broker, tmp_path):
    """Children on the broker, stateLocation ``tmp_path/state`` unless told; their consumers
    are closed before the broker stops."""
    made: list[KafkaChild] = []

    def make(
        state: str | None = "state",
        schema: pa.Schema = JSON_SCHEMA,
        rows_per_partition: int = 1000,
        **fields,
    ) -> KafkaChild:
        location = tmp_path / state if state else None
        child = KafkaChild.from_spec(
            spec(broker, **fields), context(location, schema, rows_per_partition)
        )
        made.append(child)
        return child

    yield make
    for child in made:
        child.close()


def read_table(child: KafkaChild, start: dict, end: dict, schema=JSON_SCHEMA) -> pa.Table:
    """The batch's rows by partition and offset: a task reading several partitions hands
    them over in the order their fetches arrive, each partition's in offset order."""
    batches = [batch for piece in child.partitions(start, end) for batch in piece.read(schema)]
    for batch in batches:
        assert batch.schema == schema
    table = pa.Table.from_batches(batches, schema)
    prefix = "" if "partition" in schema.names else JSON_METADATA_PREFIX
    topic, partition, offset = (f"{prefix}{n}" for n in ("topic", "partition", "offset"))
    if not {topic, partition, offset} <= set(schema.names):
        return table
    read: dict[tuple[str, int], list[int]] = {}
    for t, p, o in zip(*(table[c].to_pylist() for c in (topic, partition, offset)), strict=True):
        read.setdefault((t, p), []).append(o)
    assert all(offsets == sorted(offsets) for offsets in read.values()), read
    return table.sort_by([(topic, "ascending"), (partition, "ascending"), (offset, "ascending")])


def positions(offsets: list[int], topic: str = EVENTS) -> dict:
    return {topic: {str(p): offset for p, offset in enumerate(offsets)}}


def lag(behind: list[int]) -> dict:
    return {
        "offsets_behind_latest": sum(behind),
        "max_offsets_behind_latest": max(behind),
        "partitions": {f"{EVENTS}/{p}": n for p, n in enumerate(behind)},
    }


# --- starting offsets ------------------------------------------------------------------------


def test_earliest_starts_at_each_partitions_earliest_available_offset(broker, make_child):
    produce_events(broker, 1, 0, 2)
    low = overflow_small_topic(broker)
    child = make_child(topics=[EVENTS, SMALL], valueFormat="raw", schema=RECORD_COLUMNS)
    start = child.initial_position()
    assert start == {**positions([0, 0, 0, 0]), SMALL: {"0": low}}
    assert child.plan(start, Limits()).end == {**positions([0, 2, 0, 0]), SMALL: {"0": 60_000}}
    # Reading from there starts at the first record still kept.
    end = {**positions([0, 2, 0, 0]), SMALL: {"0": low + 3}}
    offsets = read_table(child, start, end, RECORD_COLUMNS).column("offset").to_pylist()
    assert offsets == [0, 1, low, low + 1, low + 2]


def test_latest_is_resolved_once_and_kept_in_the_state_location(broker, make_child):
    for partition, count in enumerate([2, 0, 3, 1]):
        produce_events(broker, partition, 0, count)
    first = make_child(startingOffsets="latest")
    assert first.initial_position() == positions([2, 0, 3, 1])
    produce_events(broker, 0, 2, 5)
    produce_events(broker, 1, 0, 1)
    assert make_child(startingOffsets="latest").initial_position() == positions([2, 0, 3, 1])
    # A new state location resolves the end of now.
    fresh = make_child(state="other-state", startingOffsets="latest")
    assert fresh.initial_position() == positions([7, 1, 3, 1])


def test_explicit_offsets_resolve_numbers_earliest_latest_and_left_out(broker, make_child):
    for partition in range(EVENT_PARTITIONS):
        produce_events(broker, partition, partition * 10, 3)
    offsets = {"events": {"0": 1, "1": -2, "2": -1}}
    for index, starting in enumerate((json.dumps(offsets), offsets)):
        child = make_child(startingOffsets=starting, state=f"state-{index}")
        start = child.initial_position()
        assert start == positions([1, 0, 3, 0])
        end = child.plan(start, Limits()).end
        ids = read_table(child, start, end).column("event_id").to_pylist()
        assert ids == [1, 2, 10, 11, 12, 30, 31, 32]


@pytest.mark.parametrize(
    ("starting", "shown"),
    [
        ("latest", "'latest'"),
        (" Latest ", "'latest'"),
        (None, "'latest'"),
        ("earliest", "'earliest'"),
        ({"events": {"0": 5, "1": -1}}, "{'events': {'0': 5, '1': -1}}"),
    ],
    ids=["latest", "spaced", "default", "earliest", "explicit-latest"],
)
def test_offsets_resolved_against_the_brokers_need_a_state_location(starting, shown):
    fields = spec(startingOffsets=starting)
    if starting is None:
        del fields["startingOffsets"]
    with pytest.raises(ChildSpecError) as raised:
        KafkaChild.from_spec(fields, context(None))
    assert str(raised.value).startswith(
        f"child source 'live': startingOffsets {shown} is resolved against the brokers once"
    )


def test_explicit_numbers_need_no_state_location(broker, make_child):
    produce_events(broker, 0, 0, 3)
    child = make_child(startingOffsets={"events": {"0": 1, "1": 0, "2": 0, "3": 0}}, state=None)
    assert child.initial_position() == positions([1, 0, 0, 0])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("newest", "startingOffsets = 'newest' must be 'earliest', 'latest' or a JSON object"),
        ("42", "startingOffsets = 42 must be"),
        (42, "startingOffsets = 42 must be"),
        ("[1, 2]", "startingOffsets = [1, 2] must be"),
        ({"other": {"0": 1}}, "startingOffsets names topic 'other', which is not among the"),
        ({"events": {"0": -3}}, "startingOffsets['events'] = {'0': -3} must map partition"),
        ({"events": {"x": 1}}, "startingOffsets['events'] = {'x': 1} must map partition"),
        ({"events": {"0": True}}, "startingOffsets['events'] = {'0': True} must map"),
        ({"events": {"0": "5"}}, "startingOffsets['events'] = {'0': '5'} must map"),
        ('{"events": 5}', "startingOffsets['events'] = 5 must map"),
    ],
)
def test_bad_starting_offsets_are_refused_naming_the_value(value, message):
    with pytest.raises(ChildSpecError, match=re.escape(f"child source 'live': {message}")):
        KafkaChild.from_spec(spec(startingOffsets=value), context(None))


def test_broken_json_starting_offsets_are_refused_naming_the_text():
    text = '{"events": {"0": 1}'
    with pytest.raises(ChildSpecError, match=re.escape(f"startingOffsets = {text!r}")):
        parse_starting_offsets("live", text, [EVENTS])


def test_starting_offsets_keywords_and_partition_keys_are_normalised():
    assert parse_starting_offsets("live", " EARLIEST ", [EVENTS]) == "earliest"
    assert parse_starting_offsets("live", {"events": {0: 5, "1": -1}}, [EVENTS]) == {
        "events": {"0": 5, "1": -1}
    }


# --- planning --------------------------------------------------------------------------------


@pytest.fixture
def waiting(broker) -> str:
    """60, 30, 10 and 0 records wait in the partitions of ``events``."""
    for partition, count in enumerate([60, 30, 10, 0]):
        produce_events(broker, partition, partition * 100, count)
    return broker


#: A row limit -> the rows taken from each partition while 60, 30, 10 and 0 wait.
SHARES = {
    10: [6, 3, 1, 0],
    7: [5, 2, 0, 0],  # rounding leftovers go to the partition with most left behind
    1: [1, 0, 0, 0],
    99: [60, 30, 9, 0],
    100: [60, 30, 10, 0],
    1000: [60, 30, 10, 0],
}


def test_a_row_limit_is_shared_in_proportion_to_what_waits(waiting, make_child):
    child = make_child()
    start = child.initial_position()
    for limit, takes in SHARES.items():
        planned = child.plan(start, Limits(max_rows=limit))
        assert planned.end == positions(takes), limit
        behind = [waits - take for waits, take in zip([60, 30, 10, 0], takes, strict=True)]
        assert planned.lag == lag(behind), limit
    end = child.plan(start, Limits(max_rows=7)).end
    assert read_table(child, start, end).column("event_id").to_pylist() == [
        *range(0, 5),
        100,
        101,
    ]


def test_a_limit_from_a_later_start_follows_what_is_left_then_takes_everything(waiting, make_child):
    child = make_child(startingOffsets={"events": {"0": 50, "1": 25}})
    start = child.initial_position()
    assert start == positions([50, 25, 0, 0])
    # 10, 5, 10 and 0 wait: floors 2, 1, 2, 0 and the leftover to the first most behind.
    planned = child.plan(start, Limits(max_rows=6))
    assert planned.end == positions([53, 26, 2, 0])
    assert planned.lag == lag([7, 4, 8, 0])
    everything = child.plan(planned.end, Limits())
    assert everything.end == positions([60, 30, 10, 0])
    assert everything.lag == lag([0, 0, 0, 0])


def test_planning_from_the_end_returns_the_same_end_until_records_arrive(waiting, make_child):
    child = make_child()
    end = child.plan(child.initial_position(), Limits()).end
    again = child.plan(end, Limits(max_rows=5))
    assert again.end == end
    assert again.lag == lag([0, 0, 0, 0])
    produce_events(waiting, 3, 1000, 2)
    assert child.plan(end, Limits()).end == positions([60, 30, 10, 2])


def test_a_partition_missing_from_the_start_joins_at_its_earliest_offset_next_batch(
    waiting, make_child
):
    child = make_child()
    start = {EVENTS: {"0": 58}}
    planned = child.plan(start, Limits())
    assert planned.end == positions([60, 0, 0, 0])
    assert planned.lag == lag([0, 30, 10, 0])
    assert read_table(child, start, planned.end).column("event_id").to_pylist() == [58, 59]
    following = child.plan(planned.end, Limits(max_rows=4))
    assert following.end == positions([60, 3, 1, 0])


def test_partitions_gone_from_the_brokers_fail_the_plan(broker, make_child):
    child = make_child()
    with pytest.raises(KafkaReadError, match=re.escape("partitions [('events', '9')] were read")):
        child.plan({EVENTS: {"0": 0, "9": 0}}, Limits())


@pytest.mark.parametrize(
    ("available", "limit", "takes"),
    [
        ([5, 3, 1], 4, [3, 1, 0]),
        ([1, 1, 1], 2, [1, 1, 0]),
        ([6, 3, 1], 10, [6, 3, 1]),
        ([6, 3, 1], None, [6, 3, 1]),
        ([10, 10, 10], 0, [0, 0, 0]),
        ([0, 0], 5, [0, 0]),
        ([], 3, []),
        ([1, 999], 10, [0, 10]),
    ],
)
def test_share_adds_up_to_the_limit_in_proportion(available, limit, takes):
    assert _share(available, limit) == takes


# --- reading ---------------------------------------------------------------------------------


def test_json_values_are_read_as_the_produced_events_with_record_columns(
    broker, make_child, monkeypatch
):
    monkeypatch.setattr(kafka_ranges, "RECORDS_PER_ARROW_BATCH", 2)  # several records per decode
    produce_events(broker, 0, 0, 6)
    produce_events(broker, 1, 6, 4)
    produce_events(broker, 2, 10, 2)
    produce(broker, 3, [None, b"{}"])  # a tombstone and an empty object: rows of nulls
    child = make_child()
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    table = read_table(child, start, end)
    assert table.to_pylist() == [
        *expected_rows(0, 0, 6),
        *expected_rows(1, 6, 4),
        *expected_rows(2, 10, 2),
        *(
            {**NO_EVENT, "kafka_offset": n, "kafka_partition": 3, "kafka_topic": EVENTS}
            for n in (0, 1)
        ),
    ]


def test_json_values_may_carry_fields_outside_the_schema(broker, make_child):
    produce(broker, 2, [b'{"event_id": 7, "extra": [1, 2], "account": "a1"}'])
    child = make_child(schema=pa.schema([("account", pa.string()), ("event_id", pa.int64())]))
    start = child.initial_position()
    table = read_table(child, start, child.plan(start, Limits()).end, child.schema)
    assert table.to_pylist() == [{"account": "a1", "event_id": 7}]


def test_json_values_over_several_lines_or_after_blanks_read_like_one_line_objects(
    broker, make_child
):
    produce(
        broker,
        2,
        [b'{"event_id": 1}', b'{"event_id":\n 2,\r\n"account": "a"}', b' \t{"event_id": 3}'],
    )
    child = make_child(schema=pa.schema([("event_id", pa.int64()), ("account", pa.string())]))
    start = child.initial_position()
    table = read_table(child, start, child.plan(start, Limits()).end, child.schema)
    assert table.to_pylist() == [
        {"event_id": 1, "account": None},
        {"event_id": 2, "account": "a"},
        {"event_id": 3, "account": None},
    ]


def test_raw_mode_reads_every_record_column_exactly(broker, make_child):
    stamp = int(PRODUCED_AT.timestamp() * 1000)
    produce(
        broker,
        1,
        [b"v0", b"\x00\xff", None],
        keys=[b"k0", None, b"k2"],
        timestamps=[stamp, stamp + 1, stamp + 1500],
    )
    child = make_child(valueFormat="raw", schema=RECORD_COLUMNS)
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    record = {"topic": EVENTS, "partition": 1}
    assert read_table(child, start, end, RECORD_COLUMNS).to_pylist() == [
        {"key": b"k0", "value": b"v0", **record, "offset": 0, "timestamp": PRODUCED_AT},
        {
            "key": None,
            "value": b"\x00\xff",
            **record,
            "offset": 1,
            "timestamp": PRODUCED_AT + timedelta(milliseconds=1),
        },
        {
            "key": b"k2",
            "value": None,
            **record,
            "offset": 2,
            "timestamp": PRODUCED_AT + timedelta(milliseconds=1500),
        },
    ]
    subset = pa.schema([("offset", pa.int64()), ("value", pa.binary())])
    assert read_table(child, start, end, subset).to_pylist() == [
        {"offset": 0, "value": b"v0"},
        {"offset": 1, "value": b"\x00\xff"},
        {"offset": 2, "value": None},
    ]


def test_replaying_a_batch_reads_the_same_records_after_more_arrived(waiting, make_child):
    child = make_child()
    start = child.initial_position()
    end = child.plan(start, Limits(max_rows=20)).end
    first = read_table(child, start, end)
    produce_events(waiting, 0, 5000, 3)
    produce_events(waiting, 3, 6000, 3)
    assert read_table(child, start, end) == first
    assert first.column("event_id").to_pylist() == [
        *range(0, 12),
        *range(100, 106),
        *range(200, 202),
    ]


def test_partitions_cut_the_ranges_into_tasks_of_rows_per_partition(
    broker, make_child, monkeypatch
):
    # Three records per fetch: several fetches per range.
    monkeypatch.setattr(kafka_ranges, "RECORDS_PER_ARROW_BATCH", 3)
    produce_events(broker, 0, 0, 10)
    produce_events(broker, 2, 100, 5)
    child = make_child(rows_per_partition=4, startingOffsets={"events": {"0": 1}})
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    assert end == positions([10, 0, 5, 0])
    tasks = child.partitions(start, end)
    assert [[(p.topic, p.partition, p.start, p.stop) for p in t.pieces] for t in tasks] == [
        [(EVENTS, 0, 1, 5)],
        [(EVENTS, 0, 5, 9)],
        [(EVENTS, 0, 9, 10), (EVENTS, 2, 0, 3)],
        [(EVENTS, 2, 3, 5)],
    ]
    assert tasks[2].describe() == (
        "topic 'events' partition 0 offsets 9..10; topic 'events' partition 2 offsets 0..3"
    )
    ids = [
        [row["event_id"] for batch in task.read(JSON_SCHEMA) for row in batch.to_pylist()]
        for task in tasks
    ]
    assert ids == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 100, 101, 102], [103, 104]]
    assert child.partitions(end, end) == []


def test_one_task_reads_a_thin_spread_over_many_partitions_with_one_client(broker, make_child):
    for partition in range(EVENT_PARTITIONS):
        produce_events(broker, partition, 100 * partition, 3)
    child = make_child(rows_per_partition=1000)
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    (task,) = child.partitions(start, end)
    assert len(task.pieces) == EVENT_PARTITIONS
    assert pa.Table.from_batches(list(task.read(JSON_SCHEMA))) == read_table(child, start, end)


class _CountingConsumer:
    """A real consumer that counts the calls a read makes of it."""

    made: ClassVar[list["_CountingConsumer"]] = []

    def __init__(self, config: dict):
        self.config, self.assigned, self.watermark_calls = config, [], 0
        self._consumer = Consumer(config)
        _CountingConsumer.made.append(self)

    def assign(self, partitions: list) -> None:
        self.assigned.append(sorted((p.partition, p.offset) for p in partitions))
        self._consumer.assign(partitions)

    def get_watermark_offsets(self, *args, **kwargs):
        self.watermark_calls += 1
        return self._consumer.get_watermark_offsets(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def test_a_task_assigns_its_ranges_together_and_asks_no_offsets_when_they_arrive(
    broker, monkeypatch
):
    """One fetch serves every range, and no request for a partition's earliest offset
    queues behind it: that is only needed to explain records that are gone."""
    monkeypatch.setattr(kafka_ranges, "Consumer", _CountingConsumer)
    monkeypatch.setattr(_CountingConsumer, "made", [])
    for partition in range(EVENT_PARTITIONS):
        produce_events(broker, partition, 100 * partition, 5)
    pieces = [
        KafkaRangePartition(broker, {}, EVENTS, p, 1, 4 + (p == 2), "json", 0.0)
        for p in range(EVENT_PARTITIONS)
    ]
    table = pa.Table.from_batches(list(kafka_ranges.KafkaRangesPartition(pieces).read(JSON_SCHEMA)))

    rows = sorted(
        zip(table["kafka_partition"].to_pylist(), table["event_id"].to_pylist(), strict=True)
    )
    assert rows == sorted(
        (p, 100 * p + i) for p in range(EVENT_PARTITIONS) for i in range(1, 4 + (p == 2))
    )
    (consumer,) = _CountingConsumer.made
    assert consumer.assigned == [[(p, 1) for p in range(EVENT_PARTITIONS)]]
    assert consumer.watermark_calls == 0
    assert consumer.config["fetch.wait.max.ms"] == kafka_ranges.READ_FETCH_WAIT_MS


def test_ranges_that_end_in_transaction_markers_end_without_a_stall(broker, monkeypatch):
    """A transactional producer's commit takes an offset of its own after the records, so
    a range up to the partition's end never gets a record at its last offset: the client's
    position passing it ends the range, without the brokers asked why nothing came."""
    producer = Producer({"bootstrap.servers": broker, "transactional.id": "test-markers"})
    producer.init_transactions(10)
    producer.begin_transaction()
    for partition in (0, 1):
        for value in event_values(10 * partition, 3):
            producer.produce(EVENTS, value, partition=partition)
    producer.commit_transaction(10)
    monkeypatch.setattr(kafka_ranges, "Consumer", _CountingConsumer)
    monkeypatch.setattr(_CountingConsumer, "made", [])
    # A read that waited for the markers' offsets as for records would ask the brokers
    # after this long, and wait this long in each consume.
    monkeypatch.setattr(kafka_ranges, "POLL_TIMEOUT_S", 3600.0)
    ends = {p: watermarks(broker, EVENTS, p)[1] for p in (0, 1)}
    assert ends == {0: 4, 1: 4}  # three records and a commit marker each
    pieces = [KafkaRangePartition(broker, {}, EVENTS, p, 0, 4, "json", 0.0) for p in (0, 1)]
    read: list[pa.RecordBatch] = []
    reader = threading.Thread(
        target=lambda: read.extend(kafka_ranges.KafkaRangesPartition(pieces).read(JSON_SCHEMA)),
        daemon=True,
    )
    reader.start()
    reader.join(timeout=120)

    assert not reader.is_alive(), "the read waited for records past the transactions' ends"
    assert sorted(pa.Table.from_batches(read)["event_id"].to_pylist()) == [0, 1, 2, 10, 11, 12]
    assert _CountingConsumer.made[0].watermark_calls == 0


def test_a_task_of_empty_ranges_reads_nothing_and_assigns_nothing(broker, monkeypatch):
    monkeypatch.setattr(kafka_ranges, "Consumer", _CountingConsumer)
    monkeypatch.setattr(_CountingConsumer, "made", [])
    empty = KafkaRangePartition(broker, {}, EVENTS, 0, 7, 7, "json", 0.0)
    assert list(kafka_ranges.KafkaRangesPartition([empty]).read(JSON_SCHEMA)) == []
    assert _CountingConsumer.made[0].assigned == []


def test_a_fetch_wait_in_the_properties_is_kept_for_reads():
    config = kafka_ranges.read_config("localhost:9092", {"fetch.wait.max.ms": "200"})
    assert config["fetch.wait.max.ms"] == "200"
    assert config["auto.offset.reset"] == "error"


def test_partitions_and_children_survive_pickling(waiting, make_child):
    child = make_child()
    start = child.initial_position()  # opens the planner's consumer
    end = child.plan(start, Limits(max_rows=12)).end
    pieces = child.partitions(start, end)
    copies = [pickle.loads(pickle.dumps(piece)) for piece in pieces]
    assert [[vars(p) for p in copy.pieces] for copy in copies] == [
        [vars(p) for p in piece.pieces] for piece in pieces
    ]
    read = [batch for copy in copies for batch in copy.read(JSON_SCHEMA)]
    assert pa.Table.from_batches(read) == read_table(child, start, end)

    copy = pickle.loads(pickle.dumps(child))
    assert child._consumer is not None and copy._consumer is None
    assert copy.initial_position() == start
    assert copy.plan(start, Limits(max_rows=12)).end == end
    copy.consumer.close()


def test_a_short_range_is_read_without_waiting_for_a_full_fetch(broker, monkeypatch):
    # Asking the client for more records than the range holds would wait out a poll.
    monkeypatch.setattr(kafka_ranges, "POLL_TIMEOUT_S", 30.0)
    produce_events(broker, 0, 0, 5)
    piece = KafkaRangePartition(broker, {}, EVENTS, 0, 1, 4, "json", 0.0)
    began = time.monotonic()
    ids = [row["event_id"] for batch in piece.read(JSON_SCHEMA) for row in batch.to_pylist()]
    assert ids == [1, 2, 3]
    assert time.monotonic() - began < 15.0


class _InjectedError:
    """A consumed "message" that is a non-fatal client error, as librdkafka hands them out
    among records while a broker restarts."""

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._TRANSPORT, "injected: broker transport failure")


class _ConsumerWithAnError:
    """A real consumer whose first non-empty ``consume`` also returns one client error."""

    def __init__(self, config: dict):
        self._consumer = Consumer(config)
        self._injected = False

    def consume(self, count: int, timeout: float) -> list:
        messages = self._consumer.consume(count, timeout=timeout)
        if messages and not self._injected:
            self._injected = True
            return [messages[0], _InjectedError(), *messages[1:]]
        return messages

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def test_a_client_error_among_records_does_not_end_the_range_early(broker, monkeypatch):
    # The error made the batch shorter than what was consumed, which ended the read there,
    # and Spark committed the planned end: the rest of the range was lost without a word.
    monkeypatch.setattr(kafka_ranges, "RECORDS_PER_ARROW_BATCH", 4)
    monkeypatch.setattr(kafka_ranges, "Consumer", _ConsumerWithAnError)
    produce_events(broker, 1, 0, 10)
    piece = KafkaRangePartition(broker, {}, EVENTS, 1, 0, 10, "json", 0.0)
    ids = [row["event_id"] for batch in piece.read(JSON_SCHEMA) for row in batch.to_pylist()]
    assert ids == list(range(10))


def test_records_that_never_arrive_fail_the_read_naming_the_offset(broker, monkeypatch):
    monkeypatch.setattr(kafka_ranges, "READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(kafka_ranges, "POLL_TIMEOUT_S", 0.2)
    produce_events(broker, 3, 0, 3)
    piece = KafkaRangePartition(broker, {}, EVENTS, 3, 1, 5, "json", 0.0)
    ids = []
    with pytest.raises(
        KafkaReadError,
        match=re.escape("topic 'events' partition 3 offsets 1..5: no records after offset 3 "),
    ):
        for batch in piece.read(JSON_SCHEMA):
            ids.extend(batch.column("event_id").to_pylist())
    assert ids == [1, 2]


# --- broker outages -------------------------------------------------------------------------


@pytest.fixture
def quick_metadata(monkeypatch):
    """Metadata requests give up after a second, so an outage is ridden out in small steps."""
    monkeypatch.setattr(kafka, "METADATA_TIMEOUT_S", 1.0)
    monkeypatch.setattr(kafka_ranges, "METADATA_TIMEOUT_S", 1.0)
    monkeypatch.setattr(kafka_ranges, "POLL_TIMEOUT_S", 0.2)


def test_planning_plans_no_batch_while_the_brokers_are_down_then_goes_on(
    embedded_broker, make_child, quick_metadata
):
    produce_events(embedded_broker.bootstrap_servers, 0, 0, 5)
    child = make_child(outageTimeout="1min")
    start = child.initial_position()
    first = child.plan(start, Limits())
    assert first.end == positions([5, 0, 0, 0])
    produce_events(embedded_broker.bootstrap_servers, 1, 0, 3)
    embedded_broker.take_down()
    try:
        waiting = child.plan(first.end, Limits())
        assert waiting.end == first.end  # no batch
        assert waiting.lag == first.lag  # what was last known, not a guess
    finally:
        embedded_broker.bring_up()
    after = child.plan(first.end, Limits())
    assert after.end == positions([5, 3, 0, 0])
    assert read_table(child, start, after.end).column("event_id").to_pylist() == [
        0,
        1,
        2,
        3,
        4,
        0,
        1,
        2,
    ]


def test_planning_fails_naming_the_brokers_once_the_outage_outlasts_its_timeout(
    embedded_broker, make_child, quick_metadata
):
    child = make_child(outageTimeout="2s")
    start = child.initial_position()
    embedded_broker.take_down()
    began = time.monotonic()
    assert child.plan(start, Limits()).end == start
    with pytest.raises(
        KafkaReadError,
        match=re.escape(
            f"child source 'live': the brokers at {embedded_broker.bootstrap_servers} have not "
            "answered for "
        )
        + r".*\(outageTimeout 2s\): .*no metadata for topic 'events'",
    ):
        while time.monotonic() - began < 30:
            assert child.plan(start, Limits()).end == start
    embedded_broker.bring_up()


def test_a_read_waits_out_brokers_that_come_back_within_the_timeout(
    embedded_broker, quick_metadata
):
    produce_events(embedded_broker.bootstrap_servers, 2, 0, 20)
    piece = KafkaRangePartition(
        embedded_broker.bootstrap_servers, {}, EVENTS, 2, 0, 20, "json", 60.0
    )
    embedded_broker.take_down()
    threading.Timer(3.0, embedded_broker.bring_up).start()
    ids = [row["event_id"] for batch in piece.read(JSON_SCHEMA) for row in batch.to_pylist()]
    assert ids == list(range(20))


def test_a_read_fails_naming_its_range_when_the_brokers_stay_away(embedded_broker, quick_metadata):
    produce_events(embedded_broker.bootstrap_servers, 2, 0, 20)
    piece = KafkaRangePartition(
        embedded_broker.bootstrap_servers, {}, EVENTS, 2, 0, 20, "json", 2.0
    )
    embedded_broker.take_down()
    try:
        with pytest.raises(
            KafkaReadError, match=re.escape("topic 'events' partition 2: cannot read its offsets")
        ):
            list(piece.read(JSON_SCHEMA))
    finally:
        embedded_broker.bring_up()


def test_requests_refused_as_by_a_moved_leader_are_ridden_out(embedded_broker, make_child):
    servers = embedded_broker.bootstrap_servers
    produce_events(servers, 3, 0, 10)
    child = make_child()
    start = child.initial_position()
    embedded_broker.fail_requests(LIST_OFFSETS, [KafkaError.NOT_LEADER_FOR_PARTITION] * 3)
    embedded_broker.fail_requests(FETCH, [KafkaError.NOT_LEADER_FOR_PARTITION] * 3)
    end = start
    deadline = time.monotonic() + 60
    while end == start and time.monotonic() < deadline:
        end = child.plan(start, Limits()).end
    assert end == positions([0, 0, 0, 10])
    assert read_table(child, start, end).column("event_id").to_pylist() == list(range(10))


# --- errors ----------------------------------------------------------------------------------


def test_a_start_offset_beyond_the_end_fails_naming_the_offset(broker, make_child):
    produce_events(broker, 2, 0, 3)
    child = make_child(startingOffsets={"events": {"2": 7}})
    start = child.initial_position()
    assert start == positions([0, 0, 7, 0])
    with pytest.raises(
        KafkaReadError,
        match=re.escape(
            "child source 'live': topic 'events' partition 2: offset 7 is out of range, "
            "beyond the latest offset 3"
        ),
    ):
        child.plan(start, Limits())
    piece = KafkaRangePartition(broker, {}, EVENTS, 2, 7, 9, "raw", 0.0)
    with pytest.raises(
        KafkaReadError,
        match=re.escape("topic 'events' partition 2 offsets 7..9: offset 7 is no longer (or not"),
    ):
        list(piece.read(RECORD_COLUMNS))


def test_records_deleted_before_they_were_read_fail_the_plan(broker, make_child):
    low = overflow_small_topic(broker)
    child = make_child(topics=[SMALL], valueFormat="raw", schema=RECORD_COLUMNS)
    for offset in (0, low - 1):
        with pytest.raises(
            KafkaReadError,
            match=re.escape(
                f"child source 'live': topic 'small' partition 0: offsets {offset}..{low - 1} "
                f"were deleted (retention) before they were read; the earliest available "
                f"offset is {low}"
            ),
        ):
            child.plan({SMALL: {"0": offset}}, Limits(max_rows=10))
    assert child.plan({SMALL: {"0": low}}, Limits(max_rows=10)).end == {SMALL: {"0": low + 10}}


def test_records_deleted_after_planning_fail_the_read_without_skipping(broker):
    low = overflow_small_topic(broker)
    piece = KafkaRangePartition(broker, {}, SMALL, 0, 5, low + 5, "raw", 0.0)
    batches = []
    with pytest.raises(
        KafkaReadError,
        match=re.escape(
            f"topic 'small' partition 0 offsets 5..{low + 5}: offsets 5..{low - 1} were "
            f"deleted (retention) after planning and before reading; the earliest "
            f"available is {low}"
        ),
    ):
        batches.extend(piece.read(RECORD_COLUMNS))
    assert batches == []


#: Values that are not one JSON object, and what the error says about each.
NOT_ONE_OBJECT = [
    (b"not json", "it does not start with '{'"),
    (b'{"event_id": "x"}', "changed from number to string"),
    (b'{"event_id": 1', "Missing a comma or '}' after an object member"),
    (b'{"event_id": 1}{"event_id": 2}', "2 JSON objects in one record"),
]


@pytest.mark.parametrize("per_fetch", [1, 4], ids=["one-per-fetch", "whole-range"])
def test_a_value_that_is_not_one_json_object_fails_naming_its_offset(
    broker, make_child, monkeypatch, per_fetch
):
    monkeypatch.setattr(kafka_ranges, "RECORDS_PER_ARROW_BATCH", per_fetch)
    for partition, (bad, _) in enumerate(NOT_ONE_OBJECT):
        produce(broker, partition, [*event_values(0, 2), bad, *event_values(3, 1)])
    child = make_child()
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    pieces = [piece for task in child.partitions(start, end) for piece in task.pieces]
    assert len(pieces) == len(NOT_ONE_OBJECT)
    for piece, (bad, problem) in zip(pieces, NOT_ONE_OBJECT, strict=True):
        with pytest.raises(KafkaReadError) as raised:
            list(piece.read(JSON_SCHEMA))
        message = str(raised.value)
        assert message.startswith(
            f"topic 'events' partition {piece.partition} offset 2: the value is not one JSON "
            "object of ['event_id', 'account', 'amount', 'event_time']: "
        )
        assert problem in message
        assert message.endswith(repr(bad))


@pytest.mark.parametrize("per_fetch", [1, 4], ids=["one-per-fetch", "whole-range"])
def test_with_a_quarantine_bad_values_are_set_aside_and_the_rest_is_read(
    broker, tmp_path, monkeypatch, per_fetch
):
    monkeypatch.setattr(kafka_ranges, "RECORDS_PER_ARROW_BATCH", per_fetch)
    for partition, (bad, _) in enumerate(NOT_ONE_OBJECT):
        produce(broker, partition, [*event_values(0, 2), bad, *event_values(3, 1)])
    location = resolve_uri(str(tmp_path / "bad"))
    quarantined = SourceContext(JSON_SCHEMA, str(tmp_path / "state"), 1000, "events", location)
    child = KafkaChild.from_spec(spec(broker), quarantined)
    try:
        start = child.initial_position()
        end = child.plan(start, Limits()).end
        for _ in range(2):  # a replayed batch reads and sets aside the same
            table = read_table(child, start, end)
            assert table.column("event_id").to_pylist() == [0, 1, 3] * len(NOT_ONE_OBJECT)
    finally:
        child.close()
    for partition, (bad, problem) in enumerate(NOT_ONE_OBJECT):
        written = tmp_path / "bad" / "events" / "live" / "kafka" / EVENTS / str(partition)
        (path,) = written.iterdir()
        assert path.name == f"{0:020d}-{4:020d}.jsonl"
        (line,) = [json.loads(text) for text in path.read_text().splitlines()]
        assert line["position"] == {"topic": EVENTS, "partition": partition, "offset": 2}
        assert problem in line["reason"]
        assert base64.b64decode(line["value_base64"]) == bad
    assert count_set_aside(
        {"source": "events", "phase": "live", "position": start},
        {"source": "events", "phase": "live", "position": end, OFFSET_FIELD: location},
    ) == len(NOT_ONE_OBJECT)


#: Reads partitions 0 and 1 of ``events`` whole, each as one fetch, in a separate process: a
#: reader that crashes (as pyarrow's JSON reader can on a bare ``null``) shows as an exit code.
NULL_VALUE_READER = textwrap.dedent(
    """
    import sys
    import pyarrow as pa
    from spark_jobs.sources import kafka_ranges

    for partition, stop in ((0, 1), (1, 2)):
        servers = sys.argv[1]
        piece = kafka_ranges.KafkaRangePartition(
            servers, {}, "events", partition, 0, stop, "json", 0.0
        )
        try:
            batches = list(piece.read(pa.schema([("event_id", pa.int64())])))
            print("rows", [row for batch in batches for row in batch.to_pylist()])
        except kafka_ranges.KafkaReadError as error:
            print("error", error)
    """
)


def test_a_json_null_value_fails_naming_its_offset_without_crashing_the_reader(broker):
    produce(broker, 0, [b"null"])  # first of its fetch
    produce(broker, 1, [b'{"event_id": 1}', b"null"])  # after an object in the same fetch
    done = subprocess.run(
        [sys.executable, "-c", NULL_VALUE_READER, broker],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line, where in zip(lines, ("partition 0 offset 0", "partition 1 offset 1"), strict=True):
        assert line.startswith(
            f"error topic 'events' {where}: the value is not one JSON object of ['event_id']: "
        )
        assert line.endswith(": b'null'")


def test_an_unknown_topic_is_a_clear_error(broker, make_child):
    child = make_child(topics=[EVENTS, "missing"])
    expected = f"child source 'live': topic 'missing' is not readable at {broker}: "
    with pytest.raises(KafkaReadError, match=re.escape(expected)):
        child.initial_position()
    with pytest.raises(KafkaReadError, match=re.escape(expected)):
        child.plan(positions([0, 0, 0, 0]), Limits())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topics": None}, "field 'topics' = None must be a non-empty list of topic names"),
        ({"topics": []}, "field 'topics' = [] must be a non-empty list"),
        ({"topics": " , "}, "field 'topics' = ' , ' must be a non-empty list"),
        ({"topics": ["events", ""]}, "field 'topics' = ['events', ''] must be"),
        ({"topics": [3]}, "field 'topics' = [3] must be"),
        ({"valueFormat": "avro"}, "field 'valueFormat' = 'avro' must be one of ['raw', 'json']"),
        ({"valueFormat": 1}, "field 'valueFormat' = 1 must be a str"),
        ({"bootstrapServers": None}, "field 'bootstrapServers' is required"),
        ({"properties": {"a": [1]}}, "field 'properties' = {'a': [1]} must map client"),
        ({"properties": "a=b"}, "field 'properties' = 'a=b' must be a dict"),
        (
            {"properties": {"sasl.password": "hunter2", "retries": [1]}},
            "field 'properties' = {'sasl.password': '*****', 'retries': [1]} must map client",
        ),
        ({"outageTimeout": "forever"}, "field 'outageTimeout' = 'forever': expected a number"),
        ({"outageTimeout": "30d"}, "field 'outageTimeout' = '30d': must be at most 7d"),
        ({"outageTimeout": 30}, "field 'outageTimeout' = 30 must be a str"),
        (
            {"valueFormat": "raw"},
            "columns ['event_id', 'account', 'amount', 'event_time', 'kafka_offset', "
            "'kafka_partition', 'kafka_topic'] are not record columns",
        ),
    ],
)
def test_spec_errors_name_the_field_and_value(fields, message):
    with pytest.raises(ChildSpecError, match=re.escape(f"child source 'live': {message}")):
        KafkaChild.from_spec(spec(**fields), context(None))


def test_json_mode_refuses_a_kafka_column_that_is_no_record_column():
    schema = pa.schema([("event_id", pa.int64()), ("kafka_headers", pa.string())])
    with pytest.raises(
        ChildSpecError,
        match=re.escape(
            "child source 'live': columns ['kafka_headers'] start with 'kafka_' but name no "
            "record column"
        ),
    ):
        KafkaChild.from_spec(spec(), context(None, schema))


def test_a_valid_spec_keeps_its_fields(tmp_path):
    child = KafkaChild.from_spec(
        spec(topics="events, small", properties={"security.protocol": "SSL"}),
        context(tmp_path / "state", rows_per_partition=7),
    )
    assert (child.topics, child.starting, child.value_format) == (
        [EVENTS, SMALL],
        "earliest",
        "json",
    )
    assert child.properties == {"security.protocol": "SSL"}
    assert child.rows_per_partition == 7
    assert child.state.location == f"file://{tmp_path}/state/live"
