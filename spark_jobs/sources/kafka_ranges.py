"""Reading a Kafka child's planned offset ranges on executors, as Arrow record batches.

Planning (``kafka.py``) fixes each batch's ranges; a task here reads its ranges with one
client that reads assigned offsets only: no group offsets, no offset reset, so a record
that is gone fails the batch by name instead of being skipped. A range is read whole or
the read fails; a short fetch wait keeps a bounded read from idling at a partition's end.
"""

from __future__ import annotations

import io
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.values import format_duration
from spark_jobs.sources.children import ReadablePartition
from spark_jobs.sources.quarantine import BadInput, Quarantine, range_key

logger = logging.getLogger(__name__)

#: The record columns of a raw read; with ``valueFormat: json`` they are named ``kafka_*``.
RECORD_COLUMNS = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
JSON_METADATA_PREFIX = "kafka_"
#: How long one metadata request waits; an outage is ridden out over many of them.
METADATA_TIMEOUT_S = 10.0
#: How long a read waits for records the planner saw before it fails.
READ_TIMEOUT_S = 60.0
POLL_TIMEOUT_S = 1.0
#: How long one ``consume`` of a read waits for what it asked: a range whose last offsets
#: are gaps (transaction markers, compacted records) is seen ended after one such wait.
CONSUME_WAIT_S = 0.1
RECORDS_PER_ARROW_BATCH = 10_000
#: How long a broker holds a read's fetch waiting for more records (librdkafka's default
#: is 500 ms): a task waits that out each time one of its partitions reaches its end.
READ_FETCH_WAIT_MS = 10


OFFSET_ERRORS = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


class KafkaReadError(RuntimeError):
    """Records that cannot be read as planned (deleted by retention, out of range, not
    decodable): the message names topic, partition and offsets."""


class BrokersUnreachable(KafkaReadError):
    """The brokers did not answer a metadata request: worth waiting for, for a while."""


def client_config(bootstrap_servers: str, properties: Mapping[str, str]) -> dict[str, Any]:
    """A consumer that reads assigned ranges: no group offsets, no silent offset reset."""
    return {
        **properties,
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"backlog-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": False,
    }


def read_config(bootstrap_servers: str, properties: Mapping[str, str]) -> dict[str, Any]:
    """An executor's client: as ``client_config``, and unless the properties say otherwise
    a short fetch wait, since a read is bounded and records past its ranges only delay it."""
    return {
        "fetch.wait.max.ms": READ_FETCH_WAIT_MS,
        **client_config(bootstrap_servers, properties),
    }


def partition_bounds(
    consumer: Consumer, topic: str, partition: int, servers: str
) -> tuple[int, int]:
    """The earliest and latest offsets of a partition, or an error naming it and the servers."""
    try:
        bounds = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S, cached=False
        )
    except KafkaException as error:
        bounds, problem = None, str(error)
    else:
        problem = f"no answer within {METADATA_TIMEOUT_S:.0f} s"
    if bounds is None:
        raise BrokersUnreachable(
            f"topic {topic!r} partition {partition}: cannot read its offsets from {servers}: "
            f"{problem}"
        )
    return bounds


