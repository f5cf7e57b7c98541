import xml.etree.ElementTree as ET

from airflow_provider_backlog.ui.costs import PhaseMedians, costs_chart, medians, state_chart
from tests.airflow_provider_backlog.ui.build import NO_PARTS, at, checkpoint

KNOWN = checkpoint("r1", 0, 10, backlog=True)
UNKNOWN = checkpoint("r1", 1, 20, duration_ms=500, parts=NO_PARTS)


def test_each_bar_stacks_the_data_work_under_the_fixed_cost():
    svg = ET.fromstring(str(costs_chart((KNOWN, UNKNOWN), "orders")))
    assert svg.get("id") == "costs"
    bars = [g for g in svg.iter("g") if g.get("data-checkpoint")]
    assert [(g.get("data-checkpoint"), g.get("data-unknown")) for g in bars] == [
        ("r1:0", None),
        ("r1:1", "true"),
    ]
    parts = [(r.get("class"), r.get("height")) for r in bars[0].iter("rect")]
    # 1000 ms fill the 160 px between the axis (172) and the top (12).
    assert parts == [
        ("phase backlog", "5"),
        ("part add_batch_ms", "112"),
        ("part latest_offset_ms", "16"),
        ("part get_batch_ms", "8"),
        ("part query_planning_ms", "4.8"),
        ("part wal_commit_ms", "3.2"),
        ("part commit_offsets_ms", "6.4"),
        ("part other_ms", "9.6"),
    ]
    assert (
        bars[0]
        .find("title")
        .text.endswith(
            "1.0 s = data work 700 ms + fixed cost 300 ms (data work (addBatch) 700 ms, latest "
            "offsets 100 ms, get batch 50 ms, query planning 30 ms, offset log (WAL) 20 ms, "
            "commit log 40 ms, Spark's bookkeeping 60 ms)"
        )
    )
    # two checkpoints take two narrow bars, not the chart's whole width
    strips = [r for r in svg.iter("rect") if r.get("class").startswith("phase")]
    assert [(r.get("x"), r.get("width")) for r in strips] == [("72", "23"), ("96", "23")]
    unknown = [(r.get("class"), r.get("height")) for r in bars[1].iter("rect")]
    assert unknown == [("phase live", "5"), ("unknown", "80")], "drawn as unknown, not zero"


def test_medians_per_phase_count_only_checkpoints_whose_parts_are_known():
    slow = checkpoint("r1", 2, 30, backlog=True, duration_ms=2000)
    assert medians((KNOWN, slow, UNKNOWN)) == [
        # the slow one spent its extra second outside the parts: bookkeeping, a fixed cost
        PhaseMedians("backlog", 2, 2, 1500, 800, 700, 1600 / 3000),
        PhaseMedians("live", 1, 0, None, None, None, None),
    ]


def test_state_is_drawn_where_known_and_broken_where_not():
    checkpoints = (
        checkpoint("r1", 0, 0, state=(100, 1024)),
        checkpoint("r1", 1, 50, state=(None, None)),
        checkpoint("r1", 2, 100, state=(300, 4096)),
    )
    svg = ET.fromstring(str(state_chart(checkpoints, at(0), at(100), "orders")))
    lines = {p.get("class"): p.get("d") for p in svg.iter("path")}
    assert lines == {
        "state-disk": "M72,132M896,12",
        "state-rows": "M72,118.7M896,12",
    }
    points = [(c.get("class"), c.get("data-state")) for c in svg.iter("circle")]
    assert points == [
        ("state-disk", "r1:0"),
        ("state-disk", "r1:2"),
        ("state-rows", "r1:0"),
        ("state-rows", "r1:2"),
    ]
    assert state_chart(checkpoints[1:2], at(0), at(100), "orders") is None
