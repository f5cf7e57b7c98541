import xml.etree.ElementTree as ET

from airflow_provider_backlog.hooks.metrics_values import IntervalChange
from airflow_provider_backlog.ui.runs import boundaries, runs, spans
from airflow_provider_backlog.ui.timeline import MAX_RADIUS, MIN_RADIUS, timeline
from tests.airflow_provider_backlog.ui.build import (
    at,
    checkpoint,
    history,
    lease,
    request,
    transition,
)
from tests.airflow_provider_backlog.ui.test_runs import TAKEN_OVER


def drawn(job_history) -> ET.Element:
    phases = spans(job_history)
    marks = boundaries(job_history, runs(job_history, phases))
    return ET.fromstring(str(timeline(job_history, phases, marks)))


def marked(svg: ET.Element, attribute: str) -> list[str]:
    return [element.get(attribute) for element in svg.iter() if element.get(attribute)]


def test_every_checkpoint_transition_run_boundary_and_request_is_drawn():
    job_history = history(
        *TAKEN_OVER.checkpoints,
        transitions=(transition("r1", 25, False, "hybrid-phase: events is live"),),
        requests=(request(40), request(80, "rejected", "not now")),
        lease=TAKEN_OVER.lease,
    )
    svg = drawn(job_history)
    assert svg.get("id") == "timeline"
    assert marked(svg, "data-checkpoint") == ["r1:0", "r1:1", "r1:2", "r1:3", "r2:4", "r2:5"]
    assert marked(svg, "data-span") == ["backlog", "lag", "lag"]
    assert marked(svg, "data-transition") == ["1"]
    assert marked(svg, "data-boundary") == ["launch", "takeover", "launch"]
    assert marked(svg, "data-run") == ["r1", "r1", "r2"]
    assert marked(svg, "data-request") == ["reconfigure", "reconfigure"]
    (change,) = [g for g in svg.iter("g") if g.get("data-transition")]
    assert change.find("title").text == (
        "1. 2026-11-21T12:00:25Z, run r1: live: hybrid-phase: events is live"
    )
    hatched = [r for r in svg.iter("rect") if r.get("fill") == "url(#lag-hatch)"]
    assert len(hatched) == 2


def test_checkpoints_are_sized_by_their_rows():
    svg = drawn(history(checkpoint("r1", 0, 10, rows=0), checkpoint("r1", 1, 20, rows=400)))
    radii = [float(c.get("r")) for c in svg.iter("circle")]
    assert radii == [MIN_RADIUS, MAX_RADIUS]


def test_the_interval_steps_at_each_commit_and_breaks_between_runs():
    svg = drawn(
        history(
            checkpoint("r1", 0, 0, backlog=True, interval_ms=60_000),
            checkpoint("r1", 1, 10, backlog=True, interval_ms=60_000),
            checkpoint("r1", 2, 20, interval_ms=10_000),
            checkpoint("r2", 3, 30, interval_ms=10_000),
        )
    )
    (line,) = [p for p in svg.iter("path") if p.get("class") == "interval"]
    # x = 72 + 8.72 px/s; y: 60 s at 36, 0 at 124.
    assert line.get("d") == "M72,36H159.2V36H246.4V109.3M333.6,109.3"


def test_each_interval_a_freshness_target_chose_is_marked_on_the_line_with_its_reason():
    reason = "freshness target 5s: 4.00s keeps p95 freshness at 4.70s over the last 3 live batches"
    svg = drawn(
        history(
            checkpoint("r1", 0, 0, interval_ms=2000),
            checkpoint("r1", 1, 20, interval_ms=4000),
            interval_changes=(
                IntervalChange("r1", at(0), 2000, "first"),
                IntervalChange("r1", at(10), 4000, reason),
            ),
        )
    )
    changes = [g for g in svg.iter("g") if g.get("data-interval-change")]
    assert [g.get("data-interval-change") for g in changes] == ["r1", "r1"]
    assert changes[1].find("title").text == (
        f"2026-11-21T12:00:10Z, run r1: interval 4.0 s: {reason}"
    )
    # on the line: 4 s at its top (36), 2 s half way down to 0 (124); x = 72 + 8.72 px/s
    dots = [(c.get("cx"), c.get("cy")) for g in changes for c in g.iter("circle")]
    assert dots == [("72", "80"), ("159.2", "36")]


def test_a_period_without_checkpoints_is_an_empty_axis():
    svg = drawn(history(lease=lease("r1", -10, 30, released=20)))
    assert marked(svg, "data-checkpoint") == []
    assert marked(svg, "data-boundary") == ["end"]
    assert [t.text for t in svg.iter("text")][:2] == ["12:00:00", "12:00:15"]
