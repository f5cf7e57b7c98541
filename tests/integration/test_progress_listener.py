"""The coordinator's listener reads each progress event as Spark's JSON in one call: it
receives what PySpark's own listener path gives, for its query alone, until removed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_jobs.coordinator.listener import ProgressListener
from spark_jobs.coordinator.progress import BatchProgress


class PySparksOwnPath(StreamingQueryListener):
    def __init__(self) -> None:
        self.progress: list[str] = []

    def onQueryStarted(self, event: Any) -> None:
        del event

    def onQueryProgress(self, event: Any) -> None:
        self.progress.append(event.progress.json)

    def onQueryTerminated(self, event: Any) -> None:
        del event


def run_one_batch(spark, source: Path, checkpoint: Path, name: str, rows: int) -> None:
    (source / f"{name}-{time.time_ns()}.json").write_text(
        "".join(json.dumps({"id": i, "note": 'a "quoted" note'}) + "\n" for i in range(rows))
    )
    query = (
        spark.readStream.schema("id INT, note STRING")
        .json(str(source))
        .writeStream.queryName(name)
        .format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)


def wait_until(reached, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not reached():
        assert time.monotonic() < deadline, "the listener bus delivered nothing"
        time.sleep(0.05)


def test_the_listener_gets_its_query_s_progress_as_pysparks_path_does_until_removed(
    spark, tmp_path
):
    received: list[BatchProgress] = []
    ours, theirs = ProgressListener("ours", received.append), PySparksOwnPath()
    for directory in ("ours", "other", "ours-ck", "other-ck"):
        (tmp_path / directory).mkdir()
    spark.streams.addListener(ours)
    spark.streams.addListener(theirs)
    try:
        run_one_batch(spark, tmp_path / "other", tmp_path / "other-ck", "other", 3)
        run_one_batch(spark, tmp_path / "ours", tmp_path / "ours-ck", "ours", 5)
        wait_until(lambda: len(received) >= 1 and len(theirs.progress) >= 2)
        spark.streams.removeListener(ours)
        run_one_batch(spark, tmp_path / "ours", tmp_path / "ours-ck", "ours", 7)
        wait_until(lambda: len(theirs.progress) >= 3)
    finally:
        spark.streams.removeListener(theirs)
    expected = [
        BatchProgress.from_json(text)
        for text in theirs.progress
        if BatchProgress.from_json(text).name == "ours"
    ]
    assert received == expected[:1]
    assert [p.num_input_rows for p in expected] == [5, 7]
