"""File children of the hybrid source: a bounded directory and a live landing directory.

Positions are ``{"file": i, "row": r}``: the next record is row ``r`` of the ``i``-th file
of a durable manifest, an append-only list of admitted files (with their size and row
count) kept in the source's state location, so a position names the same rows after a
restart. A file is admitted once it has been read in full and found valid: a landing file
when it is discovered, a file of a bounded directory when planning reaches it, out of the
snapshot of names taken at the first start. A malformed file is therefore refused by name
before any of its rows count, and can be repaired in place. Files are read with pyarrow
(local paths, or any URI pyarrow.fs understands).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from spark_jobs.backlog.values import parse_duration
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
from spark_jobs.sources.quarantine import BadInput, Quarantine, file_key
from spark_jobs.storage.files import (
    ListedFile,
    StateDirectory,
    StorageError,
    filesystem,
    list_files,
    resolve_uri,
    stat_file,
)

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "json", "csv")


class InputFileError(StorageError):
    """A file that cannot be read as declared; the message names it."""


@dataclass(frozen=True)
class FileEntry:
    """An admitted file: its rows are counted and its size recorded for later checks."""

    uri: str
    size: int
    mtime_ns: int
    rows: int
    #: Why the file was set aside instead (it then counts no rows).
    quarantined: str | None = None


class FileManifest:
    """The durable, append-only list of admitted files of one child source.

    Each planning that admits files adds one segment file; every ``COMPACT_EVERY`` segments
    one compacted file holds the entries so far and the files before it are deleted, so a
    landing directory that receives a file a second for months keeps a handful of state
    files, not millions (Spark's file sink log compacts the same way). Positions count
    entries from the first file ever admitted. Compaction may forget a leading run of
    entries that ``forgettable`` allows (Spark committed past them and their files are too
    old to be listed again); the compacted file then records how many came before, so no
    position changes and the list stays as long as the files a listing still considers.
    """

    SUFFIX = ".manifest.json"
    COMPACT_SUFFIX = ".compact.json"
    COMPACT_EVERY = 100

    def __init__(
        self,
        state: StateDirectory,
        forgettable: Callable[[int, FileEntry], bool] = lambda index, entry: False,
    ):
        self._state = state
        self._forgettable = forgettable
        self._entries: list[FileEntry] | None = None
        self._uris: set[str] = set()
        self._first = 0
        self._next_segment = 0
        self._staged = 0
        self.newest_mtime_ns = 0

    @property
    def entries(self) -> list[FileEntry]:
        """The entries kept: the ``first``-th file ever admitted and those after it."""
        if self._entries is None:
            self._entries = [FileEntry(**item) for item in self._load()]
            self._uris = {entry.uri for entry in self._entries}
            self.newest_mtime_ns = max((e.mtime_ns for e in self._entries), default=0)
        return self._entries

    @property
    def first(self) -> int:
        """How many entries compaction forgot: the index of ``entries[0]``."""
        self.entries  # noqa: B018 - loads the manifest
        return self._first

    @property
    def count(self) -> int:
        """How many files were ever admitted: the index the next one gets."""
        return self.first + len(self.entries)

    def entry(self, index: int) -> FileEntry | None:
        """The ``index``-th file ever admitted (not forgotten), None if not admitted yet."""
        position = index - self.first
        return self.entries[position] if position < len(self.entries) else None

    def after(self, index: int) -> list[FileEntry]:
        """The entries from the ``index``-th file ever admitted on."""
        return self.entries[index - self.first :]

    def _load(self) -> list[dict[str, Any]]:
        """The latest compacted file and the segments after it, in order."""
        segments = self._numbered(self.SUFFIX)
        compacted = self._numbered(self.COMPACT_SUFFIX)
        self._next_segment = max([*segments, *compacted], default=-1) + 1
        base = max(compacted, default=-1)
        items: list[dict[str, Any]] = []
        if base >= 0:
            kept = self._state.read(self._name(base, self.COMPACT_SUFFIX))
            # Releases before forgetting wrote a plain list: every entry, from the first.
            if isinstance(kept, list):
                items = kept
            else:
                self._first, items = kept["first"], kept["entries"]
        for number in sorted(n for n in segments if n > base):
            items += self._state.read(self._name(number, self.SUFFIX))
        return items

    def _numbered(self, suffix: str) -> list[int]:
        return [int(name.split(".")[0]) for name in self._state.names(suffix)]

    @staticmethod
    def _name(number: int, suffix: str) -> str:
        return f"{number:010d}{suffix}"

    def __contains__(self, uri: str) -> bool:
        self.entries  # noqa: B018 - loads the manifest
        return uri in self._uris

    def stage(self, entry: FileEntry) -> None:
        """Count ``entry`` as admitted now; ``flush`` writes it, with every one staged since
        the last write, as one segment."""
        self.entries.append(entry)
        self._uris.add(entry.uri)
        self.newest_mtime_ns = max(self.newest_mtime_ns, entry.mtime_ns)
        self._staged += 1

    def flush(self) -> None:
        """Write the staged entries durably, as one segment: each write is synced to disk, so
        a planning that admits a hundred files writes once, not a hundred times."""
        if not self._staged:
            return
        number = self._next_segment
        if (number + 1) % self.COMPACT_EVERY == 0:
            self._forget()
            kept = {"first": self._first, "entries": [asdict(e) for e in self.entries]}
            self._state.write(self._name(number, self.COMPACT_SUFFIX), kept)
            self._delete_before(number)
        else:
            new = self.entries[-self._staged :]
            self._state.write(self._name(number, self.SUFFIX), [asdict(e) for e in new])
        self._next_segment = number + 1
        self._staged = 0

    def _forget(self) -> None:
        """Drop the leading run of entries that may be forgotten, before a compaction."""
        entries = self.entries
        forgotten = 0
        while forgotten < len(entries) and self._forgettable(
            self._first + forgotten, entries[forgotten]
        ):
            forgotten += 1
        if forgotten:
            self._uris.difference_update(entry.uri for entry in entries[:forgotten])
            del entries[:forgotten]
            self._first += forgotten

    def append(self, new: list[FileEntry]) -> None:
        for entry in new:
            self.stage(entry)
        self.flush()

    def _delete_before(self, number: int) -> None:
        """What a compacted file supersedes; a crash before this leaves files that the next
        load ignores and the next compaction deletes."""
        for suffix in (self.SUFFIX, self.COMPACT_SUFFIX):
            for older in self._numbered(suffix):
                if older < number:
                    self._state.remove(self._name(older, suffix))


# --- reading ---------------------------------------------------------------------------


def _open(uri: str) -> pa.NativeFile:
    fs, path = filesystem(uri)
    return fs.open_input_file(path)


def check_columns(names: list[str], schema: pa.Schema) -> None:
    missing = [name for name in schema.names if name not in names]
    if missing:
        raise ValueError(f"missing columns {missing}; the file has {names}")


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    check_columns(table.column_names, schema)
    return table.select(schema.names).cast(schema)


def _reads_as(found: pa.DataType, wanted: pa.DataType) -> bool:
    """A parquet column of type ``found`` reads as ``wanted`` without losing values: the
    same type, a wider number, another timestamp unit or zone, another string encoding."""
    t = pa.types
    if t.is_dictionary(found):
        found = found.value_type
    if found.equals(wanted):
        return True
    if t.is_integer(wanted) and t.is_integer(found):
        # A signed integer holds a narrower signed or unsigned one.
        return found.bit_width < wanted.bit_width or (
            found.bit_width == wanted.bit_width and t.is_signed_integer(found)
        )
    if t.is_floating(wanted):
        if t.is_floating(found):
            return found.bit_width <= wanted.bit_width
        return t.is_integer(found) and found.bit_width <= 32
    families = (
        (t.is_timestamp,),
        (t.is_string, t.is_large_string),
        (t.is_binary, t.is_large_binary),
    )
    for family in families:
        if any(check(wanted) for check in family):
            return any(check(found) for check in family)
    return False


def check_types(file_schema: pa.Schema, schema: pa.Schema) -> None:
    """Refuse, naming every column, a file whose column types the schema cannot take:
    casting an empty table (all a footer gives) would accept strings as numbers."""
    wrong = [
        f"{field.name} is {file_schema.field(field.name).type}, not {field.type}"
        for field in schema
        if field.name in file_schema.names
        and not _reads_as(file_schema.field(field.name).type, field.type)
    ]
    if wrong:
        raise ValueError(f"column types do not match the schema: {'; '.join(wrong)}")


def _csv_timestamps(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """CSV timestamps without a zone are taken as UTC, like Spark with a UTC session zone."""
    for index, target in enumerate(schema):
        if not pa.types.is_timestamp(target.type) or target.type.tz is None:
            continue
        text = table.column(target.name)
        try:
            converted = text.cast(target.type)
        except pa.ArrowInvalid:
            naive = text.cast(pa.timestamp(target.type.unit))
            converted = pc.assume_timezone(naive, target.type.tz)
        table = table.set_column(index, target.name, converted)
    return table


def read_table(uri: str, fmt: str, schema: pa.Schema) -> pa.Table:
    """The whole file as a table of ``schema``."""
    with _open(uri) as handle:
        if fmt == "parquet":
            table = pq.read_table(handle, columns=schema.names)
        elif fmt == "json":
            parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            table = pa_json.read_json(handle, parse_options=parse)
        else:
            as_text = pa.schema(
                [f.with_type(pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema]
            )
            options = pa_csv.ConvertOptions(
                column_types=as_text, include_columns=schema.names, strings_can_be_null=True
            )
            table = _csv_timestamps(pa_csv.read_csv(handle, convert_options=options), schema)
    return _cast(table, schema)


def admit(listed: ListedFile, fmt: str, schema: pa.Schema) -> FileEntry:
    """Read the file in full (parquet: its footer and schema) and count its rows."""
    try:
        if fmt == "parquet":
            with _open(listed.uri) as handle:
                parquet = pq.ParquetFile(handle)
                # From the footer's schema alone: an empty table would import pandas into
                # the planner process, 0.5-1.3 s at every query start.
                check_columns(parquet.schema_arrow.names, schema)
                check_types(parquet.schema_arrow, schema)
                rows = parquet.metadata.num_rows
        else:
            rows = read_table(listed.uri, fmt, schema).num_rows
    except Exception as error:
        raise InputFileError(f"cannot read {fmt} input file {listed.uri}: {error}") from error
    return FileEntry(listed.uri, listed.size, listed.mtime_ns, rows)


@dataclass(frozen=True)
class FileSlice:
    """Rows ``[start, stop)`` of one admitted file."""

    entry: FileEntry
    fmt: str
    start: int
    stop: int

    def read(self, schema: pa.Schema) -> pa.Table:
        try:
            self._check_unchanged()
            if self.fmt == "parquet":
                return self._read_parquet(schema)
            table = read_table(self.entry.uri, self.fmt, schema)
            return table.slice(self.start, self.stop - self.start)
        except InputFileError:
            raise
        except Exception as error:
            raise InputFileError(
                f"cannot read {self.fmt} input file {self.entry.uri} "
                f"(rows {self.start}-{self.stop}): {error}"
            ) from error

    def _check_unchanged(self) -> None:
        now = stat_file(self.entry.uri)
        if (now.size, now.mtime_ns) != (self.entry.size, self.entry.mtime_ns):
            raise InputFileError(
                f"input file {self.entry.uri} changed after it was admitted (size "
                f"{self.entry.size} -> {now.size}, modified {self.entry.mtime_ns} -> "
                f"{now.mtime_ns} ns); input files must not be modified"
            )

    def _read_parquet(self, schema: pa.Schema) -> pa.Table:
        with _open(self.entry.uri) as handle:
            parquet = pq.ParquetFile(handle)
            groups, first_row, offset = [], None, 0
            for index in range(parquet.metadata.num_row_groups):
                size = parquet.metadata.row_group(index).num_rows
                if offset + size > self.start and offset < self.stop:
                    groups.append(index)
                    first_row = offset if first_row is None else first_row
                offset += size
            if not groups:
                return schema.empty_table()
            table = parquet.read_row_groups(groups, columns=schema.names)
        table = table.slice(self.start - (first_row or 0), self.stop - self.start)
        return _cast(table, schema)


class FileSlicesPartition(ReadablePartition):
    """Consecutive file slices read by one Spark task."""

    def __init__(self, slices: list[FileSlice]):
        self.slices = slices

    def read(self, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        for piece in self.slices:
            yield from piece.read(schema).to_batches(max_chunksize=65_536)


# --- the children ----------------------------------------------------------------------


class FileChild(ChildSource):
    """Planning over a manifest of admitted files; subclasses decide what gets admitted."""

    def __init__(
        self,
        name: str,
        directory_uri: str,
        fmt: str,
        glob: str,
        state: StateDirectory,
        schema: pa.Schema,
        rows_per_partition: int,
        quarantine: Quarantine | None = None,
    ):
        super().__init__(name)
        self.directory_uri = directory_uri
        self.fmt = fmt
        self.glob = glob
        self.state = state
        self.manifest = FileManifest(state, self._forgettable)
        self.schema = schema
        self.rows_per_partition = rows_per_partition
        self.quarantine = quarantine
        self._claimed = False

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], context: SourceContext) -> FileChild:
        name = spec_field(spec, "name", str)
        fmt = spec_field(spec, "format", str, "parquet")
        if fmt not in FORMATS:
            raise ChildSpecError(
                f"child source {name!r}: field 'format' = {fmt!r} must be one of {list(FORMATS)}"
            )
        if not context.state_location:
            raise ChildSpecError(
                f"child source {name!r}: the hybrid source needs the option 'stateLocation' "
                "(a directory kept with the checkpoint) to keep its list of admitted files"
            )
        return cls(
            name=name,
            directory_uri=resolve_uri(spec_field(spec, "path", str)),
            fmt=fmt,
            glob=spec_field(spec, "glob", str, "*"),
            state=StateDirectory(f"{resolve_uri(context.state_location)}/{name}"),
            schema=context.schema,
            rows_per_partition=context.rows_per_partition,
            quarantine=context.quarantine(name),
            **cls._own_fields(spec),
        )

    @classmethod
    def _own_fields(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments from the spec's fields that only this kind of child takes."""
        return {}

    def initial_position(self) -> Position:
        return {"file": 0, "row": 0}

    def _discover(self) -> None:
        """Admit files that became available since the last planning, where the child can."""

    def _forgettable(self, index: int, entry: FileEntry) -> bool:
        """Whether compaction may forget the ``index``-th entry; by default it keeps all."""
        return False

    def _admit(self, listed: ListedFile, index: int) -> FileEntry:
        """The file's manifest entry; with a quarantine, a malformed file is set aside and
        enters the manifest with no rows, so positions after it stay what they were."""
        try:
            return admit(listed, self.fmt, self.schema)
        except InputFileError as error:
            if self.quarantine is None:
                raise
            position = {"file": listed.uri, "index": index}
            self.quarantine.set_aside(file_key(index), [BadInput(position, str(error))])
            logger.warning(
                "child source %r: %s; set aside in %s", self.name, error, self.quarantine.directory
            )
            return FileEntry(listed.uri, listed.size, listed.mtime_ns, 0, quarantined=str(error))

    def _entry(self, index: int) -> FileEntry | None:
        """The ``index``-th admitted file, admitting it first where the child can; else None."""
        return self.manifest.entry(index)

    def _known_files(self) -> int:
        return self.manifest.count

    def _check_state(self, position: Position) -> None:
        """The state must hold what the checkpoint's offsets refer to."""
        if not self._claimed:
            identity = {"kind": self.kind, "path": self.directory_uri, "format": self.fmt}
            self.state.claim({**identity, "glob": self.glob})
            self._claimed = True
        if (position["file"], position["row"]) > (self._known_files(), 0):
            raise InputFileError(
                f"the checkpoint refers to file {position['file']} of child {self.name!r}, "
                f"but its state at {self.state.location} knows {self._known_files()} files: "
                "the state location was lost or replaced; restore it, or start over with a "
                "new checkpoint"
            )
        if position["file"] < self.manifest.first:
            raise InputFileError(
                f"the checkpoint refers to file {position['file']} of child {self.name!r}, "
                f"but its state at {self.state.location} has forgotten the files before "
                f"{self.manifest.first}, which Spark had committed: the checkpoint is older "
                "than the state location; restore both from the same time, or start over"
            )

    def plan(self, start: Position, limits: Limits) -> Planned:
        self._check_state(start)
        self._discover()
        index, row = start["file"], start["row"]
        taken = files = 0
        while True:
            room = None if limits.max_rows is None else limits.max_rows - taken
            if room == 0 or (limits.max_files is not None and files >= limits.max_files):
                break
            entry = self._entry(index)
            if entry is None:
                break
            available = entry.rows - row
            if room is not None and available > room:
                row += room
                taken += room
                break
            taken += available
            index, row, files = index + 1, 0, files + 1
        # Durable before Spark writes an offset that names these files.
        self.manifest.flush()
        end = {"file": index, "row": row}
        return Planned(end, self._behind(index, row), rows=taken)

    def _behind(self, index: int, row: int) -> dict[str, int]:
        """Files after ``end``, and their rows when every one of them is admitted."""
        lag = {"files_behind": self._known_files() - index}
        if self.manifest.count == self._known_files():
            lag["rows_behind"] = sum(entry.rows for entry in self.manifest.after(index)) - row
        return lag

    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]:
        self._check_state(start)
        self._check_state(end)
        slices: list[FileSlice] = []
        index, row = start["file"], start["row"]
        for entry in self.manifest.after(index):
            if (index, row) >= (end["file"], end["row"]):
                break
            stop = end["row"] if index == end["file"] else entry.rows
            if stop > row:
                slices.append(FileSlice(entry, self.fmt, row, stop))
            index, row = index + 1, 0
        return self._pack(slices)

    def _pack(self, slices: list[FileSlice]) -> list[ReadablePartition]:
        partitions: list[ReadablePartition] = []
        current: list[FileSlice] = []
        rows = 0
        for piece in slices:
            size = piece.stop - piece.start
            if current and rows + size > self.rows_per_partition:
                partitions.append(FileSlicesPartition(current))
                current, rows = [], 0
            current.append(piece)
            rows += size
        if current:
            partitions.append(FileSlicesPartition(current))
        return partitions


