"""How far one triggerer goes: many deferred sensors over many jobs.

Starts a throwaway PostgreSQL server (the metrics database, with pg_stat_statements), a
real Airflow in a temporary home (its metadata on SQLite: Airflow's PostgreSQL support needs
an async driver this project does not install; api-server, scheduler with the
LocalExecutor, dag-processor and one ``airflow triggerer``) and one DAG per
simulated job with ``--sensors-per-job`` deferrable sensors, half ``BacklogPhaseSensor``
(live), half ``BacklogFreshnessSensor``. Each simulated job holds a lease and renews it
(``LeaseStore``, ``LeaseKeeper``) and writes its rows through ``MetricsWriter``, as a driver
does: it is in backlog, its last checkpoint minutes old (a long backlog batch).

Once every sensor is deferred it measures for ``--window`` seconds: the task instances
running or queued (worker slots held), the statements per second the sensors' database role
sends to the metrics database (pg_stat_statements), and the triggerer's CPU time (its
process tree) per wall second. Then each job commits its decisive row, a live checkpoint
after its transition to live, at a random moment spread over two poll intervals, and the
time from that insert to each sensor's trigger event (from the triggerer's log) is
reported. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import sqlalchemy as sa

from spark_jobs.backlog.values import count_argument, duration_argument
from spark_jobs.metrics.lease import LeaseKeeper, LeaseStore
from spark_jobs.metrics.schema import CheckpointRow, TransitionRow, create_tables
from spark_jobs.metrics.writer import MetricsWriter
from tools import child_environment
from tools.pipelines.runs import say
from tools.services.postgres import PostgresServer, free_port

CONN_ID = "backlog_metrics_scale"
#: The database role the sensors read the metrics as, so their statements can be told apart.
SENSOR_ROLE = "sensors"
LEASE_TTL_S = 30.0
#: How old the jobs' last (backlog) checkpoint is while the sensors wait, and the freshness
#: the freshness sensors ask for: the decisive checkpoint meets it, the old one does not.
STALE_S = 600.0
FRESHNESS_S = 120.0

DAG_FILE = """\
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor, BacklogPhaseSensor

for job in {jobs!r}:
    with DAG(dag_id=f"scale_{{job}}", schedule="@once", start_date=datetime(2026, 1, 1)) as dag:
        for number in range({sensors}):
            common = dict(job_name=job, metrics_conn_id={conn_id!r}, deferrable=True,
                          poke_interval={poll_s}, timeout=3600, retries=2,
                          retry_delay=timedelta(seconds=5))
            if number % 2:
                BacklogFreshnessSensor(task_id=f"fresh_{{number}}", within={freshness_s}, **common)
            else:
                BacklogPhaseSensor(task_id=f"live_{{number}}", phase="live", **common)
    globals()[dag.dag_id] = dag
