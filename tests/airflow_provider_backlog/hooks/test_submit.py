import json
import os
import subprocess
import sys
import time

import psutil
import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.submit import BacklogSubmitHook, DriverProcess
from airflow_provider_backlog.profiles import PhaseProfile
from spark_jobs.backlog.secrets import SPARK_REDACTION_REGEX
from spark_jobs.jobs.spark_home import compiled_home, installed_home

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


def test_the_command_carries_the_profile_the_run_and_the_connections_master(local_spark):
    command = hook().submit_command("/app/events_pipeline.py")
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
    assert hook().submit_command("app.py")[0] == spark_submit


@pytest.fixture
def worker_without_spark(monkeypatch, tmp_path):
    """A worker whose Python has no spark-submit beside it and whose PATH has none either,
    as where the provider is installed without its spark extra: its PATH and the directory
    of its Python."""
    path = tmp_path / "usr-bin"
    beside_python = tmp_path / "venv" / "bin"
    path.mkdir()
    beside_python.mkdir(parents=True)
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.setattr(sys, "executable", str(beside_python / "python"))
    return str(path), str(beside_python)


def test_a_worker_without_spark_submit_is_told_what_is_missing_before_the_launch_starts(
    local_spark, worker_without_spark, tmp_path
):
    path, beside_python = worker_without_spark
    log_path = tmp_path / "logs" / "run.log"
    launch = hook(metrics_url="postgresql://metrics:s3cret@db/metrics")
    with pytest.raises(AirflowException) as raised:
        launch.start("/app/events_pipeline.py", log_path)
    message = str(raised.value)
    assert message.startswith(
        "spark-submit not found: Spark connection 'spark_test' runs 'spark-submit' "
    )
    assert f"neither on PATH ({path}) nor in {beside_python}, beside this worker's Python" in (
        message
    )
    assert "pip install 'airflow-provider-backlog[spark]'" in message
    assert "or put a Spark distribution's bin directory on PATH" in message
    assert "s3cret" not in message
    assert not log_path.parent.exists()  # nothing was started, not even the driver's log


def test_the_missing_spark_binary_is_the_one_the_connection_names(
    monkeypatch, worker_without_spark
):
    connection = {
        "conn_type": "spark",
        "host": "local[2]",
        "extra": {"spark-binary": "spark3-submit"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps(connection))
    with pytest.raises(AirflowException) as raised:
        hook().submit_command("app.py")
    assert str(raised.value).startswith(
        "spark3-submit not found: Spark connection 'spark_test' runs 'spark3-submit' "
    )


def test_a_missing_spark_connection_is_an_error_not_yarn():
    with pytest.raises(AirflowException) as raised:
        hook(conn_id="no_such_spark")
    assert str(raised.value).startswith(
        "Spark connection 'no_such_spark' is not defined, and without it spark-submit would "
        "submit to YARN: define it with the master as host"
    )


def spark_connection(monkeypatch, master: str, deploy_mode: str, **extra: str) -> None:
    connection = {"conn_type": "spark", "host": master, "extra": {"deploy-mode": deploy_mode}}
    connection["extra"] |= extra
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", json.dumps(connection))


REACHABLE_METRICS = "postgresql://metrics:secret@db.example.com:5432/metrics"


def conf_of(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize(
    ("master", "wait_key"),
    [
        ("yarn", "spark.yarn.submit.waitAppCompletion"),
        ("k8s://https://k8s.example.com:6443", "spark.kubernetes.submission.waitAppCompletion"),
    ],
)
def test_cluster_mode_on_yarn_and_kubernetes_submits_and_returns(monkeypatch, master, wait_key):
    spark_connection(monkeypatch, master, "cluster")
    submit = hook(
        metrics_url=REACHABLE_METRICS,
        env_vars={"BACKLOG_METRICS_PASSWORD": "secret"},
    )
    command = submit.submit_command("/app/events_pipeline.py")
    assert command[command.index("--deploy-mode") + 1] == "cluster"
    conf = conf_of(command)
    assert conf[wait_key] == "false"
    assert conf["spark.backlog.metrics.url"] == "postgresql://metrics@db.example.com:5432/metrics"
    assert submit.cluster_mode and submit.submits_only
    # Supervised (detach=False), spark-submit follows the application to its end.
    assert not hook(
        metrics_url=REACHABLE_METRICS, detach=False, env_vars={"BACKLOG_METRICS_PASSWORD": "secret"}
    ).submits_only


def test_the_local_driver_gets_this_python_and_the_password_a_cluster_driver_neither(
    monkeypatch,
):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/opt/airflow-worker/bin/python")
    monkeypatch.delenv("SPARK_HOME", raising=False)
    spark_connection(monkeypatch, "spark://127.0.0.1:7077", "client")
    local = hook(metrics_url=REACHABLE_METRICS).submit_environment()
    assert local["PYSPARK_PYTHON"] == sys.executable
    assert local["BACKLOG_METRICS_PASSWORD"] == "secret"
    # Its Python processes import compiled PySpark (spark_jobs/jobs/spark_home.py).
    assert local["SPARK_HOME"] == str(compiled_home(installed_home()))
    spark_connection(monkeypatch, "yarn", "cluster")
    remote = hook(metrics_url=REACHABLE_METRICS, env_vars={"BACKLOG_METRICS_PASSWORD": "secret"})
    assert "PYSPARK_DRIVER_PYTHON" not in remote.submit_environment()
    assert "SPARK_HOME" not in remote.submit_environment()
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/airflow-worker/bin/python")
    assert "PYSPARK_PYTHON" not in remote.submit_environment()
    conf = conf_of(remote.submit_command("app.py"))
    assert conf["spark.yarn.appMasterEnv.BACKLOG_METRICS_PASSWORD"] == "secret"


def test_a_submit_only_spark_submit_that_exits_0_has_not_failed(tmp_path):
    done = subprocess.Popen(["true"])
    done.wait()
    assert not DriverProcess(done, tmp_path / "log", submits_only=True).failed
    assert DriverProcess(done, tmp_path / "log").failed
    broken = subprocess.Popen(["false"])
    broken.wait()
    assert DriverProcess(broken, tmp_path / "log", submits_only=True).failed


def test_cluster_mode_on_a_standalone_master_is_refused_by_name(monkeypatch):
    spark_connection(monkeypatch, "spark://master.example.com:7077", "cluster")
    with pytest.raises(AirflowException) as raised:
        hook(metrics_url=REACHABLE_METRICS)
    assert str(raised.value).startswith(
        "Spark connection 'spark_test' asks for deploy mode 'cluster' on master "
        "'spark://master.example.com:7077'; cluster mode runs Python applications on YARN "
        "and Kubernetes only"
    )


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////var/lib/backlog/metrics.db",
        "postgresql://metrics@127.0.0.1:5432/metrics",
        "postgresql://metrics@localhost/metrics",
    ],
)
def test_cluster_mode_refuses_a_metrics_database_the_cluster_cannot_reach(monkeypatch, url):
    spark_connection(monkeypatch, "yarn", "cluster")
    with pytest.raises(AirflowException) as raised:
        hook(metrics_url=url)
    assert str(raised.value).startswith(f"metrics database {url!r} cannot be reached from a driver")


