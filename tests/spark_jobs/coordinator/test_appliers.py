from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import Decision
from spark_jobs.coordinator.appliers import PROBE_FILES, RestartApplier, TriggerSettings

CONFIG = BacklogConfig.from_spark_conf(
    {
        "spark.backlog.job-name": "files",
        "spark.backlog.checkpointing.interval": "5s",
        "spark.backlog.checkpointing.interval-during-backlog": "5min",
    }
)


def decision(is_backlog: bool, max_rows: int) -> Decision:
    return Decision(is_backlog, 300.0 if is_backlog else 5.0, 0.0, max_rows, is_backlog)


def test_backlog_runs_back_to_back_with_files_sized_from_rows():
    applier = RestartApplier(CONFIG, rows_per_file=lambda: 1000.0)
    assert applier.settings_for(decision(True, 45_500)) == TriggerSettings(True, 0.0, 45)
    assert applier.settings_for(decision(True, 45_500)).source_options == {
        "maxFilesPerTrigger": "45"
    }
    settings = applier.settings_for(decision(False, 1_000_000))
    assert settings == TriggerSettings(False, 5.0, None)  # live takes all that arrived
    assert settings.trigger == {"processingTime": "5000 milliseconds"}
    assert settings.source_options == {}


def test_before_rows_per_file_are_known_backlog_probes_a_few_files():
    applier = RestartApplier(CONFIG, rows_per_file=lambda: None)
    assert applier.settings_for(decision(True, 10)).max_files_per_trigger == PROBE_FILES


def test_a_restart_is_asked_for_once_per_change_of_phase():
    per_file = [100.0]
    applier = RestartApplier(CONFIG, rows_per_file=lambda: per_file[0])
    applier.apply(decision(True, 1000))
    assert applier.take_restart() == TriggerSettings(True, 0.0, 10)
    assert applier.take_restart() is None
    applier.apply(decision(True, 1500))  # 15 files: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 2000))  # twice as many: worth it
    assert applier.take_restart() == TriggerSettings(True, 0.0, 20)
    applier.apply(decision(True, 600))  # a third fewer: not worth a restart
    assert applier.take_restart() is None
    applier.apply(decision(True, 500))  # a quarter: worth it
    assert applier.take_restart() == TriggerSettings(True, 0.0, 5)
    applier.apply(decision(False, 1000))
    assert applier.take_restart() == TriggerSettings(False, 5.0, None)
    applier.apply(decision(False, 100_000))
    assert applier.take_restart() is None
    assert applier.current == TriggerSettings(False, 5.0, None)
