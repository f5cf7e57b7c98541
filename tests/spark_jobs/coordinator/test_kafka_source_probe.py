import json

from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.kafka_source_probe import NativeKafkaProbe
from spark_jobs.coordinator.progress import BatchProgress
from tests.spark_jobs.coordinator.conftest import recorded

BACKLOG = BatchProgress.from_json(recorded("kafka_native_backlog"))
LIVE = BatchProgress.from_json(recorded("kafka_native_live"))
FILES = json.loads(recorded("file_source"))["sources"][0]
KAFKA = json.loads(recorded("kafka_native_backlog"))["sources"][0]
#: Caught up, and without metrics: behind by nothing, as the offsets say.
KAFKA_CAUGHT_UP = KAFKA | {"latestOffset": KAFKA["endOffset"], "metrics": {}}


def batch_of(*sources: dict) -> BatchProgress:
    return BatchProgress.from_json(recorded("kafka_native_backlog", sources=list(sources)))


def test_before_the_first_batch_there_is_no_lag():
    assert NativeKafkaProbe("events").status() == SourceStatus(
        name="events", is_backlog=False, phase="kafka", lag={}, rule=None
    )


def test_the_probe_reports_lag_and_leaves_backlog_to_the_lag_rules():
    probe = NativeKafkaProbe("events")
    probe.observe(BACKLOG)
    assert probe.status() == SourceStatus(
        name="events",
        is_backlog=False,
        phase="kafka",
        lag={"offsets_behind_latest": 36_000_500, "max_offsets_behind_latest": 12_001_490},
        rule=None,
    )
    probe.observe(LIVE)
    assert probe.status().lag == {"offsets_behind_latest": 0, "max_offsets_behind_latest": 0}


def test_the_kafka_source_is_found_by_its_description():
    probe = NativeKafkaProbe("events")
    probe.observe(batch_of(FILES, KAFKA, KAFKA_CAUGHT_UP))  # the first Kafka source
    assert probe.status().lag["offsets_behind_latest"] == 36_000_500


def test_an_index_tells_kafka_sources_apart():
    probe = NativeKafkaProbe("clicks", source_index=1)
    probe.observe(batch_of(KAFKA, KAFKA_CAUGHT_UP))
    assert probe.status().lag == {"offsets_behind_latest": 0, "max_offsets_behind_latest": 0}


def test_a_batch_without_the_source_or_its_lag_keeps_the_last_lag():
    probe = NativeKafkaProbe("events", source_index=1)
    probe.observe(batch_of(FILES, KAFKA))
    probe.observe(BACKLOG)  # no source at index 1
    probe.observe(batch_of(FILES, KAFKA | {"latestOffset": None, "metrics": {}}))
    assert probe.status().lag["offsets_behind_latest"] == 36_000_500
    unnamed = NativeKafkaProbe("events")
    unnamed.observe(batch_of(FILES))
    assert unnamed.status().lag == {}


def test_a_backlog_batch_is_capped_in_offsets_one_per_row():
    assert NativeKafkaProbe("events").limit_options(45_500) == {"maxOffsetsPerTrigger": "45500"}
