"""The decision as the sources see it, and the one rule they apply to it.

The decider runs in the driver; Spark asks each Python source for its next offset in a
separate planner process. The coordinator publishes a ``TriggerPlan`` there, and the
source releases a batch only when the plan allows it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from spark_jobs.backlog.decider import Decision

#: A source waits this long beyond the interval for a plan before going on without one.
STALE_GRACE_S = 10.0


@dataclass(frozen=True)
class TriggerPlan:
    """A published decision. ``seq`` grows with every publication.

    A plan decided after a commit is bound to the batch it follows: ``starts`` holds each
    source's end offset of that batch, and a source releases the next batch only from
    exactly there. A source that has moved on since (a batch the coordinator has not seen
    yet) waits for the next plan, so batches never run ahead of the decisions. A
    ``standing`` plan (backlog, back to back) releases from any offset still in backlog.
    A plan with no ``starts`` (the first one) releases one batch per source. If a source
    has waited ``stale_after_s`` at one offset without a plan for it (the coordinator is
    gone), it goes on at that cadence rather than stopping the job.
    """

    seq: int
    due_at: float
    max_rows: int
    standing: bool
    stale_after_s: float
    starts: dict[str, Any] | None = None
    budgets: dict[str, int] | None = None

    @classmethod
    def from_decision(
        cls,
        seq: int,
        decision: Decision,
        stale_after_s: float,
        starts: dict[str, Any] | None = None,
        budgets: dict[str, int] | None = None,
    ) -> TriggerPlan:
        return cls(
            seq=seq,
            due_at=decision.due_at,
            max_rows=decision.max_rows,
            standing=decision.standing,
            stale_after_s=stale_after_s,
            starts=starts,
            budgets=budgets,
        )

    def rows_for(self, source: str) -> int:
        """The most rows ``source`` may put into the next batch."""
        if self.budgets is None:
            return self.max_rows
        return self.budgets.get(source, 0)

    def releases(
        self, now: float, start: dict[str, Any], last_seq: int | None, waiting_since: float
    ) -> bool:
        """Whether a source at offset ``start`` (there since ``waiting_since``), which last
        released a batch under plan ``last_seq``, may start a batch now."""
        if now < self.due_at:
            return False
        if self.standing and start.get("backlog"):
            return True
        expected = (self.starts or {}).get(str(start.get("source")))
        if expected is None and last_seq != self.seq:
            return True
        if expected is not None and expected == start:
            return True
        return now - waiting_since >= self.stale_after_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TriggerPlan:
        return cls(**json.loads(text))


def share_rows(cap: int, demands: Mapping[str, int | None]) -> dict[str, int]:
    """Split one batch's row cap among its sources, max-min fair.

    ``demands`` holds the rows each source has waiting (None: unknown, as good as unbounded).
    A source that wants less than an equal share gets what it wants; the others split the
    rest equally; whatever no source wants is handed out equally on top, as headroom for
    rows that arrived since the demands were measured. The shares add up to ``cap``, so one
    source alone gets all of it, and no source gets less than ``min(demand, cap / n)``.
    """
    names = sorted(demands)
    if not names:
        return {}
    shares = dict.fromkeys(names, 0)
    waiting = list(names)
    left = cap
    while waiting and left > 0:
        equal = left // len(waiting)
        modest = [n for n in waiting if (d := demands[n]) is not None and d <= equal]
        if not modest:
            for name in waiting:
                shares[name] += equal
            left -= equal * len(waiting)
            break
        for name in modest:
            shares[name] += demands[name] or 0
            left -= demands[name] or 0
            waiting.remove(name)
    for index, name in enumerate(names):  # what nobody asked for, and rounding
        shares[name] += left // len(names) + (1 if index < left % len(names) else 0)
    return shares
