from datetime import timedelta, timezone

import pytest

from airflow_provider_backlog.ui import fmt
from tests.airflow_provider_backlog.ui.build import T0


def test_times_are_written_in_utc():
    assert fmt.utc(T0 + timedelta(seconds=5)) == "2026-11-21T12:00:05Z"
    assert fmt.utc(T0.astimezone(timezone(timedelta(hours=2)))) == "2026-11-21T12:00:00Z"
    assert fmt.utc(None) == ""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.35, "350 ms"),
        (4.2, "4.2 s"),
        (12, "12 s"),
        (65, "1 min 5 s"),
        (3600, "1 h"),
        (7205, "2 h"),
        (7500, "2 h 5 min"),
        (90_000, "1 d 1 h"),
        (-65, "-1 min 5 s"),
        (None, ""),
    ],
)
def test_durations_read_in_their_two_largest_units(seconds, text):
    assert fmt.duration(seconds) == text


def test_sizes_counts_and_shares():
    assert [fmt.size(v) for v in (512, 1536 * 1024, 5 * 1024**5, None)] == [
        "512 B",
        "1.5 MiB",
        "5120.0 TiB",
        "",
    ]
    assert (fmt.count(12345), fmt.milliseconds(1500), fmt.share(1 / 3)) == (
        "12,345",
        "1.5 s",
        "33%",
    )


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("26833c22de494600946b8b42dce12712", "26833c22de494600<wbr>946b8b42dce12712"),
        ("r1", "r1"),
        ("<b>" + "x" * 14, "&lt;b&gt;" + "x" * 13 + "<wbr>x"),
    ],
)
def test_an_id_may_wrap_only_between_pieces_of_16_characters(text, written):
    assert str(fmt.breakable(text)) == written
