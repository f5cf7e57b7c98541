"""``postgres-cdc``: a PostgreSQL table's snapshot as backlog, then its changes as live data.

A position is in one of two phases. In the ``snapshot`` phase it counts the primary-key
chunks copied so far and the last key copied; planning reads the next chunks
(``snapshot.py``), merged with the changes made meanwhile, and writes each once under the
state location, so a replayed batch reads the same rows from the same files. The changelog
runs beside the snapshot from the slot's position before the first chunk: each batch also
carries the changes since the last one (up to the ``lsn`` every position carries, a commit's
end), without those each chunk's image holds or will hold (``coverage.py``). Spark's commit
of a batch advances the slot to its ``lsn``, in either phase, and nothing else moves it. So
the slot stays about a batch behind while the snapshot runs: the server keeps only that
much WAL, and each chunk decodes only the changes since (a snapshot of an hour costs its
last chunk what it costs its first). Once the last chunk is copied the next batch starts
the ``changelog`` phase at the position's ``lsn``.

The snapshot is backlog, and so is the changelog until it has passed the last chunk's high
watermark (``backlog_at``): only from there does the copy equal the table as of one position,
so "live" means "consistent" and a DAG can wait for it. The lag rules then act on the bytes
of WAL after a batch, so a pile-up of changes makes the job re-enter backlog.

Each plan also reports the slot's health (WAL it keeps, ``wal_status``, the server's cap),
writes a heartbeat while the table is quiet and the server busy (``heartbeat.py``), and rides
out a server that is away (restarting, say) for ``outageTimeout``: no batch meanwhile, then
a failure by name.

Spec fields: ``connection`` (a ``postgresql://user@host:port/db`` URL without a password: it
comes from ``BACKLOG_CDC_PASSWORD``, since options show in query plans), ``table``
(``name`` or ``schema.name``), ``chunkRows`` (rows per chunk, default 20000), ``slot`` and
``publication`` (default: one name derived from the state location, so each checkpoint has
its own slot), ``heartbeatInterval`` (default 10s) and ``outageTimeout`` (default 2min).
``stateLocation`` is required. ``teardown`` drops the slot and publication.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import sqlalchemy

from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.backlog.outage import Outage
from spark_jobs.backlog.secrets import redact_text
from spark_jobs.backlog.table_names import TableNameError, split_table_name
from spark_jobs.backlog.values import format_duration
from spark_jobs.sources.cdc.changelog import Changelog
from spark_jobs.sources.cdc.connection import (
    check_schema,
    checked_table,
    checked_url,
    with_source_password,
)
from spark_jobs.sources.cdc.coverage import SnapshotCoverage
from spark_jobs.sources.cdc.heartbeat import HeartbeatSchedule
from spark_jobs.sources.cdc.lsn import format_lsn, parse_lsn
from spark_jobs.sources.cdc.partitions import (
    ChangelogPartition,
    ChangelogSource,
    SnapshotChunkPartition,
)
from spark_jobs.sources.cdc.slot import (
    ReplicationSlot,
    SlotError,
    SlotHealth,
    check_name,
)
from spark_jobs.sources.cdc.snapshot import Chunk, ChunkReader, Refresh
from spark_jobs.sources.cdc.table import START_OVER, Key, TableChangedError, TableError, TableShape
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
from spark_jobs.storage.databases import is_outage
from spark_jobs.storage.files import StateDirectory, resolve_uri

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 20_000
DEFAULT_HEARTBEAT_INTERVAL = "10s"
DEFAULT_OUTAGE_TIMEOUT = "2min"
MAX_OUTAGE_TIMEOUT_S = 7 * 86_400.0
#: The first pause of a read retried while the server is away; it doubles up to a second.
SNAPSHOT, CHANGELOG = "snapshot", "changelog"
#: Refreshes one batch may make, each for what the last left incomplete.
REFRESHES_PER_BATCH = 4


def default_slot_name(state_location: str, child: str) -> str:
    """The slot (and publication) of one checkpoint: named after its state location."""
    where = f"{resolve_uri(state_location).rstrip('/')}/{child}"
    return f"backlog_{hashlib.sha256(where.encode()).hexdigest()[:20]}"


class PostgresCdcChild(ChildSource):
    kind: ClassVar[str] = "postgres-cdc"
    bounded: ClassVar[bool] = False
    STARTING = "start.json"
    #: The table's ``signature`` and its publication's ``publication_state`` when the copy
    #: began: every plan checks that neither changed.
    SHAPE = "shape.json"

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
        heartbeat_interval_s: float,
        outage_timeout_s: float,
    ):
        super().__init__(name)
        self.url, self.table, self.chunk_rows = url, table, chunk_rows
        self.slot, self.publication = slot, publication
        self.state, self.shape = state, shape
        self.outage_timeout_s = outage_timeout_s
        self.chunks = StateDirectory(f"{state.location}/chunks")
        self.refreshes = StateDirectory(f"{state.location}/refreshes")
        self._slot: ReplicationSlot | None = None
        self._reader: ChunkReader | None = None
        #: (last key, high watermark) of the chunks whose records were read, in order.
        self._covered: list[tuple[Key | None, int]] = []
        #: (keys, high watermark) of the refreshes whose records were read, by index; None
        #: for one whose record is gone (the changelog had passed it).
        self._refreshed: list[tuple[list[Key], int] | None] = []
        self._start: Position | None = None
        #: Chunk and refresh files before these are removed (only listed again after a
        #: restart).
        self._chunks_removed = 0
        self._refreshes_removed = 0
        self._heartbeat = HeartbeatSchedule(heartbeat_interval_s)
        self._outage = Outage(outage_timeout_s)
        self._last_lag: dict[str, int] = {}
        self._last_health: dict[str, str] = {}
        self._warned_unbounded = False

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
        url = checked_url(name, spec_field(spec, "connection", str))
        table = spec_field(spec, "table", str)
        try:
            split_table_name(table)
        except TableNameError as error:
            raise ChildSpecError(f"child source {name!r}: field 'table': {error}") from None
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
        heartbeat_interval_s = duration_field(
            spec, "heartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL, minimum_s=0.1
        )
        outage_timeout_s = duration_field(
            spec, "outageTimeout", DEFAULT_OUTAGE_TIMEOUT, maximum_s=MAX_OUTAGE_TIMEOUT_S
        )
        shape = checked_table(name, with_source_password(url), table)
        check_schema(name, shape, context.schema)
        state = StateDirectory(f"{resolve_uri(context.state_location)}/{name}")
        if cls.SHAPE in state.names(cls.SHAPE):
            # A query started again: its chunks and positions are of the table as it was.
            shape.check_unchanged(state.read(cls.SHAPE)["table"])
        return cls(
            name,
            url,
            table,
            chunk_rows,
            slot,
            publication,
            state,
            shape,
            heartbeat_interval_s,
            outage_timeout_s,
        )

    # --- connections, in the planner only ----------------------------------------------

    @property
    def replication_slot(self) -> ReplicationSlot:
        """The slot, its publication checked at every start of the query once it exists:
        a publication changed since (an action, a row filter, a column list, the table
        dropped from it) would make the changelog silently partial."""
        if self._slot is None:
            slot = ReplicationSlot(
                with_source_password(self.url), self.slot, self.publication, self.table
            )
            if self.STARTING in self.state.names(self.STARTING):
                try:
                    slot.check_publication()
                except BaseException:
                    slot.close()
                    raise
            self._slot = slot
        return self._slot

    @property
    def chunk_reader(self) -> ChunkReader:
        if self._reader is None:
            self._reader = ChunkReader(
                with_source_password(self.url), self.shape, self.replication_slot
            )
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
            self._keep_shape()  # a checkpoint from before shapes were kept
            self._check_unchanged()
            return self._start
        self.replication_slot.ensure()
        self._keep_shape()
        lsn = self.replication_slot.confirmed_flush_lsn()
        start = {"phase": SNAPSHOT, "lsn": format_lsn(lsn), "chunks": 0, "after": None}
        self.state.write(self.STARTING, start)
        logger.info(
            "child source %r: slot %r at %s, snapshot of %s in chunks of %d rows",
            self.name, self.slot, format_lsn(lsn), self.shape.name, self.chunk_rows,
        )  # fmt: skip
        self._start = start
        return start

    def _keep_shape(self) -> None:
        if self.SHAPE not in self.state.names(self.SHAPE):
            kept = {
                "table": self.shape.signature(),
                "publication": self.replication_slot.publication_state(),
                "catalog": self.chunk_reader.catalog().as_json(),
            }
            self.state.write(self.SHAPE, kept)

    def _check_unchanged(self) -> None:
        """Fail by name if the table or its publication changed since the copy began.

        Run at the end of every plan, after its peeks: whatever they decoded was written
        before this check, so under the shape and the publication it finds unchanged. A
        change the check finds is before the batch planned, which is never logged. (Both
        are catalog changes the changes themselves may not show: a new primary key under
        REPLICA IDENTITY FULL, a table dropped from the publication, whose changes simply
        stop arriving.)"""
        kept = self.state.read(self.SHAPE)
        try:
            now = self.chunk_reader.describe()
        except TableError as error:  # now a table the copy could not have begun with
            raise TableChangedError(
                f"table {self.shape.name} changed since the copy began: {error}; {START_OVER}"
            ) from None
        now.check_unchanged(kept["table"])
        if "catalog" in kept:  # a checkpoint from before catalogs were kept has none
            self.chunk_reader.catalog().check_unchanged(self.shape.name, kept["catalog"])
        slot = self.replication_slot
        if slot.publication_state() != kept["publication"]:
            slot.check_publication()  # names what is wrong with it now, if anything is
            raise SlotError(
                f"publication {self.publication!r} on {slot.where} changed since the copy "
                f"began (it was altered, or the table dropped from it and added again): "
                f"changes of {self.shape.name} made meanwhile may not have been decoded; "
                f"{START_OVER}"
            )

    def backlog_at(self, position: Position) -> bool:
        """Backlog until the changelog has passed every chunk's high watermark: before, the
        copy holds each chunk as of its own moment, not the table as of one."""
        if position["phase"] == SNAPSHOT:
            return True
        until = self.coverage(position["chunks"], _refreshes(position)).until
        return until is None or parse_lsn(position["lsn"]) < until

    def is_exhausted(self, position: Position) -> bool:
        return False

    def plan(self, start: Position, limits: Limits) -> Planned:
        # Records past the start are of a plan no offset logged (cut by an outage, say):
        # this plan writes them again, maybe otherwise.
        del self._covered[start["chunks"] :], self._refreshed[_refreshes(start) :]
        try:
            if start["phase"] == CHANGELOG:
                planned = self._plan_changes(start, limits)
            elif start.get("done"):
                changelog = {"phase": CHANGELOG, "lsn": start["lsn"], "chunks": start["chunks"]}
                if _refreshes(start):
                    changelog["refreshes"] = _refreshes(start)
                planned = self._plan_changes(changelog, limits)
            else:
                planned = self._plan_chunks(start, limits)
            self._check_unchanged()
        except sqlalchemy.exc.DBAPIError as error:
            if not is_outage(error):
                raise
            return self._ride_out(start, error)
        lasted = self._outage.recovered()
        if lasted is not None:
            logger.warning(
                "child source %r: the server answers again after %s",
                self.name,
                format_duration(lasted),
            )
        return planned

    def _ride_out(self, start: Position, error: sqlalchemy.exc.DBAPIError) -> Planned:
        """No batch while the server does not answer, for ``outageTimeout``; then fail."""
        self.close()  # the pools' connections are dead
        if not self._outage.ongoing:
            logger.warning(
                "child source %r: the server at %s is away (%s); planning no batch until it "
                "answers (for up to %s)",
                self.name, redact_text(self.url), str(error.orig).strip(),
                format_duration(self.outage_timeout_s),
            )  # fmt: skip
        if not self._outage.failed():
            raise SlotError(
                f"child source {self.name!r}: the server at {redact_text(self.url)} has not "
                f"answered for {format_duration(self._outage.lasted_s)} (outageTimeout "
                f"{format_duration(self.outage_timeout_s)}): {str(error.orig).strip()}"
            ) from None
        return Planned(start, self._last_lag, health=self._last_health)

    def _plan_chunks(self, start: Position, limits: Limits) -> Planned:
        """The changes since ``start`` (up to ``max_rows``), then the next chunks: as many as
        ``max_rows`` holds (at least one), all without. The changes are planned first, so
        every one ends before the chunks' low watermarks: the chunks' images hold those of
        their own keys, and the changes' partition leaves them out."""
        changelog = Changelog(self.replication_slot, self.shape)
        lsn = changelog.plan(parse_lsn(start["lsn"]), limits.max_rows)
        wanted = None if limits.max_rows is None else max(1, limits.max_rows // self.chunk_rows)
        index, after, rows = start["chunks"], start["after"], 0
        done = False
        while not done and (wanted is None or index < start["chunks"] + wanted):
            chunk = self._copy_chunk(index, after)
            index, after, rows = index + 1, chunk.last_key, rows + chunk.rows
            done = chunk.last_key is None
        end = {**start, "lsn": format_lsn(lsn), "chunks": index, "after": after}
        rows += self._refresh(changelog, start, end, extend=False)
        if done:
            end["done"] = True
            logger.info(
                "child source %r: snapshot of %s copied, %d chunks",
                self.name,
                self.shape.name,
                index,
            )
        health = self._health()
        return Planned(end, self._lag(0, health), rows, self._describe(health))

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
        behind = changelog.behind(end_lsn)["bytes_behind"] if changelog.more_after else 0
        health = self._health()
        if self._heartbeat.due(end_lsn == start_lsn, health.trailing_wal_bytes):
            self.replication_slot.heartbeat()
        end = {**start, "lsn": format_lsn(end_lsn)}
        self._refresh(changelog, start, end, extend=True)
        return Planned(end, self._lag(behind, health), health=self._describe(health))

    def _refresh(self, changelog: Changelog, start: Position, end: Position, extend: bool) -> int:
        """Read again, after the batch's changes, the rows the changelog cannot complete in
        (start, end] (``Changelog.incomplete_rows``), as a refresh that ``end`` counts: the
        batch reads the refresh's image for those keys instead of their changes. Returns the
        rows of the images.

        The image is as of its high watermark, after the batch's end: a copy that took it at
        the batch's end would hold those keys later than the others, inconsistent (backlog)
        until the next batch. So in the changelog (``extend``) the batch goes on to the
        refresh's own transaction, taking what was committed meanwhile (and refreshing again
        what that leaves incomplete), unless a transaction not yet visible is in the way or
        the refreshes a batch may make run out."""
        index, rows = _refreshes(start), 0
        start_lsn, end_lsn = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        # Moves are counted on the server; generated values read from unsent ones are not.
        decoded = bool(self.shape.generated_columns) and not self.shape.sends_whole_rows
        for round_ in range(REFRESHES_PER_BATCH):
            if not (changelog.moves or decoded):
                break
            coverage = self.coverage(end["chunks"], index)
            keys = changelog.incomplete_rows(start_lsn, end_lsn, coverage)
            if not keys:
                break
            refresh = self._refresh_keys(index, keys)
            index, rows = index + 1, rows + len(keys)
            end["refreshes"] = index
            # The last refresh a batch may make ends it where it is: running on would take
            # rows written meanwhile that no refresh reads again.
            if not extend or round_ == REFRESHES_PER_BATCH - 1:
                break
            further = changelog.plan_until(end_lsn, refresh.settled_at)
            if further < refresh.high_watermark:
                break
            end_lsn = further
            end["lsn"] = format_lsn(end_lsn)
        return rows

    def _refresh_keys(self, index: int, keys: list[Key]) -> Refresh:
        leftovers = {_chunk_file(index, "arrow"), _chunk_file(index, "json")}
        for name in leftovers.intersection(self.refreshes.names("")):
            self.refreshes.remove(name)
        path = f"{self.refreshes.location}/{_chunk_file(index, 'arrow')}"
        refresh = self.chunk_reader.refresh(keys, path)
        self.refreshes.write(
            _chunk_file(index, "json"),
            {"keys": refresh.keys, "highWatermark": format_lsn(refresh.high_watermark)},
        )
        logger.info(
            "child source %r: %d rows moved to new keys left a TOASTed value unsent; read "
            "again at %s", self.name, len(keys), format_lsn(refresh.high_watermark),
        )  # fmt: skip
        return refresh

    def _health(self) -> SlotHealth:
        """The slot's health (a lost slot fails by name); the first time an unbounded
        ``max_slot_wal_keep_size`` is seen, a warning says what it risks."""
        health = self.replication_slot.health()
        if health.unbounded and not self._warned_unbounded:
            self._warned_unbounded = True
            logger.warning(
                "child source %r: max_slot_wal_keep_size is -1 on %s, so the server keeps "
                "WAL for slot %r without limit: a job stopped for long can fill its disk; "
                "set max_slot_wal_keep_size (the slot is then lost, and the job fails by "
                "name, rather than the server)",
                self.name, redact_text(self.url), self.slot,
            )  # fmt: skip
        return health

    def _lag(self, bytes_behind: int, health: SlotHealth) -> dict[str, int]:
        self._last_lag = {
            OFFSETS_BEHIND_LATEST: bytes_behind,
            "bytes_behind": bytes_behind,
            "slot_retained_wal_bytes": health.retained_wal_bytes,
        }
        return self._last_lag

    def _describe(self, health: SlotHealth) -> dict[str, str]:
        keep = "unlimited" if health.unbounded else health.max_slot_wal_keep_size
        self._last_health = {"slot_wal_status": health.wal_status, "max_slot_wal_keep_size": keep}
        return self._last_health

    def commit(self, position: Position) -> None:
        """Spark will not read before ``position`` again: copied chunks' files may go, and
        the slot moves to its ``lsn``. With the server away, the slot stays behind until a
        later commit: behind is safe, ahead would lose changes."""
        if position["chunks"] > self._chunks_removed:
            for name in self.chunks.names(".arrow"):
                if int(name.split(".")[0]) < position["chunks"]:
                    self.chunks.remove(name)
            self._chunks_removed = position["chunks"]
        if _refreshes(position) > self._refreshes_removed:
            self._remove_refreshes(position)
        try:
            Changelog(self.replication_slot, self.shape).commit(parse_lsn(position["lsn"]))
        except sqlalchemy.exc.DBAPIError as error:
            if not is_outage(error):
                raise
            self.close()
            logger.warning(
                "child source %r: the slot stays behind %s until a later commit: the "
                "server is away (%s)",
                self.name, position["lsn"], str(error.orig).strip(),
            )  # fmt: skip

    def _remove_refreshes(self, position: Position) -> None:
        """The images of committed refreshes; and their records once the changelog is past
        their high watermarks, where they cover no change any more."""
        count, lsn = _refreshes(position), parse_lsn(position["lsn"])
        self.coverage(position["chunks"], count)
        for name in self.refreshes.names(""):
            index = int(name.split(".")[0])
            record = self._refreshed[index] if index < len(self._refreshed) else None
            passed = record is not None and record[1] <= lsn
            if index < count and (name.endswith(".arrow") or passed):
                self.refreshes.remove(name)
        self._refreshes_removed = count

    # --- reading -----------------------------------------------------------------------

    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]:
        """The changes in (start, end] of the keys the images do not hold, then the images
        read for ``end``: refreshes, and in the snapshot, chunks."""
        found: list[ReadablePartition] = []
        start_lsn, end_lsn = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        if end_lsn != start_lsn:
            coverage = self.coverage(end["chunks"], _refreshes(end))
            overlaps = coverage.until is None or start_lsn < coverage.until
            found.append(
                ChangelogPartition(
                    ChangelogSource(
                        self.url, self.slot, self.publication, self.table, self.shape,
                        self.outage_timeout_s,
                    ),
                    start_lsn,
                    end_lsn,
                    coverage if overlaps else None,
                )
            )  # fmt: skip
        found.extend(
            SnapshotChunkPartition(f"{self.refreshes.location}/{_chunk_file(i, 'arrow')}")
            for i in range(_refreshes(start), _refreshes(end))
        )
        if end["phase"] == SNAPSHOT:
            found.extend(
                SnapshotChunkPartition(f"{self.chunks.location}/{_chunk_file(i, 'arrow')}")
                for i in range(start["chunks"], end["chunks"])
            )
        return found

    def coverage(self, chunks: int, refreshes: int = 0) -> SnapshotCoverage:
        """The key ranges and high watermarks of the first ``chunks`` chunks copied and of the
        first ``refreshes`` refreshes (each record read once)."""
        for index in range(len(self._covered), chunks):
            record = self.chunks.read(_chunk_file(index, "json"))
            last = None if record["last"] is None else self.shape.typed_key(record["last"])
            self._covered.append((last, parse_lsn(record["highWatermark"])))
        for index in range(len(self._refreshed), refreshes):
            try:
                record = self.refreshes.read(_chunk_file(index, "json"))
            except FileNotFoundError:  # removed once the changelog had passed it
                self._refreshed.append(None)
                continue
            keys = [self.shape.typed_key(key) for key in record["keys"]]
            self._refreshed.append((keys, parse_lsn(record["highWatermark"])))
        refreshed = [r for r in self._refreshed[:refreshes] if r is not None]
        return SnapshotCoverage.of(self._covered[:chunks], refreshed)


def _chunk_file(index: int, suffix: str) -> str:
    return f"{index:08d}.{suffix}"


def _refreshes(position: Position) -> int:
    """How many refreshes the batches up to ``position`` read (none before the first)."""
    return int(position.get("refreshes", 0))
