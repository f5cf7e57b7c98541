from datetime import timedelta

from airflow_provider_backlog.ui.svg import Scale, TimeScale, chart, element
from tests.airflow_provider_backlog.ui.build import T0, at


def test_what_comes_from_the_database_is_escaped():
    text = element("text", {"x": 1.26, "y": 2.0, "data-job": '<a "b">', "skip": None}, "x<y")
    assert text == '<text x="1.3" y="2" data-job="&lt;a &#34;b&#34;&gt;">x&lt;y</text>'
    assert element("g", None, text) == f"<g>{text}</g>", "markup is kept as it is"


def test_scales_map_linearly():
    assert Scale(0, 10, 100, 0)(5) == 50
    assert Scale(3, 3, 0, 10)(7) == 5, "one value only: drawn midway"
    x = TimeScale(at(0), at(100), 0, 1000)
    assert x(at(25)) == 250


def test_time_ticks_fall_on_round_times():
    ticks = TimeScale(at(7), at(150), 0, 100).ticks()
    assert [label for _, label in ticks] == [
        "12:00:30",
        "12:01:00",
        "12:01:30",
        "12:02:00",
        "12:02:30",
    ]
    hourly = TimeScale(at(7), at(3600), 0, 100).ticks()
    assert [label for _, label in hourly][:2] == ["12:10", "12:20"]
    week = TimeScale(T0, T0 + timedelta(days=7), 0, 100).ticks()
    assert [label for _, label in week][:2] == ["11-22 00:00", "11-23 00:00"]
    assert len(week) == 7


def test_a_chart_scales_with_its_container():
    assert chart("c", 960.0, 200.0, "a <chart>") == (
        '<svg id="c" class="chart" viewBox="0 0 960 200" role="img" '
        'aria-label="a &lt;chart&gt;"></svg>'
    )