class BoundedFiles(FileChild):
    """A directory of historical files: the names listed at the first start, then done."""

    kind = "files"
    bounded = True
    SNAPSHOT = "listing.snapshot"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._snapshot: list[ListedFile] | None = None

    def snapshot(self) -> list[ListedFile]:
        if self._snapshot is None:
            if self.SNAPSHOT in self.state.names(self.SNAPSHOT):
                self._snapshot = [ListedFile(**item) for item in self.state.read(self.SNAPSHOT)]
            else:
                listing = sorted(list_files(self.directory_uri, self.glob), key=lambda f: f.uri)
                if not listing:
                    logger.warning(
                        "child source %r: no files matching %r in %s; it ends at once",
                        self.name,
                        self.glob,
                        self.directory_uri,
                    )
                self.state.write(self.SNAPSHOT, [asdict(f) for f in listing])
                self._snapshot = listing
        return self._snapshot

    def _entry(self, index: int) -> FileEntry | None:
        if (entry := self.manifest.entry(index)) is not None:
            return entry
        snapshot = self.snapshot()
        if index >= len(snapshot):
            return None
        # Admitted in order, so the manifest is always a prefix of the snapshot. The file is
        # looked at again: a repaired file may differ from what the snapshot saw. Planning
        # writes the files it admitted once it is done.
        entry = self._admit(stat_file(snapshot[index].uri), index)
        self.manifest.stage(entry)
        return entry

    def _known_files(self) -> int:
        return len(self.snapshot())

    def is_exhausted(self, position: Position) -> bool:
        return position["file"] >= len(self.snapshot())


