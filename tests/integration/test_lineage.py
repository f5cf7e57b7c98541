"""What a launch reports to Airflow's OpenLineage integration, under ``airflow dags test``
with real Spark and the embedded broker: the task's START and COMPLETE events name the
job's inputs, outputs and checkpoint exactly, and the OpenLineage transport handed on to
Spark keeps its API key out of the task's log and the driver's.

The task runs as in a deployment, through the executor and the task supervisor (an
``airflow api-server`` serves their Execution API), since the supervisor is what masks
secrets in the task's log."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.integration.deployment import Deployment, deployed
from tests.integration.jobs import wait_for
from tests.support.api_server import stop, wait_until_healthy
from tools.demo.airflow_demo import airflow, task_states
from tools.services.ports import free_port

DAGS = Path(__file__).parent / "dags"
DAG_ID = "backlog_lineage"
API_KEY = "lineage-api-key-7f3c9e1d"


class Collector(ThreadingHTTPServer):
    """An OpenLineage HTTP endpoint on loopback that keeps each request's Authorization."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Collect)
        self.authorizations: list[str] = []

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Collect(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.authorizations.append(self.headers.get("Authorization", ""))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def execution_api(deployment: Deployment) -> Iterator[None]:
    """An api-server on the deployment's Airflow home, whose Execution API the executor's
    task supervisors call; the deployment's environment points them at it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    deployment.env |= {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
    }
    log = deployment.root / "api-server.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            airflow("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            env=deployment.env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_healthy(server, url, log, 120)
        yield
    finally:
        stop(server)


@contextlib.contextmanager
def dag_test_on_the_executor(deployment: Deployment) -> Iterator[subprocess.Popen]:
    """``airflow dags test --use-executor``, its output in a log; at the end its process
    group goes, the executor's workers with it: they may linger once the run is over."""
    log = (deployment.root / f"{DAG_ID}.log").open("w")
    command = ["dags", "test", DAG_ID, "--use-executor", "--conf", json.dumps(deployment.conf)]
    process = subprocess.Popen(
        airflow(*command),
        env=deployment.env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    process.log_path = Path(log.name)  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


def task_events(path: Path, task_id: str) -> dict[str, dict]:
    """The OpenLineage events of the task's run so far, by type (START, COMPLETE...): the
    whole lines only, as the transport may be writing the next one."""
    if not path.exists():
        return {}
    written = path.read_text()
    whole = written[: written.rfind("\n") + 1]
    events = [json.loads(line) for line in whole.splitlines() if line.strip()]
    return {
        event["eventType"]: event
        for event in events
        if event["job"]["name"] == f"{DAG_ID}.{task_id}"
    }


def identities(datasets: list[dict]) -> list[tuple[str, str]]:
    return [(dataset["namespace"], dataset["name"]) for dataset in datasets]


def test_a_launch_reports_its_datasets_and_checkpoint_and_keeps_the_api_key_out_of_logs(
    tmp_path, broker, collector
):
    events_file = tmp_path / "openlineage.jsonl"
    transport = {
        "type": "composite",
        "transports": {
            "file": {"type": "file", "log_file_path": str(events_file), "append": True},
            "collector": {
                "type": "http",
                "url": collector.url,
                "auth": {"type": "api_key", "apiKey": API_KEY},
            },
        },
    }
    with deployed(tmp_path, broker.bootstrap_servers, history_events=4_000) as deployment:
        deployment.env |= {
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "backlog-tests",
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
        }

        def completed() -> dict[str, dict]:
            events = task_events(events_file, "launch")
            return events if "COMPLETE" in events else {}

        with execution_api(deployment), dag_test_on_the_executor(deployment) as dag_test:
            events = wait_for(completed, "the task's COMPLETE event", 300, dag_test)
        assert task_states(deployment.home, DAG_ID) == {"launch": "success"}

    data = deployment.data
    assert sorted(events) == ["COMPLETE", "START"]
    for event in events.values():
        assert identities(event["inputs"]) == [
            ("file", f"{data}/history"),
            (f"kafka://{broker.bootstrap_servers}", "events"),
        ]
        assert identities(event["outputs"]) == [("file", f"{data}/lineage output's")]
        checkpoint = event["run"]["facets"]["backlogCheckpoint"]
        assert (checkpoint["namespace"], checkpoint["name"]) == ("file", f"{data}/checkpoint")
        assert checkpoint["_schemaURL"] == (
            "urn:airflow-provider-backlog:lineage:BacklogCheckpointRunFacet:1-0-0"
            "#/$defs/BacklogCheckpointRunFacet"
        )

    # The task's run is the Spark application's parent, and the transport went to Spark with
    # its key, which the task's log shows masked and the driver's log not at all.
    assert set(collector.authorizations) == {f"Bearer {API_KEY}"}
    logs = deployment.home / "logs"
    (task_log,) = logs.glob(f"dag_id={DAG_ID}/run_id=*/task_id=launch/attempt=1.log")
    task_text = task_log.read_text()
    assert "spark.openlineage.parentJobName=backlog_lineage.launch" in task_text
    assert re.search(r"transports\.collector\.auth\.apiKey=(Bearer )?\*\*\*", task_text)
    (driver_log,) = (logs / "backlog-drivers").glob("launch.1.*.log")
    for text in (task_text, driver_log.read_text(errors="replace")):
        assert API_KEY not in text
