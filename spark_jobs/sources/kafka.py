"""The Kafka child of the hybrid source, read with confluent-kafka.

Positions are ``{"<topic>": {"<partition>": next_offset}}``, like Spark's own Kafka source,
so replaying a batch from its two positions reads exactly the same records. Planning (in
Spark's planner process) asks the brokers for each partition's earliest and latest
offsets; executors read the offset ranges as Arrow record batches, in tasks of up to
``rowsPerPartition`` records that may span several partitions, one client per task with
every range of the task assigned at once and a short fetch wait (a read is bounded).

Records that were deleted by retention before they were read, or an offset beyond the
end of its partition, fail the batch with the topic, partition and offsets named: a
checkpoint never moves past records that were not read. Brokers that do not answer (a
restart, a moved leader, a network cut) are ridden out for ``outageTimeout``: planning
plans no batch meanwhile and reads wait, then the query fails naming the brokers.
"""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.secrets import redacted_repr
from spark_jobs.backlog.values import format_duration
from spark_jobs.sources.children import (
    ChildSource,
    ChildSpecError,
    Limits,
    Planned,
    Position,
    ReadablePartition,
    SourceContext,
    duration_field,
    spec_field,
)
from spark_jobs.sources.quarantine import BadInput, Quarantine, range_key
from spark_jobs.storage.files import StateDirectory, resolve_uri

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
RAW_SCHEMA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
)
VALUE_FORMATS = ("raw", "json")
JSON_METADATA_PREFIX = "kafka_"
STARTING_KEYWORDS = ("earliest", "latest")
#: Client properties the source owns: it reads assigned ranges and never resets offsets.
RESERVED_PROPERTIES = (
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "bootstrap.servers",
)
#: Spark's convention inside explicit starting offsets.
EARLIEST, LATEST = -2, -1
#: How long one metadata request waits; an outage is ridden out over many of them.
METADATA_TIMEOUT_S = 10.0
DEFAULT_OUTAGE_TIMEOUT = "2min"
MAX_OUTAGE_TIMEOUT_S = 7 * 86_400.0
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


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _client_config(bootstrap_servers: str, properties: Mapping[str, str]) -> dict[str, Any]:
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


