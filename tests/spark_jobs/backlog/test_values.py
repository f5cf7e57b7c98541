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


@pytest.mark.parametrize("text", ["9" * 400 + "s", "9" * 308 + "d"])
def test_a_duration_too_large_for_a_float_is_refused_rather_than_endless(text):
    with pytest.raises(ValueError) as error:
        parse_duration(text)
    assert str(error.value) == (
        "the number is too large; expected a number with a unit, such as 500ms, 30s, 30min, "
        "1h or 1d (or 0)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2ms", "must be at least 3ms and at most 1d"),
        ("25h", "must be at least 3ms and at most 1d"),
        ("9" * 400 + "s", "must be at least 3ms and at most 1d"),
    ],
)
def test_a_bounded_duration_names_its_bounds(text, message):
    assert parse_duration("3ms", minimum_s=0.003, maximum_s=86400) == 0.003
    assert parse_duration("24h", minimum_s=0.003, maximum_s=86400) == 86400
    with pytest.raises(ValueError) as error:
        parse_duration(text, minimum_s=0.003, maximum_s=86400)
    assert str(error.value) == message


@pytest.mark.parametrize(("text", "digits"), [("²", None), ("٣", None), ("9" * 5000, 5000)])
def test_counts_are_ascii_digits_that_int_can_read(text, digits):
    with pytest.raises(ValueError) as error:
        parse_count(text)
    too_many = f"; {digits} digits are too many" if digits else ""
    assert str(error.value) == f"expected a whole number above 0{too_many}"


def test_a_bounded_count_names_its_bounds():
    assert parse_count("0", zero_allowed=True, maximum=10) == 0
    assert parse_count("1_0", maximum=10) == 10
    with pytest.raises(ValueError) as error:
        parse_count("11", zero_allowed=True, maximum=10)
    assert str(error.value) == "expected 0 or a whole number above 0, at most 10"
    with pytest.raises(ValueError) as error:
        parse_count("0", maximum=10_000)
    assert str(error.value) == "expected a whole number above 0, at most 10_000"
