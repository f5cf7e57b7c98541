"""Malformed input set aside instead of stopping the job: opt-in, as Spark's ``badRecordsPath``.

Without it, a file or record that cannot be read as the schema says fails the batch by
name, and the job waits for a repair. With the hybrid source's option ``badRecordsPath``,
it is written to the quarantine location with the reason and its position, and the batch
goes on with everything else.

Each quarantine file is named after the input's position (the manifest index of a file,
a topic partition's read range), and its content depends on that input only, so a replayed
batch writes nothing new, and counting the files a batch's offsets span gives the same
number however often the batch ran. Layout, one JSON object per line:

    <badRecordsPath>/<source>/<child>/files/<index>.jsonl
    <badRecordsPath>/<source>/<child>/kafka/<topic>/<partition>/<start>-<stop>.jsonl
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyarrow import fs as pa_fs

from spark_jobs.storage.files import StateFileExists, create_file, filesystem

#: The offset field that tells the driver where a source sets input aside.
OFFSET_FIELD = "badRecords"
#: The most of a bad value kept: enough to see what it is.
VALUE_BYTES = 4096
FILES, KAFKA = "files", "kafka"


@dataclass(frozen=True)
class BadInput:
    """One file or record set aside: where it was, why, and (for a record) its value."""

    position: Mapping[str, Any]
    reason: str
    value: bytes | None = None

    def as_json(self) -> str:
        line: dict[str, Any] = {"position": dict(self.position), "reason": self.reason}
        if self.value is not None:
            line["value_base64"] = base64.b64encode(self.value[:VALUE_BYTES]).decode()
        return json.dumps(line, sort_keys=True)


def file_key(index: int) -> str:
    return f"{FILES}/{index:012d}"


def range_key(topic: str, partition: int, start: int, stop: int) -> str:
    return f"{KAFKA}/{topic}/{partition}/{start:020d}-{stop:020d}"


class Quarantine:
    """Where one child of one source sets its bad input aside."""

    def __init__(self, location_uri: str, source: str, child: str):
        self.location_uri = location_uri
        self.directory = f"{location_uri}/{source}/{child}"

    def set_aside(self, key: str, bad: Sequence[BadInput]) -> None:
        """Write ``bad`` under ``key`` once; a replay finds it written and leaves it."""
        if not bad:
            return
        fs, path = filesystem(f"{self.directory}/{key}.jsonl")
        data = "".join(item.as_json() + "\n" for item in bad).encode()
        with contextlib.suppress(StateFileExists):  # written by an earlier try: the same
            create_file(fs, path, data)


def count_set_aside(start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> int | None:
    """How many files and records the batch between two hybrid offsets set aside; None
    when its source has no quarantine. A batch spanning children counts the first from
    its start on and the last up to its end."""
    location = end.get(OFFSET_FIELD)
    if not location:
        return None
    directory = f"{location}/{end['source']}"
    ends = {end["phase"]: end["position"]}
    starts = {} if start is None else {start["phase"]: start["position"]}
    return sum(
        _count_child(f"{directory}/{child}", starts.get(child), ends.get(child))
        for child in {*starts, *ends}
    )


def _count_child(directory: str, start: Any, end: Any) -> int:
    fs, path = filesystem(directory)
    total = 0
    for name in _names(fs, f"{path}/{FILES}"):
        index = int(name.split(".")[0])
        low = start["file"] if start else 0
        high = end["file"] if end else math.inf
        if low <= index < high:
            total += _lines(fs, f"{path}/{FILES}/{name}")
    for topic in _names(fs, f"{path}/{KAFKA}"):
        for partition in _names(fs, f"{path}/{KAFKA}/{topic}"):
            low = (start or {}).get(topic, {}).get(partition, 0)
            high = (end or {}).get(topic, {}).get(partition, math.inf)
            here = f"{path}/{KAFKA}/{topic}/{partition}"
            for name in _names(fs, here):
                first, last = (int(n) for n in name.split(".")[0].split("-"))
                if low <= first and last <= high:
                    total += _lines(fs, f"{here}/{name}")
    return total


def _names(fs: pa_fs.FileSystem, path: str) -> Iterable[str]:
    """Visible entries of a directory (none if it does not exist)."""
    infos = fs.get_file_info(pa_fs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if not i.base_name.startswith("."))


def _lines(fs: pa_fs.FileSystem, path: str) -> int:
    with fs.open_input_stream(path) as stream:
        return stream.read().count(b"\n")