"""


def job_names(count: int) -> list[str]:
    return [f"job{number:03d}" for number in range(count)]


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1))]


@contextlib.contextmanager
def metrics_server() -> Iterator[PostgresServer]:
    """The throwaway PostgreSQL with pg_stat_statements loaded and the sensors' role."""
    with PostgresServer(database="metrics") as server:
        admin = sa.create_engine(psycopg2(server.url), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql(
                "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
            )
        admin.dispose()
        server.stop()
        server.start()
        admin = sa.create_engine(psycopg2(server.url), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.exec_driver_sql("CREATE EXTENSION pg_stat_statements")
            # Superuser so that it may create missing tables as the hook does; trust auth.
            connection.exec_driver_sql(f"CREATE ROLE {SENSOR_ROLE} LOGIN SUPERUSER")
        create_tables(admin)
        admin.dispose()
        yield server


def psycopg2(url: str) -> str:
    """``url`` with the PostgreSQL driver that is installed (SQLAlchemy defaults to psycopg)."""
    return url.replace("postgresql://", "postgresql+psycopg2://", 1)


def role_url(server: PostgresServer, role: str, database: str) -> str:
    return f"postgresql://{role}@127.0.0.1:{server.port}/{database}"


def statements(admin: sa.Engine) -> tuple[int, int]:
    """All statements and the SELECTs the sensors' role ran on the metrics database."""
    with admin.connect() as connection:
        row = connection.execute(
            sa.text(
                "SELECT coalesce(sum(s.calls), 0), "
                "coalesce(sum(s.calls) FILTER (WHERE s.query ILIKE 'select%'), 0) "
                "FROM pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid "
                "JOIN pg_database d ON d.oid = s.dbid "
                "WHERE r.rolname = :role AND d.datname = 'metrics'"
            ),
            {"role": SENSOR_ROLE},
        ).one()
    return int(row[0]), int(row[1])


class Jobs:
    """The simulated jobs: each holds its lease and renews it, and writes its rows as a
    driver's ``MetricsWriter`` does."""

    def __init__(self, url: str, names: list[str]):
        self.names = names
        self.store = LeaseStore(url)
        self.writer = MetricsWriter(url, flush_interval_s=0.05)
        self.keepers: list[LeaseKeeper] = []
        self.batches = dict.fromkeys(names, 0)
        stale = datetime.now(UTC) - timedelta(seconds=STALE_S)
        for name in names:
            acquired = self.store.acquire(name, f"file:///scale/{name}", f"{name}-run", LEASE_TTL_S)
            keeper = LeaseKeeper(self.store, acquired, LEASE_TTL_S, lambda _: None, say)
            keeper.start()
            self.keepers.append(keeper)
            self.writer.record_transition(TransitionRow(name, f"{name}-run", stale, True, "start"))
            for _ in range(3):
                self.commit(name, stale, backlog=True)
        self.writer.flush()

    def commit(self, name: str, at: datetime, backlog: bool) -> None:
        batch = self.batches[name]
        self.batches[name] = batch + 1
        self.writer.record_checkpoint(
            CheckpointRow(
                job_name=name,
                run_id=f"{name}-run",
                batch_id=batch,
                committed_at=at,
                is_backlog=backlog,
                effective_interval_ms=60_000 if backlog else 2_000,
                num_input_rows=100_000 if backlog else 500,
                batch_duration_ms=1_500,
                watermark=None,
                sources="[]",
                observed_metrics=None,
            )
        )

    def turn_live(self, name: str) -> datetime:
        """The job's transition to live and its first live checkpoint; when it was inserted
        (just before, so latencies are not flattered)."""
        at = datetime.now(UTC)
        self.writer.record_transition(TransitionRow(name, f"{name}-run", at, False, "caught up"))
        self.commit(name, at, backlog=False)
        self.writer.flush()
        return at

    def close(self) -> None:
        for keeper in self.keepers:
            keeper.release()
        self.writer.close()
        self.store.close()


class Airflow:
    """api-server, scheduler, dag-processor and triggerer in a home of their own, each in a
    process group this tool ends."""

    COMPONENTS = (("api-server", "-w", "1"), ("scheduler",), ("dag-processor",), ("triggerer",))

    def __init__(self, home: Path, env: dict[str, str]):
        self.home = home
        self.env = env
        self.processes: dict[str, subprocess.Popen] = {}

    def command(self, *args: str) -> list[str]:
        return [os.path.join(os.path.dirname(sys.executable), "airflow"), *args]

    def start(self) -> None:
        migrate = subprocess.run(
            self.command("db", "migrate"), env=self.env, capture_output=True, text=True
        )
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stderr[-3000:]}")
        for component in self.COMPONENTS:
            log = (self.home / f"{component[0]}.log").open("w")
            self.processes[component[0]] = subprocess.Popen(
                self.command(*component),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.home / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"airflow {name} exited with {process.returncode}:\n{tail}")

    def cpu_s(self, name: str) -> float:
        """CPU seconds of the component's process tree so far."""
        root = psutil.Process(self.processes[name].pid)
        total = 0.0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def airflow_environment(
    home: Path, metadata_url: str, metrics_url: str, parallelism: int
) -> dict[str, str]:
    port = free_port()
    return {
        **child_environment(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "10000",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__TRIGGERER__CAPACITY": "5000",
        # On a loaded machine the api-server answers slowly: a worker that gives up after
        # the default 5 s fails the task before it could defer.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(
            {"conn_type": "backlog_metrics", "extra": {"url": metrics_url}}
        ),
    }


def task_states(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT coalesce(state, 'none'), count(*) FROM task_instance GROUP BY 1")
        ).all()
    return {state: count for state, count in rows}


def wait_for(
    airflow: Airflow, engine: sa.Engine, done: str, total: int, timeout_s: float
) -> dict[str, int]:
    """Until ``total`` task instances are in state ``done``, printing their states."""
    deadline = time.monotonic() + timeout_s
    shown = ""
    while True:
        airflow.check()
        with contextlib.suppress(sa.exc.SQLAlchemyError):  # tables not there yet
            states = task_states(engine)
            line = ", ".join(f"{state} {count}" for state, count in sorted(states.items()))
            if line != shown:
                say(f"  {time.strftime('%H:%M:%S')} task instances: {line}")
                shown = line
            if states.get(done, 0) >= total:
                return states
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {total} task instances {done} in {timeout_s:.0f} s")
        time.sleep(2)


def fire_times(home: Path) -> dict[tuple[str, str], tuple[datetime, bool]]:
    """When each (DAG, task)'s trigger fired its event, and whether it was a success: the
    "Trigger fired event" line, stamped by the trigger's process, goes to the trigger's own
    log file once the triggerer has opened it, and to the triggerer's console before."""
    fired: dict[tuple[str, str], tuple[datetime, bool]] = {}
    for path in home.glob("logs/dag_id=*/run_id=*/task_id=*/*.trigger.*.log"):
        dag_dir, task_dir = path.parents[2], path.parent
        key = (dag_dir.name.removeprefix("dag_id="), task_dir.name.removeprefix("task_id="))
        for line in path.read_text(errors="replace").splitlines():
            if "Trigger fired event" in line:
                record = json.loads(line)
                at = datetime.fromisoformat(record["timestamp"])
                fired[key] = (at, "'status': 'success'" in record["result"])
    for line in (home / "triggerer.log").read_text(errors="replace").splitlines():
        if "Trigger fired event" in line:
            key = (log_field(line, "dag_id"), log_field(line, "task_id"))
            at = datetime.fromisoformat(line.split(maxsplit=1)[0])
            fired[key] = (at, "'status': 'success'" in line)
    return fired


def log_field(line: str, key: str) -> str:
    """A ``key=value`` field of a line of Airflow's console log."""
    match = re.search(rf"\b{key}=(\S+)", line)
    if match is None:
        raise ValueError(f"no {key} in {line!r}")
    return match.group(1)


def wait_for_events(airflow: Airflow, total: int, timeout_s: float) -> dict:
    """Until the triggers of all ``total`` sensors have fired."""
    deadline = time.monotonic() + timeout_s
    while True:
        airflow.check()
        fired = fire_times(airflow.home)
        say(f"  {time.strftime('%H:%M:%S')} trigger events: {len(fired)} of {total}")
        if len(fired) >= total:
            return fired
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(fired)} of {total} triggers fired in {timeout_s:.0f} s")
        time.sleep(2)


