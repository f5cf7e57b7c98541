"""The decision as the sources see it, and the one rule they apply to it.

The decider runs in the driver; Spark asks each Python source for its next offset in a
separate planner process. The coordinator publishes a ``TriggerPlan`` there, and the
source releases a batch only when the plan allows it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from spark_jobs.backlog.decider import Decision


@dataclass(frozen=True)
class TriggerPlan:
    """A published decision. ``seq`` grows with every publication.

    A plan that is not ``standing`` releases one batch; the next needs a newer plan, so a
    source never runs ahead of a coordinator that has not yet seen the last commit. If no
    newer plan arrives within ``stale_after_s`` of a release (the coordinator is gone),
    batches continue at that cadence rather than stopping the job.
    """

    seq: int
    due_at: float
    max_rows: int
    standing: bool
    is_backlog: bool
    stale_after_s: float

    @classmethod
    def from_decision(cls, seq: int, decision: Decision, stale_after_s: float) -> TriggerPlan:
        return cls(
            seq=seq,
            due_at=decision.due_at,
            max_rows=decision.max_rows,
            standing=decision.standing,
            is_backlog=decision.is_backlog,
            stale_after_s=stale_after_s,
        )

    def releases(self, now: float, last_seq: int | None, last_release_at: float | None) -> bool:
        """Whether a source that last released under ``last_seq`` may start a batch now."""
        if now < self.due_at:
            return False
        if self.standing or last_seq != self.seq or last_release_at is None:
            return True
        return now - last_release_at >= self.stale_after_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TriggerPlan:
        return cls(**json.loads(text))
