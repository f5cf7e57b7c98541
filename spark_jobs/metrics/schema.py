"""The metrics tables: the contract between the streaming job and whoever reads it.

SQLAlchemy Core only, and nothing from pyspark or the rest of the project, so an Airflow
worker can import it without Spark. Column names are read by other tools: do not rename them.
The contract only grows: a new column is nullable, so readers and writers of an older
release keep working, and ``create_tables`` adds it to an existing database in place.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
    make_url,
)
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateIndex, CreateTable

metadata = MetaData()

backlog_checkpoints = Table(
    "backlog_checkpoints",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("run_id", String(200), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("committed_at", DateTime(timezone=True), nullable=False),
    Column("is_backlog", Boolean, nullable=False),
    # NULL: periodic checkpoints are disabled (interval-during-backlog = 0).
    Column("effective_interval_ms", BigInteger, nullable=True),
    Column("num_input_rows", BigInteger, nullable=False),
    Column("batch_duration_ms", BigInteger, nullable=False),
    Column("watermark", DateTime(timezone=True), nullable=True),
    Column("sources", Text, nullable=False),
    Column("observed_metrics", Text, nullable=True),
    # True: rebuilt from the checkpoint's offset and commit logs by the next run, because the
    # driver died between committing the batch and recording it (NULL: recorded as it ran).
    Column("recovered", Boolean, nullable=True),
    # Files and records the batch set aside as malformed (NULL: its sources have no
    # quarantine, or the row was recovered).
    Column("quarantined", BigInteger, nullable=True),
    # Where the batch's time went, Spark's durationMs parts (NULL: recorded before these
    # columns, or recovered). Their sum is batch_duration_ms, but for a few ms of Spark's
    # own bookkeeping; everything but add_batch_ms is the checkpoint's fixed cost.
    Column("latest_offset_ms", BigInteger, nullable=True),
    Column("get_batch_ms", BigInteger, nullable=True),
    Column("query_planning_ms", BigInteger, nullable=True),
    # The data work: reading, processing, updating state and writing to the sink.
    Column("add_batch_ms", BigInteger, nullable=True),
    # Writing the offset log (write-ahead) and the commit log of the checkpoint.
    Column("wal_commit_ms", BigInteger, nullable=True),
    Column("commit_offsets_ms", BigInteger, nullable=True),
    # Rows the sink wrote, and its commit time where the sink reports one.
    Column("sink_output_rows", BigInteger, nullable=True),
    Column("sink_commit_ms", BigInteger, nullable=True),
    # The state the checkpoint carries, summed over the stateful operators (NULL: none).
    Column("state_rows_total", BigInteger, nullable=True),
    Column("state_rows_updated", BigInteger, nullable=True),
    Column("state_memory_bytes", BigInteger, nullable=True),
    Column("state_disk_bytes", BigInteger, nullable=True),
    Column("state_commit_ms", BigInteger, nullable=True),
    # Per stateful operator, JSON list: name, the numbers above, and RocksDB's commit
    # latencies (flush, compact, checkpoint, file sync) where it is the state store.
    Column("state_operators", Text, nullable=True),
    # A retried insert of the same batch is a no-op rather than a second row.
    UniqueConstraint("job_name", "run_id", "batch_id", name="uq_backlog_checkpoints_batch"),
    # The sensors' "latest checkpoints" order by (committed_at, id): no sort with this.
    Index("ix_backlog_checkpoints_job_committed", "job_name", "committed_at", "id"),
)

backlog_transitions = Table(
    "backlog_transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("run_id", String(200), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("is_backlog", Boolean, nullable=False),
    Column("reason", String(500), nullable=False),
    # FLIP-327: each operator's status after the change, JSON list of id, kind, source,
    # inputs and is_backlog (NULL: the job's operator graph was not known).
    Column("operators", Text, nullable=True),
    UniqueConstraint(
        "job_name", "run_id", "at", "is_backlog", name="uq_backlog_transitions_change"
    ),
    Index("ix_backlog_transitions_job_at", "job_name", "at"),
)

#: Each change of the live interval chosen for a freshness target
#: (``spark.backlog.checkpointing.freshness-target``), and why.
backlog_interval_changes = Table(
    "backlog_interval_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("run_id", String(200), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("interval_ms", BigInteger, nullable=False),
    Column("reason", String(500), nullable=False),
    UniqueConstraint("job_name", "run_id", "at", name="uq_backlog_interval_changes_change"),
    Index("ix_backlog_interval_changes_job_at", "job_name", "at"),
)


#: Requests to a running job, and its answers: ``reconfigure`` (new settings) or ``stop``
#: (a graceful stop after the next committed checkpoint). Airflow inserts a ``pending``
#: row; the job's coordinator acts on it or not, and sets ``status`` to ``applied`` or
#: ``rejected`` with its message in ``answer``.
backlog_control = Table(
    "backlog_control",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("requested_at", DateTime(timezone=True), nullable=False),
    Column("action", String(20), nullable=False),
    # For reconfigure, a JSON object: Spark conf key -> value, as on the command line.
    Column("settings", Text, nullable=False),
    Column("status", String(20), nullable=False),
    Column("answer", Text, nullable=True),
    Column("answered_at", DateTime(timezone=True), nullable=True),
    Column("answered_by_run", String(200), nullable=True),
    # The run the request is meant for (NULL: whichever run is live); another run rejects it.
    Column("for_run_id", String(200), nullable=True),
    # A job's pending requests, oldest first, without a sort.
    Index("ix_backlog_control_job_status_id", "job_name", "status", "id"),
)
PENDING, APPLIED, REJECTED = "pending", "applied", "rejected"
#: A request a run has taken and is acting on; it answers (applied, rejected) next. Taking
#: it first means a request is either acted on and answered, or withdrawn, never both.
CLAIMED = "claimed"
#: A request no run took in time, taken back by whoever asked, so that a run started later
#: does not act on it.
WITHDRAWN = "withdrawn"
RECONFIGURE, STOP = "reconfigure", "stop"

#: One live driver per job and checkpoint location: the driver holds this row and renews
#: it; a second driver is refused while it is held, and takes over once it has expired
#: (its holder died without releasing it).
backlog_leases = Table(
    "backlog_leases",
    metadata,
    Column("job_name", String(200), primary_key=True),
    Column("checkpoint_location", String(1000), primary_key=True),
    Column("run_id", String(200), nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    # The run's Spark UI, for Airflow's link to it.
    Column("spark_ui_url", String(500), nullable=True),
    # Set when the run ended and let go (NULL while it runs or if it died).
    Column("released_at", DateTime(timezone=True), nullable=True),
    # A run warmed up and standing by to take over at once when this one lets go (a
    # make-before-break relaunch), and since when; NULL when none waits.
    Column("standby_run_id", String(200), nullable=True),
    Column("standby_since", DateTime(timezone=True), nullable=True),
    # A checkpoint holds one job's offsets and state: one lease row per checkpoint location.
    Index("uq_backlog_leases_checkpoint", "checkpoint_location", unique=True),
    # A job's latest lease (sensors, launcher) without a sort.
    Index("ix_backlog_leases_job_acquired", "job_name", "acquired_at"),
)


def _require_utc(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise TypeError(f"{field} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{field} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class CheckpointRow:
    """One committed micro-batch. Datetimes are normalised to UTC; naive ones are refused.

    ``sources``, ``observed_metrics`` and ``state_operators`` are JSON text, stored as given.
    """

    job_name: str
    run_id: str
    batch_id: int
    committed_at: datetime
    is_backlog: bool
    effective_interval_ms: int | None
    num_input_rows: int
    batch_duration_ms: int
    watermark: datetime | None
    sources: str
    observed_metrics: str | None
    recovered: bool | None = None
    quarantined: int | None = None
    latest_offset_ms: int | None = None
    get_batch_ms: int | None = None
    query_planning_ms: int | None = None
    add_batch_ms: int | None = None
    wal_commit_ms: int | None = None
    commit_offsets_ms: int | None = None
    sink_output_rows: int | None = None
    sink_commit_ms: int | None = None
    state_rows_total: int | None = None
    state_rows_updated: int | None = None
    state_memory_bytes: int | None = None
    state_disk_bytes: int | None = None
    state_commit_ms: int | None = None
    state_operators: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "committed_at", _require_utc(self.committed_at, "committed_at"))
        object.__setattr__(self, "watermark", _require_utc(self.watermark, "watermark"))


@dataclass(frozen=True)
class TransitionRow:
    """One change of the job's backlog status. ``at`` is normalised to UTC."""

    job_name: str
    run_id: str
    at: datetime
    is_backlog: bool
    reason: str
    operators: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _require_utc(self.at, "at"))


