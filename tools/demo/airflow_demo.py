"""The Airflow demo: the phased DAG, run by ``airflow dags test`` on embedded defaults.

Writes a file backlog and starts the embedded Kafka broker with events already waiting in
the topic and live ones arriving; points an Airflow home of its own (SQLite) at ``dags/``,
local Spark and a SQLite metrics database. ``airflow dags test backlog_phased`` launches the
job with its backlog profile, waits until it is live, relaunches it with its live profile
and checks it stays fresh; each checkpoint and task state is printed as it happens. The
DAG leaves the job running: the demo follows its live run long enough for the live
interval's steady freshness to show, then stops it through the provider, and a summary per
run (with that freshness) and a PNG timeline follow.
With ``--ui`` the same setup is served by ``airflow standalone`` instead, until Ctrl-C or
SIGTERM: then Airflow, the job, the producer and the broker are stopped, in that order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from types import FrameType

import psutil
import sqlalchemy as sa

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import JavaMissing, job_environment, require_java
from tools import REPOSITORY
from tools.data.events import KafkaProducerThread
from tools.pipelines.report import (
    Checkpoint,
    cost_lines,
    epoch,
    freshness_s,
    load,
    phase_changes,
    plot_timeline,
    steady_live,
    weighted_percentile,
)
from tools.pipelines.runs import add_workspace_arguments, prepare_history, say
from tools.services.broker import EmbeddedBroker

DAG_ID = "backlog_phased"
JOB = "events"
TOPIC = "events"
PARTITIONS = 8
#: The example DAGs, next to these tools in the checkout.
DAGS_FOLDER = REPOSITORY / "dags"
#: After Ctrl-C: how long Airflow gets to end on its own, then after SIGTERM, before SIGKILL.
AIRFLOW_GRACE_S = 10.0
TERM_GRACE_S = 5.0
#: After Ctrl-C: how long the job gets to answer a stop request, then to stop, before its
#: driver is killed (without a Ctrl-C, the provider's usual minutes).
JOB_ANSWER_S = 10.0
JOB_STOP_S = 10.0
#: How long the live profile's run is followed, from its first checkpoint, before the job
#: is stopped: its first half serves the events that arrived during the relaunch, its
#: second half shows the live interval's steady freshness.
LIVE_RUN_S = 36.0


def airflow_environment(
    home: Path, data: Path, spark_master: str = "local[2]", metrics_url: str | None = None
) -> dict[str, str]:
    """Airflow on SQLite in ``home``, reading ``dags/``, with ``spark_master`` and the metrics
    database (by default a SQLite file in ``data``) as its connections; spark-submit and
    airflow from this interpreter's environment."""
    bin_dir = os.path.dirname(sys.executable)
    metrics: dict[str, object] = {"host": str(data / "metrics" / "metrics.db")}
    if metrics_url is not None:
        metrics = {"extra": {"url": metrics_url}}
    return {
        **job_environment(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
        "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT": json.dumps(
            {"conn_type": "backlog_metrics", **metrics}
        ),
        "BACKLOG_DATA_DIR": str(data),
    }


def airflow(*args: str) -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "airflow"), *args]


def task_states(
    home: Path, dag_id: str = DAG_ID, earlier_runs: Collection[str] = ()
) -> dict[str, str]:
    """The latest state of each task of the DAG, from Airflow's own database, leaving out
    the runs ``earlier_runs`` names (a workspace's previous demo)."""
    rows = _airflow_rows(
        home,
        "SELECT task_id, state, run_id FROM task_instance WHERE dag_id = :dag ORDER BY start_date",
        dag_id,
    )
    return {task: state or "none" for task, state, run in rows if run not in earlier_runs}


def dag_runs(home: Path, dag_id: str = DAG_ID) -> set[str]:
    """The DAG's runs so far, by run id."""
    rows = _airflow_rows(home, "SELECT run_id FROM dag_run WHERE dag_id = :dag", dag_id)
    return {run for (run,) in rows}


def _airflow_rows(home: Path, query: str, dag_id: str) -> list[sa.Row]:
    database = home / "airflow.db"
    if not database.exists():
        return []
    engine = sa.create_engine(f"sqlite:///{database}")
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.text(query), {"dag": dag_id}).all())
    except sa.exc.OperationalError:
        return []  # not migrated yet, or busy
    finally:
        engine.dispose()


