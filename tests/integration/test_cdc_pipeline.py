"""``backlog-cdc-job`` on a real PostgreSQL (wal_level = logical) and real Spark, as users run it.

A writer (``tools.data.cdc_data.ChangeWriter``) inserts, updates, deletes, moves keys and updates
far-apart pairs while the snapshot is read; the slot must never be ahead of Spark's last
commit. The job killed in the snapshot, at the switch and in the changelog, with its raw change
stream checked per key, is the fault campaign's cdc trial (tests/integration/test_chaos.py).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from spark_jobs.jobs.cdc_pipeline import SOURCE_NAME
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.jobs.merge_sink import pieces, written_batches
from spark_jobs.jobs.startup import job_environment
from spark_jobs.metrics import control
from spark_jobs.metrics.schema import STOP, make_engine
from spark_jobs.sources.cdc.child import default_slot_name
from spark_jobs.sources.cdc.describe import describe_table
from spark_jobs.sources.cdc.lsn import parse_lsn
from tests.integration.jobs import (
    JobDirs,
    base_conf,
    checkpoints,
    finish,
    kill_hard,
    log_of,
    transitions,
    wait_for,
)
from tests.support.cdc_types import (
    OUTPUT_SETTINGS,
    ROWS,
    TYPE_COLUMNS,
    TypeColumn,
    create_types_table,
    output_text,
)
from tests.support.postgres import LOGICAL_DECODING, PostgresServer
from tools.data.cdc_data import ChangeWriter, create_accounts, table_rows

JOB = str(Path(sys.executable).parent / "backlog-cdc-job")
ACCOUNTS = 2_000
#: 200-row chunks, two per backlog batch: the snapshot takes several batches.
CHUNK_ROWS = 200
MAX_BATCH_ROWS = 400
INTERVAL_MS, BACKLOG_INTERVAL_MS = 1_000, 30_000
_tables = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """One server for the module. Decoding reads only flushed WAL: with the throwaway
    server's asynchronous commit a change would show up late."""
    settings = {**LOGICAL_DECODING, "synchronous_commit": "on"}
    with PostgresServer(database="shop", settings=settings) as running:
        yield running


@pytest.fixture
def accounts(server) -> str:
    name = f"accounts_{next(_tables)}"
    create_accounts(server.url, name, ACCOUNTS)
    return name


@pytest.fixture
def dirs(tmp_path) -> JobDirs:
    return JobDirs(tmp_path)


# --- running the job ---------------------------------------------------------------------


def job_conf(dirs: JobDirs, name: str) -> dict[str, str]:
    return base_conf(
        dirs,
        name,
        interval=f"{INTERVAL_MS}ms",
        interval_during_backlog=f"{BACKLOG_INTERVAL_MS}ms",
        max_batch_rows=str(MAX_BATCH_ROWS),
    )


def stop(dirs: JobDirs, job: str) -> None:
    """Ask the running job to stop after its batch under way (``BacklogStopOperator``)."""
    engine = make_engine(dirs.metrics_url)
    try:
        with engine.begin() as connection:
            control.send(connection, job, STOP)
    finally:
        engine.dispose()


def cdc_command(server: PostgresServer, table: str, dirs: JobDirs, *extra: str) -> list[str]:
    return [
        JOB,
        "--connection",
        server.url,
        "--table",
        table,
        "--checkpoint",
        str(dirs.checkpoint),
        *extra,
    ]


