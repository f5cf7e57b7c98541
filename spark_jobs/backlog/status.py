"""Per-source backlog status and the job-level status (FLIP-309).

A source's last report wins; a source that never reported is not in backlog; a bounded
source that has finished no longer counts. The job is in backlog while any running source is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceStatus:
    """What one source last said about itself.

    ``phase`` is the source's own word for where it is (a hybrid child's name, say);
    ``lag`` holds whatever distance to the live end it knows (rows or files behind);
    ``rule`` names what decided the status (``hybrid-phase``, ``pending-files``...);
    ``health`` is what the source says of its health in words (a replication slot's
    ``slot_wal_status``), for people: no rule reads it.
    """

    name: str
    is_backlog: bool = False
    finished: bool = False
    phase: str | None = None
    lag: Mapping[str, float] = field(default_factory=dict)
    rule: str | None = None
    health: Mapping[str, str] = field(default_factory=dict)

    @property
    def counts_as_backlog(self) -> bool:
        return self.is_backlog and not self.finished

    def as_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            "name": self.name,
            "is_backlog": self.is_backlog,
            "finished": self.finished,
            "phase": self.phase,
            "lag": dict(self.lag),
            "rule": self.rule,
        }
        if self.health:
            found["health"] = dict(self.health)
        return found


class BacklogModel:
    """The statuses of all sources of one query, and the job status derived from them."""

    def __init__(self, source_names: Iterable[str] = ()):
        self._statuses: dict[str, SourceStatus] = {
            name: SourceStatus(name) for name in source_names
        }

    def report(self, status: SourceStatus) -> None:
        """Record a source's report; it replaces whatever that source said before."""
        self._statuses[status.name] = status

    def status(self, name: str) -> SourceStatus:
        return self._statuses.get(name, SourceStatus(name))

    def sources(self) -> list[SourceStatus]:
        return list(self._statuses.values())

    def backlog_sources(self) -> list[str]:
        return [s.name for s in self._statuses.values() if s.counts_as_backlog]

    def job_is_backlog(self) -> bool:
        return bool(self.backlog_sources())
