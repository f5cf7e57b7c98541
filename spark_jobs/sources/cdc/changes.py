"""From decoded pgoutput messages to whole transactions of row changes by column name.

Changes name their table only by relation id, and their values only by position: the
Relation message that describes them comes earlier in the stream (pgoutput sends it before
a relation's first change in each decoding call, and again after the table changes), so
messages must be read in order, none skipped.

A transaction is the unit a reader may take or leave: the slot can only be advanced past
whole ones without losing changes, so each carries its Commit's end LSN, the position an
offset may store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from spark_jobs.sources.cdc.lsn import format_lsn
from spark_jobs.sources.cdc.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Relation,
    Truncate,
    Update,
    Value,
)

Row = Mapping[str, Value]


class ChangeStreamError(ValueError):
    """Messages that do not form whole transactions of known relations."""


@dataclass(frozen=True)
class RowChange:
    """One row's change. ``old`` identifies the row before an update or delete: the replica
    identity's columns (a primary key by default), or the whole row under REPLICA IDENTITY
    FULL; None for an insert, and for an update that kept the key (then ``new`` has it)."""

    operation: str  # "insert", "update" or "delete"
    relation: Relation
    new: Row | None
    old: Row | None = None


Change = RowChange | Truncate


@dataclass(frozen=True)
class Transaction:
    xid: int
    #: The Commit message's end LSN: advancing the slot here makes the next peek start at
    #: the following transaction. Advancing to its commit LSN would drop this one.
    end_lsn: int
    commit_time: datetime
    changes: tuple[Change, ...]


class RelationCache:
    """Relation id -> the latest Relation message, to name the columns of changes."""

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}

    def add(self, relation: Relation) -> None:
        self._relations[relation.relation_id] = relation

    def get(self, relation_id: int) -> Relation:
        try:
            return self._relations[relation_id]
        except KeyError:
            raise ChangeStreamError(
                f"a change of relation id {relation_id} came before any Relation message "
                "describing it: messages must be decoded in order, from the start of a peek"
            ) from None

    def row_change(self, message: Insert | Update | Delete) -> RowChange:
        relation = self.get(message.relation_id)
        if isinstance(message, Insert):
            return RowChange("insert", relation, _named(relation, message.new))
        old = None
        if message.key is not None:
            old = _named(relation, message.key, keys_only=True)
        elif message.old is not None:
            old = _named(relation, message.old)
        if isinstance(message, Update):
            return RowChange("update", relation, _named(relation, message.new), old)
        return RowChange("delete", relation, None, old)


def _named(relation: Relation, values: tuple[Value, ...], keys_only: bool = False) -> Row:
    """Values by column name; ``keys_only`` keeps the key columns, as a key tuple sends
    every other column as NULL."""
    if len(values) != len(relation.columns):
        raise ChangeStreamError(
            f"a change of {relation.qualified_name} has {len(values)} values for "
            f"{len(relation.columns)} columns"
        )
    return {
        column.name: value
        for column, value in zip(relation.columns, values, strict=True)
        if column.is_key or not keys_only
    }


def transactions(messages: Iterable[Message], relations: RelationCache) -> list[Transaction]:
    """The transactions in ``messages`` (decoded in order), each from Begin to Commit.

    A peek returns whole transactions only, so a change outside one, or messages that stop
    inside one, mean they were not a peek's: an error, rather than a guess at a position.
    """
    done: list[Transaction] = []
    begin: Begin | None = None
    changes: list[Change] = []
    for message in messages:
        if isinstance(message, Relation):
            relations.add(message)
        elif isinstance(message, Begin):
            if begin is not None:
                raise ChangeStreamError(f"transaction {message.xid} began inside {begin.xid}")
            begin, changes = message, []
        elif begin is None:
            raise ChangeStreamError(
                f"{type(message).__name__} message outside a transaction: "
                "every change comes between a Begin and its Commit"
            )
        elif isinstance(message, Commit):
            done.append(
                Transaction(begin.xid, message.end_lsn, message.commit_time, tuple(changes))
            )
            begin = None
        elif isinstance(message, Insert | Update | Delete):
            changes.append(relations.row_change(message))
        elif isinstance(message, Truncate):
            changes.append(message)
        # Origin and Type messages describe a transaction or a type; they change no row.
    if begin is not None:
        raise ChangeStreamError(
            f"the messages end inside transaction {begin.xid} (final LSN "
            f"{format_lsn(begin.final_lsn)}), before its Commit"
        )
    return done