def _read_config(bootstrap_servers: str, properties: Mapping[str, str]) -> dict[str, Any]:
    """An executor's client: as ``_client_config``, and unless the properties say otherwise
    a short fetch wait, since a read is bounded and records past its ranges only delay it."""
    return {
        "fetch.wait.max.ms": READ_FETCH_WAIT_MS,
        **_client_config(bootstrap_servers, properties),
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


def parse_starting_offsets(name: str, value: Any, topics: Sequence[str]) -> Any:
    """``earliest``, ``latest`` or ``{"topic": {"partition": offset}}`` (-2 earliest, -1 latest)."""
    if isinstance(value, str) and value.strip().lower() in STARTING_KEYWORDS:
        return value.strip().lower()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            if value.strip().startswith("{"):
                raise ChildSpecError(
                    f"child source {name!r}: startingOffsets = {value!r} is not valid JSON "
                    f"({error})"
                ) from None
    rule = (
        "'earliest', 'latest' or a JSON object of topic -> partition -> offset, "
        'e.g. {"events": {"0": 42, "1": -2}} (-2 = earliest, -1 = latest)'
    )
    if not isinstance(value, dict):
        raise ChildSpecError(f"child source {name!r}: startingOffsets = {value!r} must be {rule}")
    for topic, partitions in value.items():
        if topic not in topics:
            raise ChildSpecError(
                f"child source {name!r}: startingOffsets names topic {topic!r}, "
                f"which is not among the topics read: {list(topics)}"
            )
        if not isinstance(partitions, dict) or not all(
            str(p).isdigit() and isinstance(o, int) and not isinstance(o, bool) and o >= -2
            for p, o in partitions.items()
        ):
            raise ChildSpecError(
                f"child source {name!r}: startingOffsets[{topic!r}] = {partitions!r} must "
                f"map partition numbers to offsets >= -2; expected {rule}"
            )
    return {topic: {str(p): o for p, o in parts.items()} for topic, parts in value.items()}


def _all_explicit(starting: Any) -> bool:
    return isinstance(starting, dict) and all(
        offset >= 0 for partitions in starting.values() for offset in partitions.values()
    )


@dataclass(frozen=True)
class PartitionRange:
    """From ``start`` to the partition's ``latest`` offset at planning time."""

    topic: str
    partition: int
    start: int
    latest: int
    #: A partition that appeared since ``start``: it joins the position at its earliest
    #: offset and is read from the next batch on, so replaying a batch reads the same records.
    new: bool = False


class KafkaChild(ChildSource):
    """Subscribed topics, from the starting offsets on; never ends."""

    kind = "kafka"
    bounded = False
    STARTING = "starting-offsets.json"

    def __init__(
        self,
        name: str,
        bootstrap_servers: str,
        topics: list[str],
        starting: Any,
        properties: Mapping[str, str],
        value_format: str,
        state: StateDirectory | None,
        schema: pa.Schema,
        rows_per_partition: int,
        outage_timeout_s: float,
        quarantine: Quarantine | None = None,
    ):
        super().__init__(name)
        self.bootstrap_servers = bootstrap_servers
        self.topics = topics
        self.starting = starting
        self.properties = dict(properties)
        self.value_format = value_format
        self.state = state
        self.schema = schema
        self.rows_per_partition = rows_per_partition
        self.outage_timeout_s = outage_timeout_s
        self.quarantine = quarantine
        self._consumer: Consumer | None = None
        self._resolved_start: Position | None = None
        self._outage = Outage(outage_timeout_s)
        self._last_lag: Mapping[str, Any] = {}
        _check_schema(name, schema, value_format)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader travels to executors; a client connection does not.
        return {**self.__dict__, "_consumer": None}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], context: SourceContext) -> KafkaChild:
        name = spec_field(spec, "name", str)
        topics = spec.get("topics")
        if isinstance(topics, str):
            topics = [t.strip() for t in topics.split(",") if t.strip()]
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise ChildSpecError(
                f"child source {name!r}: field 'topics' = {spec.get('topics')!r} must be a "
                "non-empty list of topic names (or one comma-separated string)"
            )
        value_format = spec_field(spec, "valueFormat", str, "raw")
        if value_format not in VALUE_FORMATS:
            raise ChildSpecError(
                f"child source {name!r}: field 'valueFormat' = {value_format!r} must be one "
                f"of {list(VALUE_FORMATS)}"
            )
        properties = spec_field(spec, "properties", dict, {})
        if not all(isinstance(v, str | int | float | bool) for v in properties.values()):
            raise ChildSpecError(
                f"child source {name!r}: field 'properties' = {redacted_repr(properties)} "
                "must map client property names to plain values"
            )
        reserved = sorted(set(properties) & set(RESERVED_PROPERTIES))
        if reserved:
            raise ChildSpecError(
                f"child source {name!r}: client properties {reserved} are set by the source "
                "(it reads assigned offset ranges, commits nothing and never resets offsets)"
            )
        starting = parse_starting_offsets(name, spec.get("startingOffsets", "latest"), topics)
        outage_timeout_s = duration_field(
            spec, "outageTimeout", DEFAULT_OUTAGE_TIMEOUT, maximum_s=MAX_OUTAGE_TIMEOUT_S
        )
        state = None
        if context.state_location:
            state = StateDirectory(f"{resolve_uri(context.state_location)}/{name}")
        child = cls(
            name=name,
            bootstrap_servers=spec_field(spec, "bootstrapServers", str),
            topics=list(topics),
            starting=starting,
            properties=properties,
            value_format=value_format,
            state=state,
            schema=context.schema,
            rows_per_partition=context.rows_per_partition,
            outage_timeout_s=outage_timeout_s,
            quarantine=context.quarantine(name),
        )
        if state is None and not _all_explicit(starting):
            raise ChildSpecError(
                f"child source {name!r}: startingOffsets {starting!r} is resolved against the "
                "brokers once and kept, so that a replayed first batch reads the same records; "
                "the source needs the option 'stateLocation' (kept with the checkpoint), "
                "unless every starting offset is an explicit number"
            )
        return child

    # --- brokers ---------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(_client_config(self.bootstrap_servers, self.properties))
        return self._consumer

    def _partitions(self) -> list[tuple[str, int]]:
        found = []
        for topic in self.topics:
            try:
                metadata = self.consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
            except KafkaException as error:
                raise BrokersUnreachable(
                    f"child source {self.name!r}: no metadata for topic {topic!r} from "
                    f"{self.bootstrap_servers}: {error}"
                ) from None
            described = metadata.topics.get(topic)
            error = described.error if described is not None else None
            if error is not None and error.retriable():  # a leader being elected
                raise BrokersUnreachable(
                    f"child source {self.name!r}: topic {topic!r} at "
                    f"{self.bootstrap_servers}: {error}"
                )
            if described is None or described.error is not None or not described.partitions:
                problem = described.error if described is not None else "unknown topic"
                raise KafkaReadError(
                    f"child source {self.name!r}: topic {topic!r} is not readable at "
                    f"{self.bootstrap_servers}: {problem}"
                )
            found.extend((topic, p) for p in sorted(described.partitions))
        return found

    def _bounds(self, topic: str, partition: int) -> tuple[int, int]:
        return partition_bounds(self.consumer, topic, partition, self.bootstrap_servers)

    # --- planning --------------------------------------------------------------------------

    def initial_position(self) -> Position:
        """The starting offsets, resolved once: kept in the state location when there is one,
        so ``latest`` means the end at the first start, not at every restart before the
        first batch was logged."""
        if self._resolved_start is not None:
            return self._resolved_start
        if self.state is not None:
            self.state.claim({"kind": self.kind, "topics": ",".join(self.topics)})
            if self.STARTING in self.state.names(self.STARTING):
                self._resolved_start = self.state.read(self.STARTING)
                return self._resolved_start
        resolved: Position = {}
        partitions = self._partitions()
        if isinstance(self.starting, dict):
            unknown = sorted(
                f"{topic}/{p}"
                for topic, wanted in self.starting.items()
                for p in wanted
                if (topic, int(p)) not in partitions
            )
            if unknown:
                raise KafkaReadError(
                    f"child source {self.name!r}: startingOffsets names partitions {unknown} "
                    f"that the brokers do not have; they have {partitions}"
                )
        for topic, partition in partitions:
            low, high = self._bounds(topic, partition)
            wanted = self._starting_offset(topic, partition)
            offset = low if wanted == EARLIEST else high if wanted == LATEST else wanted
            resolved.setdefault(topic, {})[str(partition)] = offset
        if self.state is not None:
            self.state.write(self.STARTING, resolved)
        logger.info("child source %r starts at %s", self.name, resolved)
        self._resolved_start = resolved
        return resolved

    def _starting_offset(self, topic: str, partition: int) -> int:
        if self.starting == "earliest":
            return EARLIEST
        if self.starting == "latest":
            return LATEST
        # Partitions the explicit offsets leave out are read from the start.
        return int(self.starting.get(topic, {}).get(str(partition), EARLIEST))

    def ranges(self, start: Position) -> list[PartitionRange]:
        """Every partition from ``start`` to its latest offset, checked against retention."""
        ranges = []
        current = {(t, p) for t, parts in start.items() for p in parts}
        partitions = self._partitions()
        for topic, partition in partitions:
            low, high = self._bounds(topic, partition)
            offset = start.get(topic, {}).get(str(partition))
            if offset is None:
                logger.info("child source %r: new partition %s/%s", self.name, topic, partition)
                ranges.append(PartitionRange(topic, partition, low, high, new=True))
                continue
            if offset < low:
                raise KafkaReadError(
                    f"child source {self.name!r}: topic {topic!r} partition {partition}: "
                    f"offsets {offset}..{low - 1} were deleted (retention) before they were "
                    f"read; the earliest available offset is {low}. The batch fails rather "
                    "than skip them: to accept the loss, start a new checkpoint with "
                    "explicit startingOffsets"
                )
            if offset > high:
                raise KafkaReadError(
                    f"child source {self.name!r}: topic {topic!r} partition {partition}: "
                    f"offset {offset} is out of range, beyond the latest offset {high} "
                    "(was the topic deleted and created again?)"
                )
            ranges.append(PartitionRange(topic, partition, offset, high))
        vanished = current - {(t, str(p)) for t, p in partitions}
        if vanished:
            raise KafkaReadError(
                f"child source {self.name!r}: partitions {sorted(vanished)} were read "
                "before but are gone from the brokers"
            )
        return ranges

    def plan(self, start: Position, limits: Limits) -> Planned:
        try:
            ranges = self.ranges(start)
        except BrokersUnreachable as error:
            return self._ride_out(start, error)
        lasted = self._outage.recovered()
        if lasted is not None:
            logger.warning(
                "child source %r: the brokers answer again after %s",
                self.name,
                format_duration(lasted),
            )
        takes = _share([0 if r.new else r.latest - r.start for r in ranges], limits.max_rows)
        end: Position = {}
        behind: dict[str, int] = {}
        for piece, take in zip(ranges, takes, strict=True):
            stop = piece.start + take
            end.setdefault(piece.topic, {})[str(piece.partition)] = stop
            behind[partition_key(piece.topic, piece.partition)] = piece.latest - stop
        self._last_lag = {
            "offsets_behind_latest": sum(behind.values()),
            "max_offsets_behind_latest": max(behind.values(), default=0),
            "partitions": behind,
        }
        return Planned(end, self._last_lag)

    def _ride_out(self, start: Position, error: BrokersUnreachable) -> Planned:
        """No batch while the brokers do not answer, for ``outageTimeout``; then fail."""
        if not self._outage.ongoing:
            logger.warning(
                "child source %r: %s; planning no batch until they answer (for up to %s)",
                self.name,
                error,
                format_duration(self.outage_timeout_s),
            )
        if not self._outage.failed():
            raise KafkaReadError(
                f"child source {self.name!r}: the brokers at {self.bootstrap_servers} have "
                f"not answered for {format_duration(self._outage.lasted_s)} (outageTimeout "
                f"{format_duration(self.outage_timeout_s)}): {error}"
            ) from None
        return Planned(start, self._last_lag)

    def is_exhausted(self, position: Position) -> bool:
        return False

    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]:
        """The batch's offset ranges, cut into tasks of ``rows_per_partition`` records each
        (the last one smaller): a task reads the ranges of several topic partitions one
        after another with one client, so a batch spread thinly over many partitions does
        not pay a task and a client per partition."""
        tasks: list[list[KafkaRangePartition]] = [[]]
        room = self.rows_per_partition
        for topic, parts in end.items():
            for partition, stop in parts.items():
                offset = start.get(topic, {}).get(partition, stop)
                while offset < stop:
                    if room == 0:
                        tasks.append([])
                        room = self.rows_per_partition
                    until = min(stop, offset + room)
                    tasks[-1].append(
                        KafkaRangePartition(
                            self.bootstrap_servers,
                            self.properties,
                            topic,
                            int(partition),
                            offset,
                            until,
                            self.value_format,
                            self.outage_timeout_s,
                            self.quarantine,
                        )
                    )
                    room -= until - offset
                    offset = until
        return [KafkaRangesPartition(pieces) for pieces in tasks if pieces]


