import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from spark_jobs.sources.children import Limits, SourceContext
from spark_jobs.sources.file_manifest import FileManifest
from spark_jobs.sources.file_reading import InputFileError
from spark_jobs.sources.files import BoundedFiles, LandingFiles
from spark_jobs.storage.files import StateDirectory, StorageError, list_files, resolve_uri
from tests.spark_jobs.sources.conftest import SPARK_SCHEMA, arrow_table, land, write_file

SCHEMA = to_arrow_schema(SPARK_SCHEMA, timezone="UTC")


def context(tmp_path, rows_per_partition=250_000):
    return SourceContext(SCHEMA, str(tmp_path / "state"), rows_per_partition)


def bounded(tmp_path, fmt="parquet", **spec):
    spec = {"name": "history", "path": str(tmp_path / "history"), "format": fmt, **spec}
    return BoundedFiles.from_spec(spec, context(tmp_path))


def landing(tmp_path, fmt="json", **spec):
    spec = {"name": "landing", "path": str(tmp_path / "landing"), "format": fmt, **spec}
    return LandingFiles.from_spec(spec, context(tmp_path))


def read_ids(child, start, end) -> list[int]:
    ids = []
    for partition in child.partitions(start, end):
        for batch in partition.read(SCHEMA):
            assert batch.schema == SCHEMA
            ids.extend(batch.column("event_id").to_pylist())
    return ids


def test_paths_become_absolute_uris_for_executors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_uri("data/in") == f"file://{tmp_path}/data/in"
    assert resolve_uri("my data/in") == f"file://{tmp_path}/my%20data/in"
    assert resolve_uri("s3://bucket/in/") == "s3://bucket/in"
    assert resolve_uri("s3a://bucket/in") == "s3://bucket/in"  # Hadoop's name for S3


def test_names_with_spaces_and_percent_signs_are_read(tmp_path):
    directory = tmp_path / "odd dir"
    write_file(directory, "a b%.json", "json", 0, 3)
    spec = {"name": "odd", "path": str(directory), "format": "json"}
    child = LandingFiles.from_spec(spec, context(tmp_path))
    end = child.plan(child.initial_position(), Limits()).end
    assert read_ids(child, child.initial_position(), end) == [0, 1, 2]


def test_listing_skips_hidden_and_metadata_files_and_applies_the_glob(tmp_path):
    for name in ("a.json", ".a.json.tmp", "_SUCCESS", "b.json", "notes.txt"):
        (tmp_path / name).write_text("{}\n")
    names = [e.uri.rsplit("/", 1)[1] for e in list_files(resolve_uri(str(tmp_path)), "*.json")]
    assert sorted(names) == ["a.json", "b.json"]


def test_listing_a_missing_directory_names_it(tmp_path):
    with pytest.raises(StorageError, match=f"input directory file://{tmp_path}/nope does not"):
        list_files(resolve_uri(str(tmp_path / "nope")), "*")


@pytest.mark.parametrize("fmt", ["parquet", "json", "csv"])
def test_a_bounded_directory_is_read_whole_and_in_name_order(tmp_path, fmt):
    write_file(tmp_path / "history", f"b.{fmt}", fmt, 100, 50)
    write_file(tmp_path / "history", f"a.{fmt}", fmt, 0, 100)
    child = bounded(tmp_path, fmt)
    start = child.initial_position()
    planned = child.plan(start, Limits())
    assert planned.end == {"file": 2, "row": 0}
    assert (planned.lag, planned.rows) == ({"files_behind": 0, "rows_behind": 0}, 150)
    assert child.is_exhausted(planned.end)
    assert read_ids(child, start, planned.end) == list(range(150))


def test_timestamps_read_back_exactly_from_every_format(tmp_path):
    for fmt in ("parquet", "json", "csv"):
        write_file(tmp_path / fmt, f"x.{fmt}", fmt, 5, 2)
        spec = {"name": fmt, "path": str(tmp_path / fmt), "format": fmt}
        child = BoundedFiles.from_spec(spec, context(tmp_path))
        end = child.plan(child.initial_position(), Limits()).end
        [partition] = child.partitions(child.initial_position(), end)
        table = pa.Table.from_batches(list(partition.read(SCHEMA)))
        assert table.column("event_time").to_pylist()[1].isoformat() == (
            "2026-11-01T00:00:06+00:00"
        ), fmt


