from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from tools.data.cdc_data import Account
from tools.faults.cdc_check import check_changes, kinds_seen, read_changes, replay

AT = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("version", pa.int64()),
        ("balance", pa.int64()),
        ("note", pa.string()),
        ("updated_at", pa.timestamp("us", "UTC")),
        ("_op", pa.string()),
        ("_lsn", pa.int64()),
        ("_seq", pa.int32()),
        ("_commit_time", pa.timestamp("us", "UTC")),
        ("_unchanged", pa.list_(pa.string())),
    ]
)


def change(op, key, version, lsn, seq=0, balance=5, note="n", unchanged=()):
    deleted = op == "delete"
    return {
        "id": key,
        "version": None if deleted else version,
        "balance": None if deleted else balance,
        "note": None if deleted else note,
        "updated_at": None if deleted else AT,
        "_op": op,
        "_lsn": lsn,
        "_seq": seq,
        "_commit_time": None,
        "_unchanged": list(unchanged),
    }


def account(version, balance=5, note="n"):
    return Account(version, balance, note, AT)


#: Keys 1-3 in the snapshot; 1 updated twice, 2 deleted, 3 moved to 5 (its TOASTed note
#: unsent, so key 5 is read again: a snapshot row), 4 inserted; 1 and 4 then updated in one
#: transaction; 5 updated with its note unchanged.
CLEAN = [
    change("snapshot", 1, 1, 100),
    change("snapshot", 2, 3, 100),
    change("snapshot", 3, 1, 100, note="big"),
    change("update", 1, 2, 200, balance=7),
    change("insert", 4, 1, 300),
    change("delete", 2, None, 400),
    change("delete", 3, None, 500, 0),
    change("snapshot", 5, 2, 550, note="big"),
    change("update", 1, 3, 600, 0, balance=9),
    change("update", 4, 2, 600, 1),
    change("update", 5, 3, 700, note=None, unchanged=["note"]),
]
SOURCE = {1: account(3, balance=9), 4: account(2), 5: account(3, note="big")}


def test_a_clean_stream_and_copy_count_nothing():
    found = check_changes(CLEAN, SOURCE, dict(SOURCE))
    assert found.exact, found
    assert (found.rows, found.versions, found.examples) == (3, 9, ())


def test_the_replay_keeps_unchanged_values_and_drops_deleted_keys():
    assert replay(CLEAN) == SOURCE


def test_a_version_missing_inside_a_key_or_at_its_end_is_lost():
    gap = [c for c in CLEAN if (c["id"], c["version"]) != (1, 2)]
    found = check_changes(gap, SOURCE, dict(SOURCE))
    assert (found.lost, found.duplicated, found.stream_differs) == (1, 0, 0)
    assert found.examples[0].startswith("key 1: ")
    # The table's last version of key 4 never reached the stream: the replay differs too.
    end = [c for c in CLEAN if (c["id"], c["version"]) != (4, 2)]
    found = check_changes(end, SOURCE, dict(SOURCE))
    assert (found.lost, found.stream_differs, found.copy_differs) == (1, 1, 0)


def test_a_missing_snapshot_image_or_delete_is_lost():
    no_image = [c for c in CLEAN if (c["_op"], c["id"]) != ("snapshot", 1)]
    assert check_changes(no_image, SOURCE, dict(SOURCE)).lost == 1
    no_delete = [c for c in CLEAN if (c["_op"], c["id"]) != ("delete", 2)]
    found = check_changes(no_delete, SOURCE, dict(SOURCE))
    assert (found.lost, found.stream_differs) == (1, 1)


def test_a_change_emitted_twice_or_a_version_seen_twice_is_duplicated():
    found = check_changes([*CLEAN, CLEAN[3]], SOURCE, dict(SOURCE))
    assert (found.lost, found.duplicated, found.stream_differs) == (0, 1, 0)
    again = change("snapshot", 1, 1, 150)  # a second image of version 1, read later
    found = check_changes([*CLEAN, again], SOURCE, dict(SOURCE))
    assert (found.lost, found.duplicated) == (0, 1)
    deleted_twice = change("delete", 2, None, 450)
    assert check_changes([*CLEAN, deleted_twice], SOURCE, dict(SOURCE)).duplicated == 1


def test_a_copy_that_differs_counts_its_keys():
    copy = {1: account(2, balance=7), 5: account(3, note="big"), 6: account(1)}
    found = check_changes(CLEAN, SOURCE, copy)
    assert (found.lost, found.duplicated, found.stream_differs) == (0, 0, 0)
    assert found.copy_differs == 3  # key 1 old, key 4 missing, key 6 extra
    assert not found.exact
    assert found.examples == (
        "the merged copy: NOT exact: of 3 source rows, 1 missing from the copy, 1 different; "
        "1 extra rows in the copy",
    )


def test_kinds_seen_counts_each_op_and_the_two_key_transactions():
    assert kinds_seen(CLEAN) == {"snapshot": 4, "update": 4, "insert": 1, "delete": 2, "pairs": 1}


def test_read_changes_takes_only_the_batches_written_whole(tmp_path):
    for batch, rows in ((0, CLEAN[:3]), (1, CLEAN[3:]), (2, CLEAN[:1])):
        directory = tmp_path / f"batch_id={batch}"
        directory.mkdir()
        pq.write_table(pa.Table.from_pylist(rows, SCHEMA), directory / "part-0.parquet")
        if batch < 2:  # the last one is still being written
            (directory / "_SUCCESS").touch()
    assert read_changes(tmp_path) == CLEAN


def test_a_change_after_a_delete_or_a_late_snapshot_image_is_out_of_order():
    # Key 4 deleted between its two versions: each version is there once and the replay
    # ends right, but no history of one row reads so.
    early_delete = change("delete", 4, None, 350)
    found = check_changes([*CLEAN, early_delete], SOURCE, dict(SOURCE))
    assert (found.lost, found.duplicated, found.stream_differs) == (0, 0, 1)
    assert found.examples[0].startswith("key 4: ")
    late_image = change("snapshot", 4, 2, 700)  # after the update that made version 2
    found = check_changes(
        [c for c in CLEAN if (c["id"], c["version"]) != (4, 2)] + [late_image],
        SOURCE,
        dict(SOURCE),
    )
    assert (found.lost, found.duplicated, found.stream_differs) == (0, 0, 1)
