"""The table a randomized CDC trial copies, drawn from a seed: the shapes users' tables have.

A key of one integer, of an integer and a text (a composite key), or a ``char(4)``; columns
of text (one stored out of line when large, so an update that leaves it alone sends no
value), numeric, boolean, timestamptz, jsonb, bytea and a ``varchar`` whose name needs
quoting; sometimes generated columns computed from them, sometimes partitions by key range;
REPLICA IDENTITY DEFAULT, USING INDEX of the primary key's own, or FULL; a table name that
is plain, or holds a dot, a space and a quote in a schema of its own. Values are drawn with
NULLs, quotes, backslashes, non-ASCII, edge numbers and the infinities.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import string
from dataclasses import dataclass

from spark_jobs.backlog.table_names import as_part
from spark_jobs.metrics.schema import make_engine

ALPHABET = string.ascii_letters + string.digits + " '\"\\,.;{}()é€\U0001f600"
#: Long enough that PostgreSQL stores the value out of line (past about 2 kB).
BIG = 3_000
ODD = 'odd "col" name'


def literal(text: str | None) -> str:
    """``text`` as an SQL literal (NULL for None), standard_conforming_strings on."""
    return "NULL" if text is None else "'" + text.replace("'", "''") + "'"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class TableSpec:
    """What a trial's table is; ``name`` as ``--table`` takes it (``table_names``)."""

    name: str
    schema: str | None
    key: str  # "int", "composite" or "char"
    identity: str  # "default", "index" (the primary key's own index: as default) or "full"
    generated: bool
    partitioned: bool
    rows: int

    @classmethod
    def draw(cls, rng: random.Random, number: int) -> TableSpec:
        odd = rng.random() < 0.3
        schema = "Sales Team" if odd else None
        table = f'orders.{number} "v"' if odd else f"orders_{number}"
        name = f"{as_part(schema)}.{as_part(table)}" if schema else as_part(table)
        key = rng.choice(["int", "int", "composite", "char"])
        spec = cls(
            name=name,
            schema=schema,
            key=key,
            identity=rng.choice(["default", "default", "full"]),
            generated=rng.random() < 0.3,
            partitioned=key != "char" and rng.random() < 0.25,
            rows=rng.randint(40, 240),
        )
        # Drawn apart, so that the kept seeds draw what they drew before it existed.
        drawn_apart = random.Random(f"identity-{number}").random()
        if spec.identity == "default" and not spec.partitioned and drawn_apart < 0.3:
            return dataclasses.replace(spec, identity="index")
        return spec

    @property
    def sql(self) -> str:
        """The table's name in SQL."""
        from spark_jobs.backlog.table_names import split_table_name

        return ".".join(quote(part) for part in split_table_name(self.name))

    @property
    def key_name(self) -> str:
        """The primary key's (and its index's) name: the table's last part's, made short."""
        return "pk_" + hashlib.sha256(self.name.encode()).hexdigest()[:12]

    @property
    def key_columns(self) -> tuple[str, ...]:
        return {"int": ("id",), "composite": ("id", "region"), "char": ("code",)}[self.key]

    def statements(self) -> list[str]:
        """CREATE statements, and the rows."""
        key = {
            "int": "id int",
            "composite": 'id int, region text COLLATE "C"',
            "char": 'code char(4) COLLATE "C"',
        }[self.key]
        generated = ""
        if self.generated:
            generated = (
                ", total numeric GENERATED ALWAYS AS (amount * 2) STORED"
                ", notes_length int GENERATED ALWAYS AS (length(notes)) STORED"
                ", headline text GENERATED ALWAYS AS (name || ':' || left(notes, 4)) STORED"
            )
        partition = " PARTITION BY RANGE (id)" if self.partitioned else ""
        statements = [f"CREATE SCHEMA IF NOT EXISTS {quote(self.schema)}"] if self.schema else []
        # Seeds ending alike name one table: an earlier trial's goes first.
        statements.append(f"DROP TABLE IF EXISTS {self.sql} CASCADE")
        statements.append(
            f"CREATE TABLE {self.sql} ({key}, name text, notes text, amount numeric(14, 2), "
            f"flag boolean, at timestamptz, payload jsonb, raw bytea, {quote(ODD)} varchar(40)"
            f"{generated}, CONSTRAINT {quote(self.key_name)} "
            f"PRIMARY KEY ({', '.join(self.key_columns)})){partition}"
        )
        tables = [self.sql]
        if self.partitioned:
            for index, (low, high) in enumerate(((None, 1_000), (1_000, 100_000), (100_000, None))):
                part = self.sql[:-1] + f'_p{index}"'
                low_sql = "MINVALUE" if low is None else str(low)
                high_sql = "MAXVALUE" if high is None else str(high)
                statements.append(
                    f"CREATE TABLE {part} PARTITION OF {self.sql} "
                    f"FOR VALUES FROM ({low_sql}) TO ({high_sql})"
                )
                tables.append(part)
        for table in tables:
            if self.identity == "full":
                statements.append(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
            if self.identity == "index":
                statements.append(
                    f"ALTER TABLE {table} REPLICA IDENTITY USING INDEX {quote(self.key_name)}"
                )
            statements.append(f"ALTER TABLE {table} ALTER COLUMN notes SET STORAGE EXTERNAL")
        return statements

    def create(self, url: str, rng: random.Random) -> list[tuple]:
        """Create the table and its first rows; returns their keys."""
        engine = make_engine(url)
        keys = [self.fresh_key(rng, i) for i in range(1, self.rows + 1)]
        try:
            with engine.begin() as connection:
                for statement in self.statements():
                    connection.exec_driver_sql(statement)
                for key in keys:
                    connection.exec_driver_sql(self.insert(key, rng))
        finally:
            engine.dispose()
        return keys

    # --- keys and values --------------------------------------------------------------

    def fresh_key(self, rng: random.Random, number: int) -> tuple:
        """A key for ``number`` (numbers never repeat, so neither do keys)."""
        if self.key == "int":
            return (number,)
        if self.key == "composite":
            return (number, rng.choice(["eu", "us", "apac", "Ünïcode", "a b"]))
        letters = string.ascii_lowercase
        digits = [letters[(number // 26**i) % 26] for i in range(3)]
        # Trailing spaces pad a char(n) and mean nothing: a key may be shorter than 4.
        return ("".join(digits) + rng.choice(["", "\x01", "z", " "]),)

    def where(self, key: tuple) -> str:
        return " AND ".join(
            f"{column} = {literal(str(value))}"
            for column, value in zip(self.key_columns, key, strict=True)
        )

    def key_values(self, key: tuple) -> list[str]:
        return [literal(str(value)) for value in key]

    def values(self, rng: random.Random) -> dict[str, str]:
        """A row's non-key values, as SQL literals."""
        big = rng.random() < 0.35
        notes = (
            None
            if rng.random() < 0.1
            else random_text(rng, BIG + rng.randint(0, 2_000) if big else rng.randint(0, 40))
        )
        return {
            "name": literal(None if rng.random() < 0.1 else random_text(rng, rng.randint(0, 12))),
            "notes": literal(notes),
            "amount": rng.choice(
                [
                    "NULL",
                    "0",
                    "-0.01",
                    "999999999999.99",
                    "-999999999999.99",
                    f"{rng.randint(-(10**6), 10**6)}.{rng.randint(0, 99):02d}",
                ]
            ),
            "flag": rng.choice(["NULL", "true", "false"]),
            "at": rng.choice(
                [
                    "NULL",
                    "'infinity'",
                    "'-infinity'",
                    f"'2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                    f"{rng.randint(0, 23):02d}:00:00.123456+05:30'",
                ]
            ),
            "payload": literal(
                None
                if rng.random() < 0.2
                else json.dumps(
                    {"k": random_text(rng, 5), "n": rng.randint(0, 9), "a": [1, None, "x"]}
                )
            ),
            "raw": rng.choice(
                [
                    "NULL",
                    "'\\x'",
                    "'\\x00ff10'",
                    literal("\\x" + rng.randbytes(rng.randint(1, 40)).hex()),
                ]
            ),
            quote(ODD): literal(
                None if rng.random() < 0.2 else random_text(rng, rng.randint(0, 40))
            ),
        }

    def insert(self, key: tuple, rng: random.Random) -> str:
        values = self.values(rng)
        columns = [*self.key_columns, *values]
        return (
            f"INSERT INTO {self.sql} ({', '.join(columns)}) "
            f"VALUES ({', '.join([*self.key_values(key), *values.values()])})"
        )

    def update(self, key: tuple, rng: random.Random, moved_to: tuple | None = None) -> str:
        """Some of the row's columns; ``notes`` mostly left alone (so it goes unsent when
        stored out of line); the key moved to ``moved_to`` if given."""
        values = self.values(rng)
        chosen = rng.sample([c for c in values if c != "notes"], rng.randint(0, 3))
        if rng.random() < 0.2:
            chosen.append("notes")
        sets = [f"{column} = {values[column]}" for column in chosen]
        if moved_to is not None:
            sets += [
                f"{c} = {v}"
                for c, v in zip(self.key_columns, self.key_values(moved_to), strict=True)
            ]
        if not sets:
            sets = ["flag = NOT coalesce(flag, false)"]
        return f"UPDATE {self.sql} SET {', '.join(sets)} WHERE {self.where(key)}"


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(length))