class KafkaRangePartition(ReadablePartition):
    """One partition's offsets ``[start, stop)``, read on an executor."""

    def __init__(
        self,
        bootstrap_servers: str,
        properties: Mapping[str, str],
        topic: str,
        partition: int,
        start: int,
        stop: int,
        value_format: str,
        outage_timeout_s: float,
        quarantine: Quarantine | None = None,
    ):
        self.bootstrap_servers = bootstrap_servers
        self.properties = dict(properties)
        self.topic = topic
        self.partition = partition
        self.start = start
        self.stop = stop
        self.value_format = value_format
        self.outage_timeout_s = outage_timeout_s
        self.quarantine = quarantine

    def describe(self) -> str:
        return f"topic {self.topic!r} partition {self.partition} offsets {self.start}..{self.stop}"

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        yield from KafkaRangesPartition([self]).read(schema)

    def to_arrow(
        self, records: list[Any], schema: pa.Schema, bad: list[BadInput] | None
    ) -> pa.Table:
        return _to_arrow(records, schema, self.value_format, bad)

    def low_watermark(self, consumer: Consumer) -> int:
        """The partition's earliest offset, waiting out brokers that do not answer."""
        outage = Outage(self.outage_timeout_s)
        while True:
            try:
                return partition_bounds(
                    consumer, self.topic, self.partition, self.bootstrap_servers
                )[0]
            except BrokersUnreachable:
                if not outage.failed():
                    raise
                time.sleep(POLL_TIMEOUT_S)

    def explain(self, error: KafkaError, offset: int, consumer: Consumer) -> str:
        """The fetch's error, which alone decides that records are gone: a partition's
        earliest offset, asked apart while requests fail, has come back as its latest."""
        if error.code() in OFFSET_ERRORS and (low := self.low_watermark(consumer)) > offset:
            return (
                f"{self.describe()}: offsets {offset}..{low - 1} were deleted (retention) "
                f"after planning and before reading; the earliest available is {low}"
            )
        if error.code() in OFFSET_ERRORS:
            return (
                f"{self.describe()}: offset {offset} is no longer (or not yet) on the broker: "
                f"{error.str()}. Records are never skipped: the batch fails"
            )
        return f"{self.describe()}: {error.str()}"


class KafkaRangesPartition(ReadablePartition):
    """One task's offset ranges (one per topic partition), read together by one client:
    assigned at once, so the broker serves them in the same fetches, and a range that ends
    does not hold the others up."""

    def __init__(self, pieces: Sequence[KafkaRangePartition]):
        self.pieces = list(pieces)

    def describe(self) -> str:
        return "; ".join(piece.describe() for piece in self.pieces)

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        first = self.pieces[0]
        consumer = Consumer(read_config(first.bootstrap_servers, first.properties))
        try:
            yield from _RangesRead(consumer, self.pieces, schema).batches()
        finally:
            consumer.close()


class _RangeProgress:
    """How far one range is read, and its records of the last ``consume`` call."""

    def __init__(self, piece: KafkaRangePartition):
        self.piece, self.next_offset = piece, piece.start
        self.records: list[Any] = []
        self.bad: list[BadInput] | None = None if piece.quarantine is None else []

    @property
    def partition(self) -> TopicPartition:
        return TopicPartition(self.piece.topic, self.piece.partition)


