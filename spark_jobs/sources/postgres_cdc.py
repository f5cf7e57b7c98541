"""``spark.readStream.format("postgres-cdc")``: one PostgreSQL table, snapshot then changes.

The hybrid source with a single ``postgres-cdc`` child (see ``cdc/child.py``), whose schema
comes from the table: its columns, then ``_op``, ``_lsn``, ``_seq``, ``_commit_time`` and
``_unchanged``. Options: ``connection``, ``table``, ``chunkRows``, ``slot``, ``publication``
as the child's fields, and the hybrid source's ``stateLocation`` (required), ``name``,
``maxRowsPerTrigger``, ``rowsPerPartition`` and ``backlogChannel``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from spark_jobs.backlog.values import parse_count
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.sources.hybrid import HybridOptionError, HybridStreamReader

CHILD_FIELDS = ("connection", "table", "slot", "publication")
DEFAULT_NAME = "postgres-cdc"


def child_spec(options: Mapping[str, str]) -> dict[str, Any]:
    """The child spec the options describe (option keys are case-insensitive)."""
    opts = {key.lower(): value for key, value in options.items()}
    # The copy's modules (pandas, the database drivers among what they import) load only for
    # a job that reads this source: every driver registers it.
    from spark_jobs.sources.cdc.child import PostgresCdcChild

    spec: dict[str, Any] = {"name": opts.get("name", DEFAULT_NAME), "kind": PostgresCdcChild.kind}
    for field in CHILD_FIELDS:
        if field in opts:
            spec[field] = opts[field]
    if "chunkrows" in opts:
        try:
            spec["chunkRows"] = parse_count(opts["chunkrows"])
        except ValueError as error:
            raise HybridOptionError(
                f"option 'chunkRows' = {opts['chunkrows']!r}: {error}"
            ) from None
    return spec


class PostgresCdcDataSource(DataSource):
    """Register with ``spark.dataSource.register(PostgresCdcDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return DEFAULT_NAME

    def schema(self) -> StructType:
        from spark_jobs.sources.cdc.connection import change_schema, connection_url, describe

        spec = child_spec(self.options)
        try:
            for field in ("connection", "table"):
                if field not in spec:
                    raise ChildSpecError(f"option {field!r} is required")
            shape = describe(
                spec["name"], connection_url(spec["name"], spec["connection"]), spec["table"]
            )
        except ChildSpecError as error:
            raise HybridOptionError(str(error)) from None
        return from_arrow_schema(change_schema(shape))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        spec = child_spec(self.options)
        options = {**self.options, "name": spec["name"], "sources": json.dumps([spec])}
        try:
            return HybridStreamReader(options, schema)
        except ChildSpecError as error:
            raise HybridOptionError(str(error)) from None
