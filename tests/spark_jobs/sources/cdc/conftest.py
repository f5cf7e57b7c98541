import itertools
import secrets
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

import pytest
from sqlalchemy import text

from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.changes import Change, Event, RelationCache, events
from spark_jobs.sources.cdc.messages import Begin, Commit, Message
from spark_jobs.sources.cdc.slot import ReplicationSlot
from tests.support.postgres import LOGICAL_DECODING, RELEASES, PostgresServer, release_bin_dir

_tables = itertools.count()
#: Random letters and digits do not compress, and 12,000 of them are well past the 2 kB at
#: which PostgreSQL moves a value out of line.
BIG = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(12_000))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``every_release`` runs on each release the source supports."""
    if "logical_server" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "every_release"
    ):
        ids = [release or "installed" for release in RELEASES]
        metafunc.parametrize("logical_server", RELEASES, ids=ids, indirect=True, scope="module")


@pytest.fixture(scope="module")
def logical_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server with wal_level = logical (skips without one), of the
    release the test is parametrized with, else the installed one.

    Decoding reads only WAL the server has flushed: with the test servers' asynchronous
    commit, a transaction would show up a few hundred milliseconds after it committed.
    """
    settings = {**LOGICAL_DECODING, "synchronous_commit": "on"}
    bin_dir = release_bin_dir(getattr(request, "param", None))
    with PostgresServer(database="shop", settings=settings, bin_dir=bin_dir) as server:
        yield server


@pytest.fixture
def database(logical_server):
    engine = make_engine(logical_server.url)
    yield engine
    engine.dispose()


def non_c_collation(database) -> str:
    """A collation that orders by language rules, whichever the server has."""
    with database.connect() as connection:
        name = connection.execute(
            text(
                "SELECT collname FROM pg_collation WHERE collname IN ('und-x-icu', 'en_US.utf8', "
                "'en_US') ORDER BY collname DESC LIMIT 1"
            )
        ).scalar()
    if name is None:
        pytest.skip("the server has neither ICU nor an en_US locale")
    return name


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


@dataclass(frozen=True)
class Transaction:
    """A whole transaction of decoded changes, as tests build and compare them."""

    xid: int
    #: Its Commit's end; its commit record is taken to start one byte before.
    end_lsn: int
    commit_time: datetime
    changes: tuple[Change, ...]

    def events(self) -> list[Event]:
        commit_lsn = self.end_lsn - 1
        return [
            Begin(commit_lsn, self.commit_time, self.xid),
            *self.changes,
            Commit(0, commit_lsn, self.end_lsn, self.commit_time),
        ]


def transactions(messages: Iterable[Message], relations: RelationCache) -> list[Transaction]:
    """The whole transactions in decoded ``messages``, grouped from ``changes.events``."""
    found: list[Transaction] = []
    begin, changes = None, []
    for event in events(messages, relations):
        if isinstance(event, Begin):
            begin, changes = event, []
        elif isinstance(event, Commit):
            assert begin is not None
            found.append(Transaction(begin.xid, event.end_lsn, begin.commit_time, tuple(changes)))
        else:
            changes.append(event)
    return found


def as_events(*found: Transaction) -> list[Event]:
    return [event for transaction in found for event in transaction.events()]