@dataclass(frozen=True)
class IntervalChangeRow:
    """A new live interval chosen for the freshness target. ``at`` is normalised to UTC."""

    job_name: str
    run_id: str
    at: datetime
    interval_ms: int
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _require_utc(self.at, "at"))


Row = CheckpointRow | TransitionRow | IntervalChangeRow

TABLE_OF_ROW: dict[type, Table] = {
    CheckpointRow: backlog_checkpoints,
    TransitionRow: backlog_transitions,
    IntervalChangeRow: backlog_interval_changes,
}


def row_values(row: Row) -> dict[str, object]:
    """Column name to value, ready for an insert."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


#: Any constant key: drivers and Airflow creating the tables of one PostgreSQL database
#: at once take turns (concurrent CREATE TABLE IF NOT EXISTS can fail there).
_CREATE_LOCK_KEY = 7_309_327_328
#: Indexes an earlier version created that a newer one replaced.
_REPLACED_INDEXES = ("ix_backlog_checkpoints_job_committed_at", "ix_backlog_control_job_status")


def create_tables(bind: sqlalchemy.Engine | sqlalchemy.Connection) -> None:
    """Create what is missing, from tables to the nullable columns and indexes added since a
    table was created; what exists is left alone. Safe when several processes do it at once
    on a fresh database."""
    if isinstance(bind, sqlalchemy.Engine):
        with bind.begin() as connection:
            create_tables(connection)
        return
    connection = bind
    if connection.dialect.name == "postgresql":
        connection.execute(
            sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CREATE_LOCK_KEY}
        )
    inspector = sqlalchemy.inspect(connection)
    for table in metadata.sorted_tables:
        connection.execute(CreateTable(table, if_not_exists=True))
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present:
                _add_column(connection, table, column)
        for index in table.indexes:
            connection.execute(CreateIndex(index, if_not_exists=True))
        inspector.clear_cache()
    for name in _REPLACED_INDEXES:
        connection.exec_driver_sql(f"DROP INDEX IF EXISTS {name}")


def _add_column(connection: sqlalchemy.Connection, table: Table, column: Column) -> None:
    if not column.nullable:
        raise RuntimeError(f"{table.name}.{column.name} is missing and cannot be added in place")
    kind = column.type.compile(dialect=connection.dialect)
    statement = f"ALTER TABLE {table.name} ADD COLUMN {column.name} {kind}"
    try:
        with connection.begin_nested():
            connection.exec_driver_sql(statement)
    except sqlalchemy.exc.OperationalError as error:
        # SQLite has no ADD COLUMN IF NOT EXISTS: another writer added it just now.
        if "duplicate column" not in str(error):
            raise


def retention_deletes(job_name: str, cutoff: datetime) -> list[sqlalchemy.Delete]:
    """The statements deleting ``job_name``'s checkpoints, transitions and interval changes
    from before ``cutoff``, except its latest row of each (a sensor reads a stopped job's
    last state).
    Each table's (job_name, time) index finds them."""
    cutoff = _require_utc(cutoff, "cutoff")
    statements = []
    for table, time_column in (
        (backlog_checkpoints, backlog_checkpoints.c.committed_at),
        (backlog_transitions, backlog_transitions.c.at),
        (backlog_interval_changes, backlog_interval_changes.c.at),
    ):
        latest = (
            sqlalchemy.select(sqlalchemy.func.max(table.c.id))
            .where(table.c.job_name == job_name)
            .scalar_subquery()
        )
        statements.append(
            table.delete().where(
                table.c.job_name == job_name, time_column < cutoff, table.c.id != latest
            )
        )
    return statements