def test_row_limits_split_files_exactly_and_batches_tile_the_input(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 2500, row_group=1000)
    write_file(tmp_path / "history", "b.parquet", "parquet", 2500, 700)
    child = bounded(tmp_path)
    position, seen, sizes = child.initial_position(), [], []
    while not child.is_exhausted(position):
        end = child.plan(position, Limits(max_rows=900)).end
        batch = read_ids(child, position, end)
        sizes.append(len(batch))
        seen.extend(batch)
        position = end
    assert sizes == [900, 900, 900, 500]
    assert seen == list(range(3200))


def test_file_limits_count_files(tmp_path):
    for i in range(5):
        write_file(tmp_path / "history", f"{i}.parquet", "parquet", i * 10, 10)
    child = bounded(tmp_path)
    planned = child.plan(child.initial_position(), Limits(max_files=2))
    assert planned.end == {"file": 2, "row": 0}
    assert planned.lag == {"files_behind": 3}


def test_partitions_pack_slices_up_to_the_rows_per_task(tmp_path):
    for i in range(6):
        write_file(tmp_path / "history", f"{i}.parquet", "parquet", i * 100, 100)
    spec = {"name": "history", "path": str(tmp_path / "history")}
    child = BoundedFiles.from_spec(spec, context(tmp_path, rows_per_partition=250))
    end = child.plan(child.initial_position(), Limits()).end
    parts = child.partitions(child.initial_position(), end)
    assert [sum(s.stop - s.start for s in p.slices) for p in parts] == [200, 200, 200]


def test_the_bounded_snapshot_survives_a_restart_and_ignores_later_files(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 10)
    first = bounded(tmp_path)
    end = first.plan(first.initial_position(), Limits(max_rows=4)).end
    write_file(tmp_path / "history", "0-late.parquet", "parquet", 1000, 10)
    again = bounded(tmp_path)  # a new planner process after a restart
    assert read_ids(again, first.initial_position(), end) == [0, 1, 2, 3]
    assert again.plan(end, Limits()).end == {"file": 1, "row": 0}


def test_a_planning_writes_the_files_it_admits_as_one_segment(tmp_path):
    for i in range(5):
        write_file(tmp_path / "history", f"{i}.parquet", "parquet", i * 10, 10)
    child = bounded(tmp_path)
    first = child.plan(child.initial_position(), Limits(max_rows=25)).end
    end = child.plan(first, Limits()).end
    state = sorted(p.name for p in (tmp_path / "state" / "history").iterdir())
    assert [n for n in state if n.endswith(".manifest.json")] == [
        "0000000000.manifest.json",  # files 0-2, reached by the first batch
        "0000000001.manifest.json",  # files 3-4
    ]
    again = bounded(tmp_path)  # a restart replays both batches from the manifest
    assert read_ids(again, again.initial_position(), end) == list(range(50))


def test_an_empty_bounded_directory_ends_at_once(tmp_path):
    (tmp_path / "history").mkdir()
    child = bounded(tmp_path)
    assert child.is_exhausted(child.initial_position())


def test_landing_admits_files_in_arrival_order_and_only_once(tmp_path):
    directory = tmp_path / "landing"
    land(directory, "z.json", "json", 0, 3, mtime=1000)
    land(directory, "a.json", "json", 3, 2, mtime=1001)
    child = landing(tmp_path)
    start = child.initial_position()
    end = child.plan(start, Limits()).end
    assert read_ids(child, start, end) == [0, 1, 2, 3, 4]
    assert not child.is_exhausted(end)
    assert child.plan(end, Limits()).end == end  # nothing new
    land(directory, "m.json", "json", 5, 1, mtime=900)  # late arrival with an old mtime
    (directory / ".inflight.json.tmp").write_text("{broken")
    later = child.plan(end, Limits()).end
    assert read_ids(child, end, later) == [5]


def test_landing_manifest_replays_identically_in_a_new_process(tmp_path):
    land(tmp_path / "landing", "1.json", "json", 0, 4, mtime=1)
    child = landing(tmp_path)
    end = child.plan(child.initial_position(), Limits(max_rows=3)).end
    land(tmp_path / "landing", "0.json", "json", 100, 4, mtime=2)
    replay = landing(tmp_path)
    assert read_ids(replay, replay.initial_position(), end) == [0, 1, 2]