def by_run(checkpoints: Sequence[Checkpoint]) -> dict[str, list[Checkpoint]]:
    """The job's checkpoints per run (one launch), the runs in the order they started."""
    runs: dict[str, list[Checkpoint]] = {}
    for checkpoint in checkpoints:
        runs.setdefault(checkpoint.run_id or "-", []).append(checkpoint)
    return runs


def run_lines(checkpoints: Sequence[Checkpoint]) -> list[str]:
    """Per run: its checkpoints, how many in backlog, rows, its live interval and, beside
    it, its steady live freshness (``steady_live``): the p50 and p95 of its events' time
    from event to commit, which the live interval sets."""
    lines = [
        f"{'run':36}{'checkpoints':>12}{'in backlog':>12}{'rows':>12}  {'live interval':15}"
        "steady live freshness p50, p95"
    ]
    for run_id, run in by_run(checkpoints).items():
        intervals = sorted({c.interval_ms for c in run if not c.is_backlog and c.interval_ms})
        live = ", ".join(f"{ms / 1000:g} s" for ms in intervals) or "-"
        steady = steady_live(run)
        samples = freshness_s(steady)
        freshness = "-"
        if samples:
            p50, p95 = (weighted_percentile(samples, share) for share in (0.5, 0.95))
            freshness = f"{p50:.1f} s, {p95:.1f} s ({len(steady)} checkpoints)"
        backlog = sum(c.is_backlog for c in run)
        rows = sum(c.rows for c in run)
        lines.append(f"{run_id:36}{len(run):12d}{backlog:12d}{rows:12,}  {live:15}{freshness}")
    return lines


def live_run_followed(checkpoints: Sequence[Checkpoint], now: float, seconds: float) -> bool:
    """Whether the job's latest run (after the relaunch, the live profile's) has run
    ``seconds`` since its first checkpoint, ``now`` (epoch seconds): long enough for the
    second half of its live time (``steady_live``) to show the freshness its interval
    gives. True without checkpoints: there is nothing to follow."""
    if not checkpoints:
        return True
    latest = checkpoints[-1].run_id
    first = next(c for c in checkpoints if c.run_id == latest)
    return now - first.committed_at >= seconds


class Follower:
    """Prints each change of a task's state and each new checkpoint, once, as it happens."""

    def __init__(self, home: Path, metrics_url: str) -> None:
        self.home = home
        self.metrics_url = metrics_url
        self.states: dict[str, str] = {}
        self.shown = 0
        #: The runs of an earlier demo in this workspace, whose states are not this one's.
        self.earlier_runs = dag_runs(home)

    def task_states(self) -> dict[str, str]:
        return task_states(self.home, earlier_runs=self.earlier_runs)

    def step(self) -> list[Checkpoint]:
        """Print what changed since the last step; the job's checkpoints so far."""
        now = self.task_states()
        for task, state in now.items():
            if self.states.get(task) != state:
                say(f"[airflow] {task}: {state}")
        self.states = now or self.states
        try:
            checkpoints = load(self.metrics_url, JOB)[0]
        except sa.exc.SQLAlchemyError:
            checkpoints = []  # the job has not created the tables yet
        for checkpoint in checkpoints[self.shown :]:
            say(
                f"[job] checkpoint {checkpoint.batch_id:4d}  "
                f"{'backlog' if checkpoint.is_backlog else 'live   '} "
                f"{checkpoint.rows:>10,} rows  {checkpoint.duration_s:6.2f} s  "
                f"left behind: {'-' if checkpoint.behind is None else checkpoint.behind}"
            )
        self.shown = max(self.shown, len(checkpoints))
        return checkpoints


def follow_live_run(follower: Follower, seconds: float) -> None:
    """Go on printing checkpoints until the job's live run has run ``seconds``."""
    while not live_run_followed(follower.step(), time.time(), seconds):
        time.sleep(1.0)


