import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from tests.support.postgres import LOGICAL_DECODING, PostgresServer
from tools.data.cdc_data import (
    DELETE,
    INSERT,
    KINDS,
    MOVE,
    PAIR,
    UPDATE,
    ChangeWriter,
    create_accounts,
    fresh_ids,
    table_rows,
)

_tables = itertools.count()
_ID = re.compile(r"\bid\[bigint\]:(\d+)")
_VERSION = re.compile(r"\bversion\[bigint\]:(\d+)")


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server whose changes test_decoding can show (skips without one).

    Asynchronous commit, as on every throwaway server: the writer must commit synchronously
    itself for its last commits to be decoded right after it stops.
    """
    with PostgresServer(database="bank", settings=LOGICAL_DECODING) as server:
        yield server


@pytest.fixture
def database(server):
    engine = make_engine(server.url)
    yield engine
    engine.dispose()


@pytest.fixture
def table(server) -> str:
    """A fresh accounts table of 1,000 rows per test."""
    name = f"accounts_{next(_tables)}"
    create_accounts(server.url, name, 1_000)
    return name


@pytest.fixture
def changes(database, table) -> Iterator[Callable[[], list[list[str]]]]:
    """Reads the transactions committed on ``table`` since the test began, each as
    test_decoding's lines for its rows."""
    slot = f"slot_{table}"
    with database.begin() as connection:
        connection.execute(
            text("SELECT pg_create_logical_replication_slot(:slot, 'test_decoding')"),
            {"slot": slot},
        )
    read: list[list[str]] = []

    def decode() -> list[list[str]]:
        with database.begin() as connection:
            lines = connection.execute(
                text("SELECT data FROM pg_logical_slot_get_changes(:slot, NULL, NULL)"),
                {"slot": slot},
            ).scalars()
            transaction: list[str] = []
            for line in lines:
                if line.startswith("BEGIN"):
                    transaction = []
                elif line.startswith("COMMIT"):
                    if transaction:
                        read.append(transaction)
                elif line.startswith(f"table public.{table}:"):
                    transaction.append(line)
        return read

    yield decode
    with database.begin() as connection:
        connection.execute(text("SELECT pg_drop_replication_slot(:slot)"), {"slot": slot})


def test_the_fill_has_exactly_the_rows_at_version_one(server, database, table):
    rows = table_rows(server.url, table)
    assert sorted(rows) == list(range(1, 1_001))
    assert {row.version for row in rows.values()} == {1}
    assert sum(row.note is None for row in rows.values()) == 100
    with database.connect() as connection:
        columns = connection.execute(
            text(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_name = :table ORDER BY ordinal_position"
            ),
            {"table": table},
        ).all()
        key = connection.execute(
            text(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = CAST(:table AS regclass) AND i.indisprimary"
            ),
            {"table": table},
        ).all()
    assert [tuple(column) for column in columns] == [
        ("id", "bigint", "NO"),
        ("version", "bigint", "NO"),
        ("balance", "bigint", "NO"),
        ("note", "text", "YES"),
        ("updated_at", "timestamp with time zone", "NO"),
    ]
    assert [row[0] for row in key] == ["id"]


def test_a_table_of_no_rows_and_bad_names_are_refused(server):
    create_accounts(server.url, "no_accounts", 0)
    assert table_rows(server.url, "no_accounts") == {}
    with pytest.raises(ValueError, match="table name"):
        create_accounts(server.url, "accounts; DROP TABLE x", 1)
    with pytest.raises(ValueError, match="rows"):
        create_accounts(server.url, "accounts_bad", -1)


def test_a_hundred_thousand_rows_fill_in_a_few_statements(server):
    """The server makes the rows itself: no round trip per row (a million would take
    minutes)."""
    statements: list[str] = []

    def count(connection, cursor, statement, *rest):
        statements.append(statement)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", count)
    try:
        create_accounts(server.url, "accounts_large", 100_000)
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "before_cursor_execute", count)
    assert len(statements) <= 6, statements
    assert len(table_rows(server.url, "accounts_large")) == 100_000


