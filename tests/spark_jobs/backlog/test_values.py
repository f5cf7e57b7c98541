import pytest

from spark_jobs.backlog.values import format_duration, parse_count, parse_duration, processing_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("30 s", 30.0),
        ("30sec", 30.0),
        ("1.5s", 1.5),
        ("30min", 1800.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("2 hours", 7200.0),
        ("1d", 86400.0),
        ("0", 0.0),
        ("0s", 0.0),
        (" 10S ", 10.0),
    ],
)
def test_accepts_durations_as_users_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("30", "a unit is required"),
        ("thirty seconds", "expected a number with a unit"),
        ("-5s", "expected a number with a unit"),
        ("5 fortnights", "unknown unit 'fortnights'"),
        ("", "expected a number with a unit"),
    ],
)
def test_rejects_with_the_accepted_format(text, message):
    with pytest.raises(ValueError, match=message) as error:
        parse_duration(text)
    assert "500ms, 30s, 30min, 1h" in str(error.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0"), (0.5, "500ms"), (30, "30s"), (1.5, "1.5s"), (1800, "30min"), (3600, "1h")],
)
def test_formats_back_exactly(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "count"), [("1", 1), ("1_000_000", 1_000_000), (" 42 ", 42)])
def test_counts(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["0", "-3", "1e6", "many", ""])
def test_counts_must_be_whole_and_above_zero(text):
    with pytest.raises(ValueError, match="expected a whole number above 0"):
        parse_count(text)


def test_processing_time_is_in_milliseconds():
    assert processing_time(0.05) == "50 milliseconds"
    assert processing_time(30) == "30000 milliseconds"