def run(args: argparse.Namespace) -> dict[str, object]:
    sensors = args.jobs * args.sensors_per_job
    names = job_names(args.jobs)
    with tempfile.TemporaryDirectory(prefix="sensor-scale-") as root, metrics_server() as server:
        home = Path(root)
        say(f"PostgreSQL on port {server.port}; Airflow home {home}")
        admin = sa.create_engine(psycopg2(server.url))
        metadata_url = f"sqlite:///{home}/airflow.db"
        metadata = sa.create_engine(metadata_url)
        jobs = Jobs(server.url, names)
        (home / "dags").mkdir()
        (home / "dags" / "scale.py").write_text(
            DAG_FILE.format(
                jobs=names,
                sensors=args.sensors_per_job,
                conn_id=CONN_ID,
                poll_s=args.poll_interval,
                freshness_s=FRESHNESS_S,
            )
        )
        env = airflow_environment(
            home,
            metadata_url,
            role_url(server, SENSOR_ROLE, "metrics"),
            args.parallelism,
        )
        airflow = Airflow(home, env)
        try:
            say(f"starting Airflow: {args.jobs} jobs x {args.sensors_per_job} sensors")
            airflow.start()
            began = time.monotonic()
            wait_for(airflow, metadata, "deferred", sensors, args.timeout)
            say(f"all {sensors} sensors deferred after {time.monotonic() - began:.0f} s")
            time.sleep(2 * args.poll_interval)  # every trigger running in the triggerer

            say(f"measuring for {args.window:.0f} s")
            calls0, selects0 = statements(admin)
            cpu0, wall0 = airflow.cpu_s("triggerer"), time.monotonic()
            held = 0
            while time.monotonic() - wall0 < args.window:
                airflow.check()
                states = task_states(metadata)
                held = max(held, states.get("running", 0) + states.get("queued", 0))
                time.sleep(5)
            calls1, selects1 = statements(admin)
            wall = time.monotonic() - wall0
            cpu = airflow.cpu_s("triggerer") - cpu0
            figures: dict[str, object] = {
                "jobs": args.jobs,
                "sensors": sensors,
                "poll_interval_s": args.poll_interval,
                "worker_slots_held": held,
                "metrics_statements_per_s": round((calls1 - calls0) / wall, 2),
                "metrics_selects_per_s": round((selects1 - selects0) / wall, 2),
                "triggerer_cpu_share": round(cpu / wall, 4),
                "triggerer_rss_mib": round(
                    sum(
                        p.memory_info().rss
                        for p in [
                            psutil.Process(airflow.processes["triggerer"].pid),
                            *psutil.Process(airflow.processes["triggerer"].pid).children(True),
                        ]
                    )
                    / 2**20
                ),
            }
            say(
                f"  worker slots held: {held} (running or queued task instances, at most)\n"
                f"  metrics database: {figures['metrics_statements_per_s']} statements/s, "
                f"{figures['metrics_selects_per_s']} of them SELECTs\n"
                f"  triggerer: {100 * cpu / wall:.1f}% of a core, "
                f"{figures['triggerer_rss_mib']} MiB"
            )

            say("jobs turn live, spread over two poll intervals")
            decisive: dict[str, datetime] = {}
            moments = sorted(random.uniform(0, 2 * args.poll_interval) for _ in names)
            start = time.monotonic()
            for name, moment in zip(random.sample(names, len(names)), moments, strict=True):
                time.sleep(max(0.0, start + moment - time.monotonic()))
                decisive[name] = jobs.turn_live(name)
            fired = wait_for_events(airflow, sensors, args.timeout)
            failed = sum(not success for _, success in fired.values())
            if failed:
                raise RuntimeError(f"{failed} of {sensors} triggers fired an error event")
            detected = [
                (at - decisive[dag.removeprefix("scale_")]).total_seconds()
                for (dag, _), (at, _) in fired.items()
            ]
            figures |= {
                "detection_p50_s": round(statistics.median(detected), 2),
                "detection_p95_s": round(percentile(detected, 0.95), 2),
                "detection_max_s": round(max(detected), 2),
                "load_average_1min": round(os.getloadavg()[0], 2),
            }
            say(
                f"  detection (decisive insert to trigger event): p50 "
                f"{figures['detection_p50_s']} s, p95 {figures['detection_p95_s']} s, "
                f"max {figures['detection_max_s']} s (target p95 <= "
                f"{args.poll_interval + 1:g} s)\n"
                f"  load average (1 min): {figures['load_average_1min']} on {os.cpu_count()} cores"
            )
            return figures
        finally:
            airflow.stop()
            jobs.close()
            admin.dispose()
            metadata.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/sensor-scale", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=count_argument, default=20)
    parser.add_argument("--sensors-per-job", type=count_argument, default=10)
    parser.add_argument(
        "--poll-interval", type=duration_argument, default=5.0, help="the sensors' poke_interval"
    )
    parser.add_argument(
        "--window", type=duration_argument, default=60.0, help="how long to measure the wait"
    )
    parser.add_argument(
        "--parallelism", type=count_argument, default=8, help="Airflow's worker slots"
    )
    parser.add_argument(
        "--timeout", type=duration_argument, default=1800.0, help="for each stage to finish"
    )
    args = parser.parse_args(argv)
    # SIGTERM (or Ctrl-C) ends Airflow, the jobs and PostgreSQL before exiting.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures = run(args)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
