import json
from datetime import UTC, datetime

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import (
    BatchCost,
    BatchProgress,
    KafkaLag,
    SourceProgress,
    StateOperatorProgress,
)
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


def test_where_a_batch_s_time_went_and_the_rocksdb_state_it_carries():
    progress = BatchProgress.from_json(recorded("rocksdb_memory_sink"))
    assert progress.duration_ms == 1503
    assert progress.cost == BatchCost(
        latest_offset_ms=41,
        get_batch_ms=19,
        query_planning_ms=108,
        add_batch_ms=1180,
        wal_commit_ms=63,
        commit_offsets_ms=82,
    )
    assert (progress.sink_output_rows, progress.sink_commit_ms) == (5, None)
    assert progress.state_operators == (
        StateOperatorProgress(
            name="stateStoreSave",
            rows_total=5,
            rows_updated=5,
            memory_bytes=11156,
            disk_bytes=3915,
            commit_ms=299,
            rocksdb_commit_ms={
                "rocksdbCommitCheckpointLatency": 63,
                "rocksdbCommitCompactLatency": 0,
                "rocksdbCommitFileSyncLatencyMs": 214,
                "rocksdbCommitFlushLatency": 13,
            },
        ),
    )


def test_the_hdfs_backed_state_store_reports_its_current_version_on_disk():
    [operator] = BatchProgress.from_json(recorded("kafka_native_backlog")).state_operators
    assert (operator.rows_total, operator.memory_bytes, operator.disk_bytes) == (38, 21408, 9312)
    assert operator.rocksdb_commit_ms == {}


def test_a_file_sink_counts_no_rows_and_a_stateless_query_has_no_state_operators():
    progress = BatchProgress.from_json(recorded("file_source"))
    assert progress.sink_output_rows is None  # Spark reports -1
    assert progress.sink_commit_ms is None
    assert progress.state_operators == ()


def test_a_sink_commit_time_is_read_from_the_sink_s_metrics_when_it_is_a_number():
    def commit_ms(metrics: dict) -> int | None:
        sink = {"description": "custom", "numOutputRows": 3, "metrics": metrics}
        return BatchProgress.from_json(recorded("rocksdb_memory_sink", sink=sink)).sink_commit_ms

    assert [commit_ms({"commitTimeMs": "250"}), commit_ms({"commitTimeMs": "n/a"})] == [250, None]
    assert commit_ms({"bytesWritten": "1024"}) is None


def test_a_part_spark_did_not_time_is_unknown_not_zero():
    idle = {"latestOffset": 3, "triggerExecution": 3}
    cost = BatchProgress.from_json(recorded("rocksdb_memory_sink", durationMs=idle)).cost
    assert cost == BatchCost(3, None, None, None, None, None)


def test_a_hybrid_source_s_health_words_reach_its_status():
    end = {"source": "cdc", "child": 0, "phase": "cdc", "backlog": False, "position": {}}
    latest = {**end, "lag": {"slot_retained_wal_bytes": 4096}, "health": {"slot_wal_status": "x"}}
    source = SourceProgress("PythonMicroBatchStream", None, end, latest, 0)
    status = source.hybrid_status()
    assert status is not None and status.health == {"slot_wal_status": "x"}
    assert status.lag == {"slot_retained_wal_bytes": 4096}
