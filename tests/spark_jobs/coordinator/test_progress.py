from datetime import UTC, datetime

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import BatchProgress
from tests.spark_jobs.coordinator.conftest import recorded


def test_a_backlog_batch_of_the_hybrid_source():
    progress = BatchProgress.from_json(recorded("hybrid_backlog"))
    assert (progress.name, progress.batch_id, progress.num_input_rows) == ("recorded", 0, 30000)
    assert progress.started_at == datetime(2026, 11, 21, 11, 49, 56, 303000, tzinfo=UTC)
    assert progress.duration_ms == 9803
    assert progress.committed_at == datetime(2026, 11, 21, 11, 50, 6, 106000, tzinfo=UTC)
    assert progress.watermark is None  # Spark reports the epoch before the first batch
    [source] = progress.sources
    assert source.hybrid_status() == SourceStatus(
        name="events",
        is_backlog=True,
        phase="history",
        lag={"files_behind": 0},
        rule="hybrid-phase",
    )
    assert progress.observed_metrics["event_time"]["rows"] == 30000


def test_a_live_batch_carries_watermark_status_and_observed_quantiles():
    progress = BatchProgress.from_json(recorded("hybrid_live"))
    assert progress.batch_id == 3
    assert progress.watermark == datetime(2026, 11, 21, 11, 49, 58, 882000, tzinfo=UTC)
    status = progress.sources[0].hybrid_status()
    assert status is not None
    assert (status.name, status.is_backlog, status.phase) == ("events", False, "landing")
    quantiles = progress.observed_metrics["event_time"]["quantiles_ms"]
    assert len(quantiles) == 19 and quantiles == sorted(quantiles)


def test_the_handoff_batch_is_the_first_live_one():
    progress = BatchProgress.from_json(recorded("hybrid_handoff"))
    status = progress.sources[0].hybrid_status()
    assert status is not None and not status.is_backlog
    assert progress.sources[0].start_offset["phase"] == "history"


def test_the_built_in_file_source_carries_no_status():
    progress = BatchProgress.from_json(recorded("file_source"))
    [source] = progress.sources
    assert source.description == "FileStreamSource[file:/tmp/proto/fs/in]"
    assert source.end_offset == {"logOffset": 0}
    assert source.latest_offset is None
    assert source.hybrid_status() is None
    assert progress.name == "files"