def _share(available: list[int], limit: int | None) -> list[int]:
    """Split a row limit over partitions in proportion to what each has waiting.

    The shares add up to exactly ``min(limit, total)``, so a batch is as large as allowed.
    """
    total = sum(available)
    if limit is None or limit >= total:
        return list(available)
    takes = [available_here * limit // total for available_here in available]
    # Hand out what rounding left, to the partitions with the most left behind.
    order = sorted(range(len(available)), key=lambda i: available[i] - takes[i], reverse=True)
    for i in order[: limit - sum(takes)]:
        takes[i] += 1
    return takes


def _check_schema(name: str, schema: pa.Schema, value_format: str) -> None:
    """A raw read yields only record columns; a JSON read yields fields of the value plus
    record columns named ``kafka_<column>``."""
    if value_format == "raw":
        unknown = [f.name for f in schema if f.name not in RECORD_COLUMNS.names]
        if unknown:
            raise ChildSpecError(
                f"child source {name!r}: columns {unknown} are not record columns "
                f'{RECORD_COLUMNS.names}; set "valueFormat": "json" to read them from the '
                "JSON value"
            )
        return
    metadata = [f.name for f in schema if f.name.startswith(JSON_METADATA_PREFIX)]
    unknown = [n for n in metadata if n[len(JSON_METADATA_PREFIX) :] not in RECORD_COLUMNS.names]
    if unknown:
        raise ChildSpecError(
            f"child source {name!r}: columns {unknown} start with {JSON_METADATA_PREFIX!r} "
            f"but name no record column; allowed: "
            f"{[JSON_METADATA_PREFIX + n for n in RECORD_COLUMNS.names]}"
        )


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

    def _explain(self, error: KafkaError, offset: int, consumer: Consumer) -> str:
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
        consumer = Consumer(_read_config(first.bootstrap_servers, first.properties))
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
                        progress.piece._explain(error, progress.next_offset, self._consumer)
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
