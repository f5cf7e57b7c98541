"""What a run did, read back from the metrics tables: phases, cadence, freshness, a chart."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spark_jobs.backlog.freshness import EVENT_TIME_OBSERVATION, oldest_event_at
from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.metrics.schema import as_utc, backlog_checkpoints, backlog_transitions, make_engine


@dataclass(frozen=True)
class Checkpoint:
    """One committed micro-batch, with what the pipeline observed about its events."""

    batch_id: int
    started_at: float
    committed_at: float
    is_backlog: bool
    rows: int
    #: What the batch left behind: files of a landing directory, or offsets of a topic.
    behind: int | None
    event_time_quantiles_s: tuple[float, ...]
    #: The running child of the (first) hybrid source, and the rule behind its status.
    phase: str | None = None
    rule: str | None = None
    watermark: datetime | None = None
    #: Malformed files and records the batch set aside (None without a quarantine).
    quarantined: int | None = None
    #: Spark's time on the batch's data (addBatch), and the rest of its duration: the
    #: checkpoint's fixed cost (None: recorded without its parts, or recovered).
    data_ms: int | None = None
    fixed_cost_ms: int | None = None
    #: The state it carried, over its stateful operators (None: it kept none).
    state_disk_bytes: int | None = None
    state_rows: int | None = None
    #: The event time of its oldest row (None: no rows, or not observed).
    oldest_event_s: float | None = None

    @property
    def freshness_s(self) -> float | None:
        """Its commit minus its oldest row's event time: what a freshness target judges."""
        return None if self.oldest_event_s is None else self.committed_at - self.oldest_event_s

    @property
    def duration_s(self) -> float:
        return self.committed_at - self.started_at


def load(url: str, job: str) -> tuple[list[Checkpoint], list[dict]]:
    """Checkpoints (by batch) and transitions of one job."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(backlog_checkpoints)
                .where(backlog_checkpoints.c.job_name == job)
                .order_by(backlog_checkpoints.c.batch_id)
            ).all()
            changes = connection.execute(
                sa.select(backlog_transitions)
                .where(backlog_transitions.c.job_name == job)
                .order_by(backlog_transitions.c.at)
            ).all()
    finally:
        engine.dispose()
    return [_checkpoint(r._mapping) for r in rows], [dict(r._mapping) for r in changes]


def _checkpoint(row: sa.RowMapping) -> Checkpoint:
    committed = epoch(row["committed_at"])
    sources = json.loads(row["sources"])
    lags = [
        lag.get(OFFSETS_BEHIND_LATEST, lag.get("files_behind"))
        for lag in (s.get("lag", {}) for s in sources)
    ]
    metrics = json.loads(row["observed_metrics"] or "{}")
    observed = metrics.get(EVENT_TIME_OBSERVATION, {})
    quantiles = tuple(ms / 1000 for ms in observed.get("quantiles_ms") or ())
    return Checkpoint(
        batch_id=row["batch_id"],
        started_at=committed - row["batch_duration_ms"] / 1000,
        committed_at=committed,
        is_backlog=row["is_backlog"],
        rows=row["num_input_rows"],
        behind=next((lag for lag in lags if lag is not None), None),
        event_time_quantiles_s=quantiles if observed.get("rows") else (),
        phase=sources[0].get("phase") if sources else None,
        rule=sources[0].get("rule") if sources else None,
        watermark=as_utc(row["watermark"]),
        quarantined=row["quarantined"],
        data_ms=row["add_batch_ms"],
        fixed_cost_ms=None
        if row["add_batch_ms"] is None
        else row["batch_duration_ms"] - row["add_batch_ms"],
        state_disk_bytes=row["state_disk_bytes"],
        state_rows=row["state_rows_total"],
        oldest_event_s=oldest_event_at(metrics),
    )


def epoch(value: datetime | str) -> float:
    moment = as_utc(value)
    assert moment is not None
    return moment.timestamp()


@dataclass(frozen=True)
class PhaseStats:
    checkpoints: int
    duration_s: float
    rows: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.duration_s if self.duration_s > 0 else 0.0


def phase_stats(checkpoints: Sequence[Checkpoint]) -> PhaseStats:
    """From the start of the phase's first batch to the commit of its last."""
    if not checkpoints:
        return PhaseStats(0, 0.0, 0)
    duration = checkpoints[-1].committed_at - checkpoints[0].started_at
    return PhaseStats(len(checkpoints), duration, sum(c.rows for c in checkpoints))


