import subprocess
import time
from datetime import timedelta

import psutil
import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowException
from sqlalchemy.exc import OperationalError

from airflow_provider_backlog.hooks.driver_log import safe_file_name
from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.submit import BacklogSubmitHook, DriverProcess
from airflow_provider_backlog.operators.launch import (
    BacklogLaunchOperator,
    BacklogRelaunchOperator,
    new_run_id,
)
from airflow_provider_backlog.profiles import PhaseProfile
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import backlog_control
from tests.airflow_provider_backlog.conftest import CONN_ID


def launch(**kwargs) -> BacklogLaunchOperator:
    defaults = {
        "job_name": "events",
        "application": "/app/events_pipeline.py",
        "metrics_conn_id": CONN_ID,
        "spark_conn_id": "no_such_spark",
    }
    return BacklogLaunchOperator(
        task_id="launch",
        profile=PhaseProfile("2s", "1min"),
        **(defaults | kwargs),
    )


def test_a_launch_is_refused_while_a_driver_holds_the_jobs_lease(connected):
    leases = LeaseStore(connected)
    leases.acquire("events", "file:///ck", "r1", 30, spark_ui_url="http://driver:4040")
    with pytest.raises(AirflowException) as raised:
        launch().execute({})
    message = str(raised.value)
    assert message.startswith(
        "job 'events' is already running: run r1 of job 'events' at file:///ck (lease renewed "
        "until "
    )
    assert message.endswith(
        ", Spark UI http://driver:4040). Stop it first (BacklogStopOperator) or relaunch it "
        "(BacklogRelaunchOperator)"
    )
    leases.close()


def test_a_launch_after_the_drivers_lease_was_released_goes_ahead_to_spark_submit(connected):
    leases = LeaseStore(connected)
    leases.release(leases.acquire("events", "file:///ck", "r1", 30).lease)
    # It gets as far as the Spark connection, which this test leaves undefined.
    with pytest.raises(AirflowException, match="Spark connection 'no_such_spark' is not defined"):
        launch().execute({})
    leases.close()


def test_a_profile_must_be_a_phase_profile():
    with pytest.raises(TypeError, match=r"profile must be a PhaseProfile, got \{'interval'"):
        BacklogLaunchOperator(
            task_id="launch",
            job_name="events",
            application="app.py",
            profile={"interval": "2s"},  # type: ignore[arg-type]
        )


def test_run_ids_name_the_task_and_try_and_are_unique():
    class TaskInstance:
        task_id, try_number = "launch_backlog_profile", 2

    first, second = new_run_id({"ti": TaskInstance()}), new_run_id({"ti": TaskInstance()})
    assert first.startswith("launch_backlog_profile.2.") and first != second
    assert len(new_run_id({})) == 8


