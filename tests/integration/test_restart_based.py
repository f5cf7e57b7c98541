"""Restart-based mode on Spark's built-in file source: the trigger switches at the
transition, and the output is exactly-once."""

import itertools
import json
import statistics
import threading
import time

import pyarrow.dataset as ds
from pyspark.sql.streaming import DataStreamWriter

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.coordinator.appliers import TriggerSettings
from spark_jobs.coordinator.file_source_probe import FileSourceProbe
from spark_jobs.coordinator.runtime import BacklogRuntime
from tests.integration.jobs import JobDirs, batch_starts, checkpoints, transitions


def write_json_file(directory, index, rows):
    lines = [json.dumps({"id": index * 1000 + i, "file": index}) for i in range(rows)]
    temporary = directory / f".f{index:05d}.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    temporary.rename(directory / f"f{index:05d}.json")


def test_the_file_source_switches_its_trigger_at_the_transition(spark, tmp_path):
    dirs = JobDirs(tmp_path)
    inputs = tmp_path / "in put"  # Spark logs this path percent-encoded; the probe must match it
    inputs.mkdir()
    for index in range(60):
        write_json_file(inputs, index, 50)
    config = BacklogConfig.from_spark_conf(
        {
            "spark.backlog.job-name": "file-source",
            "spark.backlog.metrics.url": dirs.metrics_url,
            "spark.backlog.checkpointing.interval": "1s",
            "spark.backlog.checkpointing.interval-during-backlog": "1min",
            # Ten seconds of live files: only a longer stall sends the job back to backlog.
            "spark.backlog.file-source.pending-files-threshold": "20",
        }
    )
    checkpoint = str(tmp_path / "checkpoint")

    def build(settings: TriggerSettings) -> DataStreamWriter:
        files = spark.readStream.schema("id BIGINT, file INT").options(**settings.source_options)
        return (
            files.json(str(inputs))
            .writeStream.format("parquet")
            .option("path", str(dirs.output))
            .option("checkpointLocation", checkpoint)
        )

    def live_trigger_batches() -> int:
        live = [start.at for start in runtime.started_with if not start.settings.is_backlog]
        rows = checkpoints(dirs) if live else []
        return sum(not r["is_backlog"] and r["committed_at"].timestamp() > live[-1] for r in rows)

    written: list[int] = []

    def live_producer():
        """A file every 0.5 s, 30 at least, until the live trigger has run 7 batches: however
        long the restart takes on a loaded machine, the cadence has batches to be judged by."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len(written) < 30 or live_trigger_batches() < 7):
            write_json_file(inputs, 60 + len(written), 10)
            written.append(60 + len(written))
            time.sleep(0.5)

    runtime = BacklogRuntime(spark, config)
    runtime.hold_lease(checkpoint)
    probe = FileSourceProbe("files", str(inputs), checkpoint, config.pending_files_threshold)
    producer = threading.Thread(target=live_producer)
    producer.start()
    try:
        # The producer ends (within 120 s); the job then stops once idle, not at a timeout.
        runtime.run_restart_based(build, probe, stop_when_idle_s=3, timeout_s=600)
    finally:
        producer.join()
        runtime.close()

    # Back to back with a files-per-trigger limit in backlog, then one batch per interval.
    # On a loaded machine the files written during a restart to the live trigger may pass
    # the threshold again: the job then goes back to backlog, as it should, and each phase
    # still starts with its own trigger.
    starts = runtime.started_with
    modes = [(s.settings.is_backlog, s.settings.processing_time_s) for s in starts]
    assert modes[0] == (True, 0.0) and modes[-1] == (False, 1.0)
    assert set(modes) == {(True, 0.0), (False, 1.0)}
    assert starts[0].settings.source_options == {"maxFilesPerTrigger": "10"}
    assert all(
        "maxFilesPerTrigger" in s.settings.source_options for s in starts if s.settings.is_backlog
    )

    rows = checkpoints(dirs)
    live = [r for r in rows if not r["is_backlog"]]
    changes = transitions(dirs)
    assert [c["is_backlog"] for c in changes] == [i % 2 == 0 for i in range(len(changes))]
    assert rows[0]["is_backlog"] and not rows[-1]["is_backlog"]
    first, transition = changes[:2]
    assert first["reason"].startswith("pending-files: files is in backlog (")
    assert transition["reason"].startswith("pending-files: files is live (")
    # The status turns live before the restart gives the query its live trigger.
    live_trigger = [r for r in live if r["committed_at"].timestamp() > starts[-1].at]
    assert len(live_trigger) >= 6
    steady = batch_starts(live_trigger[1:])
    gaps = [b - a for a, b in itertools.pairwise(steady)]
    # The trigger holds batches an interval apart, and a loaded machine only stretches the
    # gaps: the lower bound is exact, the upper one only tells 1 s apart from the backlog's 1 min.
    assert gaps and 0.75 <= statistics.median(gaps) < 10, gaps

    # Exactly once: every input row in the committed output, none twice.
    committed = [
        json.loads(line)["path"].removeprefix("file://")
        for log in sorted((dirs.output / "_spark_metadata").glob("[0-9]*"))
        for line in log.read_text().splitlines()[1:]
    ]
    ids = ds.dataset(sorted(set(committed)), format="parquet").to_table().column("id").to_pylist()
    expected = [i * 1000 + r for i in range(60) for r in range(50)]
    expected += [i * 1000 + r for i in written for r in range(10)]
    assert sorted(ids) == sorted(expected)
    assert probe.pending_files() == 0
