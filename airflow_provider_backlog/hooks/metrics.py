"""The metrics database the jobs write to, as an Airflow connection.

A ``DbApiHook``, so ``SqlSensor``, ``SQLExecuteQueryOperator`` and ad-hoc queries work with
it too. The tables and how to reach the database (SQLite tuned for a writer and readers,
PostgreSQL with whichever driver is installed) come from the one schema module the jobs
write with, which imports no pyspark.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.providers.common.sql.hooks.sql import DbApiHook
from sqlalchemy.engine import URL, Engine, make_url

from airflow_provider_backlog import METRICS_CONN_TYPE
from spark_jobs.metrics.schema import make_engine


class MetricsConnectionError(ValueError):
    """A metrics connection that names no database; the message says what to set."""


class BacklogMetricsHook(DbApiHook):
    """The ``backlog_metrics`` connection: an SQLAlchemy URL (field ``url``), or a SQLite file
    (field ``host``). A URL without a password takes the connection's password."""

    conn_name_attr = "backlog_metrics_conn_id"
    default_conn_name = "backlog_metrics_default"
    conn_type = METRICS_CONN_TYPE
    hook_name = "Backlog metrics database"

    @cached_property
    def sqlalchemy_url(self) -> URL:
        connection = self.get_connection(self.get_conn_id())
        extra = connection.extra_dejson
        # The connection form stores the field as "url"; older forms prefixed it.
        text = (extra.get("url") or extra.get(f"extra__{METRICS_CONN_TYPE}__url") or "").strip()
        if text:
            url = make_url(text)
            if url.username and url.password is None and connection.password:
                url = url.set(password=connection.password)
            return url
        if connection.host:
            return make_url(f"sqlite:///{Path(connection.host).expanduser().absolute()}")
        raise MetricsConnectionError(
            f"connection {self.get_conn_id()!r} names no metrics database: set its SQLAlchemy "
            "URL (e.g. postgresql://user@host:5432/metrics) or, for SQLite, its file as host"
        )

    @cached_property
    def engine(self) -> Engine:
        return make_engine(self.sqlalchemy_url.render_as_string(hide_password=False))

    def get_uri(self) -> str:
        return self.sqlalchemy_url.render_as_string(hide_password=False)

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Engine:
        del engine_kwargs  # the engine is tuned for this database; see make_engine
        return self.engine

    def get_conn(self) -> Any:
        """A DB-API connection from the engine (sqlite3 or the PostgreSQL driver's)."""
        return self.engine.raw_connection()

    @property
    def placeholder(self) -> str:
        return "?" if self.sqlalchemy_url.get_backend_name() == "sqlite" else "%s"