def warm_up_s(backlog: Sequence[Checkpoint]) -> float | None:
    """The first backlog batch's time beyond what its rows cost at the rate of the backlog
    batches after it: what a new driver's first batch pays to start (None with one batch)."""
    later = backlog[1:]
    if not later or not sum(c.rows for c in later):
        return None
    per_row = sum(c.duration_s for c in later) / sum(c.rows for c in later)
    return backlog[0].duration_s - backlog[0].rows * per_row


def cost_lines(checkpoints: Sequence[Checkpoint]) -> list[str]:
    """Per phase, the median checkpoint's fixed cost, its data work and the state it
    carried: the numbers an interval is tuned by, since a longer one spreads the fixed cost
    over more data. Checkpoints recorded without their parts are left out."""
    lines = [
        "where a checkpoint's time goes, median per phase:",
        f"{'phase':8}{'checkpoints':>12}{'fixed cost (ms)':>17}{'data (ms)':>11}"
        f"{'state on disk (B)':>19}{'state rows':>12}",
    ]
    for phase, is_backlog in (("backlog", True), ("live", False)):
        costed = [
            c for c in checkpoints if c.is_backlog is is_backlog and c.fixed_cost_ms is not None
        ]
        if costed:
            lines.append(
                f"{phase:8}{len(costed):>12,d}"
                f"{_median_text([c.fixed_cost_ms for c in costed]):>17}"
                f"{_median_text([c.data_ms for c in costed]):>11}"
                f"{_median_text([c.state_disk_bytes for c in costed]):>19}"
                f"{_median_text([c.state_rows for c in costed]):>12}"
            )
    return lines


def _median_text(values: Sequence[int | None]) -> str:
    known = [value for value in values if value is not None]
    return f"{statistics.median(known):,.0f}" if known else "-"


def periods(checkpoints: Sequence[Checkpoint]) -> list[list[Checkpoint]]:
    """Consecutive checkpoints of one job status: backlog, live, backlog again..."""
    return [list(group) for _, group in itertools.groupby(checkpoints, lambda c: c.is_backlog)]


def phase_changes(checkpoints: Sequence[Checkpoint]) -> list[tuple[float, str]]:
    """When the running child changed (a hybrid handoff), as chart marks."""
    return [
        (after.started_at, f"handoff: {before.phase} -> {after.phase}")
        for before, after in itertools.pairwise(checkpoints)
        if before.phase and after.phase and before.phase != after.phase
    ]


