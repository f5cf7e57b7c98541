"""Writes metrics rows from the driver without ever holding up or failing the streaming query.

Rows are buffered in memory and written by a background thread, one transaction per flush.
While the database is unreachable they wait (in order) and are retried with backoff; rows
still waiting at ``close()`` go to a spill file that the next writer delivers first.
Inserts ignore rows already present, so delivering a row twice is harmless. With a
``Retention``, the same thread deletes the job's rows once they are older than it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import sqlalchemy
from sqlalchemy import make_url
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from spark_jobs.metrics.schema import (
    TABLE_OF_ROW,
    CheckpointRow,
    TransitionRow,
    as_utc,
    create_tables,
    delete_rows_before,
    make_engine,
    row_values,
)

log = logging.getLogger(__name__)

# While the database stays down, repeat the warning at most this often (seconds).
WARN_EVERY_S = 30.0

_ROW_OF_TABLE = {table.name: row_type for row_type, table in TABLE_OF_ROW.items()}
_DATETIME_FIELDS = frozenset({"committed_at", "watermark", "at"})
_MAX_LENGTHS = {"job_name": 200, "run_id": 200, "reason": 500}
_INT_FIELDS = frozenset(
    {"batch_id", "effective_interval_ms", "num_input_rows", "batch_duration_ms"}
)
_BOOL_FIELDS = frozenset({"is_backlog"})
_STR_FIELDS = frozenset({"job_name", "run_id", "sources", "observed_metrics", "reason"})
_NULLABLE = frozenset({"effective_interval_ms", "watermark", "observed_metrics"})
_BIGINT = (-(2**63), 2**63 - 1)

Row = CheckpointRow | TransitionRow


@dataclasses.dataclass(frozen=True)
class Retention:
    """Keep ``job_name``'s checkpoint and transition rows for ``keep_s`` seconds (each
    table's latest row of the job stays whatever its age: it is the job's last state)."""

    job_name: str
    keep_s: float

    @property
    def every_s(self) -> float:
        """How often to delete: a tenth of the retention, between 1 s and 10 min."""
        return min(max(self.keep_s / 10, 1.0), 600.0)


class _Entry(NamedTuple):
    seq: int
    row: Row


def _to_json(row: Row) -> str:
    values = {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in row_values(row).items()
    }
    return json.dumps({"table": TABLE_OF_ROW[type(row)].name, "row": values}, sort_keys=True)


def _from_json(line: str) -> Row:
    data = json.loads(line)
    row_type = _ROW_OF_TABLE[data["table"]]
    values = {
        name: as_utc(value) if name in _DATETIME_FIELDS else value
        for name, value in data["row"].items()
    }
    return row_type(**values)


def _problems(row: Row) -> list[str]:
    """What the database would refuse about this row, caught before it can block the queue."""
    problems = []
    for name, value in row_values(row).items():
        if value is None:
            if name not in _NULLABLE:
                problems.append(f"{name} is None")
        elif name in _INT_FIELDS:
            if type(value) is not int or not _BIGINT[0] <= value <= _BIGINT[1]:
                problems.append(f"{name} = {value!r} is not a 64-bit integer")
        elif name in _BOOL_FIELDS:
            if type(value) is not bool:
                problems.append(f"{name} = {value!r} is not a bool")
        elif name in _STR_FIELDS:
            if not isinstance(value, str):
                problems.append(f"{name} = {value!r} is not a string")
            elif name in _MAX_LENGTHS and len(value) > _MAX_LENGTHS[name]:
                problems.append(f"{name} is longer than {_MAX_LENGTHS[name]} characters")
    return problems


def _describe(error: BaseException) -> str:
    """One line naming the error, without the SQL and parameters SQLAlchemy appends."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        error = error.orig
    text = " ".join(str(error).split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _plural(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def retry_delay(failures: int, interval_s: float, max_backoff_s: float) -> float:
    """Seconds to wait before the next attempt after ``failures`` failed ones in a row.

    The interval itself while all is well; then doubling from it, capped at ``max_backoff_s``.
    """
    if failures <= 0:
        return interval_s
    return min(interval_s * 2 ** min(failures - 1, 60), max(max_backoff_s, interval_s))


class MetricsWriter:
    """Buffered, retrying writer of :class:`CheckpointRow` and :class:`TransitionRow`.

    Safe to call from any thread. ``record_*`` only append to memory; nothing here raises
    into the caller after construction (an unparsable ``url`` raises at construction).
    """

    def __init__(
        self,
        url: str,
        *,
        spill_path: str | os.PathLike[str] | None = None,
        flush_interval_s: float = 0.5,
        max_backoff_s: float = 10.0,
        retention: Retention | None = None,
    ):
        self._url = url
        self._display_url = make_url(url).render_as_string(hide_password=True)
        self._spill_path = Path(spill_path) if spill_path is not None else None
        self._flush_interval_s = max(flush_interval_s, 0.001)
        self._max_backoff_s = max(max_backoff_s, self._flush_interval_s)

        self._cond = threading.Condition()
        self._buffer: deque[_Entry] = deque()
        self._last_seq = 0
        self._written_seq = 0
        self._wake = False
        self._stopping = False
        self._closing = False
        self._closed = False
        self._healthy = True

        # Only the background thread touches these.
        self._engine: sqlalchemy.Engine | None = None
        self._tables_ready = False
        self._down_since: float | None = None
        self._last_warning = 0.0
        self._retention = retention
        self._next_prune = 0.0

        # Rows up to _spill_holds_upto are already in the spill file, which may be removed
        # once they are written if _spill_removable (it holds nothing else).
        self._spill_lock = threading.Lock()
        self._spill_holds_upto = 0
        self._spill_removable = False
        self._load_spill_file()

        self._thread = threading.Thread(
            target=self._run, name="backlog-metrics-writer", daemon=True
        )
        self._thread.start()

    # -- public API -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Rows recorded (or loaded from the spill file) and not yet written."""
        with self._cond:
            return len(self._buffer)

    @property
    def healthy(self) -> bool:
        """Whether the last attempt to write succeeded (True before the first attempt)."""
        with self._cond:
            return self._healthy

    def record_checkpoint(self, row: CheckpointRow) -> None:
        """Queue a committed batch for writing; returns at once."""
        self._record(row, CheckpointRow)

    def record_transition(self, row: TransitionRow) -> None:
        """Queue a change of backlog status for writing; returns at once."""
        self._record(row, TransitionRow)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every row recorded before this call is written; False on timeout."""
        try:
            deadline = time.monotonic() + timeout_s
            with self._cond:
                target = self._last_seq
                if self._written_seq >= target:
                    return True
                if self._stopping:
                    return False
                self._wake = True
                self._cond.notify_all()
                while self._written_seq < target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._stopping:
                        return False
                    self._cond.wait(remaining)
                return True
        except Exception:
            log.exception("metrics flush failed unexpectedly")
            return False

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, stop the thread, and spill whatever could not be written."""
        try:
            with self._cond:
                if self._closing:
                    return
                self._closing = True
            deadline = time.monotonic() + timeout_s
            self.flush(timeout_s)
            with self._cond:
                self._closed = True
                self._stopping = True
                self._cond.notify_all()
            self._thread.join(max(deadline - time.monotonic(), 0.1))
            with self._cond:
                left = list(self._buffer)
            if left:
                self._spill(left)
            if not self._thread.is_alive() and self._engine is not None:
                self._engine.dispose()
        except Exception:
            log.exception("closing the metrics writer failed unexpectedly")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- recording ------------------------------------------------------------------------

    def _record(self, row: Row, expected: type) -> None:
        try:
            if not isinstance(row, expected):
                log.error("metrics row dropped: expected %s, got %r", expected.__name__, row)
                return
            reason = row.reason if isinstance(row, TransitionRow) else None
            if isinstance(reason, str) and len(reason) > _MAX_LENGTHS["reason"]:
                row = dataclasses.replace(row, reason=reason[:497] + "...")
            problems = _problems(row)
            if problems:
                log.error("metrics row dropped (%s): %r", "; ".join(problems), row)
                return
            with self._cond:
                closed = self._closed
                if not closed:
                    self._last_seq += 1
                    self._buffer.append(_Entry(self._last_seq, row))
            if closed:
                self._spill([_Entry(0, row)])
        except Exception:
            log.exception("metrics row dropped: recording failed unexpectedly")

    # -- spill file -----------------------------------------------------------------------

    def _load_spill_file(self) -> None:
        path = self._spill_path
        if path is None or not path.exists():
            return
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as error:
            log.error("cannot read metrics spill file %s, leaving it: %s", path, error)
            return
        rejected = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = _from_json(line)
            except Exception as error:
                log.error("metrics spill file %s line %d is unreadable: %s", path, number, error)
                rejected.append(line)
                continue
            self._last_seq += 1
            self._buffer.append(_Entry(self._last_seq, row))
        if rejected:
            kept = path.with_name(path.name + ".rejected")
            try:
                with kept.open("a", encoding="utf-8") as file:
                    file.writelines(line + "\n" for line in rejected)
                log.error("kept %d unreadable spill lines in %s", len(rejected), kept)
            except OSError as error:
                log.error(
                    "cannot keep unreadable spill lines in %s, so %s stays: %s", kept, path, error
                )
                rejected_kept = False
            else:
                rejected_kept = True
        self._spill_holds_upto = self._last_seq
        self._spill_removable = not rejected or rejected_kept
        log.info("loaded %s from metrics spill file %s", _plural(len(self._buffer)), path)

    def _forget_spill_file(self) -> None:
        """After the rows loaded from the spill file are written, the file has done its job."""
        with self._spill_lock:
            if not self._spill_removable or self._spill_path is None:
                return
            with self._cond:
                if self._written_seq < self._spill_holds_upto:
                    return
            self._spill_removable = False
            self._spill_holds_upto = 0
            try:
                self._spill_path.unlink(missing_ok=True)
                log.info("metrics spill file %s delivered and removed", self._spill_path)
            except OSError as error:
                log.warning(
                    "metrics spill file %s delivered but not removed (its rows will be "
                    "delivered again, harmlessly): %s",
                    self._spill_path,
                    error,
                )

    def _spill(self, entries: list[_Entry]) -> None:
        with self._spill_lock:
            # Rows loaded from the file are still in it: append only the others.
            new = [e for e in entries if e.seq == 0 or e.seq > self._spill_holds_upto]
            path = self._spill_path
            if path is None:
                log.error(
                    "%s of metrics could not be written to %s and are lost (no spill file set)",
                    _plural(len(entries)),
                    self._display_url,
                )
                return
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a", encoding="utf-8") as file:
                    file.writelines(_to_json(e.row) + "\n" for e in new)
                    file.flush()
                    os.fsync(file.fileno())
            except Exception as error:
                log.error(
                    "%s of metrics could not be written to %s nor spilled to %s and are lost: %s",
                    _plural(len(new)),
                    self._display_url,
                    path,
                    _describe(error),
                )
                return
            # The file now holds rows that were never written: it must outlive this writer.
            self._spill_holds_upto = max([self._spill_holds_upto, *(e.seq for e in new)])
            self._spill_removable = False
            log.error(
                "%s of metrics could not be written to %s; spilled to %s, to be delivered "
                "by the next writer using that spill file",
                _plural(len(entries)),
                self._display_url,
                path,
            )

    # -- background thread ----------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                delay = retry_delay(failures, self._flush_interval_s, self._max_backoff_s)
                with self._cond:
                    deadline = time.monotonic() + delay
                    while not self._stopping and not self._wake:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    if self._stopping:
                        return
                    self._wake = False
                    batch = list(self._buffer)
                if batch or not self._tables_ready:
                    failures = 0 if self._attempt(batch) else failures + 1
                if self._tables_ready:
                    self._prune_if_due()
            except Exception:
                log.exception("metrics writer loop failed unexpectedly; continuing")
                failures += 1

    def _attempt(self, batch: list[_Entry]) -> bool:
        try:
            self._write([e.row for e in batch])
        except Exception as error:
            self._tables_ready = False
            self._failed(error)
            return False
        if self._down_since is not None:
            # Logged before the rows count as written, so a flush() that returns saw it.
            log.info(
                "metrics database %s is reachable again after %.1f s; wrote %s",
                self._display_url,
                time.monotonic() - self._down_since,
                _plural(len(batch)),
            )
            self._down_since = None
        with self._cond:
            if batch:
                last = batch[-1].seq
                while self._buffer and self._buffer[0].seq <= last:
                    self._buffer.popleft()
                self._written_seq = max(self._written_seq, last)
            self._healthy = True
            self._cond.notify_all()
        self._forget_spill_file()
        return True

    def _prune_if_due(self) -> None:
        retention = self._retention
        if retention is None or time.monotonic() < self._next_prune or self._engine is None:
            return
        self._next_prune = time.monotonic() + retention.every_s
        cutoff = datetime.now(UTC) - timedelta(seconds=retention.keep_s)
        try:
            with self._engine.begin() as connection:
                deleted = delete_rows_before(connection, retention.job_name, cutoff)
        except Exception as error:  # the next write reports a database that went away
            log.warning("could not delete metrics rows older than %s: %s", cutoff, _describe(error))
            return
        if deleted:
            log.info(
                "deleted %s of job %s older than %s (retention)",
                _plural(deleted),
                retention.job_name,
                cutoff.isoformat(),
            )

    def _failed(self, error: BaseException) -> None:
        now = time.monotonic()
        with self._cond:
            self._healthy = False
            waiting = len(self._buffer)
        if self._down_since is None:
            self._down_since = now
            self._last_warning = now
            log.warning(
                "cannot write metrics to %s (%s waiting, will retry): %s",
                self._display_url,
                _plural(waiting),
                _describe(error),
            )
        elif now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "still cannot write metrics to %s after %.0f s (%s waiting, retrying): %s",
                self._display_url,
                now - self._down_since,
                _plural(waiting),
                _describe(error),
            )
        else:
            log.debug("metrics write to %s failed again: %s", self._display_url, _describe(error))

    def _write(self, rows: Iterable[Row]) -> None:
        if self._engine is None:
            self._engine = make_engine(self._url)
            self._display_url = self._engine.url.render_as_string(hide_password=True)
        engine = self._engine
        if not self._tables_ready:
            create_tables(engine)
            self._tables_ready = True
        by_table: dict[type, list[dict[str, object]]] = {}
        for row in rows:
            by_table.setdefault(type(row), []).append(row_values(row))
        if not by_table:
            return
        dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
        with engine.begin() as connection:
            for row_type, values in by_table.items():
                statement = dialect.insert(TABLE_OF_ROW[row_type]).on_conflict_do_nothing()
                connection.execute(statement, values)
