"""A Spark standalone cluster on loopback, from the pyspark wheel: one master, N workers.

The wheel has ``spark-class`` but not ``start-master.sh``, so the daemons are started here
directly (``org.apache.spark.deploy.master.Master`` and ``...worker.Worker``), each in a
process group of its own with its log in the cluster's directory. Jobs then run with
``--master spark://127.0.0.1:PORT`` in client mode: the driver where spark-submit runs,
executors in JVMs the workers start, as on a real cluster.

    scripts/spark-cluster start --dir var/spark-cluster   # returns once all workers joined
    scripts/spark-cluster status --dir var/spark-cluster
    scripts/spark-cluster stop --dir var/spark-cluster

Python code uses ``StandaloneCluster`` as a context manager; tests kill a worker with
``kill_worker``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from spark_jobs.backlog.values import count_argument
from tools.services.ports import free_port

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
HOST = "127.0.0.1"
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """The cluster could not start, or is not in the state asked for."""


def spark_class() -> str:
    """``spark-class`` of the pyspark this interpreter runs."""
    found = shutil.which("spark-class", path=os.path.dirname(sys.executable)) or shutil.which(
        "spark-class"
    )
    if found is None:
        raise ClusterError(f"spark-class is neither next to {sys.executable} nor on PATH")
    return found


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the JVM binds: a closed connection's TIME_WAIT does not make the port taken.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class ClusterLayout:
    """Where the daemons listen and what each worker offers; saved in the cluster's
    directory so that ``stop`` and ``status`` find a cluster another process started."""

    directory: str
    master_port: int
    master_ui_port: int
    worker_ui_ports: list[int]
    worker_cores: int
    worker_memory: str
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def master_ui_url(self) -> str:
        return f"http://{HOST}:{self.master_ui_port}"

    def save(self) -> None:
        Path(self.directory, STATE_FILE).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> ClusterLayout:
        path = directory / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no cluster was started in {directory} ({path} is missing)")
        return cls(**json.loads(path.read_text()))


class StandaloneCluster:
    """``with StandaloneCluster(directory) as cluster: ... cluster.master_url ...``

    Ports default to free ones; ``start`` fails by name when a given port is taken, and
    returns once every worker has registered with the master. ``stop`` ends the workers
    (and the executors they run) before the master.
    """

    def __init__(
        self,
        directory: Path,
        workers: int = 2,
        worker_cores: int = 2,
        worker_memory: str = "2g",
        master_port: int | None = None,
        master_ui_port: int | None = None,
    ):
        if workers < 1:
            raise ValueError(f"workers = {workers}: a cluster needs at least one worker")
        self.layout = ClusterLayout(
            directory=str(directory.resolve()),
            master_port=master_port or free_port(),
            master_ui_port=master_ui_port or free_port(),
            worker_ui_ports=[free_port() for _ in range(workers)],
            worker_cores=worker_cores,
            worker_memory=worker_memory,
        )
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def master_url(self) -> str:
        return self.layout.master_url

    @property
    def directory(self) -> Path:
        return Path(self.layout.directory)

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the daemons; stops whatever started when one of them does not come up."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        taken = [
            port
            for port in (self.layout.master_port, self.layout.master_ui_port)
            if not port_is_free(port)
        ]
        if taken:
            raise ClusterError(f"port(s) {taken} on {HOST} are in use: pick others")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.layout.pids["master"] = self._daemon(
            "master",
            MASTER_CLASS,
            "--host",
            HOST,
            "--port",
            str(self.layout.master_port),
            "--webui-port",
            str(self.layout.master_ui_port),
        )
        self.layout.save()
        deadline = time.monotonic() + timeout_s
        # A worker started before the master answers backs off for several seconds.
        _await(lambda: master_state(self.layout) is not None, "the master to start", deadline)
        for index, ui_port in enumerate(self.layout.worker_ui_ports):
            work_dir = self.directory / f"worker-{index}"
            self.layout.pids[f"worker-{index}"] = self._daemon(
                f"worker-{index}",
                WORKER_CLASS,
                "--host",
                HOST,
                "--cores",
                str(self.layout.worker_cores),
                "--memory",
                self.layout.worker_memory,
                "--webui-port",
                str(ui_port),
                "--work-dir",
                str(work_dir),
                self.master_url,
            )
            self.layout.save()
        wanted = len(self.layout.worker_ui_ports)
        _await(lambda: self.alive_workers() == wanted, f"{wanted} workers to join", deadline)

    def _daemon(self, name: str, main_class: str, *args: str) -> int:
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": HOST,
            # The daemons only schedule; executors get the memory the jobs ask for.
            "SPARK_DAEMON_MEMORY": os.environ.get("SPARK_DAEMON_MEMORY", "512m"),
            # Executors' Python workers need the job's code: this interpreter's packages.
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        }
        with (self.directory / f"{name}.log").open("ab") as log:
            process = self._processes[name] = subprocess.Popen(
                [spark_class(), main_class, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return process.pid

    def alive_workers(self) -> int:
        state = master_state(self.layout)
        return int(state.get("aliveworkers", 0)) if state else 0

    def worker_pid(self, index: int) -> int:
        return self.layout.pids[f"worker-{index}"]

    def worker_of_executor(self, executor_id: str) -> int | None:
        """Which worker runs executor ``executor_id`` (as Spark's UI and logs number them)."""
        for index in range(len(self.layout.worker_ui_ports)):
            worker = _daemon_process(self.worker_pid(index))
            for child in worker.children(recursive=True) if worker else []:
                with contextlib.suppress(psutil.Error):
                    line = child.cmdline()
                    if EXECUTOR_CLASS in " ".join(line) and _option(line, "--executor-id") == (
                        executor_id
                    ):
                        return index
        return None

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index`` as a lost machine would go: its JVM and the executors it
        started, with no chance to clean up. Returns the pids killed."""
        return _kill_tree(self.worker_pid(index), signal.SIGKILL)

    def stop(self) -> None:
        stop_daemons(self.layout)
        for process in self._processes.values():
            process.poll()  # reaped: stop_daemons waited for them

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def master_state(layout: ClusterLayout) -> dict[str, Any] | None:
    """The master's own JSON view (workers, applications), or None while it is not up."""
    try:
        with urllib.request.urlopen(f"{layout.master_ui_url}/json/", timeout=2) as response:
            return json.load(response)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _await(condition: Callable[[], bool], what: str, deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _daemon_process(pid: int) -> psutil.Process | None:
    """The process ``pid`` if it is still one of the cluster's daemons (pids get reused)."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        line = " ".join(process.cmdline())
        if MASTER_CLASS in line or WORKER_CLASS in line:
            return process
    return None


def _option(command: list[str], name: str) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return command[command.index(name) + 1]
    return None


def _kill_tree(pid: int, signum: signal.Signals) -> list[int]:
    process = _daemon_process(pid)
    if process is None:
        return []
    tree = [process, *process.children(recursive=True)]
    for member in tree:
        with contextlib.suppress(psutil.Error):
            member.send_signal(signum)
    return [member.pid for member in tree]


def stop_daemons(layout: ClusterLayout, timeout_s: float = 10.0) -> None:
    """Workers first (and their executors), then the master: SIGTERM, SIGKILL when late."""
    workers = [pid for name, pid in layout.pids.items() if name != "master"]
    for group in (workers, [layout.pids.get("master", 0)]):
        processes = []
        for pid in group:
            process = _daemon_process(pid)
            if process is not None:
                processes += [process, *process.children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(processes, timeout=timeout_s)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=2)


def describe(layout: ClusterLayout) -> str:
    state = master_state(layout)
    if state is None:
        return f"master {layout.master_url}: not answering at {layout.master_ui_url}"
    apps = [app.get("name", "?") for app in state.get("activeapps", [])]
    return (
        f"master {layout.master_url} ({state.get('status', '?')}), UI {layout.master_ui_url}: "
        f"{state.get('aliveworkers', 0)} alive workers, {state.get('cores', 0)} cores, "
        f"running applications: {', '.join(apps) or 'none'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/spark-cluster",
        description="Start, inspect or stop a Spark standalone cluster on loopback.",
    )
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument("--dir", type=Path, default=Path("var/spark-cluster"))
    parser.add_argument("--workers", type=count_argument, default=2)
    parser.add_argument("--worker-cores", type=count_argument, default=2)
    parser.add_argument("--worker-memory", default="2g")
    parser.add_argument("--master-port", type=count_argument, default=7077)
    parser.add_argument("--master-ui-port", type=count_argument, default=8090)
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            with contextlib.suppress(ClusterError):
                if master_state(ClusterLayout.load(args.dir)) is not None:
                    raise SystemExit(f"a cluster from {args.dir} is running; stop it first")
            cluster = StandaloneCluster(
                args.dir,
                workers=args.workers,
                worker_cores=args.worker_cores,
                worker_memory=args.worker_memory,
                master_port=args.master_port,
                master_ui_port=args.master_ui_port,
            )
            cluster.start()
            print(describe(cluster.layout))
            print(f"logs: {cluster.directory}; submit with --master {cluster.master_url}")
        elif args.action == "status":
            print(describe(ClusterLayout.load(args.dir)))
        else:
            stop_daemons(ClusterLayout.load(args.dir))
            print(f"stopped the cluster of {args.dir}")
    except ClusterError as error:
        print(f"scripts/spark-cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
