"""Ctrl-C on ``scripts/demo --ui`` ends everything the demo started, within a minute:
``airflow standalone`` and its components, the job's driver, the producer and the broker.

The demo runs as a terminal runs a foreground job, in a process group of its own, and gets
Ctrl-C as a terminal sends it: SIGINT to that whole group. Ctrl-C is how ``--ui`` is meant
to end, so the demo then exits with 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tools import child_environment
from tools.services.ports import free_port

pytestmark = pytest.mark.spark  # Airflow, and a local Spark job: about a minute each

REPO = Path(__file__).resolve().parents[3]
#: Ctrl-C to exit, worst case: Airflow's grace, SIGTERM's, the driver's, the broker's.
EXIT_BOUND_S = 60.0
STARTUP_BOUND_S = 180.0


def running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Demo:
    """``scripts/demo --ui`` on a small workspace, with ports of its own."""

    process: subprocess.Popen
    workdir: Path
    port: int
    output: Path

    def lines(self) -> list[str]:
        return self.output.read_text(errors="replace").splitlines()

    def tree(self) -> list[psutil.Process]:
        """Its process group, its descendants (Airflow, in a session of its own, among them)
        and the job's driver, which runs in a session of its own."""
        group = [p for p in psutil.process_iter() if pgid(p.pid) == self.process.pid]
        root = psutil.Process(self.process.pid)
        return unique([*group, root, *root.children(recursive=True), *self.drivers()])

    def drivers(self) -> list[psutil.Process]:
        """The job's driver on this workspace, with what it started."""
        checkpoint = str(self.workdir / "data" / "checkpoint")
        roots = [
            p for p in psutil.process_iter(["cmdline"]) if checkpoint in (p.info["cmdline"] or [])
        ]
        return unique([q for p in roots for q in [p, *children(p)]])

    def leftovers(self) -> list[psutil.Process]:
        """Anything else still running that names this workspace, or runs Airflow on it."""
        mark, home = str(self.workdir), str(self.workdir / "airflow")
        return [
            p
            for p in psutil.process_iter(["cmdline", "environ"])
            if p.pid != os.getpid()
            and running(p)
            and (
                any(mark in arg for arg in p.info["cmdline"] or [])
                or (p.info["environ"] or {}).get("AIRFLOW_HOME") == home
            )
        ]


def pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def names(processes: list[psutil.Process]) -> set[str]:
    """The names of those still running: a short-lived one may end as the tree is read."""
    found = set()
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.add(process.name())
    return found


def unique(processes: list[psutil.Process]) -> list[psutil.Process]:
    return list({p.pid: p for p in processes}.values())


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    """The demo, up once Airflow's API answers; whatever it leaves is killed afterwards."""
    port = free_port()
    env = {
        **child_environment(),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The scheduler's and the triggerer's log servers, away from any other Airflow's.
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }
    workdir, output = tmp_path / "demo", tmp_path / "demo.out"
    command = [str(REPO / "scripts" / "demo"), "--ui", "--port", str(port)]
    command += ["--workdir", str(workdir), "--events", "20000", "--files", "2"]
    command += ["--topic-backlog", "2000", "--live-events-per-s", "200"]
    with output.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    running_demo = Demo(process, workdir, port, output)
    try:
        wait_for_api(running_demo)
        yield running_demo
    finally:
        group = running_demo.tree() if process.poll() is None else []
        for each in unique([*group, *running_demo.leftovers()]):
            with contextlib.suppress(psutil.NoSuchProcess):
                each.kill()
        process.kill()
        process.wait()


def wait_for_api(demo: Demo) -> None:
    deadline = time.monotonic() + STARTUP_BOUND_S
    url = f"http://127.0.0.1:{demo.port}/api/v2/version"
    while True:
        assert demo.process.poll() is None, "\n".join(demo.lines()[-40:])
        assert time.monotonic() < deadline, f"no answer at {url}"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)


def api(demo: Demo, method: str, path: str, body: dict, token: str | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{demo.port}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def trigger_the_dag(demo: Demo) -> None:
    """Log in as admin and trigger the DAG with the conf the demo printed, once the DAG
    processor has parsed it."""
    passwords = demo.workdir / "airflow" / "simple_auth_manager_passwords.json.generated"
    password = json.loads(passwords.read_text())["admin"]
    token = api(demo, "POST", "/auth/token", {"username": "admin", "password": password})
    bearer = token["access_token"]
    prefix = "trigger backlog_phased with the conf "
    conf = json.loads(next(line for line in demo.lines() if line.startswith(prefix))[len(prefix) :])
    deadline = time.monotonic() + STARTUP_BOUND_S
    while True:
        try:
            api(demo, "PATCH", "/api/v2/dags/backlog_phased", {"is_paused": False}, bearer)
            break
        except urllib.error.HTTPError as error:
            assert error.code == 404 and time.monotonic() < deadline, error
            time.sleep(1)
    run = {"logical_date": None, "conf": conf}
    api(demo, "POST", "/api/v2/dags/backlog_phased/dagRuns", run, bearer)


def wait_for_the_driver(demo: Demo) -> None:
    deadline = time.monotonic() + STARTUP_BOUND_S
    while not any(p.name() == "java" for p in demo.drivers() if running(p)):
        assert demo.process.poll() is None, "\n".join(demo.lines()[-40:])
        assert time.monotonic() < deadline, "the DAG did not launch the job"
        time.sleep(1)


def ctrl_c(demo: Demo, again_after_s: float | None = None) -> None:
    """SIGINT to the demo's group, as a terminal's Ctrl-C (and again after ``again_after_s``);
    fails unless the demo exits within ``EXIT_BOUND_S``."""
    os.killpg(demo.process.pid, signal.SIGINT)
    if again_after_s is not None:
        time.sleep(again_after_s)
        os.killpg(demo.process.pid, signal.SIGINT)
    try:
        demo.process.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"still running {EXIT_BOUND_S:g} s after Ctrl-C:\n" + "\n".join(demo.lines()[-40:])
        )


def assert_all_ended(demo: Demo, before: list[psutil.Process]) -> None:
    left = [p for p in before if running(p)] + demo.leftovers()
    assert not left, f"left running: {[(p.pid, p.name()) for p in left]}"
    assert demo.process.returncode == 0, "\n".join(demo.lines()[-40:])
    assert (
        "scripts/demo: stopped Airflow, the job, the live producer and the broker" in demo.lines()
    )


def test_ctrl_c_while_the_dag_runs_the_job_ends_airflow_the_driver_and_the_broker(demo):
    trigger_the_dag(demo)
    wait_for_the_driver(demo)
    before = demo.tree()
    assert {"airflow", "java"} <= names(before)
    ctrl_c(demo)
    assert_all_ended(demo, before)


def test_a_second_ctrl_c_while_stopping_leaves_nothing_running_either(demo):
    before = demo.tree()
    ctrl_c(demo, again_after_s=1.0)
    assert_all_ended(demo, before)
