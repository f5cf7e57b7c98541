"""Writes metrics rows from the driver without ever holding up or failing the streaming query.

Each recording goes to the journal beside the checkpoint first, durably; a background
thread delivers the journal to the database in order, one transaction at a time, and
retries with backoff while the database is away. A run killed meanwhile loses nothing: the
next run reads the same journal and delivers it first. Without a journal (tools, tests)
rows wait in memory, at most ``MAX_MEMORY_ROWS``. Inserts ignore rows already present, so
delivering a row twice is harmless. With a ``Retention``, the same thread deletes the job's
rows once they are older than it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import sqlalchemy
from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text, make_url
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from spark_jobs.metrics.journal import MetricsJournal, Row
from spark_jobs.metrics.periodic import PeriodicThread
from spark_jobs.metrics.schema import (
    TABLE_OF_ROW,
    CheckpointRow,
    IntervalChangeRow,
    TransitionRow,
    create_tables,
    delete_rows_before,
    make_engine,
    row_values,
)

log = logging.getLogger(__name__)

#: While the database stays down, repeat the warning at most this often (seconds).
WARN_EVERY_S = 30.0
#: Without a journal, rows beyond this many waiting are dropped (oldest first), loudly.
MAX_MEMORY_ROWS = 10_000
#: Rows per delivering transaction.
DELIVER_ROWS = 500
_BIGINT = (-(2**63), 2**63 - 1)
_ELLIPSIS = "..."


@dataclasses.dataclass(frozen=True)
class _Column:
    """What the database accepts in one column, read from the schema."""

    nullable: bool
    kind: type
    max_length: int | None


def _columns() -> dict[str, _Column]:
    kinds = ((Boolean, bool), (BigInteger, int), (Integer, int), (DateTime, object))
    found: dict[str, _Column] = {}
    for table in TABLE_OF_ROW.values():
        for column in table.columns:
            kind = next((k for t, k in kinds if isinstance(column.type, t)), str)
            length = column.type.length if isinstance(column.type, String) else None
            if isinstance(column.type, Text):
                length = None
            found[column.name] = _Column(bool(column.nullable), kind, length)
    return found


_COLUMNS = _columns()


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


@dataclasses.dataclass
class _Pending:
    """Rows recorded together: in memory, or only in the journal file ``journal_name``."""

    seq: int
    count: int
    rows: list[Row] | None
    journal_name: str | None


def _problems(row: Row) -> list[str]:
    """What the database would refuse about this row, caught before it can block the queue."""
    problems = []
    for name, value in row_values(row).items():
        column = _COLUMNS[name]
        if value is None:
            if not column.nullable:
                problems.append(f"{name} is None")
        elif column.kind is int:
            if type(value) is not int or not _BIGINT[0] <= value <= _BIGINT[1]:
                problems.append(f"{name} = {value!r} is not a 64-bit integer")
        elif column.kind is bool:
            if type(value) is not bool:
                problems.append(f"{name} = {value!r} is not a bool")
        elif column.kind is str:
            if not isinstance(value, str):
                problems.append(f"{name} = {value!r} is not a string")
            elif column.max_length is not None and len(value) > column.max_length:
                problems.append(f"{name} is longer than {column.max_length} characters")
    return problems


def _shortened(row: Row) -> Row:
    """A reason is prose: cut it to fit rather than lose the row."""
    limit = _COLUMNS["reason"].max_length
    if (
        isinstance(row, TransitionRow | IntervalChangeRow)
        and limit is not None
        and len(row.reason) > limit
    ):
        return dataclasses.replace(row, reason=row.reason[: limit - len(_ELLIPSIS)] + _ELLIPSIS)
    return row


def _describe(error: BaseException) -> str:
    """One line naming the error, without the SQL and parameters SQLAlchemy appends."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        error = error.orig
    text = " ".join(str(error).split())
    if len(text) > 500:
        text = text[:497] + _ELLIPSIS
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
    """Journaled, retrying writer of checkpoint, transition and interval-change rows.

    Safe to call from any thread. ``record_*`` return once the row is in the journal;
    nothing here raises into the caller after construction (an unparsable ``url`` raises at
    construction).
    """

    def __init__(
        self,
        url: str,
        *,
        journal: MetricsJournal | None = None,
        flush_interval_s: float = 0.5,
        max_backoff_s: float = 10.0,
        retention: Retention | None = None,
        max_memory_rows: int = MAX_MEMORY_ROWS,
    ):
        self._url = url
        self._display_url = make_url(url).render_as_string(hide_password=True)
        self._journal = journal
        self._flush_interval_s = max(flush_interval_s, 0.001)
        self._max_backoff_s = max(max_backoff_s, self._flush_interval_s)
        self._max_memory_rows = max_memory_rows

        self._cond = threading.Condition()
        self._pending: deque[_Pending] = deque()
        # Rows held only in memory (no journal), and journaled rows also kept in memory.
        self._memory_only = 0
        self._cached = 0
        self._last_seq = 0
        self._written_seq = 0
        self._stopping = False
        self._healthy = True

        # Only the background thread touches these.
        self._engine: sqlalchemy.Engine | None = None
        self._tables_ready = False
        self._failures = 0
        self._down_since: float | None = None
        self._last_warning = 0.0
        self._retention = retention
        self._next_prune = 0.0

        self._load_journal()
        self._thread = PeriodicThread("backlog-metrics-writer", self._step)
        self._thread.start()

    # -- public API -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Rows recorded (or found in the journal) and not yet written."""
        with self._cond:
            return sum(entry.count for entry in self._pending)

    @property
    def healthy(self) -> bool:
        """Whether the last attempt to write succeeded (True before the first attempt)."""
        with self._cond:
            return self._healthy

    def record_checkpoint(self, row: CheckpointRow) -> None:
        """Journal a committed batch for writing; returns once it is durable."""
        self._record(row, CheckpointRow)

    def record_transition(self, row: TransitionRow) -> None:
        """Journal a change of backlog status for writing; returns once it is durable."""
        self._record(row, TransitionRow)

    def record_interval_change(self, row: IntervalChangeRow) -> None:
        """Journal a new live interval for writing; returns once it is durable."""
        self._record(row, IntervalChangeRow)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every row recorded before this call is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._last_seq
            if self._written_seq >= target:
                return True
            if self._stopping:
                return False
        self._thread.wake()
        with self._cond:
            while self._written_seq < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, then stop; what could not be written waits in the journal for the next run."""
        try:
            self.flush(timeout_s)
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            self._thread.stop(timeout_s=max(timeout_s, 0.1))
            left = self.pending
            if left and self._journal is not None:
                log.warning(
                    "%s of metrics could not be written to %s yet; they wait in the journal at "
                    "%s, for the next run of the job to deliver",
                    _plural(left),
                    self._display_url,
                    self._journal.location,
                )
            elif left:
                log.error(
                    "%s of metrics could not be written to %s and are lost (no journal)",
                    _plural(left),
                    self._display_url,
                )
            if self._engine is not None:
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
            row = _shortened(row)
            problems = _problems(row)
            if problems:
                log.error("metrics row dropped (%s): %r", "; ".join(problems), row)
                return
            name = self._journaled(row)
            with self._cond:
                self._last_seq += 1
                entry = _Pending(self._last_seq, 1, [row], name)
                if name is None:
                    self._memory_only += 1
                elif self._cached < self._max_memory_rows:
                    self._cached += 1
                else:
                    entry.rows = None  # safe in the journal; read back when delivered
                self._pending.append(entry)
                self._drop_beyond_memory()
                stopped = self._stopping
        except Exception:
            log.exception("metrics row dropped: recording failed unexpectedly")
            return
        if stopped and name is None:
            log.error("a metrics row recorded after close is lost (no journal): %r", row)
        self._thread.wake()

    def _journaled(self, row: Row) -> str | None:
        if self._journal is None:
            return None
        try:
            return self._journal.append([row])
        except Exception as error:
            log.error(
                "cannot journal a metrics row at %s (%s); it waits in memory only",
                self._journal.location,
                _describe(error),
            )
            return None

    def _drop_beyond_memory(self) -> None:
        """Rows only in memory beyond the bound go, oldest first (callers hold the lock)."""
        dropped = 0
        while self._memory_only > self._max_memory_rows:
            oldest = next(e for e in self._pending if e.journal_name is None)
            self._pending.remove(oldest)
            self._memory_only -= oldest.count
            dropped += oldest.count
        if dropped:
            log.error(
                "%s of metrics dropped: more than %d waited in memory for %s, and they have "
                "no journal",
                _plural(dropped),
                self._max_memory_rows,
                self._display_url,
            )

    def _load_journal(self) -> None:
        """What a previous run left in the journal goes first."""
        if self._journal is None:
            return
        try:
            names = self._journal.names()
        except Exception as error:
            log.error("cannot list the metrics journal at %s: %s", self._journal.location, error)
            return
        count = 0
        for name in names:
            rows = self._read(name)
            if rows is None:
                continue
            self._last_seq += 1
            self._pending.append(_Pending(self._last_seq, len(rows), None, name))
            count += len(rows)
        if count:
            log.info(
                "found %s of metrics in the journal at %s, from an earlier run; delivering them",
                _plural(count),
                self._journal.location,
            )

    def _read(self, name: str) -> list[Row] | None:
        """A journal file's rows; an unreadable file is set aside (and None returned)."""
        assert self._journal is not None
        try:
            return self._journal.read(name)
        except Exception as error:
            try:
                kept = self._journal.set_aside(name)
            except Exception as moving:
                log.error("cannot set aside journal file %s: %s", name, moving)
                return None
            log.error(
                "metrics journal file %s at %s is unreadable (%s); kept as %s",
                name,
                self._journal.location,
                _describe(error),
                kept,
            )
            return None

    # -- background thread ----------------------------------------------------------------

    def _step(self) -> float:
        with self._cond:
            batch = self._take_batch()
        if batch or not self._tables_ready:
            self._failures = 0 if self._attempt(batch) else self._failures + 1
        if self._tables_ready:
            self._prune_if_due()
        with self._cond:
            more = bool(self._pending) and self._failures == 0
        if more:
            return 0.0
        return retry_delay(self._failures, self._flush_interval_s, self._max_backoff_s)

    def _take_batch(self) -> list[_Pending]:
        """The oldest entries, up to ``DELIVER_ROWS`` rows (callers hold the lock)."""
        batch: list[_Pending] = []
        rows = 0
        for entry in self._pending:
            if batch and rows + entry.count > DELIVER_ROWS:
                break
            batch.append(entry)
            rows += entry.count
        return batch

    def _attempt(self, batch: list[_Pending]) -> bool:
        rows: list[Row] = []
        for entry in batch:
            # An unreadable journal file is set aside and skipped.
            rows.extend(entry.rows or self._read(entry.journal_name or "") or [])
        try:
            self._write(rows)
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
                _plural(len(rows)),
            )
            self._down_since = None
        self._forget(batch)
        with self._cond:
            if batch:
                delivered = {id(entry) for entry in batch}
                while self._pending and id(self._pending[0]) in delivered:
                    entry = self._pending.popleft()
                    if entry.journal_name is None:
                        self._memory_only -= entry.count
                    elif entry.rows is not None:
                        self._cached -= entry.count
                self._written_seq = max(self._written_seq, batch[-1].seq)
            self._healthy = True
            self._cond.notify_all()
        return True

    def _forget(self, batch: list[_Pending]) -> None:
        """Delivered journal files have done their job."""
        if self._journal is None:
            return
        for entry in batch:
            if entry.journal_name is None:
                continue
            try:
                self._journal.remove(entry.journal_name)
            except FileNotFoundError:
                pass  # set aside as unreadable
            except Exception as error:
                log.warning(
                    "metrics journal file %s was delivered but not removed (it will be "
                    "delivered again, harmlessly): %s",
                    entry.journal_name,
                    _describe(error),
                )

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
            waiting = sum(entry.count for entry in self._pending)
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
