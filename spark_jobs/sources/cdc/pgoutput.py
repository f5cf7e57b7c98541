"""A decoder of the ``pgoutput`` plugin's binary messages, protocol version 1.

``pg_logical_slot_peek_binary_changes`` returns one message per row. Decoding them here, in
pure Python, keeps the slot's SQL functions the only way we talk to the server: no walsender
connection, and nothing is confirmed behind the reader's back. The formats are those of
"Logical Replication Message Formats" (chapter 55.9 of the PostgreSQL 15 documentation).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from spark_jobs.sources.cdc.messages import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
    Value,
)

#: The kinds of a column's value in a row: NULL, a TOASTed value left unchanged, text, binary.
_NULL, _UNCHANGED, _TEXT, _BINARY = b"nutb"
#: Timestamps count microseconds from this instant.
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class PgOutputError(ValueError):
    """A message this decoder cannot read; the error says which and where."""


class _Reader:
    """Big-endian fields read one after another from one message."""

    def __init__(self, data: bytes):
        self._data = data
        self._at = 1

    def fail(self, problem: str) -> PgOutputError:
        kind = self._data[:1]
        return PgOutputError(f"pgoutput {kind!r} message: {problem} at byte {self._at}")

    def take(self, fields: str) -> tuple:
        try:
            values = struct.unpack_from(">" + fields, self._data, self._at)
        except struct.error:
            raise self.fail(f"ends before its fields {fields!r}") from None
        self._at += struct.calcsize(">" + fields)
        return values

    def byte(self) -> bytes:
        return self.take("c")[0]

    def marker(self, allowed: bytes) -> bytes:
        marker = self.byte()
        if marker not in allowed:
            expected = " or ".join(repr(bytes([b])) for b in allowed)
            raise self.fail(f"tuple marker {marker!r}; expected {expected}")
        return marker

    def string(self) -> str:
        end = self._data.find(b"\0", self._at)
        if end < 0:
            raise self.fail("a string without its terminating zero byte")
        text = self._text(end)
        self._at += 1
        return text

    def time(self) -> datetime:
        return POSTGRES_EPOCH + timedelta(microseconds=self.take("q")[0])

    def tuple_data(self) -> tuple[Value, ...]:
        """A row's values, in one loop over the bytes: every row change is read here."""
        (count,) = self.take("h")
        data, size, at = self._data, len(self._data), self._at
        values: list[Value] = []
        for _ in range(count):
            self._at = at
            if at >= size:
                raise self.fail("ends before its fields 'c'")
            kind, at = data[at], at + 1
            if kind == _NULL:
                values.append(None)
                continue
            if kind == _UNCHANGED:
                values.append(UNCHANGED)
                continue
            self._at = at
            if kind != _TEXT and kind != _BINARY:
                raise self.fail(f"column kind {bytes([kind])!r}; expected b'n', b'u', b't' or b'b'")
            if at + 4 > size:
                raise self.fail("ends before its fields 'i'")
            length, at = int.from_bytes(data[at : at + 4], "big", signed=True), at + 4
            end = at + length
            self._at = at
            if length < 0 or end > size:
                raise self.fail(f"a column of {length} bytes past the message's end")
            values.append(self._text(end) if kind == _TEXT else data[at:end])
            at = end
        self._at = at
        return tuple(values)

    def end(self) -> None:
        if self._at != len(self._data):
            raise self.fail(f"{len(self._data) - self._at} bytes left over")

    def _text(self, end: int) -> str:
        """The bytes up to ``end`` as text; the next field starts at ``end``."""
        try:
            text = self._data[self._at : end].decode()
        except UnicodeDecodeError:
            raise self.fail(
                "text that is not UTF-8 (the database's encoding must be UTF8)"
            ) from None
        self._at = end
        return text


def _insert(r: _Reader) -> Insert:
    relation_id = r.take("I")[0]
    r.marker(b"N")
    return Insert(relation_id, r.tuple_data())


def _update(r: _Reader) -> Update:
    relation_id, marker = r.take("I")[0], r.marker(b"KON")
    key = old = None
    if marker != b"N":
        before = r.tuple_data()
        key, old = (before, None) if marker == b"K" else (None, before)
        r.marker(b"N")
    return Update(relation_id, r.tuple_data(), key=key, old=old)


def _delete(r: _Reader) -> Delete:
    relation_id, marker = r.take("I")[0], r.marker(b"KO")
    values = r.tuple_data()
    return Delete(relation_id, key=values) if marker == b"K" else Delete(relation_id, old=values)


def _relation(r: _Reader) -> Relation:
    relation_id, namespace, name = r.take("I")[0], r.string(), r.string()
    identity, count = r.take("Bh")
    columns = tuple(Column(r.take("B")[0], r.string(), *r.take("Ii")) for _ in range(count))
    return Relation(relation_id, namespace, name, chr(identity), columns)


def _message(r: _Reader) -> LogicalMessage:
    flags, lsn, prefix = *r.take("BQ"), r.string()
    (length,) = r.take("I")
    content = r.take(f"{length}s")[0]
    return LogicalMessage(bool(flags & 1), lsn, prefix, content)


def _truncate(r: _Reader) -> Truncate:
    count, options = r.take("IB")
    return Truncate(options, r.take(f"{count}I"))


_PARSERS: dict[bytes, Callable[[_Reader], Message]] = {
    b"B": lambda r: Begin(r.take("Q")[0], r.time(), r.take("I")[0]),
    b"C": lambda r: Commit(*r.take("BQQ"), r.time()),
    b"O": lambda r: Origin(r.take("Q")[0], r.string()),
    b"R": _relation,
    b"Y": lambda r: Type(r.take("I")[0], r.string(), r.string()),
    b"I": _insert,
    b"U": _update,
    b"D": _delete,
    b"T": _truncate,
    b"M": _message,
}


def decode(data: bytes | memoryview) -> Message:
    """One message, as a ``data`` row of ``pg_logical_slot_peek_binary_changes`` holds it."""
    data = bytes(data)
    if not data:
        raise PgOutputError("an empty pgoutput message: every message starts with its type byte")
    parse = _PARSERS.get(data[:1])
    if parse is None:
        known = ", ".join(repr(kind) for kind in _PARSERS)
        raise PgOutputError(
            f"unknown pgoutput message type {data[:1]!r}; protocol version 1 without "
            f"streaming sends only {known}"
        )
    reader = _Reader(data)
    message = parse(reader)
    reader.end()
    return message
