"""Concurrent writers changing a trial's table at random moments, from a seed.

Each writer is a thread with its own connection, drawing transactions: inserts, updates of
some columns, key moves (the large text left alone, so under REPLICA IDENTITY DEFAULT it goes
unsent), a delete and an insert of the same key, a delete then a key move (the move taking
the deleted row's place in the transaction), updates of a range of rows, and long
transactions kept open across several of the snapshot's chunks; some of them are rolled back.
Writers collide (a key taken meanwhile, a deadlock): such a transaction rolls back and
counts as aborted. One writer may also change the table's shape or its publication, which
the job must refuse by name (``DDL``).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import sqlalchemy as sa

from spark_jobs.metrics.schema import make_engine
from tools.faults.cdc_random.table import ODD, TableSpec, quote

#: Changes to the table or its publication while the job runs, each of which the job must
#: refuse by name (docs/limits.md): {table} and {publication} are filled in.
DDL = {
    "publish-insert-only": "ALTER PUBLICATION {publication} SET (publish = 'insert')",
    "table-dropped-from-publication": "ALTER PUBLICATION {publication} DROP TABLE {table}",
    "replica-identity-changed": "ALTER TABLE {table} REPLICA IDENTITY {other_identity}",
    "narrowed-type": f"ALTER TABLE {{table}} ALTER COLUMN {quote(ODD)} TYPE varchar(39)",
    "new-key": "ALTER TABLE {table} ADD COLUMN extra_key serial; "
    "ALTER TABLE {table} DROP CONSTRAINT {constraint}, ADD PRIMARY KEY (extra_key)",
}
KINDS = {
    "insert": 3,
    "update": 4,
    "move": 2,
    "delete": 1,
    "reinsert": 1,
    "delete-then-move": 1,
    "range-update": 1,
    "long": 1,
    # Committed with synchronous_commit = on on a server whose standby never answers: its
    # commit is written and decoded, then invisible until its wait is cancelled (WAITING_S).
    "waiting": 1,
}
WAITING_S = (0.05, 1.5)


@dataclass
class Counts:
    committed: Counter[str] = field(default_factory=Counter)
    rolled_back: int = 0
    aborted: int = 0

    @property
    def transactions(self) -> int:
        return sum(self.committed.values())


def _slot_exists(connection: sa.Connection, name: str) -> bool:
    found = connection.execute(
        sa.text("SELECT 1 FROM pg_replication_slots WHERE slot_name = :name"), {"name": name}
    )
    return found.first() is not None


class Workload:
    """``writers`` threads changing ``spec``'s table in ``url`` until ``stop()``."""

    def __init__(
        self,
        url: str,
        spec: TableSpec,
        keys: list[tuple],
        rng: random.Random,
        writers: int,
        waiting: bool = False,
    ):
        self.url, self.spec = url, spec
        self._keys = list(keys)
        self._numbers = itertools.count(len(keys) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seeds = [rng.randrange(2**32) for _ in range(writers)]
        #: Whether the server holds synchronous commits (synchronous_standby_names names a
        #: standby that never answers), so "waiting" transactions may be drawn.
        self._kinds = {k: w for k, w in KINDS.items() if waiting or k != "waiting"}
        self._threads: list[threading.Thread] = []
        self.counts = Counts()
        self.errors: list[BaseException] = []
        #: Whether ``change_shape`` changed it (None: not asked to).
        self.shape_changed: bool | None = None
        #: Whether the copy's slot existed when the shape changed: if not, the copy may
        #: have begun with the new shape, and then rightly goes on.
        self.copy_had_begun = True

    def start(self) -> Workload:
        for seed in self._seeds:
            thread = threading.Thread(target=self._write, args=(random.Random(seed),), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the writers (again: nothing); ``errors`` says what failed them."""
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def change_shape(self, name: str, publication: str) -> bool:
        """One of ``DDL``, now; False if the server refused it (a value too long for the
        narrower type, say)."""
        engine = make_engine(self.url)
        try:
            constraint = self._key_constraint(engine)
            statement = DDL[name].format(
                table=self.spec.sql,
                publication=publication,
                constraint=quote(constraint),
                other_identity="DEFAULT" if self.spec.identity == "full" else "FULL",
            )
            with engine.begin() as connection:
                self.copy_had_begun = _slot_exists(connection, publication)
                for part in statement.split("; "):
                    connection.exec_driver_sql(part)
            self.shape_changed = True
        except sa.exc.DBAPIError:
            self.shape_changed = False
        finally:
            engine.dispose()
        return self.shape_changed

    # --- the writers -----------------------------------------------------------------------

    def _write(self, rng: random.Random) -> None:
        engine = make_engine(self.url)
        try:
            while not self._stop.is_set():
                kind = rng.choices(list(self._kinds), list(self._kinds.values()))[0]
                try:
                    with engine.connect() as connection:
                        committed = self._transaction(connection, kind, rng)
                except (sa.exc.IntegrityError, sa.exc.OperationalError):
                    with self._lock:
                        self.counts.aborted += 1
                    continue
                with self._lock:
                    if committed:
                        self.counts.committed[kind] += 1
                    else:
                        self.counts.rolled_back += 1
                time.sleep(rng.uniform(0, 0.02))
        except BaseException as error:  # a writer's own failure: the trial says so
            self.errors.append(error)
        finally:
            engine.dispose()

    def _transaction(self, connection: sa.Connection, kind: str, rng: random.Random) -> bool:
        run = connection.exec_driver_sql
        statements = self._statements(kind, rng)
        if kind == "waiting":
            run("SET LOCAL synchronous_commit = on")
            pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            release = threading.Timer(rng.uniform(*WAITING_S), self._release, args=(pid,))
            for statement in statements:
                run(statement)
            release.start()
            connection.commit()  # returns once the wait is cancelled, committed
            release.join()
            return True
        if kind == "long":
            for statement in statements:
                run(statement)
                time.sleep(rng.uniform(0.05, 0.6))  # open across chunks
        else:
            for statement in statements:
                run(statement)
        if rng.random() < 0.1:
            connection.rollback()
            return False
        connection.commit()
        return True

    def _statements(self, kind: str, rng: random.Random) -> list[str]:
        spec = self.spec
        some = self._some_key(rng)
        if kind == "insert" or some is None:
            return [spec.insert(self._fresh(rng), rng)]
        if kind == "update":
            return [spec.update(some, rng)]
        if kind == "move":
            return [spec.update(some, rng, moved_to=self._fresh(rng))]
        if kind == "delete":
            return [f"DELETE FROM {spec.sql} WHERE {spec.where(some)}"]
        if kind == "reinsert":
            return [f"DELETE FROM {spec.sql} WHERE {spec.where(some)}", spec.insert(some, rng)]
        if kind == "delete-then-move":
            other = self._some_key(rng) or some
            return [
                f"DELETE FROM {spec.sql} WHERE {spec.where(some)}",
                spec.update(other, rng, moved_to=self._fresh(rng)),
            ]
        if kind == "range-update":
            column = spec.key_columns[0]
            some_rows = (
                f"SELECT {column} FROM {spec.sql} ORDER BY random() LIMIT {rng.randint(2, 20)}"
            )
            return [
                f"UPDATE {spec.sql} SET flag = NOT coalesce(flag, true), amount = 1 "
                f"WHERE {column} IN ({some_rows})"
            ]
        steps = rng.randint(1, 3)  # long, waiting
        return [
            self._statements(rng.choice(["insert", "update", "move"]), rng)[0] for _ in range(steps)
        ]

    def _release(self, pid: int) -> None:
        """Cancel a commit's wait for the standby: it becomes visible."""
        engine = make_engine(self.url)
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT pg_cancel_backend(:pid)"), {"pid": pid})
        finally:
            engine.dispose()

    def _some_key(self, rng: random.Random) -> tuple | None:
        with self._lock:
            return rng.choice(self._keys) if self._keys else None

    def _fresh(self, rng: random.Random) -> tuple:
        """A key never used: past the first rows', and (an integer key) far enough apart
        that moves cross the partitions of a partitioned table."""
        with self._lock:
            number = next(self._numbers)
            if self.spec.key != "char":
                number = number * 1_000 + rng.randrange(1_000)
            key = self.spec.fresh_key(rng, number)
            self._keys.append(key)
            return key

    def _key_constraint(self, engine: sa.Engine) -> str:
        with engine.connect() as connection:
            return connection.execute(
                sa.text(
                    "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:table) "
                    "AND contype = 'p'"
                ),
                {"table": self.spec.sql},
            ).scalar_one()
