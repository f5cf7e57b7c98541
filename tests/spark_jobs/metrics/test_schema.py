from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text, inspect
from sqlalchemy.pool import NullPool

from spark_jobs.metrics.schema import (
    CheckpointRow,
    TransitionRow,
    as_utc,
    backlog_checkpoints,
    backlog_transitions,
    create_tables,
    make_engine,
    metadata,
    split_password,
    with_password,
)

REPO = Path(__file__).resolve().parents[3]


def describe(table: sqlalchemy.Table) -> list[tuple[str, str, bool]]:
    """(name, type with its length or timezone, nullable) of each column, in order."""
    result = []
    for column in table.columns:
        kind = type(column.type).__name__
        if isinstance(column.type, String) and not isinstance(column.type, Text):
            kind += f"({column.type.length})"
        if isinstance(column.type, DateTime):
            kind += f"(timezone={column.type.timezone})"
        result.append((column.name, kind, column.nullable))
    return result


def test_checkpoint_table_columns():
    assert backlog_checkpoints.name == "backlog_checkpoints"
    assert backlog_checkpoints.metadata is metadata
    assert describe(backlog_checkpoints) == [
        ("id", "Integer", False),
        ("job_name", "String(200)", False),
        ("run_id", "String(200)", False),
        ("batch_id", "BigInteger", False),
        ("committed_at", "DateTime(timezone=True)", False),
        ("is_backlog", "Boolean", False),
        ("effective_interval_ms", "BigInteger", True),
        ("num_input_rows", "BigInteger", False),
        ("batch_duration_ms", "BigInteger", False),
        ("watermark", "DateTime(timezone=True)", True),
        ("sources", "Text", False),
        ("observed_metrics", "Text", True),
        ("recovered", "Boolean", True),
        ("quarantined", "BigInteger", True),
        ("latest_offset_ms", "BigInteger", True),
        ("get_batch_ms", "BigInteger", True),
        ("query_planning_ms", "BigInteger", True),
        ("add_batch_ms", "BigInteger", True),
        ("wal_commit_ms", "BigInteger", True),
        ("commit_offsets_ms", "BigInteger", True),
        ("sink_output_rows", "BigInteger", True),
        ("sink_commit_ms", "BigInteger", True),
        ("state_rows_total", "BigInteger", True),
        ("state_rows_updated", "BigInteger", True),
        ("state_memory_bytes", "BigInteger", True),
        ("state_disk_bytes", "BigInteger", True),
        ("state_commit_ms", "BigInteger", True),
        ("state_operators", "Text", True),
    ]
    assert [c.name for c in backlog_checkpoints.primary_key] == ["id"]
    assert backlog_checkpoints.c.id.autoincrement is True


def test_transition_table_columns():
    assert backlog_transitions.name == "backlog_transitions"
    assert backlog_transitions.metadata is metadata
    assert describe(backlog_transitions) == [
        ("id", "Integer", False),
        ("job_name", "String(200)", False),
        ("run_id", "String(200)", False),
        ("at", "DateTime(timezone=True)", False),
        ("is_backlog", "Boolean", False),
        ("reason", "String(500)", False),
        ("operators", "Text", True),
    ]
    assert [c.name for c in backlog_transitions.primary_key] == ["id"]
    assert backlog_transitions.c.id.autoincrement is True


def test_column_types_are_the_sqlalchemy_generic_ones():
    assert isinstance(backlog_checkpoints.c.id.type, Integer)
    assert isinstance(backlog_checkpoints.c.batch_id.type, BigInteger)
    assert isinstance(backlog_checkpoints.c.is_backlog.type, Boolean)
    assert isinstance(backlog_transitions.c.is_backlog.type, Boolean)


def unique_constraints(table: sqlalchemy.Table) -> list[list[str]]:
    return [
        [c.name for c in constraint.columns]
        for constraint in table.constraints
        if isinstance(constraint, sqlalchemy.UniqueConstraint)
    ]


def test_unique_constraints_make_retried_inserts_idempotent():
    assert unique_constraints(backlog_checkpoints) == [["job_name", "run_id", "batch_id"]]
    assert unique_constraints(backlog_transitions) == [["job_name", "run_id", "at", "is_backlog"]]


def test_indexes_serve_latest_row_of_a_job_queries():
    assert [[c.name for c in i.columns] for i in backlog_checkpoints.indexes] == [
        ["job_name", "committed_at", "id"]
    ]
    assert [[c.name for c in i.columns] for i in backlog_transitions.indexes] == [
        ["job_name", "at"]
    ]


def test_row_dataclasses_mirror_the_columns_without_id():
    checkpoint_fields = [f.name for f in dataclasses.fields(CheckpointRow)]
    transition_fields = [f.name for f in dataclasses.fields(TransitionRow)]
    assert checkpoint_fields == [c.name for c in backlog_checkpoints.columns][1:]
    assert transition_fields == [c.name for c in backlog_transitions.columns][1:]