class _RangesRead:
    """The records of a task's ranges, each range's in offset order and whole: a range ends
    at its stop, or at a record past it, or when the client's position passes its stop
    (gaps: compaction, transaction markers), which a short ``consume`` shows; records that
    never arrive fail it by name past ``READ_TIMEOUT_S`` (or the outage timeout), and brokers
    that stay away fail it naming the partition once the outage timeout has passed."""

    def __init__(
        self, consumer: Consumer, pieces: Sequence[KafkaRangePartition], schema: pa.Schema
    ):
        self._consumer, self._schema = consumer, schema
        self._open = {(p.topic, p.partition): _RangeProgress(p) for p in pieces if p.start < p.stop}
        self._patience_s = max([READ_TIMEOUT_S, *(p.outage_timeout_s for p in pieces)])

    def batches(self) -> Iterator[pa.RecordBatch]:
        if not self._open:
            return
        self._consumer.assign(
            [
                TopicPartition(topic, partition, r.piece.start)
                for (topic, partition), r in self._open.items()
            ]
        )
        deadline = quiet_since = time.monotonic()
        deadline += self._patience_s
        while self._open:
            # consume() waits until it has as many records as asked or its timeout passes,
            # so ask for no more than the ranges hold.
            left = sum(r.piece.stop - r.next_offset for r in self._open.values())
            messages = self._consumer.consume(
                min(left, RECORDS_PER_ARROW_BATCH), timeout=CONSUME_WAIT_S
            )
            now = time.monotonic()
            if self._take(messages):
                deadline, quiet_since = now + self._patience_s, now
            if self._past_gaps() and now - quiet_since >= POLL_TIMEOUT_S:
                self._stalled(deadline)
                quiet_since = now
            for key, progress in list(self._open.items()):
                yield from self._hand_over(progress)
                if progress.next_offset >= progress.piece.stop:
                    self._close(key, progress)

    def _take(self, messages: list[Any]) -> bool:
        """File each record under its range; True if any range got records."""
        took = False
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal() or error.code() in OFFSET_ERRORS:
                    progress = self._open.get(
                        (message.topic(), message.partition()), next(iter(self._open.values()))
                    )
                    raise KafkaReadError(
                        progress.piece.explain(error, progress.next_offset, self._consumer)
                    )
                # The client recovers from the rest (a broker restarting, a moved leader) on
                # its own; the read timeout bounds how long that may take.
                logger.warning("%s: %s; retrying", self._describe(), error.str())
                continue
            progress = self._open.get((message.topic(), message.partition()))
            if progress is None or progress.next_offset >= progress.piece.stop:
                continue  # fetched before its range ended, or for a range read before
            if message.offset() >= progress.piece.stop:
                progress.next_offset = progress.piece.stop  # only a record past it ends it early
                continue
            progress.records.append(message)
            progress.next_offset = message.offset() + 1
            took = True
        return took

    def _past_gaps(self) -> list[_RangeProgress]:
        """End the ranges the client's position has passed (their rest were gaps); the
        ranges still waiting for records."""
        waiting = []
        for progress in self._open.values():
            if progress.next_offset < progress.piece.stop:
                (position,) = self._consumer.position([progress.partition])
                if position.offset >= progress.piece.stop:
                    progress.next_offset = progress.piece.stop
                else:
                    waiting.append(progress)
        return waiting

    def _stalled(self, deadline: float) -> None:
        """No record for ``POLL_TIMEOUT_S``: brokers that stay away fail the read by
        partition (once the outage timeout has passed); records that never come fail it by
        offset."""
        first = self._past_gaps()[0]
        first.piece.low_watermark(self._consumer)
        if time.monotonic() > deadline:
            raise KafkaReadError(
                f"{first.piece.describe()}: no records after offset {first.next_offset} within "
                f"{format_duration(self._patience_s)} although the brokers reported them at "
                "planning"
            )

    def _hand_over(self, progress: _RangeProgress) -> Iterator[pa.RecordBatch]:
        if progress.records:
            yield from progress.piece.to_arrow(
                progress.records, self._schema, progress.bad
            ).to_batches()
            progress.records = []

    def _close(self, key: tuple[str, int], progress: _RangeProgress) -> None:
        """A range read whole: no more fetches for it, and its bad records set aside (before
        the task ends, so before the batch commits and its rows are counted)."""
        del self._open[key]
        if self._open:
            self._consumer.pause([progress.partition])
        piece = progress.piece
        if piece.quarantine is not None and progress.bad:
            piece.quarantine.set_aside(
                range_key(piece.topic, piece.partition, piece.start, piece.stop), progress.bad
            )

    def _describe(self) -> str:
        return "; ".join(p.piece.describe() for p in self._open.values())


def _to_arrow(
    messages: list[Any], schema: pa.Schema, value_format: str, bad: list[BadInput] | None
) -> pa.Table:
    """The records as a table of ``schema``; with ``bad`` (a quarantine), values that do
    not decode are appended there and left out, else they fail the read. Only the record
    columns the schema asks for are built: each one is a pass over every record in Python."""
    if value_format != "json":
        return pa.table({f.name: _record_column(messages, f.name).cast(f.type) for f in schema})
    fields = pa.schema([f for f in schema if not f.name.startswith(JSON_METADATA_PREFIX)])
    messages, decoded = _decode_json(messages, fields, bad)
    return pa.table(
        {
            f.name: _record_column(messages, f.name[len(JSON_METADATA_PREFIX) :]).cast(f.type)
            if f.name.startswith(JSON_METADATA_PREFIX)
            else decoded.column(f.name)
            for f in schema
        }
    )


