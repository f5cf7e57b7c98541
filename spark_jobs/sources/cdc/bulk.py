"""``COPY`` out of and into PostgreSQL through whichever driver SQLAlchemy connected with.

psycopg2 and psycopg 3 (the maintained one, SQLAlchemy 2.1's default) both move ``COPY`` data
in bulk, with different calls: psycopg2's ``copy_expert`` and ``mogrify``, psycopg 3's
``cursor.copy()`` and ``ClientCursor.mogrify``. ``COPY`` takes no bound parameters, so a query
with values is rendered client-side first, by the driver's own quoting.
"""

from __future__ import annotations

import io
from typing import Any

import sqlalchemy


def _dbapi(connection: sqlalchemy.Connection) -> Any:
    return connection.connection.dbapi_connection


def _psycopg3(dbapi: Any) -> bool:
    return type(dbapi).__module__.split(".")[0] == "psycopg"


def as_literal(sql: str) -> str:
    """``sql`` (names, types) as part of a query ``copy_out`` renders: each '%' doubled, so
    that the driver, which takes a '%' for the start of a placeholder, leaves it as it is."""
    return sql.replace("%", "%%")


def copy_out(connection: sqlalchemy.Connection, query: str, values: list[Any]) -> bytes:
    """The CSV of ``COPY (query) TO STDOUT``, ``query``'s ``%s`` bound to ``values`` (its
    other '%' doubled: ``as_literal``)."""
    dbapi = _dbapi(connection)
    if _psycopg3(dbapi):
        import psycopg

        bound = psycopg.ClientCursor(dbapi).mogrify(query, values)
        buffer = io.BytesIO()
        with dbapi.cursor() as cursor, cursor.copy(f"COPY ({bound}) TO STDOUT (FORMAT csv)") as out:
            for data in out:
                buffer.write(data)
        return buffer.getvalue()
    cursor = dbapi.cursor()
    try:
        bound = cursor.mogrify(query, values).decode()
        buffer = io.BytesIO()
        cursor.copy_expert(f"COPY ({bound}) TO STDOUT WITH (FORMAT csv)", buffer)
        return buffer.getvalue()
    finally:
        cursor.close()


def copy_in(connection: sqlalchemy.Connection, statement: str, data: io.BytesIO) -> None:
    """``statement`` (a ``COPY ... FROM STDIN``) fed ``data``."""
    dbapi = _dbapi(connection)
    if _psycopg3(dbapi):
        with dbapi.cursor() as cursor, cursor.copy(statement) as copy:
            copy.write(data.getvalue())
        return
    data.seek(0)
    cursor = dbapi.cursor()
    try:
        cursor.copy_expert(statement, data)
    finally:
        cursor.close()
