"""The example DAGs end to end: ``airflow dags test`` with real Spark and a real
Kafka-protocol broker, as a user runs them. On a Spark standalone cluster on loopback with
PostgreSQL metrics, the phased DAG launches, loses a worker in the middle of the backlog,
waits until live and relaunches with the live profile; the reconfigure DAG changes the
running job's interval, or is refused with the job's reason; a driver killed from outside
makes a sensor fail by name, and a relaunch takes over from the checkpoint, exactly once.
In local mode with SQLite metrics, killing the launch task leaves no Spark process behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import urllib.request

import psutil
import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.operators.control import BacklogReconfigureOperator
from airflow_provider_backlog.operators.launch import BacklogLaunchOperator
from airflow_provider_backlog.profiles import PhaseProfile
from airflow_provider_backlog.triggers.metrics import JobExpectationTrigger
from spark_jobs.jobs import events_pipeline
from spark_jobs.metrics.schema import (
    as_utc,
    backlog_control,
    backlog_interval_changes,
    backlog_leases,
)
from tests.integration.deployment import (
    JOB,
    Deployment,
    alive,
    deployed,
    job_processes,
    kill_all,
)
from tests.integration.jobs import (
    assert_exactly_once,
    checkpoints,
    now,
    wait_for,
)
from tools.demo.airflow_demo import task_states
from tools.services.cluster import StandaloneCluster

PHASED = ["launch_backlog_profile", "wait_until_live", "relaunch_live_profile", "watch_freshness"]


@pytest.fixture
def deployment(tmp_path, broker):
    with deployed(tmp_path, broker.bootstrap_servers) as local:
        yield local


@pytest.fixture
def cluster(tmp_path):
    """A Spark standalone cluster on loopback: a master and two workers, each offering the
    cores and memory the example DAG's backlog profile asks of an executor."""
    with StandaloneCluster(tmp_path / "cluster", workers=2, worker_memory="3g") as started:
        yield started


@pytest.fixture
def cluster_deployment(tmp_path, broker, cluster, postgres_server):
    postgres_server.start()
    with deployed(
        tmp_path, broker.bootstrap_servers, cluster.master_url, postgres_server.url, 60_000
    ) as on_cluster:
        yield on_cluster


def busy_executor(spark_ui_url: str) -> str | None:
    """The id of an executor running tasks now, from the driver's REST API."""
    try:
        with urllib.request.urlopen(f"{spark_ui_url}/api/v1/applications", timeout=2) as answer:
            (application,) = json.load(answer)
        executors_url = f"{spark_ui_url}/api/v1/applications/{application['id']}/executors"
        with urllib.request.urlopen(executors_url, timeout=2) as answer:
            executors = json.load(answer)
    except (OSError, ValueError):
        return None
    busy = [e["id"] for e in executors if e["id"] != "driver" and e["activeTasks"] > 0]
    return busy[0] if busy else None


def kill_a_worker_while_it_runs_the_backlog(deployment: Deployment, cluster, dag_test) -> int:
    """SIGKILL the worker whose executor is running tasks of the first (backlog) batch."""
    lease = wait_for(
        lambda: deployment.rows(sa.select(backlog_leases.c.spark_ui_url)),
        "the driver to take its lease",
        180,
        dag_test,
    )
    spark_ui_url = lease[0].spark_ui_url
    executor = wait_for(
        lambda: busy_executor(spark_ui_url), "an executor running tasks", 180, dag_test, 0.1
    )
    worker = cluster.worker_of_executor(executor)
    assert worker is not None, f"no worker runs executor {executor}"
    assert not checkpoints(deployment.dirs), "the first backlog batch had committed already"
    assert cluster.kill_worker(worker)
    return worker


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def live_intervals_ms(deployment: Deployment, run_id: str) -> list[int]:
    return [
        row["effective_interval_ms"]
        for row in checkpoints(deployment.dirs)
        if row["run_id"] == run_id and not row["is_backlog"]
    ]


