"""What the catalog says of a table that its shape does not: the DDL that changes its rows while
no change of them is decoded.

- A column dropped and added again under the same name and type: its old values are gone,
  every row holds the new column's default, and not one change says so. Its number
  (``attnum``) tells the two columns apart.
- ``ALTER COLUMN ... TYPE`` to the type it had, ``USING`` an expression: the table is
  rewritten (a new ``relfilenode``, its catalog row's ``xmin`` the rewriting transaction's)
  in the transaction that updates the column's catalog row. A ``VACUUM FULL`` or a
  ``CLUSTER`` rewrites the table alone, and ``SET DEFAULT`` or ``SET STATISTICS`` update a
  column alone: only a rewrite by the transaction that changed a column is the rewrite of
  a column.
- An enum label renamed: the rows keep the label's OID, whose text is now another. A label
  added changes nothing that was copied.

Kept at the copy's first start beside the shape, and compared at every plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy
from sqlalchemy import text

from spark_jobs.sources.cdc.table import START_OVER, TableChangedError

_STATE = text(
    "SELECT "
    "(SELECT json_object_agg(attname, json_build_array(attnum, xmin::text)) FROM pg_attribute "
    "  WHERE attrelid = :oid AND attnum > 0 AND NOT attisdropped) AS columns, "
    "(SELECT json_object_agg(oid::text, json_build_array(relfilenode::text, xmin::text)) "
    "  FROM pg_class "
    "  WHERE oid = :oid OR oid IN (SELECT relid FROM pg_partition_tree(:oid))) AS files, "
    "(SELECT json_object_agg(e.oid::text, e.enumlabel) FROM pg_enum e WHERE e.enumtypid IN ("
    "  WITH RECURSIVE reached(oid) AS (SELECT atttypid FROM pg_attribute WHERE attrelid = :oid "
    "    AND attnum > 0 AND NOT attisdropped UNION SELECT CASE WHEN t.typtype = 'd' "
    "    THEN t.typbasetype ELSE t.typelem END FROM reached r JOIN pg_type t ON t.oid = r.oid "
    "    WHERE t.typtype = 'd' OR t.typelem <> 0) SELECT oid FROM reached)) AS labels"
)


@dataclass(frozen=True)
class CatalogState:
    """Per column its number and catalog row's ``xmin``; per relation (the table and its
    partitions) its file and catalog row's ``xmin``; per enum label its text."""

    columns: Mapping[str, list[Any]]
    files: Mapping[str, list[str]]
    labels: Mapping[str, str]

    @classmethod
    def read(cls, connection: sqlalchemy.Connection, oid: int) -> CatalogState:
        row = connection.execute(_STATE, {"oid": oid}).one()
        return cls(row.columns or {}, row.files or {}, row.labels or {})

    def as_json(self) -> dict[str, Any]:
        return {
            "columns": dict(self.columns),
            "files": dict(self.files),
            "labels": dict(self.labels),
        }

    def check_unchanged(self, table: str, kept: Mapping[str, Any]) -> None:
        """Refuse what changed rows without a change since ``kept`` (``as_json``)."""
        was = CatalogState(kept["columns"], kept["files"], kept["labels"])
        renumbered = [
            name
            for name, (number, _) in self.columns.items()
            if name in was.columns and was.columns[name][0] != number
        ]
        if renumbered:
            self._refuse(table, f"column {renumbered[0]!r} was dropped and added again")
        rewriters = {
            xmin
            for relation, (file, xmin) in self.files.items()
            if was.files.get(relation, [file])[0] != file
        }
        rewritten = [name for name, (_, xmin) in self.columns.items() if xmin in rewriters]
        if rewritten:
            self._refuse(
                table,
                f"its rows were rewritten by a change of column {rewritten[0]!r} (ALTER "
                "COLUMN ... TYPE ... USING): values changed that no change names",
            )
        renamed = [
            f"{label!r} to {self.labels.get(oid)!r}"
            for oid, label in was.labels.items()
            if self.labels.get(oid) != label
        ]
        if renamed:
            self._refuse(table, f"an enum label its columns hold was renamed, {renamed[0]}")

    @staticmethod
    def _refuse(table: str, what: str) -> None:
        raise TableChangedError(f"table {table} changed since the copy began: {what}; {START_OVER}")
