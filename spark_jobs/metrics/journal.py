"""Metrics rows on their way to the database, kept durably beside the checkpoint.

The driver records a row when Spark has committed a batch; the database may be away for a
minute or an hour, and the driver may be killed at any moment. Each recording is therefore
written to the journal first, as a small file created whole (synced on a local disk), and
deleted once its rows are in the database; the next run of the job, which reads the same
checkpoint, delivers whatever a killed run left. Memory holds file names, not rows, so an
outage of any length costs disk, not the driver's heap.

The journal lives in the checkpoint's storage (local disk, HDFS, S3...), so it moves with
the checkpoint and never depends on a host's ``/tmp``; its file names carry no URL or
secret. Inserts ignore rows already present, so delivering a file twice is harmless.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime
from typing import Any

from pyarrow import fs as pa_fs

from spark_jobs.metrics.schema import TABLE_OF_ROW, Row, as_utc, row_values
from spark_jobs.storage.files import create_file, filesystem

_ROW_OF_TABLE = {table.name: row_type for row_type, table in TABLE_OF_ROW.items()}
_DATETIME_FIELDS = frozenset({"committed_at", "watermark", "at"})


def row_to_json(row: Row) -> str:
    values = {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in row_values(row).items()
    }
    return json.dumps({"table": TABLE_OF_ROW[type(row)].name, "row": values}, sort_keys=True)


def row_from_json(line: str) -> Row:
    data = json.loads(line)
    row_type = _ROW_OF_TABLE[data["table"]]
    values: dict[str, Any] = {
        name: as_utc(value) if name in _DATETIME_FIELDS else value
        for name, value in data["row"].items()
    }
    return row_type(**values)


class MetricsJournal:
    """A directory of row files, each created once, named so that they sort in the order
    they were written."""

    SUFFIX = ".rows.jsonl"
    REJECTED = ".rejected"

    def __init__(self, location_uri: str):
        self.location = location_uri
        self._fs, self._path = filesystem(location_uri)
        self._sequence = itertools.count()

    def append(self, rows: list[Row]) -> str:
        """Write ``rows`` durably as one new file; returns its name."""
        name = f"{time.time_ns():020d}-{next(self._sequence):09d}{self.SUFFIX}"
        data = "".join(row_to_json(row) + "\n" for row in rows).encode()
        create_file(self._fs, f"{self._path}/{name}", data)
        return name

    def names(self) -> list[str]:
        """The files waiting for delivery, oldest first."""
        selector = pa_fs.FileSelector(self._path, allow_not_found=True)
        return sorted(
            info.base_name
            for info in self._fs.get_file_info(selector)
            if info.base_name.endswith(self.SUFFIX) and not info.base_name.startswith(".")
        )

    def read(self, name: str) -> list[Row]:
        with self._fs.open_input_stream(f"{self._path}/{name}") as stream:
            text = stream.read().decode()
        return [row_from_json(line) for line in text.splitlines() if line.strip()]

    def remove(self, name: str) -> None:
        self._fs.delete_file(f"{self._path}/{name}")

    def set_aside(self, name: str) -> str:
        """Move an unreadable file out of the way (kept for a person to look at)."""
        kept = f"{name}{self.REJECTED}"
        self._fs.move(f"{self._path}/{name}", f"{self._path}/{kept}")
        return kept
