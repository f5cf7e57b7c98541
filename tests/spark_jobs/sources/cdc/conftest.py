import itertools
import secrets
import string
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.slot import ReplicationSlot
from tests.support.postgres import LOGICAL_DECODING, PostgresServer

_tables = itertools.count()
#: Random letters and digits do not compress, and 12,000 of them are well past the 2 kB at
#: which PostgreSQL moves a value out of line.
BIG = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(12_000))


@pytest.fixture(scope="module")
def logical_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server with wal_level = logical (skips without one).

    Decoding reads only WAL the server has flushed: with the test servers' asynchronous
    commit, a transaction would show up a few hundred milliseconds after it committed.
    """
    settings = {**LOGICAL_DECODING, "synchronous_commit": "on"}
    with PostgresServer(database="shop", settings=settings) as server:
        yield server


@pytest.fixture
def database(logical_server):
    engine = make_engine(logical_server.url)
    yield engine
    engine.dispose()


@pytest.fixture
def table(database):
    """A new table of its own per test, its ``notes`` stored out of line when large."""
    name = f"accounts_{next(_tables)}"
    with database.begin() as connection:
        connection.execute(text(f"CREATE TABLE {name} (id int PRIMARY KEY, name text, notes text)"))
        connection.execute(text(f"ALTER TABLE {name} ALTER COLUMN notes SET STORAGE EXTERNAL"))
    return name


@pytest.fixture
def slot(logical_server, table):
    slot = ReplicationSlot(logical_server.url, f"slot_{table}", f"pub_{table}", table)
    slot.ensure()
    yield slot
    slot.drop()
    slot.close()
