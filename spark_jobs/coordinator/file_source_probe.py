"""A derived backlog signal for Spark's built-in file source.

Its progress carries no backlog signal (``latestOffset`` is null, no metrics), so we
compare the files waiting in the input directory with those the query has already
admitted, which Spark lists in ``<checkpoint>/sources/<n>/`` (one JSON line per file).
The source is in backlog while more files wait than ``pending-files-threshold``.
"""

from __future__ import annotations

import json

from pyarrow import fs as pa_fs

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.sources.files import list_files, resolve_uri


class FileSourceProbe:
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
        self._rows = 0
        self._files_in_measured_batches = 0

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
                self._admitted[entry["path"]] = int(entry["batchId"])
            self._parsed.add(name)

    def pending_files(self) -> int:
        self._read_log()
        listing = list_files(self._input_uri, self._glob)
        return sum(1 for entry in listing if entry.uri not in self._admitted)

    def rows_per_file(self) -> float | None:
        if not self._files_in_measured_batches:
            return None
        return self._rows / self._files_in_measured_batches

    def status(self, progress: BatchProgress | None = None) -> SourceStatus:
        pending = self.pending_files()
        if progress is not None and len(progress.sources) > self._source_index:
            files = sum(1 for b in self._admitted.values() if b == progress.batch_id)
            if files:
                self._rows += progress.sources[self._source_index].num_input_rows
                self._files_in_measured_batches += files
        return SourceStatus(
            name=self.name,
            is_backlog=pending > self._threshold,
            phase=f"{pending} files waiting",
            lag={"files_behind": pending},
            rule="pending-files",
        )
