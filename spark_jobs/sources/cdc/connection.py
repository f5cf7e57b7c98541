"""Where a CDC source reads: its connection URL, kept without a password, the password added in
each process that connects, and the table checked there before anything is made.

Options show in query plans and partitions travel pickled to executors, so the URL a source
keeps carries no password: ``BACKLOG_CDC_PASSWORD`` gives it, on the driver and on the
executors, to the process that connects (``with_source_password``). A URL that carries a
password itself, in its user part or its query, is refused by name.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import sqlalchemy
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.schema import with_password
from spark_jobs.sources.cdc.describe import byte_order_advice, describe_table
from spark_jobs.sources.cdc.slot import (
    ReplicationSlot,
    SlotError,
    check_logical_decoding,
    source_engine,
)
from spark_jobs.sources.cdc.table import TableError, TableShape
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.sources.file_reading import check_types

logger = logging.getLogger(__name__)

PASSWORD_ENV = "BACKLOG_CDC_PASSWORD"
#: libpq parameters that hold a secret when given in a URL's query.
_SECRET_PARAMETERS = ("password", "sslpassword")


def checked_url(child: str, url: str) -> str:
    """``url`` (SQLAlchemy's or libpq's form) as SQLAlchemy takes it; refuses a URL that is
    not PostgreSQL's or that carries a password itself, in its user part or its query."""
    if url.startswith("postgres://"):  # libpq's short scheme, which SQLAlchemy does not take
        url = "postgresql://" + url.removeprefix("postgres://")
    try:
        parsed = make_url(url)
    except ArgumentError:
        parsed = None
    if parsed is None or parsed.get_backend_name() != "postgresql":
        raise ChildSpecError(
            f"child source {child!r}: field 'connection' = {redact_text(url)!r} must be a "
            "PostgreSQL URL such as postgresql://user@host:5432/database"
        )
    secrets = [name for name in parsed.query if name.lower() in _SECRET_PARAMETERS]
    if parsed.password is not None or secrets:
        where = f"parameter {secrets[0]!r}" if secrets else "user part"
        raise ChildSpecError(
            f"child source {child!r}: field 'connection' = "
            f"{redact_text(parsed.render_as_string(hide_password=True))!r} carries a password "
            f"in its {where}; options show in query plans, so set it in the environment "
            f"variable {PASSWORD_ENV} of the driver and executors instead"
        )
    return url


def with_source_password(url: str) -> str:
    """``url`` with the password from ``BACKLOG_CDC_PASSWORD``, in the process that
    connects: only the URL without it is kept, pickled or shown."""
    return with_password(url, os.environ.get(PASSWORD_ENV))


def connection_url(child: str, url: str) -> str:
    """``checked_url`` with the password from ``BACKLOG_CDC_PASSWORD``, to connect with."""
    return with_source_password(checked_url(child, url))


def teardown(url: str, slot: str, publication: str, table: str) -> bool:
    """Drop the slot and publication of a query that is gone for good (its checkpoint and
    state location go too); True if a slot was there."""
    replication = ReplicationSlot(with_source_password(url), slot, publication, table)
    try:
        try:
            replication.confirmed_flush_lsn()
            existed = True
        except SlotError:
            existed = False
        replication.drop()
        return existed
    finally:
        replication.close()


def checked_table(child: str, url: str, table: str) -> TableShape:
    """The table's shape, after refusing by name what would fail later: a server that does
    not decode changes or does not answer, a table that cannot be read in chunks."""
    shape = describe(child, url, table)
    try:
        check_logical_decoding(url)
    except SlotError as error:
        raise ChildSpecError(f"child source {child!r}: {error}") from None
    return shape


def describe(child: str, url: str, table: str) -> TableShape:
    engine = source_engine(url)
    try:
        shape = describe_table(engine, table)
        advice = byte_order_advice(engine, shape)
        if advice is not None:
            logger.warning("child source %r: %s", child, advice)
        return shape
    except TableError as error:
        raise ChildSpecError(f"child source {child!r}: {error}") from None
    except sqlalchemy.exc.OperationalError as error:
        raise ChildSpecError(
            f"child source {child!r}: cannot connect to {redact_text(url)}: "
            f"{redact_text(str(error.orig)).strip()}"
        ) from None
    finally:
        engine.dispose()


def change_schema(shape: TableShape) -> pa.Schema:
    """The rows' schema: the table's columns, then ``_op``, ``_lsn``, ``_seq``, ``_commit_time``,
    ``_unchanged``."""
    return shape.arrow_table([], []).schema


def check_schema(child: str, shape: TableShape, schema: pa.Schema) -> None:
    """Refuse a query schema with columns the table's rows do not have, or cannot take."""
    given = change_schema(shape)
    missing = [name for name in schema.names if name not in given.names]
    if missing:
        raise ChildSpecError(
            f"child source {child!r}: the query's schema has columns {missing} that rows of "
            f"{shape.name} do not; they have {given.names}"
        )
    try:
        check_types(given, schema)
    except ValueError as error:
        raise ChildSpecError(f"child source {child!r}, table {shape.name}: {error}") from None
