"""``postgres-cdc``: a PostgreSQL table's snapshot as backlog, then its changes as live data.

A position is in one of two phases. In the ``snapshot`` phase it counts the primary-key
chunks copied so far and the last key copied; planning reads the next chunks
(``snapshot.py``), merged with the changes made meanwhile, and writes each once under the
state location, so a replayed batch reads the same rows from the same files. Once the last
chunk is copied the next batch starts the ``changelog`` phase at the slot's position from
before the first chunk (the ``lsn`` every position carries), and drops the changes each
chunk's image already holds (``coverage.py``). Each changelog position is a commit's end,
and Spark's commit of a batch advances the slot to it; nothing moves the slot before.

The snapshot is backlog, the changelog live (``backlog_at``); the lag rules then act on the
bytes of WAL after a batch, so a pile-up of changes makes the job re-enter backlog.

Spec fields: ``connection`` (a ``postgresql://user@host:port/db`` URL without a password: it
comes from ``BACKLOG_CDC_PASSWORD``, since options show in query plans), ``table``
(``name`` or ``schema.name``), ``chunkRows`` (rows per chunk, default 20000), ``slot`` and
``publication`` (default: one name derived from the state location, so each checkpoint has
its own slot). ``stateLocation`` is required. ``teardown`` drops the slot and publication.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import pyarrow as pa
import sqlalchemy
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.schema import installed_postgres_driver, with_password
from spark_jobs.sources.cdc.changelog import Changelog
from spark_jobs.sources.cdc.coverage import SnapshotCoverage
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.slot import (
    ReplicationSlot,
    SlotError,
    check_logical_decoding,
    check_name,
)
from spark_jobs.sources.cdc.snapshot import Chunk, ChunkReader, read_chunk
from spark_jobs.sources.cdc.table import TableError, TableShape, describe_table
from spark_jobs.sources.children import (
    ChildSource,
    ChildSpecError,
    Limits,
    Planned,
    Position,
    ReadablePartition,
    SourceContext,
    spec_field,
)
from spark_jobs.sources.files import check_types
from spark_jobs.sources.storage import StateDirectory, resolve_uri

logger = logging.getLogger(__name__)

PASSWORD_ENV = "BACKLOG_CDC_PASSWORD"
DEFAULT_CHUNK_ROWS = 20_000
SNAPSHOT, CHANGELOG = "snapshot", "changelog"


def default_slot_name(state_location: str, child: str) -> str:
    """The slot (and publication) of one checkpoint: named after its state location."""
    where = f"{resolve_uri(state_location).rstrip('/')}/{child}"
    return f"backlog_{hashlib.sha256(where.encode()).hexdigest()[:20]}"


def connection_url(child: str, url: str) -> str:
    """``url`` (SQLAlchemy's or libpq's form) with the password from
    ``BACKLOG_CDC_PASSWORD``; refuses a URL that is not PostgreSQL's or that carries a
    password itself."""
    if url.startswith("postgres://"):  # libpq's short scheme, which SQLAlchemy does not take
        url = "postgresql://" + url.removeprefix("postgres://")
    try:
        parsed = make_url(url)
    except ArgumentError:
        parsed = None
    if parsed is None or parsed.get_backend_name() != "postgresql":
        raise ChildSpecError(
            f"child source {child!r}: field 'connection' = {redact_text(url)!r} must be a "
            "PostgreSQL URL such as postgresql://user@host:5432/database"
        )
    if parsed.password is not None:
        raise ChildSpecError(
            f"child source {child!r}: field 'connection' = {redact_text(url)!r} carries a "
            f"password; options show in query plans, so set it in the environment variable "
            f"{PASSWORD_ENV} of the driver and executors instead"
        )
    return with_password(url, os.environ.get(PASSWORD_ENV))


class SnapshotChunkPartition(ReadablePartition):
    """One chunk's merged image, as written at planning."""

    def __init__(self, path: str):
        self.path = path

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        yield from read_chunk(self.path).select(schema.names).cast(schema).to_batches()


class ChangelogPartition(ReadablePartition):
    """The changes of the transactions that end in (start, end], peeked on the executor."""

    def __init__(
        self, child: PostgresCdcChild, start: int, end: int, coverage: SnapshotCoverage | None
    ):
        self._url = child.url
        self.slot, self.publication, self.table = child.slot, child.publication, child.table
        self.shape = child.shape
        self.start, self.end, self.coverage = start, end, coverage

    def __repr__(self) -> str:
        return f"ChangelogPartition({self.slot}, {format_lsn(self.start)}..{format_lsn(self.end)})"

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        slot = ReplicationSlot(self._url, self.slot, self.publication, self.table)
        try:
            changes = Changelog(slot, self.shape).read(self.start, self.end, self.coverage)
        finally:
            slot.close()
        yield from changes.select(schema.names).cast(schema).to_batches()


