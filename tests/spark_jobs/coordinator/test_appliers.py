import json

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import Decision
from spark_jobs.coordinator.appliers import RestartApplier, SourceGatedApplier, TriggerSettings
from spark_jobs.coordinator.native_kafka_probe import NativeKafkaProbe
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.sources.gate import PlanChannel
from tests.spark_jobs.coordinator.conftest import recorded

CONFIG = BacklogConfig.from_spark_conf(
    {
        "spark.backlog.job-name": "files",
        "spark.backlog.checkpointing.interval": "5s",
        "spark.backlog.checkpointing.interval-during-backlog": "5min",
    }
)


def decision(is_backlog: bool, max_rows: int) -> Decision:
    return Decision(is_backlog, 300.0 if is_backlog else 5.0, 0.0, max_rows, is_backlog)


class FileLimits:
    """A file source holding ``rows_per_file`` rows in each file."""

    def __init__(self, rows_per_file: int):
        self.rows_per_file = rows_per_file
        self.option = "maxFilesPerTrigger"

    def limit_options(self, max_rows: int) -> dict[str, str]:
        return {self.option: str(max_rows // self.rows_per_file)}


def backlog(option: str, value: int) -> TriggerSettings:
    return TriggerSettings(True, 0.0, {option: str(value)})


LIVE = TriggerSettings(False, 5.0)


def test_backlog_runs_back_to_back_with_the_limit_the_source_gives():
    applier = RestartApplier(CONFIG, FileLimits(1000))
    settings = applier.settings_for(decision(True, 45_500))
    assert settings == backlog("maxFilesPerTrigger", 45)
    assert settings.trigger == {"processingTime": "0 milliseconds"}
    settings = applier.settings_for(decision(False, 1_000_000))
    assert settings == LIVE  # live takes all that arrived
    assert settings.trigger == {"processingTime": "5000 milliseconds"}
    assert settings.source_options == {}


def test_live_triggers_follow_the_interval_a_freshness_target_chose():
    applier = RestartApplier(CONFIG, FileLimits(1000))
    chosen = Decision(False, 3.2, 0.0, 1_000_000, False, "freshness target 5s: ...")
    assert applier.settings_for(chosen) == TriggerSettings(False, 3.2)


def test_a_kafka_backlog_batch_takes_one_offset_per_row():
    applier = RestartApplier(CONFIG, NativeKafkaProbe("events"))
    assert applier.settings_for(decision(True, 45_500)) == backlog("maxOffsetsPerTrigger", 45_500)
    assert applier.settings_for(decision(False, 45_500)) == LIVE


def test_a_restart_is_asked_for_once_per_change_of_phase():
    applier = RestartApplier(CONFIG, FileLimits(100))
    applier.apply(decision(True, 1000))
    assert applier.take_restart() == backlog("maxFilesPerTrigger", 10)
    assert applier.take_restart() is None
    applier.apply(decision(True, 1500))  # 15 files: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 2000))  # twice as many: worth it
    assert applier.take_restart() == backlog("maxFilesPerTrigger", 20)
    applier.apply(decision(True, 600))  # a third fewer: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 500))  # a quarter: worth it
    assert applier.take_restart() == backlog("maxFilesPerTrigger", 5)
    applier.apply(decision(False, 1000))
    assert applier.take_restart() == LIVE
    applier.apply(decision(False, 100_000))
    assert applier.take_restart() is None
    assert applier.current == LIVE


def test_kafka_limits_follow_the_same_restart_rule():
    applier = RestartApplier(CONFIG, NativeKafkaProbe("events"))
    applier.apply(decision(True, 10_000))
    assert applier.take_restart() == backlog("maxOffsetsPerTrigger", 10_000)
    applier.apply(decision(True, 19_999))  # just short of twice: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 20_000))
    assert applier.take_restart() == backlog("maxOffsetsPerTrigger", 20_000)
    applier.apply(decision(True, 5_001))  # just above a quarter: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 5_000))
    assert applier.take_restart() == backlog("maxOffsetsPerTrigger", 5_000)


def test_another_kind_of_limit_is_always_worth_a_restart():
    limits = FileLimits(100)
    applier = RestartApplier(CONFIG, limits)
    applier.apply(decision(True, 1000))
    assert applier.take_restart() == backlog("maxFilesPerTrigger", 10)
    limits.option = "maxBytesPerTrigger"  # the same count of another unit
    applier.apply(decision(True, 1000))
    assert applier.take_restart() == backlog("maxBytesPerTrigger", 10)


def test_gated_sources_of_one_query_share_the_decided_rows(tmp_path):
    channel = PlanChannel(tmp_path)
    applier = SourceGatedApplier(channel, CONFIG, sources=["events", "history"])
    applier.apply(decision(True, 50_000))
    assert channel.read().budgets == {"events": 25_000, "history": 25_000}

    # events is live with 2,200 rows waiting; history is in backlog with no count known
    data = json.loads(recorded("hybrid_live"))
    data["sources"][0]["latestOffset"]["lag"]["offsets_behind_latest"] = 2_200
    history = json.loads(json.dumps(data["sources"][0]))
    history["endOffset"].update(source="history", phase="history", backlog=True)
    history["latestOffset"].update(source="history", lag={"files_behind": 40})
    data["sources"].append(history)
    applier.apply(decision(True, 50_000), BatchProgress.from_json(json.dumps(data)))
    plan = channel.read()
    assert plan.budgets == {"events": 2_200, "history": 47_800}
    assert set(plan.starts) == {"events", "history"}


def test_a_lone_gated_source_takes_the_whole_batch(tmp_path):
    channel = PlanChannel(tmp_path)
    SourceGatedApplier(channel, CONFIG, sources=["events"]).apply(decision(True, 50_000))
    assert channel.read().budgets is None and channel.read().rows_for("events") == 50_000
