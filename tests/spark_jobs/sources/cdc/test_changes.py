from datetime import UTC, datetime

import pytest

from spark_jobs.sources.cdc.changes import ChangeStreamError, RelationCache, RowChange
from spark_jobs.sources.cdc.messages import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    Relation,
    Truncate,
    Type,
    Update,
)
from tests.spark_jobs.sources.cdc.conftest import Transaction, transactions

T1 = datetime(2026, 11, 25, 1, tzinfo=UTC)
T2 = datetime(2026, 11, 25, 2, tzinfo=UTC)
ACCOUNTS = Relation(
    10,
    "public",
    "accounts",
    "d",
    (Column(1, "id", 23, -1), Column(0, "name", 25, -1), Column(0, "notes", 25, -1)),
)


def test_changes_are_named_by_their_relations_columns():
    cache = RelationCache()
    cache.add(ACCOUNTS)
    assert cache.row_change(Insert(10, ("1", "a", None))) == RowChange(
        "insert", ACCOUNTS, {"id": "1", "name": "a", "notes": None}
    )
    assert cache.row_change(Update(10, ("1", "b", UNCHANGED))) == RowChange(
        "update", ACCOUNTS, {"id": "1", "name": "b", "notes": UNCHANGED}
    )


def test_a_key_tuple_keeps_only_the_key_columns():
    cache = RelationCache()
    cache.add(ACCOUNTS)
    moved = cache.row_change(Update(10, ("2", "a", UNCHANGED), key=("1", None, None)))
    assert moved.old == {"id": "1"}
    assert cache.row_change(Delete(10, key=("2", None, None))) == RowChange(
        "delete", ACCOUNTS, None, {"id": "2"}
    )


def test_an_old_row_keeps_every_column():
    cache = RelationCache()
    cache.add(ACCOUNTS)
    assert cache.row_change(Delete(10, old=("2", "a", None))).old == {
        "id": "2",
        "name": "a",
        "notes": None,
    }


def test_a_later_relation_message_replaces_the_earlier():
    cache = RelationCache()
    cache.add(ACCOUNTS)
    renamed = Relation(10, "public", "accounts", "d", (Column(1, "key", 23, -1),))
    cache.add(renamed)
    assert cache.row_change(Insert(10, ("1",))).new == {"key": "1"}


def test_a_change_of_an_unknown_relation_is_an_error():
    with pytest.raises(ChangeStreamError, match="relation id 11 came before any Relation"):
        RelationCache().row_change(Insert(11, ("1",)))


def test_values_that_do_not_fit_the_columns_are_an_error():
    cache = RelationCache()
    cache.add(ACCOUNTS)
    with pytest.raises(ChangeStreamError, match=r"public\.accounts has 2 values for 3 columns"):
        cache.row_change(Insert(10, ("1", "a")))


def test_messages_group_into_transactions_that_end_at_their_commits_end():
    messages = [
        Begin(0x1F0, T1, 700),
        Origin(5, "elsewhere"),
        ACCOUNTS,
        Type(16400, "public", "mood"),
        Insert(10, ("1", "a", None)),
        Truncate(1, (10,)),
        Commit(0, 0x1F0, 0x220, T1),
        Begin(0x300, T2, 701),
        Delete(10, key=("1", None, None)),
        Commit(0, 0x300, 0x330, T2),
    ]
    assert transactions(messages, RelationCache()) == [
        Transaction(
            700,
            0x220,
            T1,
            (
                RowChange("insert", ACCOUNTS, {"id": "1", "name": "a", "notes": None}),
                Truncate(1, (10,)),
            ),
        ),
        Transaction(701, 0x330, T2, (RowChange("delete", ACCOUNTS, None, {"id": "1"}),)),
    ]


def test_the_cache_outlives_one_call():
    cache = RelationCache()
    transactions([Begin(1, T1, 1), ACCOUNTS, Commit(0, 1, 2, T1)], cache)
    (later,) = transactions(
        [Begin(3, T2, 2), Insert(10, ("1", "a", None)), Commit(0, 3, 4, T2)], cache
    )
    assert later.changes[0].relation == ACCOUNTS


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        (
            [Begin(1, T1, 7), Insert(10, ("1", "a", None))],
            r"end inside transaction 7 \(final LSN 0/1\)",
        ),
        ([Insert(10, ("1", "a", None))], "Insert message outside a transaction"),
        ([Commit(0, 1, 2, T1)], "Commit message outside a transaction"),
        ([Begin(1, T1, 7), Begin(2, T1, 8)], "transaction 8 began inside 7"),
    ],
)
def test_messages_that_are_not_whole_transactions_are_an_error(messages, problem):
    cache = RelationCache()
    cache.add(ACCOUNTS)
    with pytest.raises(ChangeStreamError, match=problem):
        transactions(messages, cache)


def test_a_logical_message_is_a_position_inside_its_transaction_and_skipped_outside():
    """A heartbeat (transactional) leaves a transaction with no change, whose end a batch
    may stop at; another job's non-transactional message is no transaction at all."""
    messages = [
        LogicalMessage(False, 0x100, "elsewhere", b""),
        Begin(0x1F0, T1, 700),
        LogicalMessage(True, 0x1F0, "backlog.position.s", b"heartbeat"),
        Commit(0, 0x1F0, 0x220, T1),
    ]
    assert transactions(messages, RelationCache()) == [Transaction(700, 0x220, T1, ())]