def test_a_malformed_landing_file_is_refused_by_name_before_it_is_admitted(tmp_path):
    land(tmp_path / "landing", "good.json", "json", 0, 2, mtime=1)
    bad = tmp_path / "landing" / "bad.json"
    bad.write_text('{"event_id": 5}\n{not json\n')
    os.utime(bad, ns=(2 * 10**9, 2 * 10**9))
    child = landing(tmp_path)
    with pytest.raises(InputFileError, match=f"cannot read json input file file://{bad}"):
        child.plan(child.initial_position(), Limits())
    state = StateDirectory(resolve_uri(str(tmp_path / "state" / "landing")))
    assert FileManifest(state).entries == []
    bad.unlink()
    end = child.plan(child.initial_position(), Limits()).end
    assert read_ids(child, child.initial_position(), end) == [0, 1]


def test_a_malformed_bounded_file_is_named_and_can_be_repaired_in_place(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 5)
    (tmp_path / "history" / "b.parquet").write_bytes(b"not parquet at all")
    write_file(tmp_path / "history", "c.parquet", "parquet", 10, 5)
    child = bounded(tmp_path)
    first = child.plan(child.initial_position(), Limits(max_rows=5)).end
    assert read_ids(child, child.initial_position(), first) == [0, 1, 2, 3, 4]
    with pytest.raises(InputFileError, match=r"cannot read parquet input file .*/b\.parquet"):
        child.plan(first, Limits())
    write_file(tmp_path / "history", "b.parquet", "parquet", 5, 5)  # repaired
    restarted = bounded(tmp_path)
    end = restarted.plan(first, Limits()).end
    assert read_ids(restarted, first, end) == list(range(5, 15))


def test_a_file_changed_after_admission_fails_the_read_by_name(tmp_path):
    path = write_file(tmp_path / "history", "a.json", "json", 0, 3)
    child = bounded(tmp_path, "json")
    end = child.plan(child.initial_position(), Limits()).end
    with path.open("a") as handle:
        handle.write('{"event_id": 99}\n')
    with pytest.raises(InputFileError, match="changed after it was admitted"):
        read_ids(child, child.initial_position(), end)


def test_a_file_rewritten_at_the_same_size_fails_the_read_by_name(tmp_path):
    path = write_file(tmp_path / "history", "a.json", "json", 0, 3)
    child = bounded(tmp_path, "json")
    end = child.plan(child.initial_position(), Limits()).end
    path.write_text(path.read_text().replace('"a0"', '"b0"'))  # same length, other data
    with pytest.raises(InputFileError, match=r"a\.json changed after it was admitted"):
        read_ids(child, child.initial_position(), end)


def test_state_kept_for_another_input_is_refused(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 3)
    write_file(tmp_path / "other", "a.parquet", "parquet", 0, 3)
    first = bounded(tmp_path)
    first.plan(first.initial_position(), Limits())
    moved = bounded(tmp_path, path=str(tmp_path / "other"))
    with pytest.raises(StorageError, match=r"was kept for .*history.* but this query reads"):
        moved.plan(moved.initial_position(), Limits())


def test_offsets_beyond_the_state_mean_the_state_was_lost(tmp_path):
    land(tmp_path / "landing", "1.json", "json", 0, 4, mtime=1)
    child = landing(tmp_path)
    end = child.plan(child.initial_position(), Limits()).end
    shutil.rmtree(tmp_path / "state")
    fresh = landing(tmp_path)
    with pytest.raises(InputFileError, match="the state location was lost or replaced"):
        fresh.plan(end, Limits())
    with pytest.raises(InputFileError, match="the state location was lost or replaced"):
        fresh.partitions(fresh.initial_position(), end)


def test_a_missing_column_is_named(tmp_path):
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "a.csv").write_text("event_id,account\n1,x\n")
    child = bounded(tmp_path, "csv")
    with pytest.raises(InputFileError, match=r"a\.csv.*amount"):
        child.plan(child.initial_position(), Limits())


def test_the_landing_manifest_compacts_and_keeps_every_position(tmp_path, monkeypatch):
    monkeypatch.setattr(FileManifest, "COMPACT_EVERY", 4)
    child = landing(tmp_path)
    position = child.initial_position()
    for index in range(10):  # one discovery, one segment per file
        land(tmp_path / "landing", f"{index}.json", "json", index * 2, 2, mtime=index + 1)
        end = child.plan(position, Limits()).end
        assert read_ids(child, position, end) == [index * 2, index * 2 + 1]
        position = end
    state = sorted(p.name for p in (tmp_path / "state" / "landing").iterdir())
    # segments 0-2 went into compacted file 3, and 3-6 into 7; 8 and 9 follow it
    assert [n for n in state if "manifest" in n or "compact" in n] == [
        "0000000007.compact.json",
        "0000000008.manifest.json",
        "0000000009.manifest.json",
    ]
    again = landing(tmp_path)  # a restart reads the same manifest
    assert read_ids(again, again.initial_position(), position) == list(range(20))
    land(tmp_path / "landing", "10.json", "json", 20, 2, mtime=11)
    assert again.plan(position, Limits()).end == {"file": 11, "row": 0}
    assert "0000000010.manifest.json" in os.listdir(tmp_path / "state" / "landing")


