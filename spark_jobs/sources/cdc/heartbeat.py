"""When the changelog writes a heartbeat, so its slot follows a busy server's WAL.

A slot keeps every WAL file from its position on and moves only when a batch commits a
position of ours. A quiet table in a busy database gives no such position (PostgreSQL sends
nothing for a transaction that changed no published table), so without one the server keeps
WAL for the slot without bound while the job reports no lag. A heartbeat is a transaction of
one logical message that the changelog reads as a position (Debezium's heartbeat): a batch
ends at it, and its commit moves the slot.

One is due only while nothing of ours is waiting (a batch of changes moves the slot anyway),
when the server has written at least ``MIN_TRAILING_BYTES`` after the slot (an idle server
needs none: each heartbeat would only make WAL for the next), and at most once per
``interval_s``. The clock is injected, so the rule is tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: WAL written after the slot's position below which a heartbeat would not be worth its
#: own WAL and batch.
MIN_TRAILING_BYTES = 64 * 1024


@dataclass
class HeartbeatSchedule:
    """Heartbeats at most once per ``interval_s``."""

    interval_s: float
    clock: Callable[[], float] = time.monotonic
    _last: float | None = field(default=None, init=False)

    def due(self, nothing_waiting: bool, trailing_wal_bytes: int) -> bool:
        """Whether to write a heartbeat now; a True counts as written."""
        now = self.clock()
        if not nothing_waiting or trailing_wal_bytes < MIN_TRAILING_BYTES:
            return False
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
