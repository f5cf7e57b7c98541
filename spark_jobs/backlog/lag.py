"""Lag rules (FLIP-328): a source is in backlog while the job lags far behind it.

A source's phase says whether it reads history or the live end. Lag catches what the phase
cannot: a job that reads the live end but trails it after an outage or a burst, where
throughput, not per-record latency, bounds freshness, so checkpoints may be rarer. Unlike
Flink's design, a rule goes back to backlog whenever lag grows again; separate enter and
leave thresholds and a minimum dwell time keep a lag near a threshold from flapping.

Pure, like the decider: time comes only from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from spark_jobs.backlog.status import SourceStatus

Clock = Callable[[], float]

#: The ``SourceStatus.lag`` key the offset rule reads: offsets behind the latest, summed
#: over partitions.
OFFSETS_BEHIND_LATEST = "offsets_behind_latest"
OFFSET_LAG = "offset-lag"
WATERMARK_LAG = "watermark-lag"


@dataclass(frozen=True)
class Thresholds:
    """Enter backlog when the metric is above ``enter``, leave it when at or below ``leave``.

    With ``leave <= enter``, a metric between the two keeps the current state, so a lag
    hovering around one threshold does not switch the checkpoint interval back and forth.
    """

    enter: float
    leave: float

    def holds_backlog(self, in_backlog: bool, value: float) -> bool:
        return value > (self.leave if in_backlog else self.enter)


@dataclass(frozen=True)
class LagRules:
    """The lag rules in force; a rule without thresholds is off.

    ``offsets`` applies to ``offsets_behind_latest``, ``watermark_s`` to the seconds from
    the event-time watermark to now. A rule's state lasts at least ``min_dwell_s`` before
    that rule may flip it again.
    """

    offsets: Thresholds | None = None
    watermark_s: Thresholds | None = None
    min_dwell_s: float = 0.0


def watermark_lag_s(now: float, watermark: datetime | None, num_input_rows: int) -> float | None:
    """Seconds from the watermark to ``now`` (epoch seconds), or None when the batch says
    nothing about lag: no watermark yet, or no rows read. Without no-data batches an idle
    query's watermark stands still, and an idle job is not behind."""
    if watermark is None or num_input_rows <= 0:
        return None
    return now - watermark.timestamp()


@dataclass
class _RuleState:
    in_backlog: bool = False
    #: When the rule last flipped; None until it first does, so the first flip is not
    #: delayed by the dwell time.
    since: float | None = None


@dataclass
class _SourceState:
    rules: dict[str, _RuleState] = field(default_factory=dict)
    in_backlog: bool = False
    #: The lag rule that last moved the source from backlog to live; None: its phase did.
    released_by: str | None = None


class LagDetector:
    """Applies the lag rules on top of each source's phase and remembers their state.

    The state outlives a run: ``state`` gives it as JSON for the metrics, and ``restore``
    seeds a restarted run with it, so a rule that held a source in backlog still holds it
    (and its hysteresis and dwell time still count) as if the job had never stopped.
    """

    def __init__(self, rules: LagRules, clock: Clock):
        self._rules = rules
        self._clock = clock
        self._sources: dict[str, _SourceState] = {}

    def observe(self, status: SourceStatus, watermark_lag: float | None = None) -> SourceStatus:
        """The source's final status: in backlog if its phase says so or a lag rule holds it.

        ``rule`` names the phase's rule when the phase says backlog, else the lag rule that
        holds the source; once live, the rule that released it, so a job transition names
        its cause. A metric that is missing (no ``offsets_behind_latest`` in ``status.lag``,
        ``watermark_lag`` None) leaves its rule's state as it was.
        """
        now = self._clock()
        source = self._sources.setdefault(status.name, _SourceState())
        held: list[str] = []
        released: list[str] = []
        for rule, thresholds, value in (
            (OFFSET_LAG, self._rules.offsets, status.lag.get(OFFSETS_BEHIND_LATEST)),
            (WATERMARK_LAG, self._rules.watermark_s, watermark_lag),
        ):
            if thresholds is None:
                continue
            state = source.rules.setdefault(rule, _RuleState())
            dwelled = state.since is None or now - state.since >= self._rules.min_dwell_s
            if value is not None and dwelled:
                in_backlog = thresholds.holds_backlog(state.in_backlog, value)
                if in_backlog != state.in_backlog:
                    state.in_backlog, state.since = in_backlog, now
                    if not in_backlog:
                        released.append(rule)
            if state.in_backlog:
                held.append(rule)

        is_backlog = status.is_backlog or bool(held)
        if is_backlog:
            rule_name = status.rule if status.is_backlog else held[0]
        else:
            if source.in_backlog:
                source.released_by = released[0] if released else None
            rule_name = source.released_by or status.rule
        source.in_backlog = is_backlog
        return replace(status, is_backlog=is_backlog, rule=rule_name)

    def state(self, name: str) -> dict[str, object]:
        """What the rules remember of one source, as JSON (empty before it was observed)."""
        source = self._sources.get(name)
        if source is None:
            return {}
        return {
            "in_backlog": source.in_backlog,
            "released_by": source.released_by,
            "rules": {
                rule: {"in_backlog": state.in_backlog, "since": state.since}
                for rule, state in source.rules.items()
            },
        }

    def restore(self, name: str, state: Mapping[str, object]) -> None:
        """Pick up where ``state`` (as ``state`` gave it, in an earlier run) left off;
        anything unreadable in it is ignored, leaving the rules fresh."""
        rules = state.get("rules")
        if not isinstance(rules, Mapping):
            return
        source = _SourceState(
            in_backlog=bool(state.get("in_backlog")),
            released_by=released if isinstance(released := state.get("released_by"), str) else None,
        )
        for rule, kept in rules.items():
            if rule in (OFFSET_LAG, WATERMARK_LAG) and isinstance(kept, Mapping):
                since = kept.get("since")
                source.rules[rule] = _RuleState(
                    in_backlog=bool(kept.get("in_backlog")),
                    since=float(since) if isinstance(since, int | float) else None,
                )
        self._sources[name] = source