def land_and_read(child, tmp_path, files: range, position, *, commit: bool):
    """Land one two-event file a planning (named and modified at its number, in seconds),
    read each batch, and tell the child Spark committed it when ``commit``."""
    for index in files:
        land(tmp_path / "landing", f"{index}.json", "json", index * 2, 2, mtime=index + 1)
        end = child.plan(position, Limits()).end
        assert read_ids(child, position, end) == [index * 2, index * 2 + 1]
        if commit:
            child.commit(end)
        position = end
    return position


def compacted(tmp_path) -> dict:
    state = tmp_path / "state" / "landing"
    (name,) = [p for p in state.iterdir() if p.name.endswith(".compact.json")]
    return json.loads(name.read_text())


def test_compaction_forgets_committed_landing_files_older_than_the_max_file_age(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(FileManifest, "COMPACT_EVERY", 4)
    child = landing(tmp_path, maxFileAge="5s")
    position = land_and_read(child, tmp_path, range(10), child.initial_position(), commit=True)
    # At compaction 7 the newest file was modified at 8 s: files 0 and 1 (1 s, 2 s) are
    # more than 5 s older and committed; file 2 (3 s) is not older than 5 s.
    kept = compacted(tmp_path)
    assert kept["first"] == 2
    names = [entry["uri"].rsplit("/", 1)[1] for entry in kept["entries"]]
    assert names == [f"{i}.json" for i in range(2, 8)]

    again = landing(tmp_path, maxFileAge="5s")  # a restart keeps positions absolute
    assert (again.manifest.first, again.manifest.count) == (2, 10)
    assert read_ids(again, {"file": 2, "row": 0}, position) == list(range(4, 20))
    with pytest.raises(InputFileError, match="has forgotten the files before 2"):
        again.partitions(again.initial_position(), position)
    # 0.json and 1.json are still in the directory: taken as seen, not admitted again. A file
    # landing now with an old modification time is taken as seen too (Spark's maxFileAge);
    # one within the age is admitted.
    land(tmp_path / "landing", "late.json", "json", 100, 2, mtime=4)
    land(tmp_path / "landing", "recent.json", "json", 200, 2, mtime=6)
    end = again.plan(position, Limits()).end
    assert end == {"file": 11, "row": 0}
    assert read_ids(again, position, end) == [200, 201]


def test_landing_files_are_forgotten_only_once_spark_committed_past_them(tmp_path, monkeypatch):
    monkeypatch.setattr(FileManifest, "COMPACT_EVERY", 4)
    child = landing(tmp_path, maxFileAge="1s")
    land_and_read(child, tmp_path, range(8), child.initial_position(), commit=False)
    assert compacted(tmp_path)["first"] == 0
    child.commit({"file": 5, "row": 1})  # file 5 is read in part: it stays
    land_and_read(child, tmp_path, range(8, 12), {"file": 8, "row": 0}, commit=False)
    assert compacted(tmp_path)["first"] == 5


def test_a_compacted_manifest_of_an_earlier_release_keeps_every_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(FileManifest, "COMPACT_EVERY", 4)
    child = landing(tmp_path)
    position = land_and_read(child, tmp_path, range(4), child.initial_position(), commit=True)
    (path,) = (tmp_path / "state" / "landing").glob("*.compact.json")
    path.write_text(json.dumps(compacted(tmp_path)["entries"]))  # the list it used to write
    again = landing(tmp_path)
    assert (again.manifest.first, again.manifest.count) == (0, 4)
    assert read_ids(again, again.initial_position(), position) == list(range(8))


def test_two_writers_of_one_manifest_fail_instead_of_overwriting(tmp_path):
    land(tmp_path / "landing", "1.json", "json", 0, 2, mtime=1)
    first, second = landing(tmp_path), landing(tmp_path)
    first.plan(first.initial_position(), Limits())
    second.manifest.entries  # noqa: B018 - loaded before the first writer appends again
    land(tmp_path / "landing", "2.json", "json", 2, 2, mtime=2)
    first.plan(first.initial_position(), Limits())
    land(tmp_path / "landing", "3.json", "json", 4, 2, mtime=3)
    with pytest.raises(StorageError, match="two drivers are using one state location"):
        second.plan(second.initial_position(), Limits())


def test_a_parquet_file_whose_column_types_do_not_match_is_refused_by_name(tmp_path):
    # Casting the footer's empty table accepted this file; reading it failed much later,
    # or worse, read the text as numbers.
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 3)
    table = arrow_table(3, 3)
    table = table.set_column(2, "amount", table.column("amount").cast(pa.string()))
    table = table.set_column(0, "event_id", table.column("event_id").cast(pa.uint64()))
    pq.write_table(table, tmp_path / "history" / "b.parquet")
    child = bounded(tmp_path)
    first = child.plan(child.initial_position(), Limits(max_rows=3)).end
    with pytest.raises(
        InputFileError,
        match=r"cannot read parquet input file .*/b\.parquet: column types do not match the "
        r"schema: event_id is uint64, not int64; amount is string, not double",
    ):
        child.plan(first, Limits())


