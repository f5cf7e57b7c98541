import pytest

from spark_jobs.sources.cdc.lsn import MAX_LSN, format_lsn, parse_lsn


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16/B374D848", 0x16_B374D848),
        ("0/0", 0),
        ("0/16B3748", 0x16B3748),
        ("FFFFFFFF/FFFFFFFF", MAX_LSN),
    ],
)
def test_an_lsn_reads_and_prints_as_postgresql_prints_it(text, value):
    assert parse_lsn(text) == value
    assert format_lsn(value) == text


def test_lower_case_hex_reads_and_prints_upper_case():
    assert format_lsn(parse_lsn("16/b374d848")) == "16/B374D848"


def test_lsns_order_as_the_wal_does():
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")


@pytest.mark.parametrize("bad", ["", "16", "16/", "/1", "G/1", "1/2/3", "123456789/0", " 0/1", 16])
def test_a_bad_text_is_named(bad):
    with pytest.raises(ValueError, match=r"not a PostgreSQL LSN: .*'16/B374D848'") as error:
        parse_lsn(bad)
    assert repr(bad) in str(error.value)


@pytest.mark.parametrize("bad", [-1, MAX_LSN + 1, 1.0, True, "0/1"])
def test_a_bad_int_is_named(bad):
    with pytest.raises(ValueError, match=r"expected an int from 0 to 2\*\*64 - 1") as error:
        format_lsn(bad)
    assert repr(bad) in str(error.value)