def caught_up(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Steady real time: the live checkpoints after the first one that left nothing behind.

    That first one still carries what piled up before (backlog or a per-batch limit).
    """
    live = [c for c in checkpoints if not c.is_backlog]
    for index, checkpoint in enumerate(live):
        if checkpoint.behind == 0:
            return live[index + 1 :]
    return []


@dataclass(frozen=True)
class Reentry:
    """How a run answered a pile-up that started at ``burst_at`` (epoch seconds)."""

    detect_s: float | None
    recovery_to_live_s: float | None


def reentry(transitions: Sequence[dict], burst_at: float | None) -> Reentry:
    """From the start of the pile-up to the switch into backlog, and from there back to live."""
    if burst_at is None:
        return Reentry(None, None)
    after = [(epoch(t["at"]), bool(t["is_backlog"])) for t in transitions]
    after = [(at, backlog) for at, backlog in after if at >= burst_at]
    entered = next((at for at, backlog in after if backlog), None)
    if entered is None:
        return Reentry(None, None)
    left = next((at for at, backlog in after if not backlog and at > entered), None)
    return Reentry(entered - burst_at, None if left is None else left - entered)


def freshness_s(checkpoints: Sequence[Checkpoint]) -> list[tuple[float, float]]:
    """(seconds from event to commit, weight) pairs, from each batch's event-time quantiles."""
    samples = []
    for checkpoint in checkpoints:
        quantiles = checkpoint.event_time_quantiles_s
        for event_time in quantiles:
            samples.append((checkpoint.committed_at - event_time, checkpoint.rows / len(quantiles)))
    return samples


def weighted_percentile(samples: Sequence[tuple[float, float]], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    total = sum(weight for _, weight in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= fraction * total:
            return value
    return ordered[-1][0]


def cadence_s(checkpoints: Sequence[Checkpoint]) -> list[float]:
    """Time between the starts of consecutive batches."""
    starts = [c.started_at for c in checkpoints]
    return [b - a for a, b in itertools.pairwise(starts)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot_timeline(
    runs: Sequence[tuple[str, Sequence[Checkpoint]]],
    path: Path,
    title: str,
    marks: Sequence[Sequence[tuple[float, str]]] = (),
) -> Path:
    """One panel per run, on one time axis: a bar per batch (its rows, log scale, as long as
    it ran), backlog shaded, a grey line per checkpoint, and the median freshness of each
    live batch's events on a second axis. ``marks`` label moments (epoch seconds) per run:
    transitions, a burst."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    figure, axes = plt.subplots(
        len(runs), 1, figsize=(12, 3.4 * len(runs)), squeeze=False, sharex=True
    )
    legend = [
        Patch(color=BACKLOG_COLOUR, label="backlog batch"),
        Patch(facecolor=BACKLOG_COLOUR, hatch="//", edgecolor="white", label="backlog by lag"),
        Patch(color=LIVE_COLOUR, label="live batch"),
        Line2D([], [], color=FRESHNESS_COLOUR, marker=".", label="live freshness p50"),
    ]
    for index, (axis, (label, checkpoints)) in enumerate(zip(axes[:, 0], runs, strict=True)):
        axis.set_title(label if checkpoints else f"{label}: no checkpoints")
        axis.set_ylabel("rows per batch")
        if not checkpoints:
            continue
        origin = checkpoints[0].started_at
        for checkpoint in checkpoints:
            if checkpoint.is_backlog:
                axis.axvspan(
                    checkpoint.started_at - origin,
                    checkpoint.committed_at - origin,
                    color=BACKLOG_COLOUR,
                    alpha=0.15,
                    lw=0,
                )
            axis.bar(
                checkpoint.started_at - origin,
                max(checkpoint.rows, 1),
                width=max(checkpoint.duration_s, 0.05),
                align="edge",
                color=BACKLOG_COLOUR if checkpoint.is_backlog else LIVE_COLOUR,
                hatch="//" if checkpoint.is_backlog and checkpoint.rule in LAG_RULES else None,
                edgecolor="white",
                lw=0,
            )
            axis.axvline(checkpoint.committed_at - origin, color="#555555", lw=0.4, alpha=0.4)
        axis.set_yscale("log")
        for at, text in marks[index] if index < len(marks) else ():
            axis.axvline(at - origin, color=MARK_COLOUR, lw=1, ls="--")
            axis.annotate(
                text,
                (at - origin, 1),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize="x-small",
                color=MARK_COLOUR,
                bbox={"facecolor": "white", "alpha": 0.7, "lw": 0, "pad": 1},
            )
        fresh = [
            (c.committed_at - origin, median([c.committed_at - t for t in quantiles]))
            for c in checkpoints
            if not c.is_backlog and (quantiles := c.event_time_quantiles_s)
        ]
        if fresh:
            twin = axis.twinx()
            twin.plot(*zip(*fresh, strict=True), ".-", color=FRESHNESS_COLOUR, lw=1, ms=3)
            twin.set_yscale("log")
            twin.set_ylabel("freshness p50 (s)", color=FRESHNESS_COLOUR)
        axis.legend(handles=legend, loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("seconds since the first batch started (grey lines: checkpoints)")
    figure.suptitle(title)
    return save_chart(figure, path)


def save_chart(figure: Any, path: Path, dpi: int = 110) -> Path:
    """``figure`` laid out and written to ``path`` as a PNG, then closed."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


BACKLOG_COLOUR = "#b5651d"
LIVE_COLOUR = "#2b7bb9"
FRESHNESS_COLOUR = "#2ca02c"
MARK_COLOUR = "#7a1fa2"
LAG_RULES = ("offset-lag", "watermark-lag")