class PostgresCdcChild(ChildSource):
    kind: ClassVar[str] = "postgres-cdc"
    bounded: ClassVar[bool] = False
    STARTING = "start.json"

    def __init__(
        self,
        name: str,
        url: str,
        table: str,
        chunk_rows: int,
        slot: str,
        publication: str,
        state: StateDirectory,
        shape: TableShape,
    ):
        super().__init__(name)
        self.url, self.table, self.chunk_rows = url, table, chunk_rows
        self.slot, self.publication = slot, publication
        self.state, self.shape = state, shape
        self.chunks = StateDirectory(f"{state.location}/chunks")
        self._slot: ReplicationSlot | None = None
        self._reader: ChunkReader | None = None
        self._coverage: SnapshotCoverage | None = None
        self._start: Position | None = None
        #: Chunk files before this one are removed (only listed again after a restart).
        self._chunks_removed = 0

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the spec, not the planner's connections."""
        return {**self.__dict__, "_slot": None, "_reader": None}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], context: SourceContext) -> PostgresCdcChild:
        name = spec_field(spec, "name", str)
        if not context.state_location:
            raise ChildSpecError(
                f"child source {name!r}: a postgres-cdc child keeps its snapshot chunks and "
                "starting position in the option 'stateLocation' (kept with the checkpoint), "
                "which is not set"
            )
        url = connection_url(name, spec_field(spec, "connection", str))
        table = spec_field(spec, "table", str)
        chunk_rows = spec_field(spec, "chunkRows", int, DEFAULT_CHUNK_ROWS)
        if chunk_rows < 1:
            raise ChildSpecError(
                f"child source {name!r}: field 'chunkRows' = {chunk_rows!r} must be at least 1"
            )
        slot = spec_field(spec, "slot", str, default_slot_name(context.state_location, name))
        publication = spec_field(spec, "publication", str, slot)
        for field, value in (("slot", slot), ("publication", publication)):
            try:
                check_name(field, value)
            except ValueError as error:
                raise ChildSpecError(f"child source {name!r}: field {field!r}: {error}") from None
        shape = checked_table(name, url, table)
        _check_schema(name, shape, context.schema)
        state = StateDirectory(f"{resolve_uri(context.state_location)}/{name}")
        return cls(name, url, table, chunk_rows, slot, publication, state, shape)

    # --- connections, in the planner only ----------------------------------------------

    @property
    def replication_slot(self) -> ReplicationSlot:
        if self._slot is None:
            self._slot = ReplicationSlot(self.url, self.slot, self.publication, self.table)
        return self._slot

    @property
    def chunk_reader(self) -> ChunkReader:
        if self._reader is None:
            self._reader = ChunkReader(self.url, self.table, self.replication_slot)
        return self._reader

    def close(self) -> None:
        for held in (self._reader, self._slot):
            if held is not None:
                held.close()
        self._slot = self._reader = None

    # --- positions ---------------------------------------------------------------------

    def initial_position(self) -> Position:
        """The first snapshot position, resolved once and kept: the slot is created now (or
        found) and its position is where the changelog will start."""
        if self._start is not None:
            return self._start
        self.state.claim({"kind": self.kind, "table": self.shape.name, "slot": self.slot})
        if self.STARTING in self.state.names(self.STARTING):
            self._start = self.state.read(self.STARTING)
            return self._start
        self.replication_slot.ensure()
        lsn = self.replication_slot.confirmed_flush_lsn()
        start = {"phase": SNAPSHOT, "lsn": format_lsn(lsn), "chunks": 0, "after": None}
        self.state.write(self.STARTING, start)
        logger.info(
            "child source %r: slot %r at %s, snapshot of %s in chunks of %d rows",
            self.name, self.slot, format_lsn(lsn), self.shape.name, self.chunk_rows,
        )  # fmt: skip
        self._start = start
        return start

    def backlog_at(self, position: Position) -> bool:
        return position["phase"] == SNAPSHOT

    def is_exhausted(self, position: Position) -> bool:
        return False

    def plan(self, start: Position, limits: Limits) -> Planned:
        if start["phase"] == CHANGELOG:
            return self._plan_changes(start, limits)
        if start.get("done"):
            changelog = {"phase": CHANGELOG, "lsn": start["lsn"], "chunks": start["chunks"]}
            return self._plan_changes(changelog, limits)
        return self._plan_chunks(start, limits)

    def _plan_chunks(self, start: Position, limits: Limits) -> Planned:
        """Copy the next chunks: as many as ``max_rows`` holds (at least one), all without."""
        wanted = None if limits.max_rows is None else max(1, limits.max_rows // self.chunk_rows)
        index, after, rows = start["chunks"], start["after"], 0
        done = False
        while not done and (wanted is None or index < start["chunks"] + wanted):
            chunk = self._copy_chunk(index, after)
            index, after, rows = index + 1, chunk.last_key, rows + chunk.rows
            done = chunk.last_key is None
        end = {**start, "chunks": index, "after": after}
        if done:
            end["done"] = True
            logger.info(
                "child source %r: snapshot of %s copied, %d chunks",
                self.name,
                self.shape.name,
                index,
            )
        return Planned(end, {}, rows)

    def _copy_chunk(self, index: int, after: list[Any] | None) -> Chunk:
        """Chunk ``index``: a file from a plan that no offset recorded is replaced."""
        leftovers = {_chunk_file(index, "arrow"), _chunk_file(index, "json")}
        for name in leftovers.intersection(self.chunks.names("")):
            self.chunks.remove(name)
        path = f"{self.chunks.location}/{_chunk_file(index, 'arrow')}"
        chunk = self.chunk_reader.next_chunk(after, self.chunk_rows, path)
        self.chunks.write(
            _chunk_file(index, "json"),
            {"last": chunk.last_key, "highWatermark": format_lsn(chunk.high_watermark)},
        )
        return chunk

    def _plan_changes(self, start: Position, limits: Limits) -> Planned:
        changelog = Changelog(self.replication_slot, self.shape)
        start_lsn = parse_lsn(start["lsn"])
        end_lsn = changelog.plan(start_lsn, limits.max_rows)
        behind = changelog.behind(end_lsn) if changelog.more_after else {"bytes_behind": 0}
        lag = {OFFSETS_BEHIND_LATEST: behind["bytes_behind"], **behind}
        return Planned({**start, "lsn": format_lsn(end_lsn)}, lag)

    def commit(self, position: Position) -> None:
        """Spark will not read before ``position`` again: copied chunks' files may go, and
        in the changelog the slot moves to it."""
        if position["chunks"] > self._chunks_removed:
            for name in self.chunks.names(".arrow"):
                if int(name.split(".")[0]) < position["chunks"]:
                    self.chunks.remove(name)
            self._chunks_removed = position["chunks"]
        if position["phase"] == CHANGELOG:
            Changelog(self.replication_slot, self.shape).commit(parse_lsn(position["lsn"]))

    # --- reading -----------------------------------------------------------------------

    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]:
        if end["phase"] == SNAPSHOT:
            return [
                SnapshotChunkPartition(f"{self.chunks.location}/{_chunk_file(i, 'arrow')}")
                for i in range(start["chunks"], end["chunks"])
            ]
        # A snapshot position's lsn is where its changelog starts.
        start_lsn, end_lsn = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        if end_lsn == start_lsn:
            return []
        coverage = self.coverage(end["chunks"])
        overlaps = start_lsn < coverage.until
        return [ChangelogPartition(self, start_lsn, end_lsn, coverage if overlaps else None)]

    def coverage(self, chunks: int) -> SnapshotCoverage:
        """The key ranges and high watermarks of the ``chunks`` chunks copied."""
        if self._coverage is None:
            found = [self.chunks.read(_chunk_file(i, "json")) for i in range(chunks)]
            self._coverage = SnapshotCoverage.of(
                [
                    (None if c["last"] is None else self.shape.typed_key(c["last"]),
                     parse_lsn(c["highWatermark"]))
                    for c in found
                ]
            )  # fmt: skip
        return self._coverage