def test_rows_are_frozen_and_normalise_datetimes_to_utc():
    plus_two = timezone(timedelta(hours=2))
    row = TransitionRow("orders", "run-1", datetime(2024, 5, 1, 14, 0, tzinfo=plus_two), True, "x")
    assert row.at == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert row.at.tzinfo is UTC
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.reason = "y"  # type: ignore[misc]


def test_rows_refuse_naive_datetimes():
    with pytest.raises(ValueError, match="at must be timezone-aware"):
        TransitionRow("orders", "run-1", datetime(2024, 5, 1, 12, 0), True, "x")
    with pytest.raises(ValueError, match="watermark must be timezone-aware"):
        CheckpointRow(
            "orders",
            "run-1",
            1,
            datetime.now(UTC),
            False,
            1000,
            0,
            0,
            datetime(2024, 5, 1),
            "[]",
            None,
        )


def test_as_utc_handles_what_both_backends_return():
    assert as_utc(None) is None
    assert as_utc(datetime(2024, 5, 1, 12, 0, 1, 5)) == datetime(
        2024, 5, 1, 12, 0, 1, 5, tzinfo=UTC
    )
    plus_two = timezone(timedelta(hours=2))
    converted = as_utc(datetime(2024, 5, 1, 14, 0, tzinfo=plus_two))
    assert converted == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert converted.utcoffset() == timedelta(0)
    assert as_utc("2024-05-01 12:00:00.123456") == datetime(
        2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC
    )
    assert as_utc("2024-05-01T14:00:00+02:00") == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert as_utc("2024-05-01T12:00:00Z") == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_create_tables_twice_is_harmless(backend):
    engine = make_engine(backend.url)
    try:
        create_tables(engine)
        with engine.begin() as connection:
            connection.execute(
                backlog_transitions.insert(),
                {
                    "job_name": "orders",
                    "run_id": "run-1",
                    "at": datetime(2024, 5, 1, tzinfo=UTC),
                    "is_backlog": True,
                    "reason": "history source is behind",
                },
            )
        create_tables(engine)
        inspector = inspect(engine)
        assert {"backlog_checkpoints", "backlog_transitions"} <= set(inspector.get_table_names())
        # PostgreSQL also lists the indexes behind unique constraints; leave those out.
        indexes = {
            i["name"]: i["column_names"]
            for i in inspector.get_indexes("backlog_checkpoints")
            if not i.get("duplicates_constraint")
        }
        assert indexes == {
            "ix_backlog_checkpoints_job_committed": ["job_name", "committed_at", "id"]
        }
        unique_columns = [
            u["column_names"] for u in inspector.get_unique_constraints("backlog_transitions")
        ]
        assert unique_columns == [["job_name", "run_id", "at", "is_backlog"]]
        with engine.connect() as connection:
            rows = connection.execute(sqlalchemy.select(backlog_transitions)).all()
        assert [(r.job_name, r.reason, as_utc(r.at)) for r in rows] == [
            ("orders", "history source is behind", datetime(2024, 5, 1, tzinfo=UTC))
        ]
    finally:
        engine.dispose()


def test_importing_the_schema_does_not_import_pyspark():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import spark_jobs.metrics.schema, sys; assert 'pyspark' not in sys.modules",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_sqlite_relative_path_is_made_absolute_and_its_directory_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = make_engine("sqlite:///nested/dir/metrics.db")
    try:
        assert engine.url.database == str(tmp_path / "nested" / "dir" / "metrics.db")
        assert (tmp_path / "nested" / "dir").is_dir()
        assert isinstance(engine.pool, NullPool)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        engine.dispose()


def test_postgresql_engine_checks_connections_and_finds_an_installed_driver():
    engine = make_engine("postgresql://user:pw@127.0.0.1:1/metrics")
    try:
        assert engine.dialect.name == "postgresql"
        assert engine.url.drivername in ("postgresql+psycopg", "postgresql+psycopg2")
        assert engine.pool._pre_ping is True
    finally:
        engine.dispose()


def test_postgresql_connect_gives_up_after_five_seconds():
    engine = make_engine("postgresql://user:pw@127.0.0.1:1/metrics")
    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    @sqlalchemy.event.listens_for(engine, "do_connect")
    def capture(_dialect, _record, _args, params):
        seen.update(params)
        raise Stop

    try:
        with pytest.raises(Stop):
            engine.connect()
    finally:
        engine.dispose()
    assert seen["connect_timeout"] == 5
    assert seen["host"] == "127.0.0.1"