def test_cluster_mode_needs_the_metrics_password_from_the_cluster(monkeypatch):
    spark_connection(monkeypatch, "k8s://https://k8s.example.com:6443", "cluster")
    with pytest.raises(AirflowException) as raised:
        hook(metrics_url=REACHABLE_METRICS)
    assert "spark.kubernetes.driver.secretKeyRef.BACKLOG_METRICS_PASSWORD=<secret>:<key>" in str(
        raised.value
    )
    secret = {"spark.kubernetes.driver.secretKeyRef.BACKLOG_METRICS_PASSWORD": "metrics:password"}
    submit = hook(metrics_url=REACHABLE_METRICS, profile=PhaseProfile("2s", conf=secret))
    command = submit.submit_command("app.py")
    shown = " ".join(command).replace("secretKeyRef", "").replace(SPARK_REDACTION_REGEX, "")
    assert "secret" not in shown
    assert submit._metrics_password == "secret"  # kept for nothing: the cluster supplies it


def test_the_cluster_kill_command_names_the_application_from_the_log(monkeypatch, tmp_path):
    log = tmp_path / "submit.log"
    log.write_text("INFO Client: Submitted application application_1700000000000_0042\n")
    spark_connection(monkeypatch, "yarn", "cluster")
    yarn = hook(metrics_url="postgresql://metrics@db.example.com/metrics")
    assert yarn.cluster_kill_command(tmp_path / "missing.log") is None
    assert yarn.cluster_kill_command(log) == [
        "yarn",
        "application",
        "-kill",
        "application_1700000000000_0042",
    ]
    # Rotated away since: the older file still names it.
    log.rename(tmp_path / "submit.log.1")
    log.write_text("INFO spark-submit is still running\n")
    assert yarn.cluster_kill_command(log)[-1] == "application_1700000000000_0042"
    log.write_text("\t pod name: events-4f1c2d9e8a7b6c5d-driver\n")
    spark_connection(monkeypatch, "k8s://https://k8s.example.com:6443", "cluster", namespace="jobs")
    k8s = hook(metrics_url="postgresql://metrics@db.example.com/metrics")
    assert k8s.cluster_kill_command(log)[-4:] == [
        "--master",
        "k8s://https://k8s.example.com:6443",
        "--kill",
        "jobs:events-4f1c2d9e8a7b6c5d-driver",
    ]
    # What Spark logs when it does not wait for the application: the namespace with the pod.
    log.write_text(
        "INFO LoggingPodStatusWatcherImpl: Deployed Spark application events with application "
        "ID spark-0123abcd and submission ID streaming:events-99aa-driver into Kubernetes\n"
    )
    assert k8s.cluster_kill_command(log)[-1] == "streaming:events-99aa-driver"
    spark_connection(monkeypatch, "local[2]", "client")
    assert hook().cluster_kill_command(log) is None