def delete_rows_before(connection: sqlalchemy.Connection, job_name: str, cutoff: datetime) -> int:
    """Run ``retention_deletes``; returns how many rows went."""
    return sum(
        connection.execute(statement).rowcount for statement in retention_deletes(job_name, cutoff)
    )


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    try:
        # WAL: readers (Airflow sensors) are not blocked by the job's writes and vice versa.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=5000")
    finally:
        cursor.close()


def installed_postgres_driver(url: sqlalchemy.URL) -> sqlalchemy.URL:
    """Pick an installed driver for a plain ``postgresql://`` URL.

    SQLAlchemy 2.1 made psycopg 3 the default, 2.0 used psycopg2. Both work; psycopg2 is
    what the Spark extra installs, so where both are installed a plain URL means it on
    every machine alike, and ``postgresql+psycopg://`` asks for psycopg 3.
    """
    if url.drivername != "postgresql":
        return url
    for driver in ("psycopg2", "psycopg"):
        if importlib.util.find_spec(driver) is not None:
            return url.set(drivername=f"postgresql+{driver}")
    return url


#: Where a driver finds the password of its metrics database's user, so that a launcher
#: can keep it off the spark-submit command line (and out of task logs).
METRICS_PASSWORD_ENV = "BACKLOG_METRICS_PASSWORD"


