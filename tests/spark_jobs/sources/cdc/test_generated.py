"""Which generated values a change leaves standing, and which no one can compute."""

import pytest

from spark_jobs.sources.cdc.generated import incomplete, kept
from spark_jobs.sources.cdc.table import TableColumn, TableShape


def column(name: str, generated_from: tuple[str, ...] = ()) -> TableColumn:
    expression = " || ".join(generated_from) if generated_from else None
    return TableColumn(name, name, 25, "text", generated=expression, generated_from=generated_from)


TABLE = TableShape(
    1,
    "public.t",
    (
        column("id"),
        column("title"),
        column("body"),
        column("headline", ("title", "body")),
        column("body_length", ("body",)),
    ),
    ("id",),
)


@pytest.mark.parametrize(
    ("unsent", "standing", "missing"),
    [
        ((), [], False),
        (("body",), ["body_length"], True),  # headline reads body, unsent, and title, sent
        (("title", "body"), ["headline", "body_length"], False),
        (("title",), [], True),
    ],
)
def test_a_generated_value_stands_when_all_it_reads_went_unsent(unsent, standing, missing):
    assert [c.name for c in TABLE.generated_columns if kept(c, unsent)] == standing
    assert incomplete(TABLE, unsent) is missing


def test_a_generated_value_that_reads_no_column_is_computed_not_kept():
    constant = TableColumn("one", "one", 23, "integer", generated="1")
    assert not kept(constant, ("body",))