class LandingFiles(FileChild):
    """A directory that files land in, atomically (written elsewhere or hidden, then moved).

    Its manifest would otherwise grow with every file that ever landed. As Spark's file
    source does with ``maxFileAge``, a listed file modified more than the maximum age before
    the newest admitted file is taken as seen, so compaction can forget the entries of such
    files once Spark has committed past them: the manifest, and the planner's memory, then
    hold the files of the last ``maxFileAge`` (7 days by default, Spark's too).
    """

    kind = "landing"
    bounded = False
    DEFAULT_MAX_FILE_AGE = "7d"

    def __init__(self, *args: Any, max_file_age_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_file_age_ns = int(max_file_age_s * 1e9)
        self._committed_files = 0

    @classmethod
    def _own_fields(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        text = spec_field(spec, "maxFileAge", str, cls.DEFAULT_MAX_FILE_AGE)
        try:
            return {"max_file_age_s": parse_duration(text, minimum_s=1.0)}
        except ValueError as error:
            raise ChildSpecError(
                f"child source {spec.get('name')!r}: field 'maxFileAge' = {text!r}: {error}"
            ) from None

    def _seen_before_ns(self) -> int:
        """Files modified before this are taken as seen, admitted or not."""
        return self.manifest.newest_mtime_ns - self.max_file_age_ns

    def _forgettable(self, index: int, entry: FileEntry) -> bool:
        return index < self._committed_files and entry.mtime_ns < self._seen_before_ns()

    def commit(self, position: Position) -> None:
        self._committed_files = max(self._committed_files, position["file"])

    def _discover(self) -> None:
        seen_before = self._seen_before_ns()
        new = [
            f
            for f in list_files(self.directory_uri, self.glob)
            if f.mtime_ns >= seen_before and f.uri not in self.manifest
        ]
        new.sort(key=lambda f: (f.mtime_ns, f.uri))
        # Validated before admission, so a malformed file is named and nothing after it moves.
        first = len(self.manifest.entries)
        self.manifest.append([self._admit(listed, first + i) for i, listed in enumerate(new)])

    def is_exhausted(self, position: Position) -> bool:
        return False
