"""An Airflow deployment for the end-to-end tests: its own Airflow home reading ``dags/``,
connections to a Spark master and a metrics database, a file backlog and a Kafka topic
with events waiting and arriving; and finding (and killing) a job's driver processes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from spark_jobs.metrics.schema import make_engine, metadata
from tests.integration.jobs import KAFKA_PARTITIONS, KAFKA_TOPIC, JobDirs, now
from tools.data.events import KafkaProducerThread, history_range, write_history
from tools.demo.airflow_demo import airflow, airflow_environment, task_states

JOB = "events"


class Deployment:
    """An Airflow home on SQLite reading ``dags/``, with a Spark master and a metrics
    database as its connections (local Spark and SQLite unless given), a file backlog, and a
    topic with events waiting and live ones arriving."""

    def __init__(
        self,
        root: Path,
        bootstrap_servers: str,
        spark_master: str = "local[2]",
        metrics_url: str | None = None,
        history_events: int = 40_000,
    ):
        self.root = root
        self.data = root / "data"
        self.home = root / "airflow"
        self.env = airflow_environment(self.home, self.data, spark_master, metrics_url)
        self.dirs = JobDirs(self.data, bootstrap_servers, metrics_url)
        self.metrics_url = self.dirs.metrics_url
        self.dirs.metrics_dir.mkdir(parents=True)
        engine = make_engine(self.metrics_url)
        metadata.drop_all(engine)
        metadata.create_all(engine)
        engine.dispose()
        start, end = history_range(now())
        first_live_id = write_history(self.data / "history", history_events, 4, start, end)
        self.producer = KafkaProducerThread(
            bootstrap_servers, KAFKA_TOPIC, KAFKA_PARTITIONS, first_live_id, 500
        )
        self.producer.burst(20_000)
        self.producer.start()
        self.conf = {"data_dir": str(self.data), "kafka_bootstrap_servers": bootstrap_servers}
        subprocess.run(airflow("db", "migrate"), env=self.env, check=True, capture_output=True)

    def dags_test(self, dag_id: str, **conf: object) -> subprocess.Popen:
        log = (self.root / f"{dag_id}-{time.time_ns()}.log").open("w")
        process = subprocess.Popen(
            airflow("dags", "test", dag_id, "--conf", json.dumps(self.conf | conf)),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        process.log_path = Path(log.name)  # type: ignore[attr-defined]
        return process

    def run_dag(self, dag_id: str, timeout_s: float, **conf: object) -> dict[str, str]:
        """Run the DAG to its end; the state of each of its tasks."""
        process = self.dags_test(dag_id, **conf)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"{dag_id} did not end:\n{self.log_of(process)}") from None
        return task_states(self.home, dag_id)

    def log_of(self, process: subprocess.Popen) -> str:
        return process.log_path.read_text()[-6000:]  # type: ignore[attr-defined]

    def use_connections(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The same connections for operators run in this test process."""
        for key, value in self.env.items():
            if key.startswith("AIRFLOW_CONN_"):
                monkeypatch.setenv(key, value)

    def rows(self, query: sa.Select) -> list[sa.Row]:
        engine = make_engine(self.metrics_url)
        try:
            with engine.connect() as connection:
                return connection.execute(query).all()
        finally:
            engine.dispose()

    def xcom(self, task_id: str, key: str) -> object:
        engine = sa.create_engine(f"sqlite:///{self.home / 'airflow.db'}")
        try:
            with engine.connect() as connection:
                value = connection.execute(
                    sa.text("SELECT value FROM xcom WHERE task_id = :task AND key = :key"),
                    {"task": task_id, "key": key},
                ).scalar_one()
        finally:
            engine.dispose()
        return json.loads(value) if isinstance(value, str) else value

    def close(self) -> None:
        if self.producer.is_alive():
            self.producer.stop()

    def driver_log(self, task_id: str) -> str:
        """The driver's output of the run ``task_id`` launched (its first try)."""
        logs = self.home / "logs" / "backlog-drivers"
        (path,) = logs.glob(f"{task_id}.1.*.log")
        return path.read_text(errors="replace")


@contextlib.contextmanager
def deployed(*args: object, **kwargs: object) -> Iterator[Deployment]:
    deployment = Deployment(*args, **kwargs)  # type: ignore[arg-type]
    try:
        yield deployment
    finally:
        deployment.close()
        kill_all(job_processes(JOB, deployment.data))


def job_processes(job: str, data: Path) -> list[psutil.Process]:
    """Every process of a driver of ``job`` on ``data`` (spark-submit, its JVM, its Python
    driver and workers), found by their command lines and their parents'."""
    found: list[psutil.Process] = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if f"spark.backlog.job-name={job}" in line and str(data) in line:
            with contextlib.suppress(psutil.NoSuchProcess):
                found += [process, *process.children(recursive=True)]
    return [p for p in found if alive(p)]


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_all(processes: list[psutil.Process]) -> None:
    """Kill each; one that ended meanwhile (a child whose parent went first) is no error."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