def test_parquet_columns_of_narrower_or_equivalent_types_are_read(tmp_path):
    table = arrow_table(0, 3)
    table = table.set_column(0, "event_id", table.column("event_id").cast(pa.int32()))
    table = table.set_column(1, "account", table.column("account").cast(pa.large_string()))
    table = table.set_column(2, "amount", table.column("amount").cast(pa.float32()))
    table = table.set_column(3, "event_time", table.column("event_time").cast(pa.timestamp("ms")))
    (tmp_path / "history").mkdir()
    pq.write_table(table, tmp_path / "history" / "a.parquet")
    child = bounded(tmp_path)
    end = child.plan(child.initial_position(), Limits()).end
    assert read_ids(child, child.initial_position(), end) == [0, 1, 2]


def test_with_a_quarantine_malformed_files_are_set_aside_and_the_rest_is_read(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 3)
    (tmp_path / "history" / "b.parquet").write_bytes(b"not parquet at all")
    table = arrow_table(3, 3)
    pq.write_table(
        table.set_column(2, "amount", table.column("amount").cast(pa.string())),
        tmp_path / "history" / "c.parquet",
    )
    write_file(tmp_path / "history", "d.parquet", "parquet", 6, 3)
    location = resolve_uri(str(tmp_path / "bad"))
    spec = {"name": "history", "path": str(tmp_path / "history"), "format": "parquet"}
    quarantined = SourceContext(SCHEMA, str(tmp_path / "state"), 250_000, "events", location)
    child = BoundedFiles.from_spec(spec, quarantined)
    start = child.initial_position()
    planned = child.plan(start, Limits())
    assert planned.end == {"file": 4, "row": 0} and planned.rows == 6
    assert read_ids(child, start, planned.end) == [0, 1, 2, 6, 7, 8]
    set_aside = tmp_path / "bad" / "events" / "history" / "files"
    reasons = {path.name: json.loads(path.read_text()) for path in sorted(set_aside.iterdir())}
    assert list(reasons) == [f"{1:012d}.jsonl", f"{2:012d}.jsonl"]
    assert reasons[f"{1:012d}.jsonl"]["position"]["file"].endswith("/b.parquet")
    assert "amount is string, not double" in reasons[f"{2:012d}.jsonl"]["reason"]
    # A restart plans from the manifest: the files stay set aside, positions unchanged.
    again = BoundedFiles.from_spec(spec, quarantined)
    assert again.plan(start, Limits()).end == planned.end
    assert read_ids(again, start, planned.end) == [0, 1, 2, 6, 7, 8]


def test_admitting_parquet_files_leaves_pandas_out_of_the_planner_process(tmp_path):
    write_file(tmp_path / "history", "a.parquet", "parquet", 0, 10)
    script = (
        "import sys\n"
        "from tests.spark_jobs.sources.test_files import Limits, bounded\n"
        f"child = bounded(__import__('pathlib').Path({str(tmp_path)!r}))\n"
        "assert child.plan(child.initial_position(), Limits()).rows == 10\n"
        "print('pandas' in sys.modules)\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert found.stdout.strip() == "False"  # importing it costs 0.5-1.3 s per query start
