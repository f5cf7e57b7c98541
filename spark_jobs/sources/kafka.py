"""The Kafka child of the hybrid source, read with confluent-kafka.

Positions are ``{"<topic>": {"<partition>": next_offset}}``, like Spark's own Kafka source,
so replaying a batch from its two positions reads exactly the same records. Planning (in
Spark's planner process) asks the brokers for each partition's earliest and latest
offsets and cuts the batch into tasks of up to ``rowsPerPartition`` records that may span
several partitions; executors read them (``kafka_ranges``).

Records that were deleted by retention before they were read, or an offset beyond the
end of its partition, fail the batch with the topic, partition and offsets named: a
checkpoint never moves past records that were not read. Brokers that do not answer (a
restart, a moved leader, a network cut) are ridden out for ``outageTimeout``: planning
plans no batch meanwhile and reads wait, then the query fails naming the brokers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException

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
from spark_jobs.sources.kafka_ranges import (
    JSON_METADATA_PREFIX,
    METADATA_TIMEOUT_S,
    RECORD_COLUMNS,
    BrokersUnreachable,
    KafkaRangePartition,
    KafkaRangesPartition,
    KafkaReadError,
    client_config,
    partition_bounds,
)
from spark_jobs.sources.quarantine import Quarantine
from spark_jobs.storage.files import StateDirectory, resolve_uri

logger = logging.getLogger(__name__)

RAW_SCHEMA_DDL = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
)
VALUE_FORMATS = ("raw", "json")
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
DEFAULT_OUTAGE_TIMEOUT = "2min"
MAX_OUTAGE_TIMEOUT_S = 7 * 86_400.0


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


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
            self._consumer = Consumer(client_config(self.bootstrap_servers, self.properties))
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
