"""The durable list of a file child's admitted files, which its positions index.

A position ``{"file": i, "row": r}`` must name the same rows after a restart, so the
files a planning admits are written (synced) before Spark logs an offset that names
them, and the list is append-only: compaction may forget a leading run that no position
can reach again, never renumber.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spark_jobs.storage.files import StateDirectory


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