def split_password(url: str) -> tuple[str, str | None]:
    """The URL without its password, and the password (None when it has none)."""
    parsed = make_url(url)
    if parsed.password is None:
        return url, None
    # URL.set ignores None: build the URL again without the password.
    bare = URL.create(
        parsed.drivername,
        parsed.username,
        None,
        parsed.host,
        parsed.port,
        parsed.database,
        parsed.query,
    )
    return bare.render_as_string(hide_password=False), str(parsed.password)


def with_password(url: str, password: str | None) -> str:
    """The URL with ``password`` for its user, unless it has a password or no user."""
    parsed = make_url(url)
    if not password or parsed.password is not None or not parsed.username:
        return url
    return parsed.set(password=password).render_as_string(hide_password=False)


#: The longest a metrics statement may run on PostgreSQL; every one of ours is an index lookup.
STATEMENT_TIMEOUT_S = 30


def make_engine(url: str) -> sqlalchemy.Engine:
    """An engine tuned for small, infrequent writes from a long-running job.

    SQLite: a relative path is taken against the current directory (and its parent created);
    no pool, so each use opens the file afresh and notices that it went away or came back.
    PostgreSQL: connections are checked before use, connecting gives up after 5 s, a statement
    after ``STATEMENT_TIMEOUT_S``, and TCP keepalives with a user timeout end a half-open
    connection within about a minute, so no reader or writer can hang on one for days; a URL
    without a driver uses whichever of psycopg and psycopg2 is installed. Connections speak
    UTF-8 whatever the database or role sets as ``client_encoding``: what is sent in bulk
    (``COPY`` of CSV that Arrow wrote) is UTF-8.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise ValueError(
                f"{url!r} is an in-memory SQLite database; metrics need a file such as "
                "sqlite:///backlog_metrics.db"
            )
        if not parsed.query.get("uri"):
            path = Path(database).expanduser()
            if not path.is_absolute():
                path = Path.cwd() / path
            path.parent.mkdir(parents=True, exist_ok=True)
            parsed = parsed.set(database=str(path))
        engine = sqlalchemy.create_engine(parsed, poolclass=NullPool)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if backend == "postgresql":
        parsed = installed_postgres_driver(parsed)
        connect_args: dict[str, object] = {}
        if parsed.get_driver_name() in ("psycopg2", "psycopg"):
            connect_args = {
                "connect_timeout": 5,
                "client_encoding": "utf8",
                "options": f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}",
                "keepalives": 1,
                "keepalives_idle": 30,
                "keepalives_interval": 10,
                "keepalives_count": 3,
                "tcp_user_timeout": 60_000,
            }
        return sqlalchemy.create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    raise ValueError(f"unsupported metrics database {backend!r}: use sqlite or postgresql")


def as_utc(value: datetime | str | None) -> datetime | None:
    """A timestamp read back from either backend, as an aware UTC datetime.

    SQLite keeps no offset (the writer stores UTC), so naive values are taken as UTC.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.strip())
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
