import json
from urllib.parse import quote

from spark_jobs.coordinator.file_source_probe import PROBE_FILES, FileSourceProbe
from spark_jobs.coordinator.progress import BatchProgress
from tests.spark_jobs.coordinator.conftest import recorded


def spark_log(checkpoint, name, entries):
    """A file in Spark's FileStreamSourceLog format: a version line, then one JSON per file."""
    directory = checkpoint / "sources" / "0"
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [
        json.dumps({"path": path, "timestamp": 1, "batchId": batch}) for path, batch in entries
    ]
    (directory / name).write_text("\n".join(lines))


def test_pending_files_are_those_not_yet_in_the_source_log(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(6):
        (inputs / f"{i}.json").write_text("{}\n")
    (inputs / "_temporary").write_text("")
    uri = f"file://{inputs}"
    spark_log(tmp_path / "ck", "0", [(f"{uri}/0.json", 0), (f"{uri}/1.json", 0)])
    spark_log(
        tmp_path / "ck",
        "1.compact",
        [(f"{uri}/0.json", 0), (f"{uri}/1.json", 0), (f"{uri}/2.json", 1)],
    )
    probe = FileSourceProbe("files", str(inputs), str(tmp_path / "ck"), pending_files_threshold=2)
    assert probe.pending_files() == 3
    status = probe.status()
    assert (status.is_backlog, status.lag, status.rule) == (
        True,
        {"files_behind": 3},
        "pending-files",
    )
    spark_log(tmp_path / "ck", "2", [(f"{uri}/3.json", 2)])
    assert probe.status().is_backlog is False  # 2 waiting is not more than the threshold


def test_rows_per_file_is_learnt_from_progress(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    uri = f"file://{inputs}"
    for i in range(4):
        (inputs / f"{i}.json").write_text("{}\n")
    spark_log(tmp_path / "ck", "0", [(f"{uri}/0.json", 0), (f"{uri}/1.json", 0)])
    probe = FileSourceProbe("files", str(inputs), str(tmp_path / "ck"), pending_files_threshold=9)
    assert probe.rows_per_file() is None
    progress = BatchProgress.from_json(recorded("file_source"))  # batch 0 read 2 rows
    probe.observe(progress)
    assert probe.rows_per_file() == 1.0
    probe.observe(progress)  # observing again weighs the same batch again, not more
    assert probe.rows_per_file() == 1.0


def test_backlog_batches_are_capped_in_files_from_rows_per_file(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    uri = f"file://{inputs}"
    spark_log(tmp_path / "ck", "0", [(f"{uri}/0.json", 0), (f"{uri}/1.json", 0)])
    probe = FileSourceProbe("files", str(inputs), str(tmp_path / "ck"), pending_files_threshold=9)
    # Before any batch: a few files, whatever the rows asked for.
    assert probe.limit_options(1_000_000) == {"maxFilesPerTrigger": str(PROBE_FILES)}
    probe.observe(BatchProgress.from_json(recorded("file_source")))  # 2 rows in 2 files
    assert probe.rows_per_file() == 1.0
    assert probe.limit_options(45) == {"maxFilesPerTrigger": "45"}
    big = json.loads(recorded("file_source"))
    big["sources"][0]["numInputRows"] = 2_000  # this batch: 1000 rows per file
    probe.observe(BatchProgress.from_json(json.dumps(big)))
    assert probe.rows_per_file() == 2002 / 4
    assert probe.limit_options(45_500) == {"maxFilesPerTrigger": "90"}  # 45500 / 500.5
    assert probe.limit_options(10) == {"maxFilesPerTrigger": "1"}  # never none


def test_files_match_however_spark_spells_their_paths(tmp_path):
    inputs = tmp_path / "in put"
    inputs.mkdir()
    for name in ("a b.json", "c%d.json", "e.json"):
        (inputs / name).write_text("{}\n")
    spark_log(
        tmp_path / "ck",
        "0",
        [(f"file:{quote(str(inputs))}/a%20b.json", 0), (f"file://{inputs}/c%25d.json", 0)],
    )
    probe = FileSourceProbe("files", str(inputs), str(tmp_path / "ck"), pending_files_threshold=9)
    assert probe.pending_files() == 1
