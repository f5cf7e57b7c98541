import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.jobs.merge.record import MergeRefused, Record, Verdict, judge, query_id

OURS = Record("q1", "/ck/a", 7)


@pytest.mark.parametrize(
    ("record", "query", "batch", "start_over", "verdict"),
    [
        (None, "q1", 0, False, Verdict.MERGE),
        (None, "q1", 0, True, Verdict.MERGE),
        (OURS, "q1", 8, False, Verdict.MERGE),
        (OURS, "q1", 7, False, Verdict.SKIP),
        (OURS, "q1", 3, False, Verdict.SKIP),
        (OURS, "q1", 3, True, Verdict.SKIP),
        (OURS, "q2", 0, True, Verdict.EMPTY_THEN_MERGE),
    ],
)
def test_a_batch_is_merged_skipped_or_merged_into_an_emptied_table(
    record, query, batch, start_over, verdict
):
    assert judge(record, query, batch, start_over, "copy", "/ck/b") is verdict


@pytest.mark.parametrize("batch", [0, 7, 8])
def test_a_batch_of_another_query_is_refused_naming_both(batch):
    with pytest.raises(MergeRefused) as refused:
        judge(OURS, "q2", batch, False, "copy", "/ck/b")
    message = str(refused.value)
    for named in ("copy", "batches up to 7 of query q1", "/ck/a", "q2", "/ck/b", "--start-over"):
        assert named in message


@pytest.mark.parametrize("start_over", [False, True])
def test_a_batch_that_does_not_follow_the_last_one_the_table_holds_is_refused(start_over):
    """The table lacks batches of this query: restored from a backup, given to a checkpoint
    that ran before without it, or made again since (its OID). No --start-over helps."""
    cases = [
        (OURS, 9, None, "holds batches up to 7 of this query q1 (checkpoint /ck/b), not batch 8"),
        (None, 12, None, "holds no batch of this query q1 (checkpoint /ck/b), whose batches 0"),
        (Record("q1", "/ck/a", 7, 4242), 8, 4343, "was made again since batch 7"),
    ]
    for record, batch, oid, said in cases:
        with pytest.raises(MergeRefused, match=re.escape(said)) as refused:
            judge(record, "q1", batch, start_over, "copy", "/ck/b", oid)
        assert "a new --checkpoint" in str(refused.value)
    assert judge(Record("q1", "/ck/a", 7, 4242), "q1", 8, start_over, "c", "/ck", 4242).name == (
        "MERGE"
    )


def test_start_over_empties_a_table_only_at_a_query_s_first_batch():
    """A query left running with --start-over must not empty a table another query started
    over into meanwhile (it would keep one batch of changes, losing the rest)."""
    theirs = Record("q2", "/ck/c", 3)
    with pytest.raises(MergeRefused, match="only at a query's first batch, not at batch 9"):
        judge(theirs, "q1", 9, True, "copy", "/ck/b")


@given(
    st.lists(
        st.tuples(st.sampled_from(["q1", "q2"]), st.integers(0, 6), st.booleans()), max_size=40
    )
)
def test_whatever_batches_arrive_the_table_holds_one_query_s_batches_from_0_on_once(arrivals):
    """Batches of two queries arrive in any order (replays, restarts, a query left running
    beside another started over), each with or without --start-over: a table that applies
    each verdict holds, at every step, batches 0 to k of a single query, each once."""
    held: list[tuple[str, int]] = []
    record = None
    for query, batch, start_over in arrivals:
        try:
            verdict = judge(record, query, batch, start_over, "copy", "/ck")
        except MergeRefused:
            continue
        if verdict is Verdict.SKIP:
            assert (query, batch) in held
            continue
        if verdict is Verdict.EMPTY_THEN_MERGE:
            held = []
        held.append((query, batch))
        record = Record(query, "/ck", batch)
        assert held == [(query, b) for b in range(batch + 1)], held


def test_the_query_id_is_the_one_spark_keeps_in_the_checkpoint(tmp_path):
    assert query_id(str(tmp_path)) is None
    (tmp_path / "metadata").write_text(json.dumps({"id": "5d1e"}) + "\n")
    assert query_id(str(tmp_path)) == "5d1e"
