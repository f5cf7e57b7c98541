import json

import sqlalchemy as sa

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.appliers import RestartApplier, TriggerSettings
from spark_jobs.coordinator.coordinator import BacklogCoordinator
from spark_jobs.coordinator.native_kafka_probe import NativeKafkaProbe
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.metrics.schema import backlog_transitions, make_engine
from spark_jobs.metrics.writer import MetricsWriter
from tests.spark_jobs.backlog.simulation import FakeClock
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


def test_native_kafka_lag_drives_restarts_and_transitions_through_the_coordinator(tmp_path):
    """Recorded progress in, restart settings and metrics out: the restart-based path."""
    config = BacklogConfig.from_spark_conf(
        {
            "spark.backlog.job-name": "native",
            "spark.backlog.run-id": "run-1",
            "spark.backlog.checkpointing.interval": "2s",
            "spark.backlog.checkpointing.interval-during-backlog": "30s",
            "spark.backlog.checkpointing.max-batch-rows": "50000",
            "spark.backlog.lag.offsets.enter-threshold": "100000",
        }
    )
    probe = NativeKafkaProbe("events")
    applier = RestartApplier(config, probe)
    url = f"sqlite:///{tmp_path}/metrics.db"
    writer = MetricsWriter(url)
    coordinator = BacklogCoordinator(config, applier, writer, clock=FakeClock(0), probes=[probe])
    coordinator.start()
    # Nothing is known before the first batch: it starts live, with no limit.
    assert applier.take_restart() == TriggerSettings(False, 2.0)

    coordinator.on_progress(BACKLOG)
    assert applier.take_restart() == TriggerSettings(True, 0.0, {"maxOffsetsPerTrigger": "50000"})
    coordinator.on_progress(LIVE)
    assert applier.take_restart() == TriggerSettings(False, 2.0)
    assert writer.flush()
    writer.close()

    with make_engine(url).connect() as connection:
        changes = connection.execute(
            sa.select(backlog_transitions.c.is_backlog, backlog_transitions.c.reason)
        ).all()
    # The probe's status at the start (no lag known) is live: the lag found is a switch.
    assert [tuple(change) for change in changes] == [
        (False, "reported: events is live (kafka)"),
        (True, "offset-lag: events is in backlog (kafka)"),
        (False, "offset-lag: events is live (kafka)"),
    ]
