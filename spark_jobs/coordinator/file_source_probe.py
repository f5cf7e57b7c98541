"""A derived backlog signal for Spark's built-in file source.

Its progress carries no backlog signal (``latestOffset`` is null, no metrics), so we
compare the files waiting in the input directory with those the query has already
admitted, which Spark lists in ``<checkpoint>/sources/<n>/`` (one JSON line per file).
The source is in backlog while more files wait than ``pending-files-threshold``.
"""

from __future__ import annotations

import json
import math
from collections import deque
from urllib.parse import unquote, urlparse

from pyarrow import fs as pa_fs

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.storage.files import SCHEME_ALIASES, list_files, resolve_uri

#: Rows per file is averaged over this many recent batches.
RECENT_BATCHES = 8
#: Files in a backlog batch before rows per file are known.
PROBE_FILES = 10


def _file_key(uri: str) -> str:
    """One spelling for a file, whether pyarrow listed it or Spark logged it (which may
    percent-encode, write ``file:/`` or use Hadoop's scheme names)."""
    parsed = urlparse(uri)
    scheme = SCHEME_ALIASES.get(parsed.scheme, parsed.scheme)
    return f"{scheme}://{parsed.netloc}{unquote(parsed.path)}"


class FileSourceProbe:
    """The backlog status of one file source, from its directory and its source log."""

    def __init__(
        self,
        name: str,
        input_dir: str,
        checkpoint_location: str,
        pending_files_threshold: int,
        *,
        source_index: int = 0,
        glob: str = "*",
    ):
        self.name = name
        self._input_uri = resolve_uri(input_dir)
        self._glob = glob
        self._threshold = pending_files_threshold
        self._source_index = source_index
        self._log_fs, self._log_path = pa_fs.FileSystem.from_uri(
            f"{resolve_uri(checkpoint_location)}/sources/{source_index}"
        )
        self._parsed: set[str] = set()
        self._admitted: dict[str, int] = {}
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_BATCHES)

    def _read_log(self) -> None:
        selector = pa_fs.FileSelector(self._log_path, allow_not_found=True)
        names = sorted(
            info.base_name
            for info in self._log_fs.get_file_info(selector)
            if info.type == pa_fs.FileType.File and not info.base_name.startswith(".")
        )
        for name in names:
            if name in self._parsed or not (name.split(".")[0].isdigit()):
                continue
            with self._log_fs.open_input_stream(f"{self._log_path}/{name}") as stream:
                lines = stream.read().decode().splitlines()
            for line in lines[1:]:  # the first line is the log format version
                entry = json.loads(line)
                self._admitted[_file_key(entry["path"])] = int(entry["batchId"])
            self._parsed.add(name)

    def pending_files(self) -> int:
        self._read_log()
        listing = list_files(self._input_uri, self._glob)
        return sum(1 for entry in listing if _file_key(entry.uri) not in self._admitted)

    def observe(self, progress: BatchProgress) -> None:
        """Learn rows per file from a committed batch (recent batches only: files differ)."""
        self._read_log()
        files = sum(1 for batch in self._admitted.values() if batch == progress.batch_id)
        if files and len(progress.sources) > self._source_index:
            self._recent.append((progress.sources[self._source_index].num_input_rows, files))

    def rows_per_file(self) -> float | None:
        files = sum(f for _, f in self._recent)
        return sum(rows for rows, _ in self._recent) / files if files else None

    def limit_options(self, max_rows: int) -> dict[str, str]:
        """As many files as hold about ``max_rows`` rows, at least one; a few to learn from
        before any batch told how many rows a file holds."""
        per_file = self.rows_per_file()
        files = PROBE_FILES if per_file is None else math.floor(max_rows / per_file)
        return {"maxFilesPerTrigger": str(max(1, files))}

    def status(self) -> SourceStatus:
        pending = self.pending_files()
        return SourceStatus(
            name=self.name,
            is_backlog=pending > self._threshold,
            phase=f"{pending} files waiting",
            lag={"files_behind": pending},
            rule="pending-files",
        )
