"""The child-source interface of the hybrid source.

A child plans offsets in Spark's planner process and hands executors self-contained
partitions to read. Positions are plain JSON dicts, stored by Spark in its offset log, so
replaying a batch from the same two positions reads exactly the same records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from spark_jobs.backlog.secrets import REDACTED, is_secret_key, redacted_repr
from spark_jobs.backlog.values import parse_duration
from spark_jobs.sources.quarantine import Quarantine

Position = dict[str, Any]


class ChildSpecError(ValueError):
    """A child source specification that cannot work; the message names the field and value."""


@dataclass(frozen=True)
class SourceContext:
    """What every child of one hybrid source shares. ``bad_records``: the quarantine
    location (``badRecordsPath``), None to fail on malformed input."""

    schema: pa.Schema
    state_location: str | None
    rows_per_partition: int
    source_name: str = "hybrid"
    bad_records: str | None = None

    def quarantine(self, child: str) -> Quarantine | None:
        if self.bad_records is None:
            return None
        return Quarantine(self.bad_records, self.source_name, child)


@dataclass(frozen=True)
class Planned:
    """How far the next batch may go, how many rows that is (None: not known before reading),
    what is known about the data left behind (``rows_behind``: rows waiting after ``end``,
    where known), and what the source says of its health in words (a replication slot's
    ``wal_status``, say) for the metrics and whoever reads them."""

    end: Position
    lag: Mapping[str, Any] = field(default_factory=dict)
    rows: int | None = None
    health: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """Per-batch bounds: rows from the read limit or the coordinator, files from the options."""

    max_rows: int | None = None
    max_files: int | None = None


class ReadablePartition(InputPartition):
    """A partition that knows how to read itself on an executor."""

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError


class ChildSource(ABC):
    """One phase of a hybrid source (historical files, a landing directory, a topic)."""

    kind: ClassVar[str]
    #: A bounded child ends; only the last child of a hybrid source may be unbounded.
    bounded: ClassVar[bool]

    def __init__(self, name: str):
        self.name = name

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: Mapping[str, Any], context: SourceContext) -> ChildSource:
        """Build from the JSON spec the user wrote; raise ChildSpecError on bad values."""

    @abstractmethod
    def initial_position(self) -> Position: ...

    @abstractmethod
    def plan(self, start: Position, limits: Limits) -> Planned:
        """The end of the next batch from ``start`` (``start`` itself when nothing is new)."""

    @abstractmethod
    def is_exhausted(self, position: Position) -> bool:
        """True when a bounded child has nothing after ``position``."""

    @abstractmethod
    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]: ...

    def backlog_at(self, position: Position) -> bool | None:
        """Whether reading on from ``position`` is backlog by the child's own phases (a
        table's snapshot is, its changelog is not); None: by the child's place."""
        return None

    def commit(self, position: Position) -> None:  # noqa: B027 - a hook, as close
        """Spark has committed every batch up to ``position`` and will not read before it
        again: state kept only for a replay of those batches may go."""

    def close(self) -> None:  # noqa: B027 - a hook: most children hold nothing open
        """Release what planning holds open (a client connection); the query has stopped."""


def duration_field(
    spec: Mapping[str, Any],
    key: str,
    default: str,
    minimum_s: float = 0.0,
    maximum_s: float | None = None,
) -> float:
    """A duration field (``"30s"``, ``"2min"``) in seconds, naming the child, field and
    value when it is wrong."""
    text = spec_field(spec, key, str, default)
    try:
        return parse_duration(text, minimum_s=minimum_s, maximum_s=maximum_s)
    except ValueError as error:
        raise ChildSpecError(
            f"child source {spec.get('name')!r}: field {key!r} = {text!r}: {error}"
        ) from None


def spec_field(spec: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """Read one field of a child spec, naming the child, field and value when it is wrong."""
    value = spec.get(key, default)
    if value is None:
        raise ChildSpecError(f"child source {spec.get('name')!r}: field {key!r} is required")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        shown = REDACTED if is_secret_key(key) else redacted_repr(value)
        raise ChildSpecError(
            f"child source {spec.get('name')!r}: field {key!r} = {shown} must be a {kind.__name__}"
        )
    return value
