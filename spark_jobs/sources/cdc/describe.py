"""What a table must be for a CDC copy, read from the catalog and checked before any work starts.

Every column must be of a type ``table.COLUMN_TYPES`` holds. Any other type is refused by
name before the first batch rather than copied wrong: money (its text depends on
``lc_monetary``), composites, ranges, geometric types, tsvector and tsquery, bit strings,
pg_lsn, the oid family, an extension's types.

Chunks are ranges of the primary key, read with ``(key) > (:after) ORDER BY key`` on the
server and merged with decoded changes by key in Python. Both sides must order keys the
same way, so every key column must be of a type whose PostgreSQL order is Python's order of
the values read: integers, numeric (``values.NumericKey``), dates and timestamps (counts,
infinities at the ends), uuid (its lower-case text orders as its bytes), and text, varchar
and char(n) in a UTF-8 database, compared ``COLLATE "C"`` whatever their own collation:
byte order, which is code point order there (a char(n) compared without its padding,
``values.PaddedKey``). A language collation orders by rules Python does not know, and a key
compared both ways would put a row in no chunk or in two; a nondeterministic one makes keys
equal that differ, so it is refused. Every key column is checked, not only the first,
because the merge compares whole keys. A key index of another collation cannot serve the
byte order: ``byte_order_advice`` names the index that would.

A table without a primary key has no key to chunk on (and its updates and deletes carry no
key, unless under REPLICA IDENTITY FULL): it is refused, as is a replica identity that is
neither the primary key nor FULL, since changes must name the key of the row they change;
and so is a table whose rows a read and its changes would see apart (``_check_whole``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy
from sqlalchemy import text

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.backlog.table_names import in_text, qualified, text_quoting
from spark_jobs.sources.cdc.table import (
    _IDENTITIES,
    ALLOWED,
    CHUNKABLE,
    COLUMN_TYPES,
    SUPPORTED,
    TEXT,
    TEXT_TYPES,
    TableColumn,
    TableError,
    TableShape,
)
from spark_jobs.storage.databases import sqlstate

_KIND = text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)")
_INSUFFICIENT_PRIVILEGE = "42501"
_RELATION = text(
    "SELECT c.oid, c.relkind, quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name, "
    "c.relreplident, (SELECT i.indexrelid::regclass::text FROM pg_index i "
    "  WHERE i.indrelid = c.oid AND i.indisreplident AND NOT i.indisprimary) AS other_index, "
    "(SELECT con.conname FROM pg_constraint con WHERE con.conrelid = c.oid "
    "  AND con.contype = 'p' AND con.condeferrable) AS deferrable_key, "
    "(SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid) "
    "  AS parent, c.relispartition, "
    "(SELECT i.inhrelid::regclass::text FROM pg_inherits i WHERE i.inhparent = c.oid "
    "  AND c.relkind = 'r' LIMIT 1) AS child, c.relrowsecurity, c.relpersistence "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = to_regclass(:name)"
)
_COLUMNS = text(
    "SELECT a.attname, quote_ident(a.attname) AS sql, a.atttypid, a.atttypmod, "
    "format_type(a.atttypid, a.atttypmod) AS type_name, "
    "CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END AS generated, "
    "(SELECT quote_ident(cn.nspname) || '.' || quote_ident(co.collname) FROM pg_collation co "
    "  JOIN pg_namespace cn ON cn.oid = co.collnamespace WHERE co.oid = a.attcollation) "
    "  AS collation, "
    "ARRAY(SELECT r.attname::text FROM pg_depend dep JOIN pg_attribute r "
    "  ON r.attrelid = dep.refobjid AND r.attnum = dep.refobjsubid "
    "  WHERE dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid "
    "  AND dep.refclassid = 'pg_class'::regclass AND dep.refobjid = a.attrelid "
    "  AND r.attnum <> a.attnum ORDER BY r.attnum) AS generated_from, "
    "a.attgenerated = 'v' AS virtual "
    "FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid "
    "AND d.adnum = a.attnum AND a.attgenerated <> '' "
    "WHERE a.attrelid = :oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
)
#: A generated column that a partition computes by an expression of its own, if any.
_OTHER_EXPRESSIONS = text(
    "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS partition, a.attname "
    "FROM pg_partition_tree(:oid) p JOIN pg_class c ON c.oid = p.relid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "JOIN pg_attribute a ON a.attrelid = p.relid AND a.attgenerated <> '' "
    "JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "JOIN pg_attribute ra ON ra.attrelid = :oid AND ra.attname = a.attname "
    "JOIN pg_attrdef rd ON rd.adrelid = ra.attrelid AND rd.adnum = ra.attnum "
    "WHERE p.relid <> :oid "
    "AND pg_get_expr(d.adbin, d.adrelid) <> pg_get_expr(rd.adbin, rd.adrelid) "
    "LIMIT 1"
)
#: A partitioned table's partitions at every level, and the replica identities of its
#: leaves, where its updates and deletes happen.
_PARTITIONS = text(
    "SELECT p.relid::oid AS oid, p.relid::regclass::text AS name, p.isleaf, c.relreplident, "
    "c.relpersistence "
    "FROM pg_partition_tree(:oid) p JOIN pg_class c ON c.oid = p.relid "
    "WHERE p.relid <> :oid ORDER BY p.relid::oid"
)
#: The types of the columns and every type they are built on (domains' base types, arrays'
#: elements); an array type is one that is another type's ``typarray``.
_TYPES = text(
    "WITH RECURSIVE reached(oid) AS ("
    "  SELECT atttypid FROM pg_attribute WHERE attrelid = :oid AND attnum > 0 "
    "  AND NOT attisdropped "
    "  UNION SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END "
    "  FROM reached r JOIN pg_type t ON t.oid = r.oid "
    "  WHERE t.typtype = 'd' OR t.typelem <> 0"
    ") SELECT t.oid, t.typtype, t.typbasetype, t.typelem, format_type(t.oid, NULL) AS name, "
    "  t.oid = (SELECT e.typarray FROM pg_type e WHERE e.oid = t.typelem) AS is_array "
    "FROM reached JOIN pg_type t ON t.oid = reached.oid"
)
_KEY = text(
    "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) AS type_name, "
    "coll.collname, coll.collisdeterministic AS deterministic, "
    "pg_encoding_to_char(db.encoding) AS encoding, o.oid AS order_collation, "
    "quote_ident(ocn.nspname) || '.' || quote_ident(oc.collname) AS order_collation_name "
    "FROM pg_index i CROSS JOIN unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position) "
    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    "LEFT JOIN pg_collation coll ON coll.oid = a.attcollation "
    "JOIN pg_database db ON db.datname = current_database() "
    # Its own collation where that orders by bytes (libc's C or POSIX, the database's
    # default included), which its key index then serves; else "C" (OID 950).
    "CROSS JOIN LATERAL (SELECT CASE WHEN a.attcollation = 0 THEN NULL "
    "  WHEN (CASE WHEN coll.collprovider = 'd' THEN db.datlocprovider "
    "    ELSE coll.collprovider END) = 'c' "
    "  AND (CASE WHEN coll.collprovider = 'd' THEN db.datcollate ELSE coll.collcollate END) "
    "    IN ('C', 'POSIX') THEN a.attcollation ELSE 950 END AS oid) o "
    "LEFT JOIN pg_collation oc ON oc.oid = o.oid "
    "LEFT JOIN pg_namespace ocn ON ocn.oid = oc.collnamespace "
    # The key's own columns, not those it INCLUDEs.
    "WHERE i.indrelid = :oid AND i.indisprimary AND k.position <= i.indnkeyatts "
    "ORDER BY k.position"
)


def describe_table(engine: sqlalchemy.Engine, table: str) -> TableShape:
    """The columns and primary key of ``table`` (``name`` or ``schema.name``, each part as
    written: ``Orders`` is not ``orders``); TableError if the source cannot copy it."""
    where = redact_text(engine.url.render_as_string(hide_password=False))
    quote = text_quoting(engine.dialect.identifier_preparer)
    name = qualified(table, quote)
    with engine.connect() as connection:
        _lock_if_partitioned(connection, name)
        found = connection.execute(_RELATION, {"name": name}).first()
        if found is None or found.relkind not in ("r", "p"):
            what = "no table" if found is None else f"relation {found.name} is not a table, and"
            raise TableError(
                f"{what} {table!r} on {where}: a snapshot reads an ordinary or partitioned table"
            )
        _check_whole(connection, found)
        columns = connection.execute(_COLUMNS, {"oid": found.oid}).all()
        types = {t.oid: t for t in connection.execute(_TYPES, {"oid": found.oid})}
        key = connection.execute(_KEY, {"oid": found.oid}).all()
        partitions = connection.execute(_PARTITIONS, {"oid": found.oid}).all()
        generated_by_partitions = connection.execute(_OTHER_EXPRESSIONS, {"oid": found.oid}).first()
    if not key:
        raise TableError(
            f"table {found.name} has no primary key; reading it in chunks needs one "
            f"(ALTER TABLE {found.name} ADD PRIMARY KEY (...))"
        )
    if found.relreplident == "n" or found.other_index is not None:
        identity = "NOTHING" if found.relreplident == "n" else f"USING INDEX {found.other_index}"
        raise TableError(
            f"table {found.name} has REPLICA IDENTITY {identity}: its updates and deletes would "
            "not name the primary key of the row they change; use REPLICA IDENTITY DEFAULT"
        )
    if found.deferrable_key is not None:
        raise TableError(
            f"table {found.name}: its primary key {found.deferrable_key} "
            f"({', '.join(k.attname for k in key)}) is DEFERRABLE, which PostgreSQL does not "
            "take as a replica identity: once the table is published, every UPDATE and DELETE "
            "of it fails, and within a transaction two rows may share a key. Make the key NOT "
            "DEFERRABLE (ALTER TABLE ... ALTER CONSTRAINT cannot: drop and add it again)"
        )
    described = tuple(_described(found.name, c, types) for c in columns)
    for column in key:
        _check_key_column(found.name, column, _without_domains(column.atttypid, types))
    _check_generated(found.name, described, generated_by_partitions)
    key_names = tuple(column.attname for column in key)
    generated_keys = [c.name for c in described if c.generated and c.name in key_names]
    if generated_keys:
        raise TableError(
            f"table {found.name}: primary-key column {generated_keys[0]!r} is generated, and "
            "pgoutput sends no value for a generated column, so no change would name its row's "
            "key; key the table on the columns it is generated from"
        )
    unlogged = [p.name for p in (found, *partitions) if p.relpersistence != "p"]
    if unlogged:
        raise TableError(
            f"table {found.name}: {'' if unlogged[0] == found.name else 'partition '}"
            f"{unlogged[0]} is UNLOGGED (or temporary), so its changes are not written to the "
            "WAL and none would reach the copy: make it logged (ALTER TABLE ... SET LOGGED)"
        )
    other = [p.name for p in partitions if p.isleaf and p.relreplident != found.relreplident]
    if other:
        raise TableError(
            f"table {found.name}: partition {other[0]} has another replica identity than the "
            f"table's ({_IDENTITIES[found.relreplident]}); its updates and deletes would name "
            "their rows otherwise: give every partition the table's"
        )
    return TableShape(
        found.oid,
        found.name,
        described,
        key_names,
        found.relreplident,
        tuple(p.oid for p in partitions),
        tuple(
            None if c.order_collation is None else (c.order_collation, c.order_collation_name)
            for c in key
        ),
    )


def _check_generated(
    table: str, columns: tuple[TableColumn, ...], by_partition: sqlalchemy.Row | None
) -> None:
    """Refuse generated values the source cannot compute again from a change: one that reads
    a system column (``tableoid``: no change carries it), one a partition computes by an
    expression of its own (from PostgreSQL 17; its rows hold the partition's values)."""
    system = [c.name for c in columns if c.generated and "tableoid" in c.generated_from]
    if system:
        raise TableError(
            f"table {table}: generated column {system[0]!r} reads tableoid, which no change "
            "carries, so its value could not be computed for one; generate it from the row's "
            "own columns"
        )
    if by_partition is not None:
        raise TableError(
            f"table {table}: partition {by_partition.partition} computes generated column "
            f"{by_partition.attname!r} by another expression than the table's, which changes "
            "published as the table's would be computed by; give it the table's"
        )


def _lock_if_partitioned(connection: sqlalchemy.Connection, name: str) -> None:
    """Lock a partitioned table before reading of it what locks its partitions. ALTER TABLE
    locks the table, then its partitions; reading the partitions' catalog locks them and
    reading the table's expressions locks it, so an ALTER between the two deadlocked, and
    PostgreSQL ended the read. Whether it is partitioned is read in a transaction of its own:
    the lock then comes before the reading transaction's snapshot, which sees an ALTER whole.
    It waits as the read of the partitions would anyway; an ordinary table, whose catalog
    reads wait for no lock, is not locked. A role that may read the columns but not lock the
    table (column privileges) reads unlocked, as before."""
    partitioned = connection.execute(_KIND, {"name": name}).scalar() == "p"
    connection.commit()
    if not partitioned:
        return
    try:
        with connection.begin_nested():
            connection.execute(text(f"LOCK TABLE ONLY {in_text(name)} IN ACCESS SHARE MODE"))
    except sqlalchemy.exc.DBAPIError as error:
        if sqlstate(error) != _INSUFFICIENT_PRIVILEGE:
            raise


def _check_whole(connection: sqlalchemy.Connection, found: sqlalchemy.Row) -> None:
    """Refuse a table whose rows a snapshot and its changes would not both see whole: a
    partition (its changes are published as its root's), a table with inheritance children
    (a read of it holds theirs, whose changes name them), one whose row security would hide
    rows from the reader (the slot decodes them all)."""
    if found.relispartition:
        raise TableError(
            f"table {found.name} is a partition of {found.parent}, whose changes are published "
            f"as {found.parent}'s: copy {found.parent}"
        )
    if found.child is not None:
        raise TableError(
            f"table {found.name} has inheritance children ({found.child}): a read of it holds "
            "their rows, whose changes name them, not it; copy each table apart, or "
            "partition it"
        )
    if found.relrowsecurity:
        try:
            with connection.begin_nested():
                connection.execute(text("SET LOCAL row_security = off"))
                connection.execute(text(f"SELECT 1 FROM {in_text(found.name)} LIMIT 0"))
        except sqlalchemy.exc.DBAPIError:
            raise TableError(
                f"table {found.name} has row-level security that hides rows from this role, "
                "while its changes show them all: connect as a role with BYPASSRLS (or the "
                "table's owner)"
            ) from None


def _described(table: str, column: sqlalchemy.Row, types: Mapping[int, Any]) -> TableColumn:
    """``column`` with the supported type it is read as; TableError if it has none."""
    base = _supported_base(column.atttypid, types)
    if base is None:
        raise TableError(
            f"table {table}: column {column.attname!r} is {column.type_name}, which cannot be "
            f"copied exactly; a column must be {SUPPORTED}"
        )
    return TableColumn(
        column.attname,
        column.sql,
        column.atttypid,
        column.type_name,
        None if base == column.atttypid else base,
        None if column.atttypid < _FIRST_USER_OID else _portable(column.atttypid, types),
        column.atttypmod,
        column.generated,
        tuple(column.generated_from) if column.generated else (),
        column.collation,
        column.virtual,
    )


def _portable(type_oid: int, types: Mapping[int, Any]) -> str:
    """A built-in type holding every value of ``type_oid``: past its domains, text for an
    enum, an array of the portable element type."""
    found = types[_without_domains(type_oid, types)]
    if found.is_array:
        element = _portable(found.typelem, types)
        return f"{element}[]" if found.typelem >= _FIRST_USER_OID else found.name
    return "text" if found.typtype == "e" else found.name


#: PostgreSQL's first OID of a user-made object: types below it are built in.
_FIRST_USER_OID = 16384


def _supported_base(type_oid: int, types: Mapping[int, Any]) -> int | None:
    """The type of ``COLUMN_TYPES`` a column of ``type_oid`` is read as, None if none."""
    found = types[_without_domains(type_oid, types)]
    if found.is_array:
        return None if _supported_base(found.typelem, types) is None else TEXT.oid
    if found.typtype == "e":
        return TEXT.oid
    return found.oid if found.oid in COLUMN_TYPES else None


def _without_domains(type_oid: int, types: Mapping[int, Any]) -> int:
    while types[type_oid].typtype == "d":
        type_oid = types[type_oid].typbasetype
    return type_oid


def _check_key_column(table: str, column: sqlalchemy.Row, base_oid: int) -> None:
    """Refuse a key column whose order Python cannot reproduce; ``base_oid`` is its type's,
    or a domain's base type's."""
    if base_oid in CHUNKABLE:
        return
    if base_oid in TEXT_TYPES:
        if column.encoding != "UTF8":
            raise TableError(
                f"table {table}: primary-key column {column.attname!r} is {column.type_name}, "
                f"whose chunks are read in byte order, but the database is encoded in "
                f"{column.encoding}, where byte order is not code point order; a key column "
                f"must be {ALLOWED}"
            )
        if column.deterministic is False:
            raise TableError(
                f"table {table}: primary-key column {column.attname!r} is {column.type_name} "
                f"with collation {column.collname!r}, which is nondeterministic: it makes keys "
                f"equal whose bytes differ; a key column must be {ALLOWED}"
            )
        return
    raise TableError(
        f"table {table}: primary-key column {column.attname!r} is {column.type_name}, which "
        f"cannot be chunked; a key column must be {ALLOWED}"
    )


_INDEXES = text(
    "SELECT i.indkey::text AS columns, i.indcollation::text AS collations, "
    "i.indoption::text AS options, am.amname AS method FROM pg_index i "
    "JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_am am ON am.oid = ic.relam "
    "WHERE i.indrelid = :oid AND i.indisvalid AND i.indpred IS NULL"
)
_ATTNUMS = text(
    "SELECT a.attname, a.attnum FROM pg_attribute a WHERE a.attrelid = :oid AND a.attnum > 0"
)


def key_order(shape: TableShape, prefix: str = "") -> str:
    """The key as chunks and refreshes compare and order it: each text column under its
    byte-ordered collation (``TableShape.key_collations``), Python's order of its values."""
    return ", ".join(
        f"{prefix}{c.sql}" + ("" if collation is None else f" COLLATE {collation[1]}")
        for c, collation in zip(shape.key_columns, shape.key_collations, strict=True)
    )


def byte_order_advice(engine: sqlalchemy.Engine, shape: TableShape) -> str | None:
    """None if a btree index of ``shape`` serves its chunks' order (``key_order``), else
    the index to create: without one, every chunk's read sorts the whole table."""
    with engine.connect() as connection:
        attnums = dict(connection.execute(_ATTNUMS, {"oid": shape.oid}).all())
        indexes = connection.execute(_INDEXES, {"oid": shape.oid}).all()
    wanted = [
        (str(attnums[c.name]), "0" if collation is None else str(collation[0]))
        for c, collation in zip(shape.key_columns, shape.key_collations, strict=True)
    ]
    if any(_serves(index, wanted) for index in indexes):
        return None
    # A partitioned table's index cannot be made concurrently (its partitions' can).
    how = "CREATE INDEX ON" if shape.partitions else "CREATE INDEX CONCURRENTLY ON"
    return (
        f"chunks of {shape.name} are read in key order with text compared in byte order, "
        "which no index of the table serves, so each chunk's read sorts the table; for a "
        f"large table, create one: {how} {shape.name} ({key_order(shape)})"
    )


def _serves(index: sqlalchemy.Row, wanted: list[tuple[str, str]]) -> bool:
    """Whether ``index`` is a btree that begins with the ``wanted`` columns (attnums) of the
    wanted collations (OIDs), all in one direction, so a scan of it reads them in order.
    Its collations and options cover its key columns only, not its INCLUDE ones."""
    collations, options = index.collations.split(), index.options.split()
    found = list(zip(index.columns.split(), collations, options, strict=False))[: len(wanted)]
    return (
        index.method == "btree"
        and len(found) == len(wanted)
        and {option for *_, option in found} in ({"0"}, {"3"})  # all ASC, or all DESC
        and all(
            (column, collation) == want
            for (column, collation, _), want in zip(found, wanted, strict=True)
        )
    )
