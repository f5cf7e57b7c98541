"""File children of the hybrid source: a bounded directory and a live landing directory.

Positions are ``{"file": i, "row": r}``: the next record is row ``r`` of the ``i``-th file
of a durable manifest. The manifest is an append-only list of admitted files kept in the
source's state location, so a position names the same rows after a restart: a bounded
directory is the snapshot taken at the first start, a landing directory grows as files
arrive. Files are read with pyarrow (local paths or any URI pyarrow.fs understands).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import posixpath
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from pyarrow import fs as pa_fs

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

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "json", "csv")
#: Spark's and Hadoop's convention: names starting with these are in progress or metadata.
HIDDEN_PREFIXES = (".", "_")


class InputFileError(RuntimeError):
    """A file that cannot be read as declared; the message names it."""


@dataclass(frozen=True)
class FileEntry:
    uri: str
    size: int
    mtime_ns: int


def resolve_uri(location: str) -> str:
    """An absolute URI for a path or URI, so executors in other processes find the same file."""
    if "://" in location:
        return location.rstrip("/")
    return "file://" + posixpath.abspath(location)


def _filesystem(uri: str) -> tuple[pa_fs.FileSystem, str]:
    return pa_fs.FileSystem.from_uri(uri)


def list_files(directory_uri: str, glob: str) -> list[FileEntry]:
    """Visible files directly in ``directory_uri`` whose names match ``glob``."""
    filesystem, path = _filesystem(directory_uri)
    try:
        infos = filesystem.get_file_info(pa_fs.FileSelector(path, allow_not_found=False))
    except FileNotFoundError as error:
        raise InputFileError(f"input directory {directory_uri} does not exist") from error
    scheme = directory_uri.split("://", 1)[0]
    entries = []
    for info in infos:
        name = info.base_name
        if info.type != pa_fs.FileType.File or name.startswith(HIDDEN_PREFIXES):
            continue
        if fnmatch.fnmatch(name, glob):
            entries.append(FileEntry(f"{scheme}://{info.path}", info.size, info.mtime_ns or 0))
    return entries


class FileManifest:
    """The durable, append-only list of admitted files of one child source.

    Each append is a new numbered segment written under a temporary name and moved into
    place, so a reader sees whole segments only.
    """

    def __init__(self, location_uri: str):
        self._filesystem, self._path = _filesystem(location_uri)
        self._entries: list[FileEntry] | None = None
        self._segments = 0

    @property
    def entries(self) -> list[FileEntry]:
        if self._entries is None:
            self._entries = self._load()
        return self._entries

    def _load(self) -> list[FileEntry]:
        self._filesystem.create_dir(self._path, recursive=True)
        infos = self._filesystem.get_file_info(pa_fs.FileSelector(self._path))
        names = sorted(i.base_name for i in infos if i.base_name.endswith(".json"))
        entries: list[FileEntry] = []
        for name in names:
            with self._filesystem.open_input_stream(f"{self._path}/{name}") as stream:
                entries.extend(FileEntry(**item) for item in json.loads(stream.read()))
        self._segments = len(names)
        return entries

    def append(self, new: list[FileEntry], *, even_if_empty: bool = False) -> None:
        if not new and not even_if_empty:
            return
        entries = self.entries
        final = f"{self._path}/{self._segments:010d}.json"
        temporary = f"{self._path}/.{uuid.uuid4().hex}.tmp"
        payload = json.dumps([e.__dict__ for e in new]).encode()
        with self._filesystem.open_output_stream(temporary) as stream:
            stream.write(payload)
        self._filesystem.move(temporary, final)
        self._segments += 1
        entries.extend(new)

    @property
    def is_empty(self) -> bool:
        """True before the first segment was written (an empty segment still counts)."""
        self.entries  # noqa: B018 - loads the segment count
        return self._segments == 0


# --- reading ---------------------------------------------------------------------------


def _open(entry: FileEntry) -> pa.NativeFile:
    filesystem, path = _filesystem(entry.uri)
    return filesystem.open_input_file(path)


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ValueError(f"missing columns {missing}; the file has {table.column_names}")
    return table.select(schema.names).cast(schema)


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


def read_table(entry: FileEntry, fmt: str, schema: pa.Schema) -> pa.Table:
    """The whole file as a table of ``schema``."""
    with _open(entry) as handle:
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


def count_rows(entry: FileEntry, fmt: str, schema: pa.Schema) -> int:
    """Rows in the file; JSON and CSV are parsed in full, which also validates them."""
    try:
        if fmt == "parquet":
            with _open(entry) as handle:
                return pq.ParquetFile(handle).metadata.num_rows
        return read_table(entry, fmt, schema).num_rows
    except Exception as error:
        raise InputFileError(f"cannot read {fmt} input file {entry.uri}: {error}") from error


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
            table = read_table(self.entry, self.fmt, schema)
            return table.slice(self.start, self.stop - self.start)
        except InputFileError:
            raise
        except Exception as error:
            raise InputFileError(
                f"cannot read {self.fmt} input file {self.entry.uri} "
                f"(rows {self.start}-{self.stop}): {error}"
            ) from error

    def _check_unchanged(self) -> None:
        filesystem, path = _filesystem(self.entry.uri)
        info = filesystem.get_file_info(path)
        if info.type != pa_fs.FileType.File:
            raise InputFileError(f"input file {self.entry.uri} was admitted but is gone")
        if info.size != self.entry.size:
            raise InputFileError(
                f"input file {self.entry.uri} changed after it was admitted (size "
                f"{self.entry.size} -> {info.size}); input files must not be modified"
            )

    def _read_parquet(self, schema: pa.Schema) -> pa.Table:
        with _open(self.entry) as handle:
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
    """Shared planning over a manifest of files; subclasses decide how files are admitted."""

    bounded: ClassVar[bool]

    def __init__(
        self,
        name: str,
        directory_uri: str,
        fmt: str,
        glob: str,
        manifest: FileManifest,
        schema: pa.Schema,
        rows_per_partition: int,
    ):
        super().__init__(name)
        self.directory_uri = directory_uri
        self.fmt = fmt
        self.glob = glob
        self.manifest = manifest
        self.schema = schema
        self.rows_per_partition = rows_per_partition
        self._rows: dict[str, int] = {}

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
            manifest=FileManifest(f"{resolve_uri(context.state_location)}/{name}"),
            schema=context.schema,
            rows_per_partition=context.rows_per_partition,
        )

    def initial_position(self) -> Position:
        return {"file": 0, "row": 0}

    def admitted(self) -> list[FileEntry]:
        """Files admitted so far, admitting new ones first where the child allows it."""
        return self.manifest.entries

    def rows_in(self, entry: FileEntry) -> int:
        if entry.uri not in self._rows:
            self._rows[entry.uri] = count_rows(entry, self.fmt, self.schema)
        return self._rows[entry.uri]

    def is_exhausted(self, position: Position) -> bool:
        return self.bounded and position["file"] >= len(self.admitted())

    def plan(self, start: Position, limits: Limits) -> Planned:
        entries = self.admitted()
        index, row = start["file"], start["row"]
        taken = files = 0
        while index < len(entries):
            room = None if limits.max_rows is None else limits.max_rows - taken
            if room == 0 or (limits.max_files is not None and files >= limits.max_files):
                break
            available = self.rows_in(entries[index]) - row
            if room is not None and available > room:
                row += room
                break
            taken += available
            index, row, files = index + 1, 0, files + 1
        return Planned({"file": index, "row": row}, {"files_behind": len(entries) - index})

    def partitions(self, start: Position, end: Position) -> list[ReadablePartition]:
        entries = self.manifest.entries
        slices: list[FileSlice] = []
        index, row = start["file"], start["row"]
        while (index, row) < (end["file"], end["row"]) and index < len(entries):
            stop = end["row"] if index == end["file"] else self.rows_in(entries[index])
            if stop > row:
                slices.append(FileSlice(entries[index], self.fmt, row, stop))
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
    """A directory of historical files: the snapshot listed at the first start, then done."""

    kind = "files"
    bounded = True

    def admitted(self) -> list[FileEntry]:
        if self.manifest.is_empty:
            listing = sorted(list_files(self.directory_uri, self.glob), key=lambda e: e.uri)
            if not listing:
                logger.warning(
                    "child source %r: no files matching %r in %s; it ends at once",
                    self.name,
                    self.glob,
                    self.directory_uri,
                )
            self.manifest.append(listing, even_if_empty=True)
        return self.manifest.entries


class LandingFiles(FileChild):
    """A directory that files land in, atomically (written elsewhere or hidden, then moved)."""

    kind = "landing"
    bounded = False

    def admitted(self) -> list[FileEntry]:
        known = {entry.uri for entry in self.manifest.entries}
        new = [e for e in list_files(self.directory_uri, self.glob) if e.uri not in known]
        new.sort(key=lambda e: (e.mtime_ns, e.uri))
        for entry in new:
            self.rows_in(entry)  # validate before admitting, naming a malformed file
        self.manifest.append(new)
        return self.manifest.entries


FILE_CHILDREN: dict[str, type[FileChild]] = {c.kind: c for c in (BoundedFiles, LandingFiles)}