def test_the_writer_makes_each_kind_of_change_and_the_table_shows_them(server, table):
    before = table_rows(server.url, table)
    with ChangeWriter(
        server.url, table, transactions_per_s=float("inf"), seed=7, max_transactions=300
    ) as writer:
        assert writer.join(timeout_s=30)
    counts = writer.counts
    assert sum(counts.values()) == 300 == writer.transactions
    assert all(counts[kind] > 0 for kind in KINDS), counts
    assert writer.failures == 0
    after = table_rows(server.url, table)
    assert len(after) == len(before) + counts[INSERT] - counts[DELETE]
    # Inserts and moves take fresh ids, after every id there was; moves keep the row count.
    fresh = set(after) - set(before)
    assert min(fresh) > max(before)
    assert len(fresh) <= counts[INSERT] + counts[MOVE]
    assert len(set(before) - set(after)) <= counts[DELETE] + counts[MOVE]


def test_versions_grow_by_one_per_write_and_each_transaction_is_one_change(server, table, changes):
    """What the changelog shows, checked per key against the snapshot's version 1; the last
    commits are decoded right after stop(), which needs synchronous commit."""
    with ChangeWriter(
        server.url, table, transactions_per_s=float("inf"), seed=11, max_transactions=400
    ) as writer:
        assert writer.join(timeout_s=30)
    transactions = changes()
    assert len(transactions) == 400
    versions = dict.fromkeys(range(1, 1_001), 1)
    seen = dict.fromkeys(KINDS, 0)
    for transaction in transactions:
        kind = _kind(transaction)
        seen[kind] += 1
        if kind == PAIR:
            ids = [int(_ID.search(line)[1]) for line in transaction]
            assert abs(ids[0] - ids[1]) > 500, transaction
        for line in transaction:
            _apply(versions, line)
    assert seen == writer.counts
    final = table_rows(server.url, table)
    assert {key: row.version for key, row in final.items()} == versions


def test_an_update_of_many_rows_is_one_transaction_of_neighbouring_keys(server, table, changes):
    with ChangeWriter(
        server.url,
        table,
        transactions_per_s=float("inf"),
        seed=3,
        max_transactions=60,
        rows_per_update=7,
    ) as writer:
        assert writer.join(timeout_s=30)
    transactions = changes()
    updates = [t for t in transactions if len(t) == 7]
    assert len(updates) == writer.counts[UPDATE] > 0
    for transaction in updates:
        keys = sorted(int(_ID.search(line)[1]) for line in transaction)
        # The next keys in order; a few may have been deleted or moved away before.
        assert len(set(keys)) == 7 and keys[-1] - keys[0] < 20, transaction
    assert writer.rows_changed == sum(len(t) for t in transactions)
    versions = dict.fromkeys(range(1, 1_001), 1)
    for line in itertools.chain.from_iterable(transactions):
        _apply(versions, line)
    final = table_rows(server.url, table)
    assert {key: row.version for key, row in final.items()} == versions


def _kind(transaction: list[str]) -> str:
    if len(transaction) == 2:
        assert all(": UPDATE: id[" in line for line in transaction), transaction
        return PAIR
    [line] = transaction
    if ": INSERT:" in line:
        return INSERT
    if ": DELETE:" in line:
        return DELETE
    return MOVE if "old-key:" in line else UPDATE


def _apply(versions: dict[int, int], line: str) -> None:
    if ": INSERT:" in line:
        key, version = int(_ID.search(line)[1]), int(_VERSION.search(line)[1])
        assert key not in versions and key > max(versions, default=0) and version == 1, line
        versions[key] = version
    elif ": DELETE:" in line:
        del versions[int(_ID.search(line)[1])]
    elif "old-key:" in line:
        old, new_tuple = line.split("new-tuple:")
        previous = versions.pop(int(_ID.search(old)[1]))
        key, version = int(_ID.search(new_tuple)[1]), int(_VERSION.search(new_tuple)[1])
        assert key not in versions and version == previous + 1, line
        versions[key] = version
    else:
        key, version = int(_ID.search(line)[1]), int(_VERSION.search(line)[1])
        assert version == versions[key] + 1, line
        versions[key] = version