def teardown(url: str, slot: str, publication: str, table: str) -> bool:
    """Drop the slot and publication of a query that is gone for good (its checkpoint and
    state location go too); True if a slot was there."""
    replication = ReplicationSlot(url, slot, publication, table)
    try:
        try:
            replication.confirmed_flush_lsn()
            existed = True
        except SlotError:
            existed = False
        replication.drop()
        return existed
    finally:
        replication.close()


def _chunk_file(index: int, suffix: str) -> str:
    return f"{index:08d}.{suffix}"


def checked_table(child: str, url: str, table: str) -> TableShape:
    """The table's shape, after refusing by name what would fail later: a server that does
    not decode changes or does not answer, a table that cannot be read in chunks."""
    shape = describe(child, url, table)
    try:
        check_logical_decoding(url)
    except SlotError as error:
        raise ChildSpecError(f"child source {child!r}: {error}") from None
    return shape


def describe(child: str, url: str, table: str) -> TableShape:
    engine = sqlalchemy.create_engine(installed_postgres_driver(make_url(url)))
    try:
        return describe_table(engine, table)
    except TableError as error:
        raise ChildSpecError(f"child source {child!r}: {error}") from None
    except sqlalchemy.exc.OperationalError as error:
        raise ChildSpecError(
            f"child source {child!r}: cannot connect to {redact_text(url)}: "
            f"{redact_text(str(error.orig)).strip()}"
        ) from None
    finally:
        engine.dispose()


def change_schema(shape: TableShape) -> pa.Schema:
    """The rows' schema: the table's columns, then ``_op``, ``_lsn``, ``_seq``, ``_commit_time``,
    ``_unchanged``."""
    return shape.arrow_table([], []).schema


def _check_schema(child: str, shape: TableShape, schema: pa.Schema) -> None:
    """Refuse a query schema with columns the table's rows do not have, or cannot take."""
    given = change_schema(shape)
    missing = [name for name in schema.names if name not in given.names]
    if missing:
        raise ChildSpecError(
            f"child source {child!r}: the query's schema has columns {missing} that rows of "
            f"{shape.name} do not; they have {given.names}"
        )
    try:
        check_types(given, schema)
    except ValueError as error:
        raise ChildSpecError(f"child source {child!r}, table {shape.name}: {error}") from None