def stop_job(
    env: dict[str, str], answer_timeout_s: float = 60.0, stop_timeout_s: float = 180.0
) -> str:
    """End the job as a DAG would, through the provider: the DAG leaves it running."""
    os.environ.update(env)
    from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook

    hook = BacklogMetricsHook()
    if hook.live_run(JOB) is None:
        return "no run of the job is alive"
    return hook.stop(JOB, answer_timeout_s=answer_timeout_s, stop_timeout_s=stop_timeout_s)


class Interrupts:
    """Ctrl-C and SIGTERM, which end the demo alike. Until it starts stopping what it started,
    the first raises KeyboardInterrupt where the demo waits. From then on they only set
    ``hurry``: the shutdown then kills what is left instead of waiting for it, and no
    KeyboardInterrupt cuts it short, which would leave processes running."""

    def __init__(self) -> None:
        self.caught = False
        self.stopping = False
        self.hurry = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.caught = self.stopping = True
            raise KeyboardInterrupt
        self.hurry.set()


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """Children started meanwhile inherit SIGINT blocked. A terminal's Ctrl-C reaches its
    whole foreground process group: the embedded broker would stop on it at once, before
    the job and the producer that need it (the producer's close then waits for minutes on
    events it can no longer deliver); it is stopped last, by ``EmbeddedBroker.stop``."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def running(process: psutil.Process) -> bool:
    """Still running: neither gone nor a zombie waiting for its parent."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def session_processes(session: int) -> list[psutil.Process]:
    """The running processes of a session, wherever their parent's death reparented them."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getsid(process.pid) == session and running(process):
                found.append(process)
    return found


def session_left(
    leader: subprocess.Popen, seconds: float, hurry: threading.Event
) -> list[psutil.Process]:
    """The processes of the session ``leader`` leads still running after ``seconds``, or
    at once after another Ctrl-C; ``leader`` is reaped once it has ended."""
    deadline = time.monotonic() + seconds
    while True:
        leader.poll()
        left = session_processes(leader.pid)
        if not left or hurry.is_set() or time.monotonic() >= deadline:
            return left
        hurry.wait(0.2)


def end_airflow(standalone: subprocess.Popen, hurry: threading.Event) -> str:
    """End ``airflow standalone`` and every process of its session.

    SIGINT to standalone alone is its own way to end: it sends SIGTERM to each component
    and waits for them, and the scheduler then tells its LocalExecutor workers to stop.
    (A terminal's Ctrl-C reached all of them at once, those workers included, which ignore
    it; ``subprocess.run`` then killed standalone after 0.25 s, and the scheduler was left
    waiting at its exit for workers never told to stop.) What is left after
    ``AIRFLOW_GRACE_S`` (tasks still running, which the scheduler waits for) gets SIGTERM,
    then SIGKILL."""
    count = len(session_processes(standalone.pid))
    if standalone.poll() is None:
        standalone.send_signal(signal.SIGINT)
    left = session_left(standalone, AIRFLOW_GRACE_S, hurry)
    how = ""
    if left and not hurry.is_set():
        how = f"; SIGTERM to {len(left)} still running after {AIRFLOW_GRACE_S:g} s"
        signal_all(left, psutil.Process.terminate)
        left = session_left(standalone, TERM_GRACE_S, hurry)
    if left:
        how += f"; SIGKILL to {len(left)}" + (" after a second Ctrl-C" if hurry.is_set() else "")
        signal_all(left, psutil.Process.kill)
    standalone.wait()
    psutil.wait_procs(left, timeout=TERM_GRACE_S)
    return f"its {count} processes have ended{how}"


def signal_all(processes: list[psutil.Process], send: Callable[[psutil.Process], None]) -> None:
    """``send`` (``psutil.Process.terminate`` or ``kill``) to each process still there."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            send(process)


def workspace_drivers(data: Path) -> list[psutil.Process]:
    """The running processes of drivers of the job on this workspace's data, with what they
    started: spark-submit, its log rotator, the JVM and the Python driver name its
    checkpoint; Python workers are their children."""
    checkpoint = str(data / "checkpoint")
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline"]):
        if checkpoint in (process.info["cmdline"] or []) and running(process):
            with contextlib.suppress(psutil.NoSuchProcess):
                found.update({p.pid: p for p in [process, *process.children(recursive=True)]})
    return list(found.values())


