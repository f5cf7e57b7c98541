"""The channel from the driver's coordinator to the sources in Spark's planner process.

They share no memory (the planner is a separate Python process started by the JVM, on
the driver's host), so the coordinator publishes its current ``TriggerPlan`` as a small
file that sources read whenever Spark asks them for an offset.

The same channel carries the fence: until when the driver's lease is surely held, on the
host's monotonic clock (shared by every process on it). Past that time a source starts no
batch, whatever the plan says, so a driver that cannot renew its lease stops committing
before another driver could take the checkpoint over.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.backlog.plan import TriggerPlan

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
FENCE_FILE = "fence.json"
HOLD_FILE = "hold"


class PlanChannel:
    """One directory, one file: the latest plan, replaced atomically."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    def publish(self, plan: TriggerPlan) -> None:
        self._replace(PLAN_FILE, plan.to_json())

    def publish_fence(self, confirmed_until: float) -> None:
        """Batches may start until ``confirmed_until`` (``time.monotonic()``), no later."""
        self._replace(FENCE_FILE, json.dumps({"confirmed_until_monotonic": confirmed_until}))

    def hold(self) -> None:
        """No batch starts from now on: the run is stopping, and stops after the batch under
        way (one that started meanwhile would be cut off and left planned, uncommitted)."""
        self._replace(HOLD_FILE, "")

    def held(self) -> bool:
        return (self.directory / HOLD_FILE).exists()

    def read_fence(self) -> float | None:
        """The published fence; None when the driver runs without a lease."""
        try:
            return float(
                json.loads((self.directory / FENCE_FILE).read_text())["confirmed_until_monotonic"]
            )
        except FileNotFoundError:
            return None

    def _replace(self, name: str, text: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{name}-")
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.replace(temporary, self.directory / name)

    def read(self) -> TriggerPlan | None:
        """The latest plan (a few hundred bytes, read whole each time: no stale cache)."""
        try:
            return TriggerPlan.from_json((self.directory / PLAN_FILE).read_text())
        except FileNotFoundError:
            return None


class SourceGate:
    """Applies the published plan to one source: when it may release a batch, and how big."""

    def __init__(
        self,
        channel: PlanChannel,
        source: str,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._channel = channel
        self._source = source
        self._clock = clock
        self._monotonic = monotonic
        self._fenced = False
        self._plan: TriggerPlan | None = None
        self._released_seq: int | None = None
        self._waiting_at: dict[str, Any] | None = None
        self._waiting_since = 0.0

    def allowed_rows(self, start: dict[str, Any]) -> int | None:
        """Rows the batch from ``start`` may take, or None when it may not start now."""
        plan = self._channel.read()
        if plan is None:
            raise RuntimeError(
                f"no trigger plan in {self._channel.directory}: the source option "
                "'backlogChannel' must name the channel of a running backlog coordinator"
            )
        if self._fenced_now() or self._channel.held():
            return None
        now = self._clock()
        if start != self._waiting_at:
            self._waiting_at, self._waiting_since = start, now
        self._plan = plan
        if plan.releases(now, start, self._released_seq, self._waiting_since):
            return plan.rows_for(self._source) or None
        return None

    def _fenced_now(self) -> bool:
        fence = self._channel.read_fence()
        fenced = fence is not None and self._monotonic() >= fence
        if fenced != self._fenced:
            self._fenced = fenced
            if fenced:
                logger.warning(
                    "source %r: the driver's lease is not confirmed: no batch starts", self._source
                )
            else:
                logger.info("source %r: the driver's lease is confirmed again", self._source)
        return fenced

    def mark_released(self) -> None:
        """Record that a batch started under the plan last read."""
        if self._plan is not None:
            self._released_seq = self._plan.seq
