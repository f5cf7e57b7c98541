from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)

from spark_jobs.metrics import writer as writer_module
from spark_jobs.metrics.journal import MetricsJournal
from spark_jobs.metrics.schema import (
    TABLE_OF_ROW,
    CheckpointRow,
    IntervalChangeRow,
    TransitionRow,
    as_utc,
    backlog_checkpoints,
    backlog_interval_changes,
    backlog_transitions,
    make_engine,
    row_values,
)
from spark_jobs.metrics.writer import MetricsWriter, retry_delay
from spark_jobs.storage.files import resolve_uri

LOGGER = "spark_jobs.metrics.writer"
REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
# So long that the writer only tries when a test calls flush(): attempts happen at known points.
MANUAL = 3600.0


def checkpoint(batch_id: int, **changes: object) -> CheckpointRow:
    values: dict[str, object] = {
        "job_name": "orders",
        "run_id": "run-1",
        "batch_id": batch_id,
        "committed_at": T0 + timedelta(seconds=batch_id),
        "is_backlog": batch_id < 3,
        "effective_interval_ms": None if batch_id < 3 else 30_000,
        "num_input_rows": 1_000_000 + batch_id,
        "batch_duration_ms": 200 + batch_id,
        "watermark": None if batch_id == 0 else T0 - timedelta(minutes=10, seconds=-batch_id),
        "sources": json.dumps([{"name": "history", "is_backlog": batch_id < 3}]),
        "observed_metrics": None if batch_id % 2 else json.dumps({"late_rows": batch_id}),
    }
    values.update(changes)
    return CheckpointRow(**values)  # type: ignore[arg-type]


def transition(second: int, is_backlog: bool, reason: str = "history is behind") -> TransitionRow:
    return TransitionRow("orders", "run-1", T0 + timedelta(seconds=second), is_backlog, reason)


def stored_checkpoints(url: str) -> list[CheckpointRow]:
    rows = _select(url, backlog_checkpoints)
    return [
        CheckpointRow(
            **{
                **row,
                "committed_at": as_utc(row["committed_at"]),
                "watermark": as_utc(row["watermark"]),
            }
        )
        for row in rows
    ]


def stored_transitions(url: str) -> list[TransitionRow]:
    return [
        TransitionRow(**{**row, "at": as_utc(row["at"])})
        for row in _select(url, backlog_transitions)
    ]


def _select(url: str, table: sqlalchemy.Table) -> list[dict[str, object]]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            result = connection.execute(sqlalchemy.select(table).order_by(table.c.id))
            rows = [dict(row) for row in result.mappings()]
    finally:
        engine.dispose()
    for row in rows:
        del row["id"]
    return rows


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def open_writer() -> Iterator[Callable[..., MetricsWriter]]:
    writers: list[MetricsWriter] = []

    def open_(url: str, **options: object) -> MetricsWriter:
        writer = MetricsWriter(url, **options)  # type: ignore[arg-type]
        writers.append(writer)
        return writer

    yield open_
    for writer in writers:
        writer.close(timeout_s=0.2)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db' / 'metrics.db'}"


def test_rows_are_written_with_exact_values(backend, open_writer):
    writer = open_writer(backend.url, flush_interval_s=0.05)
    checkpoints = [checkpoint(0), checkpoint(1), checkpoint(5)]
    transitions = [transition(0, True, "history is 2 h behind"), transition(9, False, "caught up")]
    writer.record_transition(transitions[0])
    writer.record_checkpoint(checkpoints[0])
    writer.record_checkpoint(checkpoints[1])
    writer.record_checkpoint(checkpoints[2])
    writer.record_transition(transitions[1])

    assert writer.flush(timeout_s=10) is True
    assert writer.pending == 0
    assert writer.healthy is True
    assert stored_checkpoints(backend.url) == checkpoints
    assert stored_transitions(backend.url) == transitions
    first = stored_checkpoints(backend.url)[0]
    assert first.committed_at == datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert first.effective_interval_ms is None
    assert first.watermark is None
    assert first.observed_metrics == '{"late_rows": 0}'