def end_drivers(data: Path, stopping: bool) -> int:
    """End what is left of the job's drivers: SIGTERM, then SIGKILL after ``TERM_GRACE_S``;
    returns how many processes that took. A driver leads a session of its own, out of
    Airflow's reach, so a launch task killed before its first checkpoint, or a stop that
    timed out, would leave it running. A job that agreed to stop (``stopping``) gets
    ``TERM_GRACE_S`` to exit on its own first."""
    drivers = workspace_drivers(data)
    if stopping:
        _, drivers = psutil.wait_procs(drivers, timeout=TERM_GRACE_S)
    signal_all(drivers, psutil.Process.terminate)
    _, alive = psutil.wait_procs(drivers, timeout=TERM_GRACE_S)
    signal_all(alive, psutil.Process.kill)
    psutil.wait_procs(alive, timeout=TERM_GRACE_S)
    return len(drivers)


def end_job(env: dict[str, str], data: Path, interrupts: Interrupts) -> str:
    """Stop the job through the provider, sooner given up after Ctrl-C and skipped after a
    second one, then kill whatever is left of its drivers."""
    answer, stopping = "skipped after a second Ctrl-C", False
    if not interrupts.hurry.is_set():
        timeouts = (JOB_ANSWER_S, JOB_STOP_S) if interrupts.caught else ()
        try:
            answer, stopping = stop_job(env, *timeouts), True
        except Exception as error:  # whatever it was, its driver is ended below
            answer = f"{type(error).__name__}: {error}"
    ended = end_drivers(data, stopping)
    return f"{answer}; {ended} processes of its driver ended by signal" if ended else answer