def test_on_a_cluster_the_phased_dag_survives_a_lost_worker_relaunches_and_answers_airflow(
    cluster_deployment, cluster, monkeypatch
):
    deployment = cluster_deployment
    dag_test = deployment.dags_test("backlog_phased")
    try:
        kill_a_worker_while_it_runs_the_backlog(deployment, cluster, dag_test)
        dag_test.wait(600)
    finally:
        if dag_test.poll() is None:
            dag_test.kill()
    states = task_states(deployment.home, "backlog_phased")
    assert states == dict.fromkeys(PHASED, "success"), deployment.log_of(dag_test)
    assert cluster.alive_workers() == 1
    # The lost tasks ran again on the other worker's executor.
    assert "Lost executor" in deployment.driver_log("launch_backlog_profile")

    # Two runs on one checkpoint: the backlog profile's, then the live profile's.
    rows = checkpoints(deployment.dirs)
    runs = list(dict.fromkeys(row["run_id"] for row in rows))
    assert [run.split(".")[:2] for run in runs] == [
        ["launch_backlog_profile", "1"],
        ["relaunch_live_profile", "1"],
    ]
    first, second = runs
    assert [row["batch_id"] for row in rows] == list(range(len(rows))), "not one checkpoint"
    assert rows[0]["is_backlog"], "the first run started on the backlog"
    assert set(live_intervals_ms(deployment, first)) == {5000}
    assert set(live_intervals_ms(deployment, second)) == {2000}
    transitions = deployment.rows(
        sa.text("SELECT run_id, is_backlog, reason FROM backlog_transitions ORDER BY at")
    )
    assert (first, 0) in {(t.run_id, t.is_backlog) for t in transitions}
    leases = deployment.rows(sa.select(backlog_leases.c.run_id, backlog_leases.c.released_at))
    assert [(lease.run_id, lease.released_at is not None) for lease in leases] == [
        (second, False)
    ], "the first run let go when it was stopped, the second holds the lease"
    for task in ("launch_backlog_profile", "relaunch_live_profile"):
        assert str(deployment.xcom(task, "spark_ui_url")).startswith("http://")
    assert deployment.xcom("relaunch_live_profile", "return_value")["stopped_run_id"] == first

    # A second launch while the job runs is refused by name.
    deployment.use_connections(monkeypatch)
    second_launch = BacklogLaunchOperator(
        task_id="launch_again",
        job_name=JOB,
        application="unused.py",
        profile=PhaseProfile("2s"),
    )
    with pytest.raises(AirflowException, match=rf"job 'events' is already running: run {second}"):
        second_launch.execute({})

    # The reconfigure DAG: acknowledged, and the job checkpoints every 3 s from then on.
    states = deployment.run_dag("backlog_reconfigure", 300, interval="3s")
    assert states == dict.fromkeys(
        ["wait_until_running", "reconfigure", "watch_freshness"], "success"
    )
    wait_for(
        lambda: live_intervals_ms(deployment, second)[-2:] == [3000, 3000], "3 s checkpoints", 60
    )

    # Invalid values: refused with the job's reason, and the job runs on.
    with pytest.raises(AirflowException) as raised:
        BacklogReconfigureOperator(task_id="reconfigure", job_name=JOB, interval="5min").execute({})
    assert str(raised.value).startswith(
        "job 'events' rejected {'spark.backlog.checkpointing.interval': '5min'}: "
        "invalid backlog configuration:\n  spark.backlog.checkpointing.interval-during-backlog "
        "= '1min' is invalid: it must be 0 (no periodic checkpoint during backlog) or at least "
        "spark.backlog.checkpointing.interval (5min)"
    )
    requests = deployment.rows(sa.select(backlog_control.c.status).order_by(backlog_control.c.id))
    assert [request.status for request in requests] == ["applied", "applied", "rejected"]
    count = len(checkpoints(deployment.dirs))
    wait_for(lambda: len(checkpoints(deployment.dirs)) >= count + 2, "the job running on", 60)

    # A freshness target: the job chooses its live interval (at most the 3 s interval) from
    # the live batches it has measured, records why, and the next batches follow it. Live
    # batches here take seconds (a cluster on two cores beside Airflow), so the target may
    # also be one no interval meets: then the reason says so.
    answer = BacklogReconfigureOperator(
        task_id="reconfigure", job_name=JOB, freshness_target="6s"
    ).execute({})
    assert " freshness-target=6s " in answer
    chosen = (
        sa.select(backlog_interval_changes)
        .where(backlog_interval_changes.c.run_id == second)
        .order_by(backlog_interval_changes.c.at)
    )
    wait_for(lambda: deployment.rows(chosen), "the chosen interval recorded", 30)
    target_set = deployment.rows(chosen)[0]
    assert target_set.reason.startswith(("freshness target 6s: ", "freshness target 6s cannot")), (
        target_set.reason
    )
    assert target_set.interval_ms <= 3000

    def live_batches_with_the_change_in_force() -> list[tuple]:
        """Each live batch since the target was set, but the latest, with the latest change
        made at or before its commit. The checkpoints are read first: the job writes its
        metrics in order, so a batch followed by another has its own change written too."""
        batches = sorted(
            (row for row in checkpoints(deployment.dirs) if row["run_id"] == second),
            key=lambda row: as_utc(row["committed_at"]),
        )
        changes = deployment.rows(chosen)
        judged = [
            batch
            for batch in batches[:-1]
            if not batch["is_backlog"] and as_utc(batch["committed_at"]) >= as_utc(target_set.at)
        ]
        return [
            ([c for c in changes if as_utc(c.at) <= as_utc(batch["committed_at"])][-1], batch)
            for batch in judged
        ]

    def three_judged() -> list[tuple]:
        judged = live_batches_with_the_change_in_force()
        return judged if len(judged) >= 3 else []

    for change, batch in wait_for(three_judged, "three live batches judged", 90):
        assert batch["effective_interval_ms"] == change.interval_ms <= 3000, (change, batch)

    # The driver is killed from outside: a waiting sensor's trigger fails naming the cause.
    driver = job_processes(JOB, deployment.data)
    assert driver, "no driver process found"
    kill_all(driver)
    trigger = JobExpectationTrigger(
        BacklogMetricsHook.default_conn_name,
        JOB,
        {"phase": "backlog", "checkpoints": 1, "within_s": None},
        1.0,
        now().isoformat(),
    )
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 120)).payload
    assert event["status"] == "error"
    assert event["message"].startswith(
        f"the driver of job 'events' (run {second}) stopped renewing its lease, which expired at "
    )
    assert event["message"].endswith(": it has died")

    # Launched again, supervised: the task follows the driver until the job, idle once the
    # producer has stopped, ends; nothing was lost or duplicated across the three runs.
    deployment.close()
    supervised = BacklogLaunchOperator(
        task_id="launch_supervised",
        job_name=JOB,
        application=events_pipeline.__file__,
        application_args=[*deployment.dirs.args(), "--stop-when-idle", "2s"],
        profile=PhaseProfile("2s"),
        detach=False,
        driver_log_dir=str(deployment.root / "drivers"),
    )
    result = supervised.execute({})
    assert result["run_id"] not in runs
    assert result["run_id"] in {row["run_id"] for row in checkpoints(deployment.dirs)}
    assert_exactly_once(deployment.dirs, window_s=10.0)


