from collections.abc import Iterator

import pytest

from spark_jobs.metrics.schema import make_engine
from tests.support.postgres import LOGICAL_DECODING, PostgresServer


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