def report(root: Path, metrics_url: str, states: dict[str, str]) -> None:
    say("\ntasks of the DAG run:")
    for task, state in states.items():
        say(f"  {task:24} {state}")
    checkpoints, transitions = load(metrics_url, JOB)
    say("\nruns of the job (each launch is one run, from the same checkpoint):")
    for line in run_lines(checkpoints):
        say(f"  {line}")
    say("  (steady: a run's live checkpoints in the second half of its live time)")
    origin = checkpoints[0].started_at if checkpoints else 0.0
    say("\ntransitions:")
    for change in transitions:
        phase = "backlog" if change["is_backlog"] else "live   "
        say(f"  {epoch(change['at']) - origin:7.1f} s  {phase}  {change['reason']}")
    say("")
    for line in cost_lines(checkpoints):
        say(f"  {line}")
    marks = [(epoch(t["at"]), t["reason"]) for t in transitions] + phase_changes(checkpoints)
    runs = list(by_run(checkpoints).items())
    marks += [(run[0].started_at, f"relaunched: {run_id}") for run_id, run in runs[1:]]
    chart = plot_timeline(
        [("the phased DAG: backlog profile, then live profile", checkpoints)],
        root / "timeline.png",
        "file backlog and a topic read from behind, launched and relaunched by Airflow",
        [marks],
    )
    say(f"\ntimeline chart: {chart}\nmetrics: {metrics_url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    add_workspace_arguments(parser, "var/airflow-demo", events=1_000_000)
    parser.add_argument(
        "--topic-backlog", type=count_argument, default=300_000, help="events in the topic at first"
    )
    parser.add_argument(
        "--ui", action="store_true", help="serve it with airflow standalone instead"
    )
    parser.add_argument("--port", type=int, default=8080, help="the Airflow UI's port (--ui)")
    parser.add_argument(
        "--live-seconds",
        type=float,
        default=LIVE_RUN_S,
        help="how long the relaunched run is followed, from its first checkpoint, before the "
        "job is stopped (the second half shows its steady freshness)",
    )
    args = parser.parse_args(argv)
    try:
        require_java()
    except JavaMissing as error:
        print(f"scripts/demo: {error}", file=sys.stderr)
        return 2
    interrupts = Interrupts()
    root = args.workdir.resolve()
    data, home = root / "data", root / "airflow"
    shutil.rmtree(data, ignore_errors=True)
    say(f"writing a backlog of {args.events:,} events in {args.files} parquet files")
    first_live_id = prepare_history(data / "history", args.events, args.files)
    metrics_url = f"sqlite:///{data / 'metrics' / 'metrics.db'}"
    env = airflow_environment(home, data)
    with contextlib.ExitStack() as stack:
        broker = EmbeddedBroker(root / "broker", {TOPIC: PARTITIONS})
        stack.callback(broker.stop)
        with sigint_blocked():
            broker.start()
        producer = KafkaProducerThread(
            broker.bootstrap_servers, TOPIC, PARTITIONS, first_live_id, args.live_events_per_s
        )
        say(f"{args.topic_backlog:,} events wait in topic {TOPIC!r} at {broker.bootstrap_servers}")
        try:
            producer.burst(args.topic_backlog)
            producer.start()
            conf = json.dumps(
                {"data_dir": str(data), "kafka_bootstrap_servers": broker.bootstrap_servers}
            )
            subprocess.run(airflow("db", "migrate"), env=env, check=True, capture_output=True)
            if args.ui:
                code = serve(env, home, conf, args.port, interrupts)
            else:
                follower = Follower(home, metrics_url)
                dag_test, states, log_path = run_dag_test(
                    env, root, conf, follower, args.live_seconds
                )
        finally:
            # Also after an error or Ctrl-C: the driver runs detached from this process.
            interrupts.stopping = True
            say(f"stopping the job: {end_job(env, data, interrupts)}")
            producer.stop()
    if args.ui:
        say("scripts/demo: stopped Airflow, the job, the live producer and the broker")
        return code
    report(root, metrics_url, states)
    failed = failed_tasks(states)
    if dag_test.returncode != 0 or failed:
        print(f"scripts/demo: the DAG run failed: {failed}; see {log_path}", file=sys.stderr)
        return 1
    return 0


def failed_tasks(states: dict[str, str]) -> dict[str, str]:
    """The tasks of the DAG run that did not succeed, with their states."""
    return {task: state for task, state in states.items() if state != "success"}


def run_dag_test(
    env: dict[str, str], root: Path, conf: str, follower: Follower, live_seconds: float
) -> tuple[subprocess.Popen, dict[str, str], Path]:
    """``airflow dags test`` of the DAG, followed until it ends; then, if it succeeded, the
    job it left running until its live run has run ``live_seconds``. The process, the task
    states and its log."""
    log_path = root / "dags-test.log"
    say(f"airflow dags test {DAG_ID} (its log: {log_path})")
    with log_path.open("w") as log:
        dag_test = subprocess.Popen(
            airflow("dags", "test", DAG_ID, "--conf", conf),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    while dag_test.poll() is None:
        follower.step()
        time.sleep(1.0)
    states = follower.task_states()
    if dag_test.returncode == 0 and states and not failed_tasks(states):
        say(
            "the DAG run has ended; the job runs on, as in production: following its live "
            f"run until it has run {live_seconds:g} s"
        )
        follow_live_run(follower, live_seconds)
    return dag_test, states, log_path


def serve(env: dict[str, str], home: Path, conf: str, port: int, interrupts: Interrupts) -> int:
    """``airflow standalone`` on this setup, until Ctrl-C or SIGTERM (then 0) or its end.

    It runs in a session of its own, which a terminal's Ctrl-C does not reach: this process
    ends it (``end_airflow``), rather than ``subprocess.run``, which on KeyboardInterrupt
    kills it after 0.25 s and leaves its components running without it."""
    url = f"http://localhost:{port}"
    say(
        f"\nairflow standalone at {url} (user admin, password in "
        f"{home / 'simple_auth_manager_passwords.json.generated'});\ntrigger {DAG_ID} with "
        f"the conf {conf}\nCtrl-C ends Airflow and stops the job"
    )
    # Tasks reach the API server at the execution API's URL, by default on port 8080.
    env = {
        **env,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
    }
    standalone = subprocess.Popen(airflow("standalone"), env=env, start_new_session=True)
    try:
        return standalone.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        interrupts.stopping = True
        say(f"stopping Airflow: {end_airflow(standalone, interrupts.hurry)}")


if __name__ == "__main__":
    sys.exit(main())