def test_killing_the_task_ends_the_driver_tree_at_once_and_releases_its_lease(connected, tmp_path):
    leases = LeaseStore(connected)
    leases.acquire("events", "file:///ck", "r1", 30)
    operator = launch()
    log = tmp_path / "driver.log"
    with log.open("ab") as out:  # a stand-in driver whose child ignores SIGTERM
        process = subprocess.Popen(
            ["bash", "-c", "(trap '' TERM; sleep 300) & sleep 300"],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    operator._driver, operator._run_id = DriverProcess(process, log), "r1"
    deadline = time.monotonic() + 10
    while len(operator._driver.tree()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = operator._driver.tree()

    began = time.monotonic()
    operator.on_kill()
    # Airflow SIGKILLs a task 5 s after its SIGTERM, on_kill finished or not.
    assert time.monotonic() - began < 5
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert BacklogMetricsHook(CONN_ID).live_run("events") is None
    with pytest.raises(AirflowException, match=r"^the task was killed while run r1 started"):
        operator._await_start("r1", operator._driver)
    leases.close()


def test_a_kill_while_the_first_checkpoint_is_read_fails_the_task(connected, monkeypatch):
    """on_kill runs from a signal handler, which may land while the launch reads the first
    checkpoint: the read found it, and the task reported success for the run on_kill had
    just ended (a DAG test under load then waited for its live phase forever)."""
    operator = launch()

    def found_while_killed(self, job_name, run_id):
        operator.on_kill()
        return object()

    monkeypatch.setattr(BacklogMetricsHook, "run_start", found_while_killed)
    with pytest.raises(AirflowException, match=r"^the task was killed while run r1 started"):
        operator._await_start("r1", None)  # type: ignore[arg-type]


def test_in_cluster_mode_killing_the_task_asks_the_cluster_and_keeps_the_lease(
    connected, tmp_path, monkeypatch
):
    """The driver runs in YARN: ending spark-submit does not end it, so the task asks
    YARN to kill the application and leaves the lease to expire once the driver is gone
    (a retry must not start a second driver meanwhile)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_YARN",
        '{"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}',
    )
    asked = tmp_path / "yarn-was-asked"
    yarn = tmp_path / "bin" / "yarn"
    yarn.parent.mkdir()
    yarn.write_text(f'#!/bin/sh\necho "$@" > {asked}\n')
    yarn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{yarn.parent}:/usr/bin:/bin")
    leases = LeaseStore(connected)
    leases.acquire("events", "file:///ck", "r1", 30)
    operator = launch(spark_conn_id="spark_yarn")
    operator._submit = BacklogSubmitHook(
        job_name="events",
        run_id="r1",
        profile=PhaseProfile("2s"),
        metrics_url="postgresql://metrics@db.example.com/metrics",
        conn_id="spark_yarn",
    )
    log = tmp_path / "submit.log"
    log.write_text("INFO Client: Submitted application application_1700000000000_0042\n")
    submitted = subprocess.Popen(["/bin/true"])
    submitted.wait()
    operator._driver = DriverProcess(submitted, log, submits_only=True)
    operator._run_id = "r1"
    assert not operator._driver.failed, "spark-submit returning after submitting is no failure"

    operator.on_kill()
    operator._cluster_kill.wait(10)
    assert asked.read_text() == "application -kill application_1700000000000_0042\n"
    assert BacklogMetricsHook(CONN_ID).live_run("events").run_id == "r1"
    leases.close()


#: A stand-in driver under a real spark-submit: it takes its run's lease as a driver does
#: (its run id and job name from its JVM's command line), then holds the metrics database
#: locked, so the launch's next look for the first checkpoint fails for real.
LOCKING_DRIVER = """
import os, sqlite3, time
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import backlog_control
args = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
conf = dict(arg.split("=", 1) for arg in args if arg.startswith("spark.backlog."))
store = LeaseStore(conf["spark.backlog.metrics.url"])
store.acquire(conf["spark.backlog.job-name"], "file:///ck", conf["spark.backlog.run-id"], 60)
store.close()
lock = sqlite3.connect(conf["spark.backlog.metrics.url"][len("sqlite:///"):], timeout=60)
lock.isolation_level = None
lock.execute("PRAGMA locking_mode=EXCLUSIVE")
lock.execute("BEGIN EXCLUSIVE")
print("driver pids", os.getpid(), os.getppid(), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("metrics_url", ["sqlite"], indirect=True)
def test_a_launch_that_fails_after_spark_submit_started_ends_the_driver_and_its_lease(
    connected, tmp_path, monkeypatch
):
    """A real database error while waiting for the first checkpoint ("database is locked",
    by the driver itself) must not leave the driver running nor its lease held. The job
    name is one no file may be named after."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[1]"}')
    application = tmp_path / "locking_driver.py"
    application.write_text(LOCKING_DRIVER)
    logs = tmp_path / "logs"
    operator = launch(
        job_name="../My Job/ü",
        spark_conn_id="spark_local",
        application=str(application),
        driver_log_dir=str(logs),
        poll_interval_s=0.2,
    )
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            operator.execute({})
        driver = operator._driver
        assert driver is not None and driver.exit_code is not None
        line = next(x for x in driver.log_path.read_text().splitlines() if "driver pids" in x)
        pids = [driver.pid, *map(int, line.split()[-2:])]  # rotator, Python driver, JVM
        assert not [pid for pid in pids if psutil.pid_exists(pid)]
        assert driver.tree() == []
        hook = BacklogMetricsHook(CONN_ID)
        assert hook.live_run("../My Job/ü") is None
        assert hook.run_released("../My Job/ü", operator._run_id, 0, 0)
        assert [path.name for path in logs.iterdir()] == [safe_file_name(operator._run_id, ".log")]
    finally:
        if operator._driver is not None:
            operator._driver.end()


#: A stand-in next run under a real spark-submit that fails while it warms up, before it
#: stands by; it shows the conf it was given.
FAILING_STANDBY = """
import os, sys
args = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
print("conf", [arg for arg in args if arg.startswith("spark.backlog.lease.")], flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("metrics_url", ["sqlite"], indirect=True)
def test_a_next_run_that_fails_while_warming_up_leaves_the_running_run_unstopped(
    connected, tmp_path, monkeypatch
):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[1]"}')
    application = tmp_path / "failing_standby.py"
    application.write_text(FAILING_STANDBY)
    leases = LeaseStore(connected)
    leases.acquire("events", "file:///ck", "r1", 60)
    operator = BacklogRelaunchOperator(
        task_id="relaunch",
        job_name="events",
        application=str(application),
        profile=PhaseProfile("2s"),
        metrics_conn_id=CONN_ID,
        spark_conn_id="spark_local",
        driver_log_dir=str(tmp_path / "logs"),
        poll_interval_s=0.2,
        answer_timeout=timedelta(seconds=30),
        stop_timeout=timedelta(seconds=60),
    )
    assert operator.handover_wait() == timedelta(seconds=120)
    try:
        with pytest.raises(AirflowException) as raised:
            operator.execute({})
    finally:
        if operator._driver is not None:
            operator._driver.end()
    message = str(raised.value)
    assert message.startswith(f"run {operator._run_id} of job 'events' ended (exit code 3) ")
    assert "before it stood by; run r1 was not stopped and serves on" in message
    assert "conf ['spark.backlog.lease.wait-for-handover=120s']" in message
    hook = BacklogMetricsHook(CONN_ID)
    assert hook.live_run("events").run_id == "r1"
    with hook.engine.connect() as connection:
        assert connection.execute(sa.select(backlog_control)).all() == [], "no stop was asked"
    leases.close()


def test_a_relaunch_can_break_before_it_makes():
    operator = BacklogRelaunchOperator(
        task_id="relaunch",
        job_name="events",
        application="app.py",
        profile=PhaseProfile("2s"),
        make_before_break=False,
    )
    assert not operator.make_before_break
