"""The messages of PostgreSQL's ``pgoutput`` plugin (protocol version 1), decoded.

Small frozen values, so a batch of them can be compared, replayed and shipped as they are.
Column values stay as the server's text (``values.typed`` reads them as Python values),
bytes for a value in binary format, None for NULL, or ``UNCHANGED`` for a TOASTed value that
an update left as it was: the server does not send such a value again, so a consumer must
keep the one it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class Unchanged(enum.Enum):
    """A TOASTed value that an update did not change, and so did not send."""

    UNCHANGED = "unchanged"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged.UNCHANGED
#: Text for 't' columns, bytes for 'b' (binary format), None for NULL.
Value = str | bytes | None | Unchanged


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    """``end_lsn`` is where the next transaction's decoding starts: the only commit position
    an offset may store, since advancing the slot to ``commit_lsn`` drops this transaction."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True)
class Column:
    flags: int
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity: sent in an update's or delete's old key."""
        return bool(self.flags & 1)


@dataclass(frozen=True)
class Relation:
    relation_id: int
    namespace: str
    name: str
    #: ``relreplident``: 'd' default (primary key), 'n' nothing, 'f' full, 'i' index.
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace or 'pg_catalog'}.{self.name}"


@dataclass(frozen=True)
class Type:
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Insert:
    relation_id: int
    new: tuple[Value, ...]


@dataclass(frozen=True)
class Update:
    """``key`` (replica identity changed) or ``old`` (REPLICA IDENTITY FULL), else neither."""

    relation_id: int
    new: tuple[Value, ...]
    key: tuple[Value, ...] | None = None
    old: tuple[Value, ...] | None = None


@dataclass(frozen=True)
class Delete:
    """Exactly one of ``key`` (the replica identity's columns) and ``old`` (the whole row)."""

    relation_id: int
    key: tuple[Value, ...] | None = None
    old: tuple[Value, ...] | None = None


@dataclass(frozen=True)
class LogicalMessage:
    """A ``pg_logical_emit_message`` record (sent with the ``messages`` option). A
    transactional one comes inside its transaction and changes no row: a heartbeat or a
    snapshot's high watermark, whose transaction's end is a position like any other."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True)
class Truncate:
    #: Flags: 1 CASCADE, 2 RESTART IDENTITY.
    options: int
    relation_ids: tuple[int, ...]


Message = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | LogicalMessage
)
