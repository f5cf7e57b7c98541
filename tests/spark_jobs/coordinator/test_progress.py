import json
from datetime import UTC, datetime

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import BatchProgress, KafkaLag
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


#: latestOffset - endOffset of the recorded backlog batch, per partition of topic events.
BACKLOG_BEHIND = {("events", 0): 12_000_000, ("events", 1): 11_999_010, ("events", 2): 12_001_490}


def kafka_source(**changes) -> dict:
    """The recorded backlog batch's Kafka source entry, with fields replaced."""
    source = json.loads(recorded("kafka_native_backlog"))["sources"][0]
    return source | changes


def kafka_lags(*sources: dict) -> list[KafkaLag | None]:
    text = recorded("kafka_native_backlog", sources=list(sources))
    return [source.kafka_lag() for source in BatchProgress.from_json(text).sources]


def test_a_native_kafka_batch_capped_behind_a_backlog():
    progress = BatchProgress.from_json(recorded("kafka_native_backlog"))
    [source] = progress.sources
    assert source.description == "KafkaV2[Subscribe[events]]"
    assert source.hybrid_status() is None
    assert source.kafka_lag() == KafkaLag(36_000_500, 12_001_490, BACKLOG_BEHIND)


def test_a_native_kafka_batch_that_took_everything_is_not_behind():
    [source] = BatchProgress.from_json(recorded("kafka_native_live")).sources
    assert source.kafka_lag() == KafkaLag(0, 0, {("events", p): 0 for p in range(3)})


def test_without_latest_offsets_the_metrics_tell_the_lag():
    # The average arrives as a Java double, 1.2000166666666666E7, over 3 partitions.
    assert kafka_lags(kafka_source(latestOffset=None)) == [KafkaLag(36_000_500, 12_001_490, {})]


def test_the_maximum_comes_from_the_metric_else_from_the_offsets():
    reported = kafka_source(metrics={"maxOffsetsBehindLatest": "7"})
    assert kafka_lags(reported, kafka_source(metrics={})) == [
        KafkaLag(36_000_500, 7, BACKLOG_BEHIND),
        KafkaLag(36_000_500, 12_001_490, BACKLOG_BEHIND),
    ]


def test_no_kafka_lag_from_other_sources_or_without_any_signal():
    for name in ("file_source", "hybrid_live", "hybrid_backlog", "hybrid_handoff"):
        [source] = BatchProgress.from_json(recorded(name)).sources
        assert source.kafka_lag() is None, name
    assert kafka_lags(kafka_source(latestOffset=None, metrics={})) == [None]
