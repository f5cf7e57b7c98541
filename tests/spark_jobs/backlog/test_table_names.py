import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from spark_jobs.backlog.table_names import (
    TableNameError,
    as_part,
    in_text,
    qualified,
    split_table_name,
    text_quoting,
)


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("accounts", ("accounts",)),
        ("sales.accounts", ("sales", "accounts")),
        ("Sales.Orders", ("Sales", "Orders")),
        ('"q1.2026"', ("q1.2026",)),
        ('sales."q1.2026"', ("sales", "q1.2026")),
        ('"Sales Team"."q1 ""final"""', ("Sales Team", 'q1 "final"')),
        ('"a.b".c', ("a.b", "c")),
    ],
)
def test_a_name_splits_at_dots_outside_double_quotes(name, parts):
    assert split_table_name(name) == parts


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("a.b.c", "'table' or 'schema.table'"),
        ("", "no empty part"),
        ("a.", "no empty part"),
        ('"a', "not closed"),
        ('"a"b', "must end at a dot"),
    ],
)
def test_a_name_that_does_not_split_is_refused_with_the_rule(name, rule):
    with pytest.raises(TableNameError, match=rf"table name {name!r}: .*{rule}.*double quotes"):
        split_table_name(name)


parts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
#: Parts made of what SQL text treats apart: a ':word' parameter, '%', quotes, backslashes.
sql_parts = st.lists(
    st.sampled_from([":eur", ":", "::x", "%", '"', ".", " ", "\\", "a", "1", "é"]),
    min_size=1,
    max_size=6,
).map("".join)


@given(st.lists(parts, min_size=1, max_size=2))
def test_any_parts_quoted_split_back_to_themselves(found):
    name = ".".join('"' + part.replace('"', '""') + '"' for part in found)
    assert split_table_name(name) == tuple(found)


@given(parts)
def test_a_part_written_by_as_part_splits_back_whole(part):
    """The target table named after the source's last part, which may hold a dot."""
    assert split_table_name(as_part(part)) == (part,)


def test_qualified_quotes_each_part_as_the_dialect_does():
    def quote(part: str) -> str:
        return '"' + part.replace('"', '""') + '"'

    assert qualified('sales."q1.2026"', quote) == '"sales"."q1.2026"'


@given(st.lists(sql_parts, min_size=1, max_size=2))
def test_a_quoted_name_in_text_renders_as_itself_with_no_bound_parameter(found):
    """``text()`` takes ``:word`` for a parameter, inside an identifier's quotes too."""
    name = ".".join('"' + part.replace('"', '""') + '"' for part in found)
    sql = qualified(name, text_quoting(postgresql.dialect().identifier_preparer))
    statement = text(f"LOCK TABLE {in_text(sql)}").compile(dialect=postgresql.dialect())
    assert statement.params == {}
    assert str(statement).replace("%%", "%") == f"LOCK TABLE {sql}"