def _record_column(messages: list[Any], name: str) -> pa.Array:
    """One of ``RECORD_COLUMNS`` over ``messages``."""
    if name == "key":
        return pa.array([m.key() for m in messages], pa.binary())
    if name == "value":
        return pa.array([m.value() for m in messages], pa.binary())
    if name == "topic":
        return pa.array([m.topic() for m in messages], pa.string())
    if name == "partition":
        return pa.array([m.partition() for m in messages], pa.int32())
    if name == "offset":
        return pa.array([m.offset() for m in messages], pa.int64())
    # A record without a timestamp says -1: that is null, not 1969.
    return pa.array(
        [ms * 1000 if (ms := m.timestamp()[1]) >= 0 else None for m in messages], pa.int64()
    ).cast(pa.timestamp("us", tz="UTC"))


def _decode_json(
    messages: list[Any], fields: pa.Schema, bad: list[BadInput] | None
) -> tuple[list[Any], pa.Table]:
    """One JSON object per record value; a null value (a tombstone) gives a row of nulls.
    Returns the records kept and their decoded values.

    Values are checked to be objects first: pyarrow's reader expects newline-delimited
    objects, and a bare literal such as ``null`` can crash it rather than raise.
    """
    values = [message.value() or b"{}" for message in messages]
    lines = b"\n".join(values)
    # The usual case, checked in two passes over bytes: every value one line, an object.
    kept = messages
    if lines.count(b"\n") != len(values) - 1 or not all(v[:1] == b"{" for v in values):
        kept, values = [], []
        for message in messages:
            value = (message.value() or b"{}").replace(b"\n", b" ")
            if value.lstrip().startswith(b"{"):
                kept.append(message)
                values.append(value)
            else:
                _reject(message, fields, "it does not start with '{'", bad)
        lines = b"\n".join(values)
    if not values:
        return [], fields.empty_table()
    options = pa_json.ParseOptions(explicit_schema=fields, unexpected_field_behavior="ignore")
    try:
        table = pa_json.read_json(io.BytesIO(lines), parse_options=options)
        if table.num_rows == len(values):
            return kept, table.select(fields.names).cast(fields)
    except pa.ArrowInvalid:
        pass
    # Decode one by one, to name (or set aside) each record that does not decode alone.
    decoded, singles = [], []
    for message, value in zip(kept, values, strict=True):
        try:
            single = pa_json.read_json(io.BytesIO(value), parse_options=options)
        except pa.ArrowInvalid as error:
            _reject(message, fields, str(error), bad)
            continue
        if single.num_rows != 1:
            _reject(message, fields, f"{single.num_rows} JSON objects in one record", bad)
            continue
        decoded.append(message)
        singles.append(single.select(fields.names).cast(fields))
    if bad is None and len(decoded) == len(kept):
        raise KafkaReadError(f"{len(values)} record values did not decode together: {fields.names}")
    return decoded, pa.concat_tables(singles) if singles else fields.empty_table()


def _reject(message: Any, fields: pa.Schema, problem: str, bad: list[BadInput] | None) -> None:
    """Fail the read naming the record, or set it aside when there is a quarantine."""
    reason = f"the value is not one JSON object of {fields.names}: {problem}"
    position = {"topic": message.topic(), "partition": message.partition()}
    position["offset"] = message.offset()
    if bad is None:
        raise KafkaReadError(
            f"topic {message.topic()!r} partition {message.partition()} offset "
            f"{message.offset()}: {reason}: {(message.value() or b'')[:200]!r}"
        )
    bad.append(BadInput(position, reason, message.value()))