def start_job(
    server: PostgresServer, table: str, dirs: JobDirs, *extra: str, conf: dict[str, str]
) -> subprocess.Popen:
    """The console command in its own process group (a kill takes its JVM too)."""
    conf_args = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    dirs.root.mkdir(parents=True, exist_ok=True)
    path = dirs.root / f"job-{time.time_ns()}.log"
    with path.open("w") as log:
        process = subprocess.Popen(
            [*cdc_command(server, table, dirs, "--chunk-rows", str(CHUNK_ROWS), *extra),
             *conf_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=job_environment(),
            start_new_session=True,
        )  # fmt: skip
    process.log_path = path  # type: ignore[attr-defined]
    return process


def run_command(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, env=job_environment(), capture_output=True, text=True, timeout=120, check=False
    )


def changes_output(dirs: JobDirs) -> Path:
    return dirs.root / "changes"


# --- the checkpoint's logs ---------------------------------------------------------------


def _log(dirs: JobDirs, kind: str) -> dict[int, Path]:
    directory = dirs.checkpoint / "spark" / kind
    if not directory.exists():
        return {}
    return {int(p.name): p for p in directory.iterdir() if p.name.isdigit()}


def offset(dirs: JobDirs, batch: int) -> dict:
    """The source's end position of ``batch`` in the offset log."""
    lines = _log(dirs, "offsets")[batch].read_text().splitlines()
    return json.loads(lines[2])["position"]


def committed(dirs: JobDirs) -> list[int]:
    return sorted(_log(dirs, "commits"))


def last_committed_end(dirs: JobDirs) -> int | None:
    """The lsn of the last committed batch's end (for a snapshot position, where its
    changelog will start)."""
    done = committed(dirs)
    return parse_lsn(offset(dirs, done[-1])["lsn"]) if done else None


# --- the slot ----------------------------------------------------------------------------


def _query(server: PostgresServer | str, statement: str, **values) -> list[tuple]:
    engine = make_engine(server if isinstance(server, str) else server.url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(sa.text(statement), values)]
    finally:
        engine.dispose()


def execute(server: PostgresServer, statement: str) -> None:
    engine = make_engine(server.url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(statement))
    finally:
        engine.dispose()


def slots(server: PostgresServer | str) -> dict[str, int]:
    rows = _query(server, "SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots")
    return {name: parse_lsn(lsn) for name, lsn in rows}


def publications(server: PostgresServer) -> list[str]:
    return [row[0] for row in _query(server, "SELECT pubname FROM pg_publication")]


class SlotWatch(threading.Thread):
    """Samples, while a job runs, that the slot never passes the last committed batch's end:
    the slot is read first, then the commit log, which only grows."""

    def __init__(self, server: PostgresServer, dirs: JobDirs):
        super().__init__(daemon=True)
        self.server, self.dirs = server, dirs
        self.violations: list[str] = []
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            self.check()

    def check(self) -> None:
        confirmed = slots(self.server).get(slot_of(self.dirs))
        end = last_committed_end(self.dirs)
        if confirmed is not None and end is not None:
            self.samples += 1
            if confirmed > end:
                self.violations.append(f"slot at {confirmed:X} > committed end {end:X}")

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join(10)


def slot_of(dirs: JobDirs) -> str:
    """The slot (and publication) the job makes for its checkpoint."""
    return default_slot_name(f"{dirs.checkpoint}/source", SOURCE_NAME)


def teardown(server: PostgresServer, table: str, dirs: JobDirs, *extra: str) -> str:
    result = run_command(cdc_command(server, table, dirs, "--teardown", *extra))
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- the tests ---------------------------------------------------------------------------


def test_snapshot_as_backlog_then_live_merged_into_a_copy_until_a_truncate(server, accounts, dirs):
    """One run with --target (a table in the same database) while the writer changes the
    table during the snapshot: the snapshot's batches are backlog and the changelog's live,
    with one transition and each phase's interval; the copy equals the table, a TOASTed value
    kept through a primary-key update included, and a column "Note" beside note (names that
    differ only by case: Spark is case-insensitive unless told); the slot's health is in the
    metrics; the slot
    never passes the last commit; a TRUNCATE fails the query by name; teardown leaves nothing
    and says what the target keeps. (The raw stream's per-key check runs with the kills
    below: one launch fewer.)"""
    copy = f"{accounts}_copy"
    # Some notes are stored out of line: an UPDATE of the key (the writer's moves, and one
    # below) leaves them unchanged ('u').
    execute(server, f"ALTER TABLE {accounts} ALTER COLUMN note SET STORAGE EXTERNAL")
    execute(server, f"UPDATE {accounts} SET note = repeat(md5(id::text), 300) WHERE id % 50 = 7")
    execute(server, f'ALTER TABLE {accounts} ADD COLUMN "Note" text')
    execute(server, f"UPDATE {accounts} SET \"Note\" = 'N' || id WHERE id % 3 = 0")
    writer = ChangeWriter(server.url, accounts, transactions_per_s=40, seed=1).start()
    watch = SlotWatch(server, dirs)
    job = start_job(
        server,
        accounts,
        dirs,
        "--target",
        server.url,
        "--target-table",
        copy,
        "--timeout",
        "300s",
        conf=job_conf(dirs, "cdc-merge"),
    )
    watch.start()
    try:
        try:
            wait_for(
                lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= 2,
                "2 live checkpoints",
                150,
                job,
            )
        finally:
            writer.stop()
        assert writer.transactions > 0 and writer.failures == 0
        # Under REPLICA IDENTITY DEFAULT the new key arrives without its TOASTed note: it
        # was merged as NULL before; it must come over from the old key.
        big = _query(server, f"SELECT min(id) FROM {accounts} WHERE length(note) = 9600")[0][0]
        moved = _query(server, f"SELECT nextval('{accounts}_fresh_ids')")[0][0]
        execute(
            server, f"UPDATE {accounts} SET id = {moved}, version = version + 1 WHERE id = {big}"
        )
        source = table_rows(server.url, accounts)
        assert len(source[moved].note) == 9600
        wait_for(lambda: table_rows(server.url, copy) == source, "the copy to match", 60, job)
        by_case = 'SELECT id, "Note" FROM {} ORDER BY id'
        assert _query(server, by_case.format(copy)) == _query(server, by_case.format(accounts))
        watch.stop()
        watch.check()
        assert not watch.violations, watch.violations
        assert watch.samples > 5
        check_phases(dirs)
        health = json.loads(checkpoints(dirs)[-1]["sources"])[0]
        assert health["health"]["slot_wal_status"] == "reserved", health
        assert health["lag"]["slot_retained_wal_bytes"] > 0, health
        # The slot moved past its start, and only ever to a committed batch's end.
        confirmed = slots(server)[slot_of(dirs)]
        ends = {parse_lsn(offset(dirs, b)["lsn"]) for b in committed(dirs)}
        start = json.loads((dirs.checkpoint / "source/cdc/start.json").read_text())["lsn"]
        assert parse_lsn(start) < confirmed and confirmed in ends, (confirmed, start, ends)

        execute(server, f"TRUNCATE {accounts}")
        assert job.wait(60) != 0
        failure = log_of(job)
        assert f"table public.{accounts} was truncated" in failure, failure[-4000:]
        assert "backlog-cdc-job: the query failed" in failure
        # The copy is as it was: the truncate was not taken for deletes.
        assert table_rows(server.url, copy) == source
    finally:
        if watch.is_alive():
            watch.stop()
        if job.poll() is None:
            kill_hard(job)
    assert slot_of(dirs) in slots(server) and slot_of(dirs) in publications(server)
    said = teardown(server, accounts, dirs, "--target", server.url, "--target-table", copy)
    assert "dropped replication slot" in said
    assert f"target table {copy} on {server.url} keeps its rows, merged up to batch" in said
    assert "needs --start-over, which empties it first" in said
    assert slot_of(dirs) not in slots(server) and slot_of(dirs) not in publications(server)
    assert "no replication slot" in teardown(server, accounts, dirs)


def consistent_from(dirs: JobDirs) -> int:
    """The last chunk's high watermark: from there on the copy is the table as of one LSN."""
    chunks = (dirs.checkpoint / "source" / "cdc" / "chunks").glob("*.json")
    return max(parse_lsn(json.loads(c.read_text())["highWatermark"]) for c in chunks)


def check_phases(dirs: JobDirs) -> None:
    """Backlog batches, then live ones, one transition, each phase's interval; the metrics'
    phase is the source's (a snapshot position is backlog, and so is a changelog position
    before the copy is consistent), and backlog batches are capped."""
    rows = checkpoints(dirs)
    phases = [r["is_backlog"] for r in rows]
    backlog = phases.count(True)
    assert backlog >= 3 and phases == [True] * backlog + [False] * (len(phases) - backlog), phases
    assert [t["is_backlog"] for t in transitions(dirs)] == [True, False]
    assert {r["effective_interval_ms"] for r in rows if r["is_backlog"]} == {BACKLOG_INTERVAL_MS}
    assert {r["effective_interval_ms"] for r in rows if not r["is_backlog"]} == {INTERVAL_MS}
    until = consistent_from(dirs)
    for row in rows:
        position = offset(dirs, row["batch_id"])
        held = position["phase"] == "snapshot" or parse_lsn(position["lsn"]) < until
        assert held == row["is_backlog"], (row, position, until)
    # max-batch-rows caps a backlog batch's chunks (a chunk's image may hold a few rows
    # more or less than chunk-rows, with the changes made while it was read).
    snapshot = [offset(dirs, r["batch_id"]) for r in rows]
    chunks = [p["chunks"] for p in snapshot if p["phase"] == "snapshot"]
    steps = [b - a for a, b in zip([0, *chunks], chunks, strict=False)]
    assert all(1 <= step <= MAX_BATCH_ROWS // CHUNK_ROWS for step in steps), steps


@pytest.fixture
def plain_database(postgres_server) -> Iterator[str]:
    """A database of its own on the session's plain server (wal_level = replica), so the
    metrics tests sharing that server see no table of ours."""
    admin = sa.create_engine(make_engine(postgres_server.url).url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(sa.text("CREATE DATABASE cdc_refusals"))
        yield postgres_server.url.rsplit("/", 1)[0] + "/cdc_refusals"
        with admin.connect() as connection:
            connection.execute(sa.text("DROP DATABASE cdc_refusals WITH (FORCE)"))
    finally:
        admin.dispose()


def test_refusals_before_any_batch(server, plain_database, dirs):
    """Each refused by name on stderr with a non-zero exit, before Spark starts: nothing
    in the checkpoint or the output, no slot made."""
    execute(server, "CREATE TABLE no_key (id int, note text)")
    create_accounts(plain_database, "accounts_plain", 10)
    before = (slots(server), publications(server))
    password = server.url.replace("postgres@", "postgres:s3cret-word@")
    cases = [
        (server.url, "no_key", "table public.no_key has no primary key"),
        (plain_database, "accounts_plain", "wal_level is 'replica'"),
        (password, "accounts_x", "carries a password"),
    ]
    for connection, table, message in cases:
        command = [JOB, "--connection", connection, "--table", table]
        command += ["--checkpoint", str(dirs.checkpoint), "--changes-output", str(dirs.output)]
        result = run_command(command)
        assert result.returncode != 0, (table, result)
        assert message in result.stderr, (message, result.stderr)
        assert "s3cret-word" not in result.stdout + result.stderr
        assert not (dirs.checkpoint / "spark").exists() and not dirs.output.exists()
    assert (slots(server), publications(server)) == before
    assert slots(plain_database) == {}


@pytest.fixture(scope="module")
def warehouse() -> Iterator[PostgresServer]:
    """A second server for copies: it has none of the source's enums and domains."""
    with PostgresServer(database="warehouse") as running:
        yield running


def texts(url: str, table: str, ids: range | None = None) -> dict[int, tuple]:
    """Each row's values as their output functions write them, under the source's settings:
    two servers agree on these exactly when the values are equal."""
    columns = ", ".join(output_text(c.sql) for c in TYPE_COLUMNS)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            for setting in OUTPUT_SETTINGS:
                connection.execute(sa.text(setting))
            found = connection.execute(sa.text(f"SELECT id, {columns} FROM {table}")).all()
    finally:
        engine.dispose()
    return {row[0]: tuple(row[1:]) for row in found}


def sqlite_value(column: TypeColumn, text: str | None) -> object:
    """What a SQLite target holds for a value whose output text is ``text``."""
    if text is None:
        return None
    kind = column.sql_type
    if kind in ("smallint", "integer", "bigint", "cdc_positive"):
        return int(text)
    if kind == "boolean":
        return int(text == "t")
    if kind in ("real", "double precision"):
        # A float4 is the double of the same value there: 0.1 is 0.10000000149011612.
        number = float(text) if kind == "double precision" else float(np.float32(text))
        return "NaN" if text == "NaN" else number
    if kind == "bytea":
        return bytes.fromhex(text[2:])
    return text


def test_every_type_is_copied_exactly_and_a_copy_started_over_needs_asking(
    server, warehouse, dirs, tmp_path
):
    """The table of every supported type, its NULLs, a TOASTed value and each type's edge
    values, through the snapshot and the changelog (an insert of every edge value again, a
    key update that leaves the TOASTed value alone, a delete): the PostgreSQL copy holds the
    same values, and the raw stream merged into SQLite holds them as docs/sources.md says.
    Then the job starts over on a new checkpoint: refused before Spark starts without
    --start-over; with it the copy is emptied first, so a row deleted meanwhile is gone."""
    create_types_table(server.url, "every_type")
    conf = job_conf(dirs, "cdc-types")
    target = ["--target", warehouse.url, "--target-table", "copy"]
    job = start_job(
        server,
        "every_type",
        dirs,
        *target,
        "--changes-output",
        str(changes_output(dirs)),
        conf=conf,
    )
    wait_for(lambda: any(not r["is_backlog"] for r in checkpoints(dirs)), "live", 150, job)
    names = ", ".join(c.sql for c in TYPE_COLUMNS)
    execute(server, f"INSERT INTO every_type SELECT id + 100, {names} FROM every_type")
    execute(server, "UPDATE every_type SET id = 1000, \"note\" = 'moved' WHERE id = 1")
    execute(server, "DELETE FROM every_type WHERE id = 2")
    source = texts(server.url, "every_type")
    # Live until the copy holds the changes (an idle stop could come before they are made),
    # then stopped as Airflow's stop operator stops a job.
    wait_for(lambda: texts(warehouse.url, "copy") == source, "the copy to match", 120, job)
    stop(dirs, "cdc-types")
    finish(job, 120)
    assert len(source) == 2 * ROWS - 1 and texts(warehouse.url, "copy") == source
    assert len(source[1000][TYPE_COLUMNS.index(LONG_NOTE)]) == 12_000

    shape = check_source_shape(server)
    sqlite = MergeTarget(f"sqlite:///{tmp_path}/copy.db", "copy", shape, outage_timeout_s=1.0)
    for batch_id, directory in written_batches(str(changes_output(dirs))).items():
        sqlite.merge(lambda d=directory: pieces(d), "q", "/raw", batch_id, False)
    sqlite.close()
    held = _query(f"sqlite:///{tmp_path}/copy.db", f"SELECT id, {names} FROM copy")
    assert {row[0]: tuple(row[1:]) for row in held} == {
        key: tuple(sqlite_value(c, v) for c, v in zip(TYPE_COLUMNS, values, strict=True))
        for key, values in source.items()
    }

    assert "dropped replication slot" in teardown(server, "every_type", dirs, *target)
    shutil.rmtree(dirs.checkpoint)
    execute(server, "DELETE FROM every_type WHERE id = 3")
    refused = run_command([*cdc_command(server, "every_type", dirs), *target])
    assert refused.returncode == 2, refused
    assert "target table copy holds batches up to" in refused.stderr
    assert "Run with --start-over" in refused.stderr and not (dirs.checkpoint / "spark").exists()
    again = start_job(
        server, "every_type", dirs, *target, "--start-over", "--stop-when-idle", "3s", conf=conf
    )
    finish(again, 120)
    assert texts(warehouse.url, "copy") == texts(server.url, "every_type")
    teardown(server, "every_type", dirs)


LONG_NOTE = next(c for c in TYPE_COLUMNS if c.name == "Long Note")


def check_source_shape(server: PostgresServer):
    engine = make_engine(server.url)
    try:
        return describe_table(engine, "every_type")
    finally:
        engine.dispose()
