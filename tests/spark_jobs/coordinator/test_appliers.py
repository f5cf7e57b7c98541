from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import Decision
from spark_jobs.coordinator.appliers import RestartApplier, TriggerSettings
from spark_jobs.coordinator.kafka_source_probe import NativeKafkaProbe

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
