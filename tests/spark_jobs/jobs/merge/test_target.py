"""MergeTarget on SQLite and PostgreSQL: each batch once, by key, and no value lost."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from spark_jobs.jobs.merge import apply as apply_module
from spark_jobs.jobs.merge.apply import MergeError
from spark_jobs.jobs.merge.record import MergeRefused, Verdict
from spark_jobs.jobs.merge.target import MergeTarget
from spark_jobs.metrics.schema import make_engine
from spark_jobs.sources.cdc.table import TableColumn
from tests.spark_jobs.jobs.merge.conftest import AT, SHAPE, Target, change

BIG = "x" * 5000


def test_upserts_and_deletes_merge_by_key(target):
    target.merge(0, change("snapshot", 1, 1, "a", 10), change("snapshot", 2, 1, None, 10))
    target.merge(
        1,
        change("update", 1, 2, "b", 20),
        change("delete", 2, None, None, 20, 1),
        change("insert", 3, 1, "c", 20, 2),
    )
    assert target.rows() == {1: (2, "b", 20), 3: (1, "c", 20)}


def test_a_replayed_or_older_batch_changes_nothing(target):
    target.merge(0, change("insert", 1, 1, "a", 10))
    target.merge(1, change("update", 1, 2, "b", 20))
    # Spark runs batch 1 again after a failure, and a stale batch 0 turns up: both skipped.
    assert target.merge(1, change("insert", 9, 1, "x", 20)) is Verdict.SKIP
    assert target.merge(0, change("insert", 1, 1, "a", 10)) is Verdict.SKIP
    assert target.rows() == {1: (2, "b", 20)}


def test_the_record_survives_a_new_target_and_is_per_table(url, table):
    first = Target(url, table)
    for batch in range(4):
        first.merge(batch, change("insert", 1, 1, "a", 10))
    first.merger.close()
    again = Target(url, table)  # a restarted driver
    again.merge(3, change("update", 1, 9, "late", 5))
    assert again.rows() == {1: (1, "a", 10)}
    other = Target(url, f"{table}_other")
    other.merge(0, change("insert", 7, 1, "o", 1), query="other")
    assert other.rows() == {7: (1, "o", 1)}
    assert again.merger.record().batch_id == 3 and other.merger.record().query_id == "other"
    again.merger.close()
    other.merger.close()


def test_a_batch_of_another_query_is_refused_unless_starting_over(target):
    """A query started afresh counts batches from 0 again: its batches must not be taken
    for replays, and the rows an older query left (deleted in the source since) must go."""
    target.merge(0, change("insert", 1, 1, "a", 10), change("insert", 2, 1, "b", 10))
    target.merge(1, change("update", 1, 2, "a", 20))
    with pytest.raises(MergeRefused, match=r"holds batches up to 1 of query q .*--start-over"):
        target.merge(0, change("snapshot", 1, 2, "a", 30), query="fresh")
    assert target.rows() == {1: (2, "a", 20), 2: (1, "b", 10)}
    verdict = target.merge(0, change("snapshot", 1, 2, "a", 30), query="fresh", start_over=True)
    assert verdict is Verdict.EMPTY_THEN_MERGE
    assert target.rows() == {1: (2, "a", 30)}
    # Once the fresh query's batches are recorded, --start-over left on changes nothing.
    target.merge(1, change("insert", 3, 1, "c", 40), query="fresh", start_over=True)
    assert target.rows() == {1: (2, "a", 30), 3: (1, "c", 40)}


def test_a_failing_batch_leaves_neither_rows_nor_its_record(target, monkeypatch):
    target.merge(0, change("insert", 1, 1, "a", 10))

    def failing(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr("spark_jobs.jobs.merge.target.apply", failing)
    with pytest.raises(RuntimeError, match="boom"):
        target.merge(1, change("delete", 1, None, None, 20), change("insert", 2, 1, "b", 20, 1))
    assert target.rows() == {1: (1, "a", 10)} and target.merger.record().batch_id == 0
    monkeypatch.setattr("spark_jobs.jobs.merge.target.apply", apply_module.apply)
    target.merge(1, change("delete", 1, None, None, 20), change("insert", 2, 1, "b", 20, 1))
    assert target.rows() == {2: (1, "b", 20)} and target.merger.record().batch_id == 1


def test_many_changes_of_one_key_in_a_batch_end_as_the_last_says(target):
    target.merge(0, change("snapshot", 1, 1, "a", 10), change("snapshot", 2, 1, "b", 10))
    target.merge(
        1,
        change("update", 1, 2, "a2", 20),
        change("delete", 1, None, None, 30),
        change("insert", 1, 1, "new", 40),
        change("update", 1, 2, "newer", 50),
        change("update", 2, 2, "b2", 20),
        change("delete", 2, None, None, 60),
        change("insert", 3, 1, "c", 60, 1),
    )
    assert target.rows() == {1: (2, "newer", 50), 3: (1, "c", 60)}


def test_an_unchanged_value_keeps_the_one_the_target_holds(target):
    target.merge(0, change("snapshot", 1, 1, BIG, 10))
    target.merge(1, change("update", 1, 2, None, 20, unchanged=("big note",)))
    assert target.rows() == {1: (2, BIG, 20)}


def test_an_unchanged_value_of_a_key_the_target_lacks_fails_by_name(target):
    """The source reads a moved row again rather than send its insert without a value: one
    that comes all the same would write NULL for the value, and fails the batch instead."""
    target.merge(0, change("snapshot", 1, 1, "a", 10))
    with pytest.raises(MergeError, match=r"key \{'id': 4\}.*has no row of that key"):
        target.merge(1, change("update", 4, 2, None, 20, unchanged=("big note",)))
    with pytest.raises(MergeError, match=r"key \{'id': 7\}.*left a value unsent"):
        target.merge(
            1,
            change("delete", 1, None, None, 20, 0),
            change("insert", 7, 2, None, 20, 1, unchanged=("big note",)),
        )
    assert target.rows() == {1: (1, "a", 10)} and target.merger.record().batch_id == 0


def test_batches_read_in_many_pieces(url, table):
    made = Target(url, table)
    found = [change("snapshot", i, 1, None, 1) for i in range(50)]
    from tests.spark_jobs.jobs.merge.conftest import pieces

    assert len(pieces(*found, size=7)) == 8
    made.merger.merge(lambda: iter(pieces(*found, size=7)), "q", "/ck", 0, False)
    deletes = [change("delete", i, None, None, 2, i) for i in range(0, 50, 2)]
    made.merger.merge(lambda: iter(pieces(*deletes, size=7)), "q", "/ck", 1, False)
    assert sorted(made.rows()) == list(range(1, 50, 2))
    made.merger.close()


def test_columns_that_differ_only_by_case_are_refused_by_sqlite_and_merged_by_postgresql(
    url, table
):
    """SQLite's column names ignore case: its table could not hold "Note" beside note."""
    shape = dataclasses.replace(
        SHAPE,
        columns=(*SHAPE.columns[:2], TableColumn("Big Note", '"Big Note"', 25, "text"),
                 SHAPE.columns[2]),
    )  # fmt: skip
    if url.startswith("sqlite"):
        with pytest.raises(MergeRefused, match="columns 'Big Note' and 'big note' differ only"):
            MergeTarget(url, table, shape, outage_timeout_s=1.0)
        return
    merger = MergeTarget(url, table, shape, outage_timeout_s=1.0)
    try:
        rows = [{"id": 1, "version": 1, "Big Note": "upper", "big note": "lower"}]
        marks = [("insert", 5, 0, AT, [])]
        found = shape.arrow_table(rows, marks).to_batches()
        merger.merge(lambda: iter(found), "q", "/ck", 0, False)
        engine = make_engine(url)
        with engine.connect() as connection:
            held = connection.execute(sa.text(f'SELECT "Big Note", "big note" FROM {table}'))
            assert held.all() == [("upper", "lower")]
        engine.dispose()
    finally:
        merger.close()
