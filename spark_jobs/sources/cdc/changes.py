"""From decoded pgoutput messages to whole transactions of row changes by column name.

Changes name their table only by relation id, and their values only by position: the
Relation message that describes them comes earlier in the stream (pgoutput sends it before
a relation's first change in each decoding call, and again after the table changes), so
messages must be read in order, none skipped.

A transaction is the unit a reader may take or leave: the slot can only be advanced past
whole ones without losing changes, so its Commit's end LSN is the position an offset may
store. Its Begin carries the commit record's own LSN (``final_lsn``): a transaction's commit
starts before a position ``p`` (a record's end, such as a high watermark's) exactly when it
ends at or before ``p``, since WAL records do not overlap; so a reader can judge a
transaction at its Begin, before its changes arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from spark_jobs.sources.cdc.lsn import format_lsn
from spark_jobs.sources.cdc.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
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
#: What ``events`` yields: a transaction's Begin, its changes, then its Commit.
Event = Begin | Change | Commit


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


def events(messages: Iterable[Message], relations: RelationCache) -> Iterator[Event]:
    """The Begin, row changes and Commit of each transaction in ``messages`` (decoded in
    order), one at a time, so a transaction of a million changes is never held whole.

    A peek returns whole transactions only, so a change outside one, or messages that stop
    inside one, mean they were not a peek's: an error, rather than a guess at a position.
    A logical message changes no row: inside a transaction it leaves a transaction with no
    change (a position only), outside one (non-transactional) it is skipped.
    """
    begin: Begin | None = None
    for message in messages:
        if isinstance(message, Relation):
            relations.add(message)
        elif isinstance(message, Begin):
            if begin is not None:
                raise ChangeStreamError(f"transaction {message.xid} began inside {begin.xid}")
            begin = message
            yield message
        elif isinstance(message, LogicalMessage) and not message.transactional:
            continue
        elif begin is None:
            raise ChangeStreamError(
                f"{type(message).__name__} message outside a transaction: "
                "every change comes between a Begin and its Commit"
            )
        elif isinstance(message, Commit):
            begin = None
            yield message
        elif isinstance(message, Insert | Update | Delete):
            yield relations.row_change(message)
        elif isinstance(message, Truncate):
            yield message
        # Origin, Type and logical messages describe a transaction or a type; they change
        # no row.
    if begin is not None:
        raise ChangeStreamError(
            f"the messages end inside transaction {begin.xid} (final LSN "
            f"{format_lsn(begin.final_lsn)}), before its Commit"
        )
