"""What a batch of changes holds, counted on the server: where it ends, how many changes, how
many of them move rows to new keys, and whether a transaction not yet visible stops it.

Planning a batch needs only where transactions end and how many changes each holds, so the
server counts them over a peek of the slot (``ReplicationSlot.summary`` runs ``SUMMARY``)
and no change is sent or decoded in Python for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text

#: The plugin's options: protocol 1, the publication's tables, and logical messages (for
#: heartbeats; non-transactional ones are skipped by ``changes.events``).
OPTIONS = "'proto_version', '1', 'publication_names', :publication, 'messages', 'true'"

#: Per transaction after the slot: where it ends, how many row changes (insert, update,
#: delete, truncate) it holds, how many of them are updates that move a row to a new key
#: (under the default replica identity only those carry the old key, a 'K' tuple), whether it
#: is this slot's heartbeat, and whether it is visible yet; counted on the server
#: (``get_byte(data, 0)`` is a message's type), so no change travels to plan a batch. The
#: last transaction that fits in ``:max_changes`` (None: all; the first always) ends the
#: batch; ``left_out`` counts those after it. A transaction that is only another's logical
#: message (another job's heartbeat) is a batch of its own only when nothing else is.
#:
#: A commit is written to the WAL, and so decoded, before it becomes visible (with
#: synchronous replication, until the standby confirms it): the batch ends before the first
#: transaction that the server's snapshot, taken after the peek, does not show yet. A snapshot
#: read later is then sure to see every transaction the slot is moved past, which the
#: snapshot's chunks rely on. A decoded xid is 32 bits: it is taken in the epoch nearest the
#: snapshot's xmax, as ``snapshot.Visibility`` does.
SUMMARY = text(
    "WITH m AS MATERIALIZED (SELECT lsn, xid, get_byte(data, 0) AS kind, "
    "  get_byte(data, 0) = 77 AND substring(data FROM 11 FOR :prefix_bytes) = :prefix "
    "  AS ours, get_byte(data, 0) = 85 AND get_byte(data, 5) = 75 AS moves "
    f"  FROM pg_logical_slot_peek_binary_changes(:slot, CAST(:upto_lsn AS pg_lsn), "
    f"    CAST(:upto_nchanges AS integer), {OPTIONS})), "
    "s AS MATERIALIZED (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax "
    "  FROM (SELECT pg_current_snapshot() AS snap) now), "
    "t AS (SELECT xid, max(lsn) FILTER (WHERE kind = 67) AS end_lsn, "
    "  count(*) FILTER (WHERE kind IN (73, 85, 68, 84)) AS changes, bool_or(ours) AS ours, "
    "  count(*) FILTER (WHERE moves) AS moves FROM m WHERE xid <> 0 GROUP BY xid), "
    "v AS (SELECT t.*, pg_visible_in_snapshot(CAST(CAST(s.xmax + (((xid::text::bigint "
    "  - s.xmax % 4294967296 + 2147483648) % 4294967296 + 4294967296) % 4294967296) "
    "  - 2147483648 AS text) AS xid8), s.snap) AS visible FROM t, s "
    "  WHERE end_lsn > CAST(:start AS pg_lsn) AND (changes > 0 OR ours)), "
    "b AS (SELECT min(end_lsn) AS blocked_at FROM v WHERE NOT visible), "
    "r AS (SELECT end_lsn, moves, sum(changes) OVER (ORDER BY end_lsn) AS running, "
    "  row_number() OVER (ORDER BY end_lsn) AS n FROM v, b "
    "  WHERE b.blocked_at IS NULL OR end_lsn < b.blocked_at), "
    "c AS (SELECT *, n = 1 OR CAST(:max_changes AS bigint) IS NULL "
    "  OR running <= :max_changes AS fits FROM r) "
    "SELECT (SELECT count(*) FROM m) AS messages, "
    "(SELECT max(end_lsn) FROM c WHERE fits)::text AS end_lsn, "
    "(SELECT coalesce(max(running), 0) FROM c WHERE fits) AS changes, "
    "(SELECT coalesce(sum(moves), 0) FROM c WHERE fits) AS moves, "
    "(SELECT count(*) FROM c WHERE NOT fits) AS left_out, "
    "(SELECT blocked_at::text FROM b) AS blocked_at"
)


@dataclass(frozen=True)
class BatchSummary:
    """What the slot holds after a start, as ``summary`` counted it: ``messages`` peeked
    (the bound a peek stops at), the ``end`` of the last transaction that fits (None:
    nothing new), the row ``changes`` up to there and how many of them ``moves`` rows to
    new keys, how many transactions were ``left_out`` after it, and where the first
    transaction not visible yet ends (``blocked_at``; the batch ends before it)."""

    messages: int
    end: int | None
    changes: int
    moves: int
    left_out: int
    blocked_at: int | None = None