def previous_release_tables() -> sqlalchemy.MetaData:
    """The checkpoint and transition tables as the release before the cost, state and
    operator columns created them."""
    previous = sqlalchemy.MetaData()
    sqlalchemy.Table(
        "backlog_checkpoints",
        previous,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("job_name", String(200), nullable=False),
        Column("run_id", String(200), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("committed_at", DateTime(timezone=True), nullable=False),
        Column("is_backlog", Boolean, nullable=False),
        Column("effective_interval_ms", BigInteger, nullable=True),
        Column("num_input_rows", BigInteger, nullable=False),
        Column("batch_duration_ms", BigInteger, nullable=False),
        Column("watermark", DateTime(timezone=True), nullable=True),
        Column("sources", Text, nullable=False),
        Column("observed_metrics", Text, nullable=True),
        Column("recovered", Boolean, nullable=True),
        Column("quarantined", BigInteger, nullable=True),
        UniqueConstraint("job_name", "run_id", "batch_id", name="uq_backlog_checkpoints_batch"),
        Index("ix_backlog_checkpoints_job_committed", "job_name", "committed_at", "id"),
    )
    sqlalchemy.Table(
        "backlog_transitions",
        previous,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("job_name", String(200), nullable=False),
        Column("run_id", String(200), nullable=False),
        Column("at", DateTime(timezone=True), nullable=False),
        Column("is_backlog", Boolean, nullable=False),
        Column("reason", String(500), nullable=False),
        UniqueConstraint(
            "job_name", "run_id", "at", "is_backlog", name="uq_backlog_transitions_change"
        ),
        Index("ix_backlog_transitions_job_at", "job_name", "at"),
    )
    return previous


def test_the_first_write_migrates_a_database_of_the_previous_release(backend, open_writer):
    """Its rows still read, with the new columns unknown; the new rows carry them."""
    old_checkpoint, old_transition = checkpoint(0), transition(0, True)
    previous = previous_release_tables()
    engine = make_engine(backend.url)
    try:
        previous.create_all(engine)
        with engine.begin() as connection:
            for row in (old_checkpoint, old_transition):
                table = previous.tables[TABLE_OF_ROW[type(row)].name]
                values = {k: v for k, v in row_values(row).items() if k in table.c}
                connection.execute(table.insert(), values)
    finally:
        engine.dispose()
    operators = [
        {"id": "scan", "kind": "source", "source": "events", "inputs": [], "is_backlog": False}
    ]
    new_checkpoint = checkpoint(
        4,
        latest_offset_ms=41,
        get_batch_ms=19,
        query_planning_ms=108,
        add_batch_ms=1180,
        wal_commit_ms=63,
        commit_offsets_ms=82,
        sink_output_rows=5,
        sink_commit_ms=None,
        state_rows_total=5,
        state_rows_updated=5,
        state_memory_bytes=11156,
        state_disk_bytes=3915,
        state_commit_ms=299,
        state_operators=json.dumps([{"name": "stateStoreSave", "rows_total": 5}]),
    )
    new_transition = dataclasses.replace(transition(4, False), operators=json.dumps(operators))

    writer = open_writer(backend.url, flush_interval_s=MANUAL)
    writer.record_checkpoint(new_checkpoint)
    writer.record_transition(new_transition)
    assert writer.flush(timeout_s=10) is True
    assert stored_checkpoints(backend.url) == [old_checkpoint, new_checkpoint]
    assert stored_transitions(backend.url) == [old_transition, new_transition]


def test_rows_are_written_in_the_background_without_flush(backend, open_writer):
    writer = open_writer(backend.url, flush_interval_s=0.05)
    writer.record_checkpoint(checkpoint(3))
    assert wait_until(lambda: writer.pending == 0)
    assert stored_checkpoints(backend.url) == [checkpoint(3)]


def test_sqlite_is_in_wal_mode_so_a_reader_does_not_block_the_writer(
    tmp_path, sqlite_url, open_writer
):
    writer = open_writer(sqlite_url, flush_interval_s=0.05)
    writer.record_checkpoint(checkpoint(0))
    assert writer.flush(timeout_s=10) is True

    reader = sqlite3.connect(tmp_path / "db" / "metrics.db", isolation_level=None, timeout=5)
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        reader.execute("BEGIN")
        count = "SELECT count(*) FROM backlog_checkpoints"
        assert reader.execute(count).fetchone() == (1,)
        # With a rollback journal this commit would wait for the reader's transaction.
        writer.record_checkpoint(checkpoint(1))
        assert writer.flush(timeout_s=3) is True
        assert reader.execute(count).fetchone() == (1,)
        reader.execute("COMMIT")
        assert reader.execute(count).fetchone() == (2,)
    finally:
        reader.close()


def test_duplicate_rows_are_ignored(backend, open_writer):
    writer = open_writer(backend.url, flush_interval_s=0.05)
    writer.record_checkpoint(checkpoint(7))
    writer.record_checkpoint(checkpoint(7, num_input_rows=1))
    writer.record_transition(transition(1, True))
    writer.record_transition(transition(1, True, reason="said twice"))
    assert writer.flush(timeout_s=10) is True

    retry = open_writer(backend.url, flush_interval_s=0.05)
    retry.record_checkpoint(checkpoint(7, batch_duration_ms=1))
    retry.record_checkpoint(checkpoint(7, run_id="run-2"))
    retry.record_checkpoint(checkpoint(8))
    retry.record_transition(transition(1, True))
    retry.record_transition(transition(1, False))
    assert retry.flush(timeout_s=10) is True

    assert stored_checkpoints(backend.url) == [
        checkpoint(7),
        checkpoint(7, run_id="run-2"),
        checkpoint(8),
    ]
    assert stored_transitions(backend.url) == [transition(1, True), transition(1, False)]


class Attempts:
    """Counts a writer's finished attempts at writing, so that a test waits for one (with
    all it logged) instead of for a time the machine may not keep to."""

    def __init__(self, writer: MetricsWriter, monkeypatch: pytest.MonkeyPatch):
        self.writer, self.done = writer, 0
        self._cond = threading.Condition()
        attempt = writer._attempt

        def counted(batch):
            try:
                return attempt(batch)
            finally:
                with self._cond:
                    self.done += 1
                    self._cond.notify_all()

        monkeypatch.setattr(writer, "_attempt", counted)

    def flush_failing(self, timeout_s: float) -> None:
        """A flush that cannot succeed, and the one attempt it asked for, ended."""
        before = self.done
        assert self.writer.flush(timeout_s=timeout_s) is False
        with self._cond:
            assert self._cond.wait_for(lambda: self.done > before, 10), "no attempt ended"


def test_rows_wait_while_the_database_is_away_and_arrive_once_in_order(
    backend, open_writer, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    writer = open_writer(backend.url, flush_interval_s=MANUAL, max_backoff_s=MANUAL)
    writer.record_checkpoint(checkpoint(0))
    assert writer.flush(timeout_s=10) is True
    attempts = Attempts(writer, monkeypatch)

    backend.go_away()
    # Recording wakes the writer's thread; held asleep here, it tries only when asked, so
    # the first attempt finds all six rows. Recording itself writes nothing.
    with monkeypatch.context() as asleep:
        asleep.setattr(writer._thread, "wake", lambda: None)
        for batch_id in range(1, 6):
            writer.record_checkpoint(checkpoint(batch_id))
            if batch_id == 2:
                writer.record_transition(transition(3, False, "caught up"))
    assert attempts.done == 0

    attempts.flush_failing(timeout_s=0.3)
    assert writer.pending == 6
    assert writer.healthy is False
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert warnings[0].startswith("cannot write metrics to ")
    assert backend.shown_url in warnings[0]
    assert "(6 rows waiting, will retry): " in warnings[0]
    if backend.name == "sqlite":
        assert warnings[0].endswith("OperationalError: unable to open database file")
    else:
        assert "OperationalError: " in warnings[0]
    assert "s3cret" not in caplog.text

    # Further failed attempts do not repeat the warning.
    attempts.flush_failing(timeout_s=0.1)
    attempts.flush_failing(timeout_s=0.1)
    assert attempts.done == 3
    assert len(messages(caplog, logging.WARNING)) == 1
    assert len(messages(caplog, logging.DEBUG)) == 2
    assert messages(caplog, logging.INFO) == []
    assert writer.pending == 6

    backend.come_back()
    assert writer.flush(timeout_s=10) is True
    assert writer.pending == 0
    assert writer.healthy is True
    infos = messages(caplog, logging.INFO)
    assert len(infos) == 1
    assert infos[0].startswith("metrics database ")
    assert backend.shown_url in infos[0]
    assert " is reachable again after " in infos[0]
    assert infos[0].endswith("; wrote 6 rows")
    assert stored_checkpoints(backend.url) == [checkpoint(b) for b in range(6)]
    assert stored_transitions(backend.url) == [transition(3, False, "caught up")]


def test_the_writer_retries_on_its_own_until_the_database_is_back(
    backend, open_writer, caplog, monkeypatch
):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    writer = open_writer(backend.url, flush_interval_s=0.05, max_backoff_s=0.2)
    writer.record_checkpoint(checkpoint(0))
    assert wait_until(lambda: writer.pending == 0)

    attempts = Attempts(writer, monkeypatch)
    backend.go_away()
    writer.record_checkpoint(checkpoint(1))
    assert wait_until(lambda: not writer.healthy)
    # Retries come on their own, 0.05 s, then 0.1 s, then every 0.2 s apart (0.35 s for
    # three; a wait may end a few milliseconds early, and at 0.05 s each they would take
    # 0.15 s), each failing anew without a warning of its own.
    started = time.monotonic()
    assert wait_until(lambda: attempts.done >= 4)
    assert time.monotonic() - started >= 0.3, "retries came faster than the backoff"
    assert len(messages(caplog, logging.WARNING)) == 1
    assert writer.pending == 1

    backend.come_back()
    assert wait_until(lambda: writer.pending == 0)
    assert writer.healthy is True
    assert stored_checkpoints(backend.url) == [checkpoint(0), checkpoint(1)]
    assert len(messages(caplog, logging.INFO)) == 1


def test_retry_delay_doubles_from_the_flush_interval_up_to_the_cap():
    assert [retry_delay(n, 0.5, 10.0) for n in range(8)] == [
        0.5,
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        10.0,
        10.0,
    ]
    assert retry_delay(100_000, 0.5, 10.0) == 10.0


def test_the_warning_is_repeated_at_most_every_30_seconds(
    tmp_path, sqlite_url, open_writer, caplog, monkeypatch
):
    assert writer_module.WARN_EVERY_S == 30.0
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    writer = open_writer(sqlite_url, flush_interval_s=MANUAL, max_backoff_s=MANUAL)
    writer.record_checkpoint(checkpoint(0))
    assert writer.flush(timeout_s=10) is True
    attempts = Attempts(writer, monkeypatch)
    (tmp_path / "db").rename(tmp_path / "away")
    writer.record_checkpoint(checkpoint(1))
    assert wait_until(lambda: attempts.done == 1)  # the one recording woke it for
    for _ in range(2):
        attempts.flush_failing(timeout_s=0.1)
    assert len(messages(caplog, logging.WARNING)) == 1

    monkeypatch.setattr(writer_module, "WARN_EVERY_S", 0.0)
    for _ in range(2):
        attempts.flush_failing(timeout_s=0.1)
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 3
    assert warnings[1].startswith(f"still cannot write metrics to {sqlite_url} after ")
    assert (
        "(1 row waiting, retrying): OperationalError: unable to open database file" in (warnings[2])
    )


def journal_at(tmp_path: Path) -> MetricsJournal:
    return MetricsJournal(resolve_uri(str(tmp_path / "checkpoint" / "metrics-journal")))


def test_rows_wait_in_the_journal_across_runs_until_the_database_is_back(
    backend, open_writer, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger=LOGGER)
    journal = journal_at(tmp_path)
    first = open_writer(backend.url, journal=journal, flush_interval_s=MANUAL)
    first.record_checkpoint(checkpoint(0))
    assert first.flush(timeout_s=10) is True
    assert journal.names() == [], "a delivered row leaves the journal"

    backend.go_away()
    first.record_checkpoint(checkpoint(1))
    first.record_transition(transition(2, False, "caught up"))
    first.record_checkpoint(checkpoint(2))
    started = time.monotonic()
    first.close(timeout_s=0.5)
    assert time.monotonic() - started < 2.0
    assert [row for name in journal.names() for row in journal.read(name)] == [
        checkpoint(1),
        transition(2, False, "caught up"),
        checkpoint(2),
    ]
    warnings = messages(caplog, logging.WARNING)
    assert warnings[-1].startswith("3 rows of metrics could not be written to ")
    assert warnings[-1].endswith(
        f"yet; they wait in the journal at {journal.location}, for the next run of the job to "
        "deliver"
    )
    assert "s3cret" not in caplog.text

    # A restart while the database is still away keeps them and adds the new rows.
    second = open_writer(backend.url, journal=journal, flush_interval_s=MANUAL)
    assert second.pending == 3
    second.record_checkpoint(checkpoint(3))
    assert second.flush(timeout_s=0.2) is False
    second.close(timeout_s=0.2)
    assert len(journal.names()) == 4

    backend.come_back()
    third = open_writer(backend.url, journal=journal, flush_interval_s=MANUAL)
    assert third.pending == 4
    third.record_checkpoint(checkpoint(4))
    assert third.flush(timeout_s=10) is True
    assert third.pending == 0
    assert stored_checkpoints(backend.url) == [checkpoint(b) for b in range(5)]
    assert stored_transitions(backend.url) == [transition(2, False, "caught up")]
    assert journal.names() == []


RECORD_THEN_WAIT_FOR_SIGKILL = """
import sys, time
from tests.spark_jobs.metrics.test_writer import checkpoint
from spark_jobs.metrics.journal import MetricsJournal
from spark_jobs.metrics.writer import MetricsWriter
writer = MetricsWriter(sys.argv[1], journal=MetricsJournal(sys.argv[2]), flush_interval_s=3600)
for batch_id in range(1, 4):
    writer.record_checkpoint(checkpoint(batch_id))
print("recorded", flush=True)
time.sleep(600)
"""


def test_a_driver_killed_while_the_database_is_away_loses_no_row(backend, tmp_path, open_writer):
    journal = journal_at(tmp_path)
    first = open_writer(backend.url)
    first.record_checkpoint(checkpoint(0))
    assert first.flush(timeout_s=10)  # the database exists, then goes away
    backend.go_away()
    process = subprocess.Popen(
        [sys.executable, "-c", RECORD_THEN_WAIT_FOR_SIGKILL, backend.url, journal.location],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "recorded\n"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    backend.come_back()
    next_run = open_writer(backend.url, journal=journal, flush_interval_s=0.05)
    assert next_run.flush(timeout_s=10) is True
    assert stored_checkpoints(backend.url) == [checkpoint(b) for b in range(4)]


def test_without_a_journal_memory_is_bounded_and_the_drop_is_loud(
    tmp_path, sqlite_url, open_writer, caplog
):
    writer = open_writer(sqlite_url, flush_interval_s=MANUAL, max_memory_rows=3)
    writer.record_checkpoint(checkpoint(0))
    assert writer.flush(timeout_s=10) is True
    (tmp_path / "db").rename(tmp_path / "away")
    for batch_id in range(1, 6):
        writer.record_checkpoint(checkpoint(batch_id))
    assert writer.pending == 3
    assert messages(caplog, logging.ERROR) == [
        f"1 row of metrics dropped: more than 3 waited in memory for {sqlite_url}, and they "
        "have no journal",
        f"1 row of metrics dropped: more than 3 waited in memory for {sqlite_url}, and they "
        "have no journal",
    ]
    (tmp_path / "away").rename(tmp_path / "db")
    assert writer.flush(timeout_s=10) is True
    assert stored_checkpoints(sqlite_url) == [checkpoint(b) for b in (0, 3, 4, 5)]
    writer.close()
    assert messages(caplog, logging.ERROR)[-1].startswith("1 row of metrics dropped")


def test_with_a_journal_rows_beyond_memory_are_read_back_from_it(tmp_path, sqlite_url, open_writer):
    journal = journal_at(tmp_path)
    (tmp_path / "db").write_text("a file where the database's directory belongs")
    writer = open_writer(sqlite_url, journal=journal, flush_interval_s=MANUAL, max_memory_rows=2)
    for batch_id in range(6):
        writer.record_checkpoint(checkpoint(batch_id))
    assert writer.pending == 6 and len(journal.names()) == 6
    (tmp_path / "db").unlink()
    assert writer.flush(timeout_s=10) is True
    assert stored_checkpoints(sqlite_url) == [checkpoint(b) for b in range(6)]


def test_rows_recorded_after_close_go_to_the_journal(tmp_path, sqlite_url, open_writer):
    journal = journal_at(tmp_path)
    writer = open_writer(sqlite_url, journal=journal, flush_interval_s=0.05)
    writer.close(timeout_s=2)
    writer.record_checkpoint(checkpoint(9))
    assert len(journal.names()) == 1
    again = open_writer(sqlite_url, journal=journal, flush_interval_s=0.05)
    assert again.flush(timeout_s=10) is True
    assert stored_checkpoints(sqlite_url) == [checkpoint(9)]


def test_record_never_raises_and_invalid_rows_do_not_block_valid_ones(
    sqlite_url, open_writer, caplog
):
    writer = open_writer(sqlite_url, flush_interval_s=0.05)
    writer.record_checkpoint("not a row")  # type: ignore[arg-type]
    writer.record_transition(checkpoint(0))  # type: ignore[arg-type]
    writer.record_checkpoint(checkpoint(1, job_name="j" * 201))
    writer.record_checkpoint(checkpoint(2, num_input_rows=2**63))
    writer.record_checkpoint(checkpoint(3, sources=None))
    writer.record_transition(transition(4, True, reason="r" * 600))
    writer.record_checkpoint(checkpoint(5))
    assert writer.flush(timeout_s=10) is True

    assert stored_checkpoints(sqlite_url) == [checkpoint(5)]
    assert stored_transitions(sqlite_url) == [transition(4, True, reason="r" * 497 + "...")]
    errors = messages(caplog, logging.ERROR)
    assert [e.split(":")[0] for e in errors] == [
        "metrics row dropped",
        "metrics row dropped",
        "metrics row dropped (job_name is longer than 200 characters)",
        f"metrics row dropped (num_input_rows = {2**63} is not a 64-bit integer)",
        "metrics row dropped (sources is None)",
    ]


def test_an_unreadable_journal_file_is_set_aside(tmp_path, sqlite_url, open_writer, caplog):
    journal = journal_at(tmp_path)
    journal.append([transition(0, True, "journaled")])
    torn = journal.append([transition(1, True, "torn")])
    path = tmp_path / "checkpoint" / "metrics-journal" / torn
    path.write_text('{"table": "backlog_transitions", "row": {"job_na')

    writer = open_writer(sqlite_url, journal=journal, flush_interval_s=0.05)
    assert writer.pending == 1
    assert writer.flush(timeout_s=10) is True
    assert [t.reason for t in stored_transitions(sqlite_url)] == ["journaled"]
    assert journal.names() == []
    assert (path.parent / f"{torn}.rejected").exists()
    assert any(f"journal file {torn} at " in m for m in messages(caplog, logging.ERROR))


def test_retention_deletes_the_jobs_old_rows_but_its_latest_and_no_other_jobs(
    backend, open_writer, caplog
):
    now = datetime.now(UTC)
    old, recent = now - timedelta(days=3), now - timedelta(hours=1)
    other = checkpoint(0, job_name="payments", committed_at=old)
    writer = open_writer(backend.url, flush_interval_s=MANUAL)
    for batch_id in range(4):  # three days old
        writer.record_checkpoint(
            checkpoint(batch_id, committed_at=old + timedelta(seconds=batch_id))
        )
    writer.record_checkpoint(checkpoint(4, committed_at=recent))
    writer.record_checkpoint(other)
    writer.record_transition(TransitionRow("orders", "run-1", old, True, "history is behind"))
    writer.record_transition(
        TransitionRow("orders", "run-1", old + timedelta(days=1), False, "live")
    )
    assert writer.flush(timeout_s=10)
    writer.close()

    caplog.set_level(logging.INFO, logger=LOGGER)
    pruning = open_writer(
        backend.url, flush_interval_s=0.05, retention=writer_module.Retention("orders", 2 * 86400)
    )
    assert wait_until(lambda: len(stored_checkpoints(backend.url)) == 2)
    assert stored_checkpoints(backend.url) == [checkpoint(4, committed_at=recent), other]
    # The job's latest transition stays: it says what the job's status was last.
    assert [t.reason for t in stored_transitions(backend.url)] == ["live"]
    assert wait_until(
        lambda: any("deleted 5 rows of job orders" in m for m in messages(caplog, logging.INFO))
    )
    pruning.close()


def test_retention_runs_every_tenth_of_its_length_between_1_s_and_10_min():
    assert writer_module.Retention("orders", 5).every_s == 1.0
    assert writer_module.Retention("orders", 3600).every_s == 360.0
    assert writer_module.Retention("orders", 7 * 86400).every_s == 600.0


def interval_change(second: int, reason: str) -> IntervalChangeRow:
    return IntervalChangeRow("job", "run-1", T0 + timedelta(seconds=second), 3400, reason)


def test_interval_changes_wait_in_the_journal_and_arrive_once_with_their_reason(
    backend, open_writer, tmp_path
):
    journal = journal_at(tmp_path)
    quoted = "freshness target 5s: 3.40s keeps p95 at 4.80s over 'the \"last\" 40' batches ✓"
    cut = "x" * 497 + "..."  # cut to the column rather than lost
    first = open_writer(backend.url, journal=journal, flush_interval_s=MANUAL)
    first.record_interval_change(interval_change(0, "until measured"))
    assert first.flush(timeout_s=10) is True
    backend.go_away()
    first.record_interval_change(interval_change(1, quoted))
    first.record_interval_change(interval_change(2, "x" * 600))
    first.close(timeout_s=0.2)
    assert [row.reason for name in journal.names() for row in journal.read(name)] == [quoted, cut]

    backend.come_back()
    second = open_writer(backend.url, journal=journal, flush_interval_s=MANUAL)
    second.record_interval_change(interval_change(1, "said twice"))  # the same change again
    assert second.flush(timeout_s=10) is True
    stored = _select(backend.url, backlog_interval_changes)
    assert [row["reason"] for row in stored] == ["until measured", quoted, cut]
    assert {row["interval_ms"] for row in stored} == {3400}
    assert journal.names() == []
