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
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import pyarrow as pa

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
from spark_jobs.sources.file_manifest import FileEntry, FileManifest
from spark_jobs.sources.file_reading import (
    FORMATS,
    FileSlice,
    FileSlicesPartition,
    InputFileError,
    admit,
)
from spark_jobs.sources.quarantine import BadInput, Quarantine, file_key
from spark_jobs.storage.files import (
    ListedFile,
    StateDirectory,
    list_files,
    resolve_uri,
    stat_file,
)

logger = logging.getLogger(__name__)

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