def python_workers(task: psutil.Process) -> list[psutil.Process]:
    """Spark's Python workers under the task: they exist once a batch reads data. They run
    ``python -m <daemon module> pyspark.worker``, the daemon ours or PySpark's."""
    with contextlib.suppress(psutil.Error):
        tree = task.children(recursive=True)
        return [p for p in tree if command_line(p).endswith(" pyspark.worker")]
    return []


def test_killing_the_launch_task_leaves_no_spark_process_behind(deployment):
    dag_test = deployment.dags_test("backlog_phased")
    task = psutil.Process(dag_test.pid)
    try:
        # The launch task returns at the first checkpoint, so it is frozen while the first
        # batch runs (its Python workers exist) and killed after that batch committed.
        wait_for(lambda: python_workers(task), "the driver's Python workers", 240, dag_test, 0.2)
        task.suspend()
        assert not checkpoints(deployment.dirs), "the task was frozen after the first checkpoint"
        wait_for(lambda: checkpoints(deployment.dirs), "the first checkpoint", 240)
        driver = job_processes(JOB, deployment.data)
        assert len(driver) >= 3, "spark-submit, its JVM and the Python driver"
        # Every process under the task, whatever its command line says.
        driver += task.children(recursive=True)
        # What Airflow does to a task it kills: SIGTERM, which runs the operator's on_kill.
        os.kill(dag_test.pid, signal.SIGTERM)
        task.resume()
        dag_test.wait(120)
    finally:
        if dag_test.poll() is None:
            dag_test.kill()
    left = [p for p in driver if alive(p)]
    assert not left, f"left behind: {left}"
    assert not job_processes(JOB, deployment.data)
    states = task_states(deployment.home, "backlog_phased")
    assert states["launch_backlog_profile"] == "failed"
    assert states["wait_until_live"] == "upstream_failed"
    assert "the task was killed while run launch_backlog_profile.1." in deployment.log_of(dag_test)
    # Its lease was released with it: a retry need not wait for it to expire.
    leases = deployment.rows(sa.select(backlog_leases.c.released_at))
    assert [lease.released_at is not None for lease in leases] == [True]
