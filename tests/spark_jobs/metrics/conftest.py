from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_jobs.metrics.schema import make_engine, metadata
from tests.support.postgres import PostgresServer


@dataclass
class Backend:
    """A metrics database that a test can take away and bring back."""

    name: str
    url: str
    # What the writer's log lines show of the URL (the password masked).
    shown_url: str
    go_away: Callable[[], None]
    come_back: Callable[[], None]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        directory = tmp_path / "db"
        away = tmp_path / "db-moved-away"
        database = directory / "metrics.db"

        def go_away() -> None:
            directory.rename(away)
            # A plain file in its place, so a writer started meanwhile cannot create the
            # directory (and a fresh, empty database) again.
            directory.write_text("moved away\n")

        def come_back() -> None:
            directory.unlink()
            away.rename(directory)

        yield Backend(
            name="sqlite",
            url=f"sqlite:///{database}",
            shown_url=f"sqlite:///{database}",
            go_away=go_away,
            come_back=come_back,
        )
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    server.start()
    engine = make_engine(server.url)
    metadata.drop_all(engine)
    engine.dispose()
    try:
        yield Backend(
            name="postgresql",
            url=f"postgresql://postgres:s3cret@127.0.0.1:{server.port}/{server.database}",
            shown_url=f"postgres:***@127.0.0.1:{server.port}/{server.database}",
            go_away=server.stop,
            come_back=server.start,
        )
    finally:
        server.start()
