"""A lease is running or died by the metrics database's clock, which drivers renew it by,
not the api-server's: on SQLite, and on a PostgreSQL whose clock runs an hour ahead of the
api-server's (its ``clock_timestamp()`` shadowed for one database through its search
path)."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.ui.pages import job_page, jobs_page
from spark_jobs.metrics.schema import backlog_leases, make_engine, metadata
from tests.airflow_provider_backlog.conftest import CONN_ID, add_checkpoints, insert, use_connection
from tests.airflow_provider_backlog.ui.conftest import sees_every_job
from tests.airflow_provider_backlog.ui.markup import cells

AHEAD = timedelta(hours=1)
SKEWED_DATABASE = "clock_ahead"


@pytest.fixture
def skewed_postgres(postgres_server) -> Iterator[str]:
    """A PostgreSQL database whose ``clock_timestamp()`` is ``AHEAD`` of the real one."""
    postgres_server.start()
    admin = make_engine(postgres_server.url)
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {SKEWED_DATABASE}")
        connection.exec_driver_sql(f"CREATE DATABASE {SKEWED_DATABASE}")
        connection.exec_driver_sql(
            f"ALTER DATABASE {SKEWED_DATABASE} SET search_path = public, skewed, pg_catalog"
        )
    admin.dispose()
    url = f"{postgres_server.url.rsplit('/', 1)[0]}/{SKEWED_DATABASE}"
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE SCHEMA skewed")
        connection.exec_driver_sql(
            "CREATE FUNCTION skewed.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS "
            f"$$ SELECT pg_catalog.clock_timestamp() + interval '{AHEAD.seconds} seconds' $$"
        )
        metadata.create_all(connection)
    engine.dispose()
    yield url


@pytest.fixture(params=["sqlite", "postgresql ahead"])
def database(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, timedelta]:
    """A metrics database reachable as ``CONN_ID``, and how far its clock is ahead."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/metrics.db"
        engine = make_engine(url)
        metadata.create_all(engine)
        engine.dispose()
        use_connection(monkeypatch, host=url.removeprefix("sqlite:///"))
        return url, timedelta(0)
    url = request.getfixturevalue("skewed_postgres")
    use_connection(monkeypatch, extra={"url": url})
    return url, AHEAD


def lease(job_name: str, acquired_at: datetime, expires_at: datetime) -> dict:
    return {
        "job_name": job_name,
        "checkpoint_location": f"file:///checkpoints/{job_name}",
        "run_id": f"{job_name}-run",
        "acquired_at": acquired_at,
        "expires_at": expires_at,
        "spark_ui_url": None,
        "released_at": None,
    }


def test_a_lease_is_judged_by_the_clock_of_its_database(database) -> None:
    """``near`` expires half an hour after the api-server's now: running by a database that
    keeps its time, died by one an hour ahead; ``far`` expires after both."""
    url, ahead = database
    now = datetime.now(UTC)
    start, near_expiry = now - timedelta(minutes=5), now + timedelta(minutes=30)
    insert(
        url,
        backlog_leases,
        lease("near", start, near_expiry),
        lease("far", start, now + timedelta(minutes=90)),
    )
    add_checkpoints(url, "near", "near-run", start, "ll")
    hook = BacklogMetricsHook(CONN_ID)
    jobs = cells(jobs_page(hook, root="", access=sees_every_job(), now=now), "jobs")
    leases = {job[0]: job[3].split(": lease")[0] for job in jobs}
    near = "died" if ahead else "running"
    assert leases == {
        "far": "run far-run running",
        "near": f"last checkpoint by run near-run run near-run {near}",
    }
    (run,) = cells(job_page(hook, root="", conn_id=CONN_ID, job_name="near", now=now), "runs")
    assert run[2] == (
        f"{near_expiry:%Y-%m-%dT%H:%M:%SZ} run "
        "near-run died: its lease expired and was never released"
        if ahead
        else "running, or after this period"
    )