def test_the_writer_survives_rows_deleted_under_it(server, database, table):
    with ChangeWriter(server.url, table, transactions_per_s=500, seed=5) as writer:
        deleted = threading.Event()

        def delete_all() -> None:
            for start in range(1, 1_001, 100):
                with database.begin() as connection:
                    connection.execute(
                        text(f"DELETE FROM {table} WHERE id < :end"), {"end": start + 100}
                    )
            deleted.set()

        deleter = threading.Thread(target=delete_all)
        deleter.start()
        deleter.join(timeout=30)
        assert deleted.is_set()
        done = writer.transactions
        deadline = time.monotonic() + 10
        while writer.transactions < done + 50 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert writer.transactions >= done + 50
    assert writer.error is None
    rows = table_rows(server.url, table)
    assert rows and min(rows) > 1_000


def test_the_writer_carries_on_once_its_database_is_back(server, table):
    with ChangeWriter(server.url, table, transactions_per_s=200, seed=9) as writer:
        server.stop()
        time.sleep(0.5)
        server.start()
        done = writer.transactions
        deadline = time.monotonic() + 15
        while writer.transactions < done + 20 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert writer.failures >= 1
    assert writer.transactions >= done + 20


def test_stop_ends_after_the_transaction_in_flight_and_the_rate_is_a_ceiling(server, table):
    started = time.monotonic()
    paced = ChangeWriter(server.url, table, transactions_per_s=20, seed=1)
    fast = ChangeWriter(server.url, table, transactions_per_s=float("inf"))
    for writer in (paced, fast):
        writer.start()
        deadline = time.monotonic() + 30
        while writer.transactions < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = writer.transactions
        writer.stop()  # raises TimeoutError if it does not stop within its bound
        assert not writer.running
        # The one committing when asked, and the one in flight then: no more.
        assert 5 <= before <= writer.transactions <= before + 2
    assert paced.transactions <= 20 * (time.monotonic() - started) + 1


def test_new_ids_are_never_reused_across_writers(server, database, table):
    for seed in (1, 2):
        with ChangeWriter(
            server.url,
            table,
            transactions_per_s=float("inf"),
            seed=seed,
            weights={INSERT: 1, DELETE: 1},
            max_transactions=50,
        ) as writer:
            writer.join(timeout_s=30)
    with database.begin() as connection:
        handed_out = connection.execute(text(f"SELECT last_value FROM {fresh_ids(table)}"))
        last = handed_out.scalar_one()
        # Deleting the largest ids does not make the next writer hand them out again.
        connection.execute(text(f"DELETE FROM {table} WHERE id > 1000"))
    with ChangeWriter(
        server.url,
        table,
        transactions_per_s=float("inf"),
        seed=3,
        weights={INSERT: 1},
        max_transactions=5,
    ) as writer:
        writer.join(timeout_s=30)
    assert min(key for key in table_rows(server.url, table) if key > 1_000) > last


def test_a_writer_on_a_table_made_elsewhere_takes_ids_after_its_largest(server, database):
    with database.begin() as connection:
        connection.execute(
            text(
                "CREATE TABLE accounts_elsewhere (id bigint PRIMARY KEY, version bigint NOT NULL, "
                "balance bigint NOT NULL, note text, updated_at timestamptz NOT NULL DEFAULT now())"
            )
        )
        connection.execute(
            text("INSERT INTO accounts_elsewhere (id, version, balance) VALUES (40, 1, 0)")
        )
    with ChangeWriter(
        server.url,
        "accounts_elsewhere",
        transactions_per_s=float("inf"),
        weights={INSERT: 1},
        max_transactions=3,
    ) as writer:
        writer.join(timeout_s=30)
    assert sorted(table_rows(server.url, "accounts_elsewhere")) == [40, 41, 42, 43]


def test_weights_and_rates_are_checked(server, table):
    with pytest.raises(ValueError, match="unknown kinds"):
        ChangeWriter(server.url, table, weights={"truncate": 1})
    with pytest.raises(ValueError, match="no kind"):
        ChangeWriter(server.url, table, weights={INSERT: 0})
    with pytest.raises(ValueError, match="above 0"):
        ChangeWriter(server.url, table, transactions_per_s=0)
    with pytest.raises(ValueError, match="rows_per_update must be at least 1, not 0"):
        ChangeWriter(server.url, table, rows_per_update=0)