def test_a_templated_job_name_is_checked_once_rendered(local_spark):
    with pytest.raises(ValueError, match=r"spark.backlog.job-name = 'two\\nlines' is invalid"):
        hook(job_name="two\nlines")


def test_ending_a_driver_ends_its_whole_tree_even_what_ignores_sigterm(tmp_path):
    """A stand-in driver: a process group leader with a child and a grandchild that
    ignores SIGTERM, as a JVM's Python worker might; all must be gone."""
    script = "trap '' TERM; sleep 300 & (trap '' TERM; sleep 300) & wait"
    driver = DriverProcess.start(["bash", "-c", script], tmp_path / "driver.log", env=os.environ)
    deadline = time.monotonic() + 10
    while len(driver.tree()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = driver.tree()
    assert len(tree) >= 4, "the log rotator, bash, and what bash started"
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


def test_the_metrics_password_reaches_the_driver_but_not_its_command_line(
    local_spark, tmp_path, monkeypatch
):
    """A real spark-submit of a one-line application that reports what it was given."""
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "fernet-key-of-the-worker")
    application = tmp_path / "report.py"
    application.write_text(
        "import os, sys\n"
        "print('password:', os.environ.get('BACKLOG_METRICS_PASSWORD'))\n"
        "print('argv:', sys.argv[1:])\n"
        "print('airflow:', sorted(k for k in os.environ if 'AIRFLOW' in k))\n"
    )
    submit = hook(metrics_url="postgresql://metrics:s3cret@db:5432/metrics")
    command = submit.submit_command(str(application))
    assert "s3cret" not in " ".join(command)
    assert "spark.backlog.metrics.url=postgresql://metrics@db:5432/metrics" in command
    driver = submit.start(str(application), tmp_path / "driver.log")
    assert driver.wait(120) == 0, driver.log_tail()
    log = driver.log_path.read_text()
    assert "password: s3cret" in log
    assert "argv: ['--checkpoint', '/data/ck']" in log
    assert "airflow: ['AIRFLOW_HOME']" in log, "the driver got Airflow's secrets"


def test_the_driver_gets_none_of_airflows_secrets_but_what_env_vars_names(local_spark, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "fernet")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://airflow:pw@db/airflow")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "jwt")
    monkeypatch.setenv("AIRFLOW_CONN_X", "postgresql://x:pw@db/x")
    monkeypatch.setenv("AIRFLOW_VAR_TOKEN", "token")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "dag")
    monkeypatch.setenv("JAVA_HOME", "/usr/lib/jvm/default")
    monkeypatch.setenv("AIRFLOW_HOME", "/opt/airflow")
    explicit = {"AIRFLOW_VAR_REGION": "eu-west-1", "KAFKA_PASSWORD": "k"}
    local = hook(env_vars=explicit).submit_environment()
    spark_connection(monkeypatch, "yarn", "cluster")
    explicit["BACKLOG_METRICS_PASSWORD"] = "s"  # how a driver in the cluster gets it
    remote = hook(metrics_url=REACHABLE_METRICS, env_vars=explicit)
    for env in (local, remote.submit_environment()):
        airflows = sorted(key for key in env if key.startswith(("AIRFLOW", "_AIRFLOW")))
        assert airflows == ["AIRFLOW_HOME", "AIRFLOW_VAR_REGION"]
        assert env["PATH"] == os.environ["PATH"] and env["JAVA_HOME"] == "/usr/lib/jvm/default"
        assert env["AIRFLOW_VAR_REGION"] == "eu-west-1" and env["KAFKA_PASSWORD"] == "k"


def test_drivers_log_at_warn_unless_the_profile_says_otherwise(local_spark):
    assert conf_of(hook().submit_command("app.py"))["spark.log.level"] == "WARN"
    own = PhaseProfile("2s", conf={"spark.log.level": "INFO"})
    assert conf_of(hook(profile=own).submit_command("app.py"))["spark.log.level"] == "INFO"


def test_python_workers_start_from_the_jobs_daemon_unless_the_profile_says_otherwise(
    local_spark,
):
    key = "spark.python.daemon.module"
    assert conf_of(hook().submit_command("app.py"))[key] == "spark_jobs.jobs.worker_daemon"
    own = PhaseProfile("2s", conf={key: "pyspark.daemon"})
    assert conf_of(hook(profile=own).submit_command("app.py"))[key] == "pyspark.daemon"


def test_spark_redacts_our_secrets_unless_the_profile_says_otherwise(local_spark):
    conf = conf_of(hook().submit_command("app.py"))
    assert conf["spark.redaction.regex"] == SPARK_REDACTION_REGEX
    own = PhaseProfile("2s", conf={"spark.redaction.regex": "(?i)secret|mine"})
    assert (
        conf_of(hook(profile=own).submit_command("app.py"))["spark.redaction.regex"]
        == "(?i)secret|mine"
    )
