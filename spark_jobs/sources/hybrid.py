"""``spark.readStream.format("hybrid")``: child sources read one after another.

Like Flink's HybridSource with FLIP-309: while one of the first N-1 children runs, the
source is in backlog; while the last runs, it is live. Each offset names the running
child, its phase and whether it is in backlog, so every progress event shows the phase.

Options (keys are case-insensitive):
- ``sources``: JSON list of child specs, e.g.
  ``[{"name": "history", "kind": "files", "path": "/data/history", "format": "parquet"},
  {"name": "landing", "kind": "landing", "path": "/data/landing", "format": "json"}]``
  or, for a topic as the live phase, ``{"name": "live", "kind": "kafka",
  "bootstrapServers": "host:9092", "topics": ["events"], "startingOffsets": "earliest",
  "valueFormat": "json"}`` (see ``kafka.py``), or a PostgreSQL table's snapshot then its
  changes, ``{"name": "accounts", "kind": "postgres-cdc", "connection": "postgresql://...",
  "table": "accounts"}`` (see ``cdc/child.py``, which says per position whether it is in
  backlog);
  a spec may set ``"backlog": true|false`` to override the position rule.
- ``name``: this source's name in statuses and metrics (default ``hybrid``).
- ``stateLocation``: where the children keep their durable state; keep it with the
  checkpoint (delete both or neither).
- ``maxRowsPerTrigger`` or ``maxFilesPerTrigger``: a static per-batch limit, as for
  Spark's own sources.
- ``rowsPerPartition``: rows per Spark task (default 250000).
- ``badRecordsPath``: where malformed files and records are set aside (see
  ``quarantine.py``) instead of failing the batch; unset, they fail it by name.
- ``backlogChannel``: set by the backlog coordinator; gates batches by its decisions.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
)
from pyspark.sql.types import StructType

from spark_jobs.backlog.secrets import redacted_repr
from spark_jobs.backlog.values import parse_count
from spark_jobs.sources.children import (
    ChildSource,
    ChildSpecError,
    Limits,
    ReadablePartition,
    SourceContext,
    spec_field,
)
from spark_jobs.sources.gate import PlanChannel, SourceGate
from spark_jobs.sources.quarantine import OFFSET_FIELD as QUARANTINE_FIELD
from spark_jobs.storage.files import resolve_uri

#: Each kind's class, imported only once a job names the kind: a job of files and Kafka
#: loads neither the CDC child's SQLAlchemy and PostgreSQL driver nor Kafka's client when it
#: has no such child, in its driver or in any of its Python workers.
CHILD_KINDS: dict[str, str] = {
    "files": "spark_jobs.sources.files:BoundedFiles",
    "landing": "spark_jobs.sources.files:LandingFiles",
    "kafka": "spark_jobs.sources.kafka:KafkaChild",
    "postgres-cdc": "spark_jobs.sources.cdc.child:PostgresCdcChild",
}
DEFAULT_ROWS_PER_PARTITION = 250_000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class HybridOptionError(ValueError):
    """Invalid hybrid source options; the message names the option, its value and the rule."""


def parse_children(text: str | None) -> list[dict[str, Any]]:
    """Validate the ``sources`` option's shape (not the children's own fields)."""
    if not text:
        raise HybridOptionError(
            "option 'sources' is required: a JSON list of child sources such as "
            '[{"name": "history", "kind": "files", "path": "...", "format": "parquet"}, '
            '{"name": "landing", "kind": "landing", "path": "...", "format": "json"}]'
        )
    try:
        specs = json.loads(text)
    except json.JSONDecodeError as error:
        raise HybridOptionError(
            f"option 'sources' is not valid JSON ({error}): {redacted_repr(text)}"
        ) from None
    if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
        raise HybridOptionError(
            f"option 'sources' = {redacted_repr(text)} must be a non-empty JSON list of objects"
        )
    names = []
    for position, spec in enumerate(specs):
        name = spec_field(spec, "name", str)
        if not _NAME.match(name):
            raise HybridOptionError(
                f"child source #{position}: name {name!r} must be 1-100 letters, digits, _ . -"
            )
        kind = spec_field(spec, "kind", str)
        if kind not in CHILD_KINDS:
            raise HybridOptionError(
                f"child source {name!r}: kind {kind!r} is not one of {sorted(CHILD_KINDS)}"
            )
        if "backlog" in spec and not isinstance(spec["backlog"], bool):
            raise HybridOptionError(
                f"child source {name!r}: field 'backlog' = {spec['backlog']!r} "
                "must be true or false"
            )
        names.append(name)
    if len(set(names)) != len(names):
        raise HybridOptionError(f"child source names must be unique, got {names}")
    for spec in specs[:-1]:
        if not child_class(spec["kind"]).bounded:
            raise HybridOptionError(
                f"child source {spec['name']!r} of kind {spec['kind']!r} never ends, "
                "so only the last child may be of that kind"
            )
    return specs


def child_class(kind: str) -> type[ChildSource]:
    """The class of a kind of ``CHILD_KINDS``, imported on first use."""
    module, name = CHILD_KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def _positive_int(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key.lower())
    if value is None:
        return None
    try:
        return parse_count(value)
    except ValueError as error:
        raise HybridOptionError(f"option {key!r} = {redacted_repr(value)}: {error}") from None


class HybridStreamReader(DataSourceStreamReader):
    """Plans offsets over the children in Spark's planner process; reads on executors."""

    def __init__(self, options: Mapping[str, str], schema: StructType):
        opts = {key.lower(): value for key, value in options.items()}
        self.source_name = opts.get("name", "hybrid")
        if not _NAME.match(self.source_name):
            raise HybridOptionError(
                f"option 'name' = {self.source_name!r} must be 1-100 letters, digits, _ . -"
            )
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        specs = parse_children(opts.get("sources"))
        bad_records = opts.get("badrecordspath")
        self.bad_records = resolve_uri(bad_records) if bad_records else None
        context = SourceContext(
            schema=self.arrow_schema,
            state_location=opts.get("statelocation"),
            rows_per_partition=_positive_int(opts, "rowsPerPartition")
            or DEFAULT_ROWS_PER_PARTITION,
            source_name=self.source_name,
            bad_records=self.bad_records,
        )
        self.children = [child_class(spec["kind"]).from_spec(spec, context) for spec in specs]
        self.backlog_overrides: list[bool | None] = [spec.get("backlog") for spec in specs]
        self.max_rows = _positive_int(opts, "maxRowsPerTrigger")
        self.max_files = _positive_int(opts, "maxFilesPerTrigger")
        if self.max_rows and self.max_files:
            raise HybridOptionError(
                "options 'maxRowsPerTrigger' and 'maxFilesPerTrigger' exclude each other; set one"
            )
        channel = opts.get("backlogchannel")
        self.gate = SourceGate(PlanChannel(channel), self.source_name) if channel else None
        self.latest: dict[str, Any] | None = None

    # --- offsets ---------------------------------------------------------------------------

    def _offset(self, index: int, position: dict[str, Any], rows: int | None) -> dict[str, Any]:
        """The offset at ``position`` of child ``index``. ``rows`` is how many rows the batch
        ending here takes, so that its checkpoint's metrics can be rebuilt from the offset
        log if the driver dies before recording them."""
        child = self.children[index]
        offset = {
            "source": self.source_name,
            "child": index,
            "phase": child.name,
            "backlog": self._backlog(index, position),
            "position": position,
        }
        if index == len(self.children) - 1 and child.is_exhausted(position):
            offset["finished"] = True
        if self.bad_records is not None:
            offset[QUARANTINE_FIELD] = self.bad_records
        if rows is not None:
            offset["rows"] = rows
        return offset

    def _backlog(self, index: int, position: dict[str, Any]) -> bool:
        """The spec's ``backlog`` if set, else the child's phase at ``position`` if it has
        phases, else whether a child follows it."""
        for decided in (self.backlog_overrides[index], self.children[index].backlog_at(position)):
            if decided is not None:
                return decided
        return index < len(self.children) - 1

    def initialOffset(self) -> dict[str, Any]:
        """Called once, at the first start of the query: every child resolves its starting
        position now (a topic's ``latest`` means its end at this moment, not when the
        children before it are done), and keeps it in its state."""
        positions = [child.initial_position() for child in self.children]
        return self._offset(0, positions[0], rows=None)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows:
            return ReadMaxRows(self.max_rows)
        if self.max_files:
            return ReadMaxFiles(self.max_files)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        limits = Limits(
            max_rows=limit.max_rows if isinstance(limit, ReadMaxRows) else None,
            max_files=limit.max_files if isinstance(limit, ReadMaxFiles) else None,
        )
        if self.gate is not None:
            allowed = self.gate.allowed_rows(start)
            if allowed is None:
                return start
            limits = Limits(min(allowed, limits.max_rows or allowed), limits.max_files)
        index, position = start["child"], start["position"]
        while index < len(self.children) - 1 and self.children[index].is_exhausted(position):
            index += 1
            position = self.children[index].initial_position()
        planned = self.children[index].plan(position, limits)
        end = self._offset(index, planned.end, planned.rows)
        self.latest = {**end, "lag": dict(planned.lag)}
        if planned.health:
            self.latest["health"] = dict(planned.health)
        del self.latest["position"]
        if (index, planned.end) == (start["child"], start["position"]):
            return start  # nothing new: no batch
        if self.gate is not None:
            self.gate.mark_released()
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self.latest

    def commit(self, end: dict[str, Any]) -> None:
        self.children[end["child"]].commit(end["position"])

    def stop(self) -> None:
        for child in self.children:
            child.close()

    # --- data ------------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        index = end["child"]
        child = self.children[index]
        # Children before the end child were exhausted at ``start``: nothing to read there.
        first = start["position"] if start["child"] == index else child.initial_position()
        return list(child.partitions(first, end["position"]))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ReadablePartition)
        yield from partition.read(self.arrow_schema)


class HybridDataSource(DataSource):
    """Register with ``spark.dataSource.register(HybridDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "hybrid"

    def schema(self) -> str:
        raise HybridOptionError(
            "the hybrid source needs a schema: spark.readStream.format('hybrid').schema(...)"
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            return HybridStreamReader(self.options, schema)
        except ChildSpecError as error:
            raise HybridOptionError(str(error)) from None
