import pytest

from airflow_provider_backlog.profiles import PhaseProfile


def test_a_profile_becomes_the_runs_spark_conf_and_resources():
    profile = PhaseProfile(
        "2s",
        "0",
        total_executor_cores=4,
        driver_memory="768m",
        conf={"spark.backlog.lag.offsets.enter-threshold": "5000"},
    )
    assert profile.spark_conf("events", "r1", "sqlite:///m.db") == {
        "spark.backlog.lag.offsets.enter-threshold": "5000",
        "spark.backlog.checkpointing.interval": "2s",
        "spark.backlog.checkpointing.interval-during-backlog": "0",
        "spark.backlog.job-name": "events",
        "spark.backlog.run-id": "r1",
        "spark.backlog.metrics.url": "sqlite:///m.db",
    }
    assert profile.resources() == {"total_executor_cores": 4, "driver_memory": "768m"}
    assert profile.describe() == (
        "interval=2s interval-during-backlog=0 total-executor-cores=4 driver-memory=768m"
    )


def test_an_invalid_profile_is_refused_with_every_problem_named():
    with pytest.raises(ValueError) as raised:
        PhaseProfile(
            "2 parsecs",
            "1s",
            num_executors=0,
            executor_memory="lots",
            conf={
                "spark.backlog.run-id": "mine",
                "spark.backlog.checkpointing.interval": "1s",
                "spark.backlog.nonsense": "1",
            },
        )
    message = str(raised.value)
    assert message.startswith("invalid phase profile:\n  ")
    for problem in (
        "num_executors = 0: expected a whole number of at least 1",
        "executor_memory = 'lots': expected a JVM memory size such as 512m or 4g",
        "conf 'spark.backlog.checkpointing.interval': set it as the profile's own field instead",
        "conf 'spark.backlog.run-id': the launch sets it, per job and run",
        "spark.backlog.checkpointing.interval = '2 parsecs' is invalid: unknown unit 'parsecs'",
        "spark.backlog.nonsense = '1' is not a known setting",
    ):
        assert problem in message


def test_a_rarer_backlog_interval_is_required_as_the_job_requires_it():
    with pytest.raises(
        ValueError, match=r"interval-during-backlog = '1s' is invalid: it must be 0"
    ):
        PhaseProfile("2s", "1s")


def test_a_freshness_target_is_a_field_checked_as_the_job_checks_it():
    live = PhaseProfile("30s", freshness_target="5s")
    assert (
        live.spark_conf("events", "r1", "sqlite://")["spark.backlog.checkpointing.freshness-target"]
        == "5s"
    )
    assert live.describe() == "interval=30s freshness-target=5s"
    with pytest.raises(ValueError) as raised:
        PhaseProfile(
            "30s",
            freshness_target="soon",
            conf={"spark.backlog.checkpointing.freshness-target": "5s"},
        )
    message = str(raised.value)
    assert (
        "conf 'spark.backlog.checkpointing.freshness-target': set it as the profile's own "
        "field instead"
    ) in message
    assert "spark.backlog.checkpointing.freshness-target = 'soon' is invalid" in message
