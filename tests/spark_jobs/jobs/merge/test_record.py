import json

import pytest

from spark_jobs.jobs.merge.record import MergeRefused, Record, Verdict, judge, query_id

OURS = Record("q1", "/ck/a", 7)


@pytest.mark.parametrize(
    ("record", "query", "batch", "start_over", "verdict"),
    [
        (None, "q1", 0, False, Verdict.MERGE),
        (None, "q1", 12, False, Verdict.MERGE),
        (OURS, "q1", 8, False, Verdict.MERGE),
        (OURS, "q1", 7, False, Verdict.SKIP),
        (OURS, "q1", 3, False, Verdict.SKIP),
        (OURS, "q1", 3, True, Verdict.SKIP),
        (OURS, "q2", 0, True, Verdict.EMPTY_THEN_MERGE),
        (OURS, "q2", 9, True, Verdict.EMPTY_THEN_MERGE),
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


def test_the_query_id_is_the_one_spark_keeps_in_the_checkpoint(tmp_path):
    assert query_id(str(tmp_path)) is None
    (tmp_path / "metadata").write_text(json.dumps({"id": "5d1e"}) + "\n")
    assert query_id(str(tmp_path)) == "5d1e"
