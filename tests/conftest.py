from collections.abc import Iterator

import pytest

from tests.support.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server on loopback, shared by the session (skips without one)."""
    with PostgresServer() as server:
        yield server