def test_postgresql_connections_time_statements_out_and_detect_a_dead_peer(postgres_server):
    postgres_server.start()
    engine = make_engine(postgres_server.url)
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SHOW statement_timeout").scalar() == "30s"
            # libpq's socket options, as the driver connected with them
            dsn = engine.raw_connection().driver_connection.info.dsn_parameters
            assert (dsn["keepalives"], dsn["keepalives_idle"], dsn["tcp_user_timeout"]) == (
                "1",
                "30",
                "60000",
            )
            connection.exec_driver_sql("SET statement_timeout = '200ms'")
            with pytest.raises(sqlalchemy.exc.OperationalError, match="statement timeout"):
                connection.exec_driver_sql("SELECT pg_sleep(5)")
    finally:
        engine.dispose()


# The tables as the first release created them: no recovered, no for_run_id, leases unique
# per job and checkpoint only.
OLD_SCHEMA = [
    """CREATE TABLE backlog_checkpoints (id {serial}, job_name VARCHAR(200) NOT NULL,
    run_id VARCHAR(200) NOT NULL, batch_id BIGINT NOT NULL, committed_at TIMESTAMP NOT NULL,
    is_backlog BOOLEAN NOT NULL, effective_interval_ms BIGINT, num_input_rows BIGINT NOT NULL,
    batch_duration_ms BIGINT NOT NULL, watermark TIMESTAMP, sources TEXT NOT NULL,
    observed_metrics TEXT, UNIQUE (job_name, run_id, batch_id))""",
    """CREATE TABLE backlog_control (id {serial}, job_name VARCHAR(200) NOT NULL,
    requested_at TIMESTAMP NOT NULL, action VARCHAR(20) NOT NULL, settings TEXT NOT NULL,
    status VARCHAR(20) NOT NULL, answer TEXT, answered_at TIMESTAMP,
    answered_by_run VARCHAR(200))""",
    """CREATE TABLE backlog_leases (job_name VARCHAR(200), checkpoint_location VARCHAR(1000),
    run_id VARCHAR(200) NOT NULL, acquired_at TIMESTAMP NOT NULL, expires_at TIMESTAMP NOT NULL,
    spark_ui_url VARCHAR(500), released_at TIMESTAMP,
    PRIMARY KEY (job_name, checkpoint_location))""",
    """INSERT INTO backlog_checkpoints (job_name, run_id, batch_id, committed_at, is_backlog,
    num_input_rows, batch_duration_ms, sources) VALUES ('orders', 'run-1', 7,
    '2024-05-01 12:00:00', TRUE, 10, 20, '[]')""",
]


def test_an_older_database_is_migrated_in_place_and_its_rows_still_read(backend):
    engine = make_engine(backend.url)
    try:
        with engine.begin() as connection:
            serial = "SERIAL PRIMARY KEY" if backend.name == "postgresql" else "INTEGER PRIMARY KEY"
            for statement in OLD_SCHEMA:
                connection.exec_driver_sql(statement.format(serial=serial))
        create_tables(engine)
        inspector = inspect(engine)
        assert "recovered" in {c["name"] for c in inspector.get_columns("backlog_checkpoints")}
        assert "for_run_id" in {c["name"] for c in inspector.get_columns("backlog_control")}
        unique = [i["column_names"] for i in inspector.get_indexes("backlog_leases") if i["unique"]]
        assert ["checkpoint_location"] in unique
        with engine.connect() as connection:
            row = connection.execute(sqlalchemy.select(backlog_checkpoints)).one()
        assert (row.batch_id, row.is_backlog, row.recovered) == (7, True, None)
        create_tables(engine)  # and again: nothing left to do
    finally:
        engine.dispose()


CREATE_IN_A_FRESH_PROCESS = (
    "import sys; from spark_jobs.metrics.schema import create_tables, make_engine; "
    "create_tables(make_engine(sys.argv[1]))"
)


def test_several_processes_create_the_tables_of_a_fresh_database_at_once(backend):
    for attempt in range(3):
        engine = make_engine(backend.url)
        metadata.drop_all(engine)
        engine.dispose()
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", CREATE_IN_A_FRESH_PROCESS, backend.url],
                cwd=REPO,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        errors = [p.communicate(timeout=120)[1] for p in processes]
        failed = [e for p, e in zip(processes, errors, strict=True) if p.returncode != 0]
        assert not failed, f"attempt {attempt}: {failed[0]}"


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "mysql://user@localhost/metrics"],
)
def test_make_engine_refuses_databases_it_cannot_serve(url):
    with pytest.raises(ValueError):
        make_engine(url)


def test_a_password_is_split_off_a_url_and_put_back():
    url = "postgresql://metrics:s3cret@db.example.com:5432/metrics"
    bare, password = split_password(url)
    assert (bare, password) == ("postgresql://metrics@db.example.com:5432/metrics", "s3cret")
    assert with_password(bare, password) == url
    assert split_password("sqlite:////data/metrics.db") == ("sqlite:////data/metrics.db", None)
    assert with_password(url, "other") == url, "a URL's own password wins"
    assert with_password("sqlite:////data/m.db", "x") == "sqlite:////data/m.db", "no user"
    assert with_password(bare, None) == bare
