from collections.abc import Iterator

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def target_url(request, tmp_path) -> Iterator[str]:
    """A merge target's database, of each kind: SQLite in the test's directory, or the
    session's PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/target.db"
    else:
        yield request.getfixturevalue("postgres_server").url
