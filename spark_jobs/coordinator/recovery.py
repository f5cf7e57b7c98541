"""Metrics rows for batches a killed driver committed but did not record.

Spark writes a batch's ``commits/N`` before it tells listeners, so a driver killed in
between leaves a committed batch without its row. The next run reads the commit log of the
batches before its first one, finds those no row matches, and records them from what the
log says (``recovered`` rows: when, how many rows when our sources planned them, and the
job's status as its last row left it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyarrow import fs as pa_fs

from spark_jobs.metrics.schema import CheckpointRow
from spark_jobs.storage.files import filesystem

logger = logging.getLogger(__name__)

#: How many batches before a run's first one are checked: a driver records every batch as
#: it commits, so only its last few can be missing.
LOOK_BACK_BATCHES = 10
#: Clock slack when matching a row to a commit (the row's time is the listener's).
MATCH_SLACK = timedelta(minutes=1)


@dataclass(frozen=True)
class CommittedBatch:
    batch_id: int
    started_at: datetime
    committed_at: datetime
    rows: int | None


def _numbered(fs: pa_fs.FileSystem, directory: str) -> dict[int, pa_fs.FileInfo]:
    infos = fs.get_file_info(pa_fs.FileSelector(directory, allow_not_found=True))
    return {int(i.base_name): i for i in infos if i.base_name.isdigit()}


def _planned_rows(offset_lines: list[str]) -> int | None:
    """Rows the batch read, when every source is ours (their offsets say it)."""
    total = 0
    for line in offset_lines:
        offset = json.loads(line) if line.strip() not in ("", "-") else None
        if not isinstance(offset, dict) or not isinstance(offset.get("rows"), int):
            return None
        total += offset["rows"]
    return total


def committed_batches(
    checkpoint_root: str, before: int, look_back: int = LOOK_BACK_BATCHES
) -> list[CommittedBatch]:
    """The committed batches among the ``look_back`` before batch ``before``, read from
    Spark's offset and commit logs (``checkpoint_root`` as Spark resolved it)."""
    fs, root = filesystem(checkpoint_root)
    commits = _numbered(fs, f"{root}/commits")
    batches = []
    for batch_id in sorted(b for b in commits if before - look_back <= b < before):
        with fs.open_input_stream(f"{root}/offsets/{batch_id}") as stream:
            lines = stream.read().decode().splitlines()
        started_ms = json.loads(lines[1])["batchTimestampMs"]
        committed_ns = commits[batch_id].mtime_ns or 0
        batches.append(
            CommittedBatch(
                batch_id,
                datetime.fromtimestamp(started_ms / 1000, UTC),
                datetime.fromtimestamp(committed_ns / 1e9, UTC),
                _planned_rows(lines[2:]),
            )
        )
    return batches


def unrecorded(
    batches: list[CommittedBatch], recorded: Mapping[int, list[datetime]]
) -> list[CommittedBatch]:
    """The batches no recorded row matches: same id, committed between the batch's start
    and its commit (with slack for the listener's clock)."""
    return [
        batch
        for batch in batches
        if not any(
            batch.started_at - MATCH_SLACK <= at <= batch.committed_at + MATCH_SLACK
            for at in recorded.get(batch.batch_id, ())
        )
    ]


def recovered_row(
    batch: CommittedBatch, job_name: str, run_id: str, is_backlog: bool
) -> CheckpointRow:
    return CheckpointRow(
        job_name=job_name,
        run_id=run_id,
        batch_id=batch.batch_id,
        committed_at=batch.committed_at,
        is_backlog=is_backlog,
        effective_interval_ms=None,
        num_input_rows=batch.rows or 0,
        batch_duration_ms=max(
            0, int((batch.committed_at - batch.started_at) / timedelta(milliseconds=1))
        ),
        watermark=None,
        sources="[]",
        observed_metrics=None,
        recovered=True,
    )
