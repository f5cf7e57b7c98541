"""A server that is away, told from a statement that is wrong, on real connections."""

import pytest
import sqlalchemy as sa

from spark_jobs.metrics.schema import make_engine
from spark_jobs.storage.databases import is_outage
from tests.support.postgres import free_port


def error_of(url: str, statement: str) -> Exception:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(sa.text(statement))
    except sa.exc.DBAPIError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError(f"{statement} ran")


def test_a_refused_connection_is_an_outage_and_a_wrong_statement_is_not(postgres_server):
    away = f"postgresql://postgres@127.0.0.1:{free_port()}/metrics"
    assert is_outage(error_of(away, "SELECT 1"))
    assert not is_outage(error_of(postgres_server.url, "SELECT * FROM nowhere"))
    assert not is_outage(error_of(postgres_server.url, "SELECT 1 / 0"))


def test_a_server_shutting_down_the_session_is_an_outage(postgres_server):
    """57P01, as a fast shutdown or pg_terminate_backend cuts a session."""
    error = error_of(postgres_server.url, "SELECT pg_terminate_backend(pg_backend_pid())")
    assert is_outage(error)


@pytest.mark.parametrize("error", [ValueError("x"), sa.exc.ProgrammingError("s", {}, None)])
def test_errors_of_no_connection_are_never_an_outage(error):
    assert not is_outage(error)
