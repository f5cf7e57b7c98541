import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.submit import BacklogSubmitHook, DriverProcess, PhaseProfile

LOCAL_SPARK = json.dumps({"conn_type": "spark", "host": "local[2]"})


@pytest.fixture
def local_spark(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", LOCAL_SPARK)


def hook(**kwargs) -> BacklogSubmitHook:
    arguments = {
        "job_name": "events",
        "run_id": "launch.1.abc",
        "profile": PhaseProfile("2s", "1min", num_executors=2, executor_memory="1g"),
        "metrics_url": "sqlite:////var/lib/backlog/metrics.db",
        "conn_id": "spark_test",
        "application_args": ["--checkpoint", "/data/ck"],
    }
    return BacklogSubmitHook(**(arguments | kwargs))


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


def test_the_command_carries_the_profile_the_run_and_the_connections_master(local_spark):
    command = hook()._build_spark_submit_command("/app/events_pipeline.py")
    assert command[0] == os.path.join(os.path.dirname(sys.executable), "spark-submit")
    assert command[1:3] == ["--master", "local[2]"]
    pairs = {command[i + 1] for i, arg in enumerate(command) if arg == "--conf"}
    assert {
        "spark.backlog.checkpointing.interval=2s",
        "spark.backlog.checkpointing.interval-during-backlog=1min",
        "spark.backlog.job-name=events",
        "spark.backlog.run-id=launch.1.abc",
        "spark.backlog.metrics.url=sqlite:////var/lib/backlog/metrics.db",
    } <= pairs
    assert command[command.index("--num-executors") + 1] == "2"
    assert command[command.index("--executor-memory") + 1] == "1g"
    assert command[command.index("--name") + 1] == "events"
    assert command[-3:] == ["/app/events_pipeline.py", "--checkpoint", "/data/ck"]


def test_spark_submit_is_found_next_to_the_interpreter_when_not_on_path(local_spark, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    assert hook()._build_spark_submit_command("app.py")[0] == spark_submit


def test_a_missing_spark_connection_is_an_error_not_yarn():
    with pytest.raises(AirflowException) as raised:
        hook(conn_id="no_such_spark")
    assert str(raised.value).startswith(
        "Spark connection 'no_such_spark' is not defined, and without it spark-submit would "
        "submit to YARN: define it with the master as host"
    )


def test_cluster_deploy_mode_is_refused(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_TEST",
        json.dumps({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}),
    )
    with pytest.raises(AirflowException, match="asks for deploy mode 'cluster'"):
        hook()


def test_a_templated_job_name_is_checked_once_rendered(local_spark):
    with pytest.raises(ValueError, match=r"spark.backlog.job-name = 'no spaces' is invalid"):
        hook(job_name="no spaces")


def test_ending_a_driver_ends_its_whole_tree_even_what_ignores_sigterm(tmp_path):
    """A stand-in driver: a process group leader with a child and a grandchild that
    ignores SIGTERM, as a JVM's Python worker might; all must be gone."""
    script = "trap '' TERM; sleep 300 & (trap '' TERM; sleep 300) & wait"
    log = tmp_path / "driver.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["bash", "-c", script], stdout=out, stderr=out, start_new_session=True
        )
    driver = DriverProcess(process, log)
    deadline = time.monotonic() + 10
    while len(driver.tree()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = driver.tree()
    assert len(tree) >= 3
    driver.end(timeout_s=1.0)
    assert driver.exit_code is not None
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_following_a_driver_yields_its_log_until_it_ends(tmp_path):
    log = tmp_path / "driver.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            ["bash", "-c", "echo one; sleep 0.7; echo two; exit 3"], stdout=out, stderr=out
        )
    driver = DriverProcess(process, log)
    assert list(driver.follow()) == ["one", "two"]
    assert driver.exit_code == 3
    assert driver.log_tail(1) == "two"


def test_the_metrics_password_reaches_the_driver_but_not_its_command_line(local_spark, tmp_path):
    """A real spark-submit of a one-line application that reports what it was given."""
    application = tmp_path / "report.py"
    application.write_text(
        "import os, sys\n"
        "print('password:', os.environ.get('BACKLOG_METRICS_PASSWORD'))\n"
        "print('argv:', sys.argv[1:])\n"
    )
    submit = hook(metrics_url="postgresql://metrics:s3cret@db:5432/metrics")
    command = submit._build_spark_submit_command(str(application))
    assert "s3cret" not in " ".join(command)
    assert "spark.backlog.metrics.url=postgresql://metrics@db:5432/metrics" in command
    driver = submit.start(str(application), tmp_path / "driver.log")
    assert driver.wait(120) == 0, driver.log_tail()
    log = driver.log_path.read_text()
    assert "password: s3cret" in log
    assert "argv: ['--checkpoint', '/data/ck']" in log
