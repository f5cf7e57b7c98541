"""One PostgreSQL metrics database shared by several jobs and the sensors watching them.

Each job is a process of its own, writing as a job's driver does (its lease, its
checkpoints and transitions through ``MetricsWriter``), while sensors in this process poll
every job. Nothing is lost or doubled, and each sensor answers for its own job only:
never live before that job is, and live once it is. The sensors' queries are answered
from indexes.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
from airflow_provider_backlog.hooks.metrics_poll import read_job
from airflow_provider_backlog.sensors.metrics import BacklogFreshnessSensor, BacklogPhaseSensor
from spark_jobs.metrics import control, history
from spark_jobs.metrics.lease import LeaseStore
from spark_jobs.metrics.schema import (
    APPLIED,
    STOP,
    CheckpointRow,
    TransitionRow,
    backlog_checkpoints,
    backlog_transitions,
    make_engine,
    metadata,
    retention_deletes,
)
from spark_jobs.metrics.writer import MetricsWriter

BATCHES = 240
#: Each job turns live at its own batch, so the sensors become true at different times.
LIVE_FROM = {"orders": 60, "payments": 120, "clicks": 180, "refunds": 230}


def run_job(url: str, job: str, live_from: int, go: multiprocessing.Event) -> None:
    """A job's driver, as far as the metrics database sees it."""
    run_id = f"{job}-run"
    leases = LeaseStore(url)
    lease = leases.acquire(job, f"file:///checkpoints/{job}", run_id, 30.0).lease
    writer = MetricsWriter(url, flush_interval_s=0.02)
    go.wait()
    for batch_id in range(BATCHES):
        now = datetime.now(UTC)
        if batch_id == live_from:
            writer.record_transition(TransitionRow(job, run_id, now, False, "caught up"))
        writer.record_checkpoint(
            CheckpointRow(
                job_name=job,
                run_id=run_id,
                batch_id=batch_id,
                committed_at=now,
                is_backlog=batch_id < live_from,
                effective_interval_ms=2000,
                num_input_rows=batch_id,
                batch_duration_ms=10,
                watermark=None,
                sources=json.dumps([{"name": "events", "is_backlog": batch_id < live_from}]),
                observed_metrics=None,
            )
        )
        time.sleep(0.01)
    writer.close()
    leases.release(lease)
    leases.close()


@pytest.fixture
def shared_database(postgres_server, monkeypatch):
    postgres_server.start()
    url = postgres_server.url
    engine = make_engine(url)
    metadata.drop_all(engine)
    metadata.create_all(engine)
    engine.dispose()
    monkeypatch.setenv(
        "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT",
        json.dumps({"conn_type": "backlog_metrics", "extra": {"url": url}}),
    )
    return url


def test_several_jobs_write_while_sensors_poll_and_each_sensor_answers_for_its_job(
    shared_database,
):
    spawn = multiprocessing.get_context("spawn")
    go = spawn.Event()
    jobs = [
        spawn.Process(target=run_job, args=(shared_database, job, live_from, go))
        for job, live_from in LIVE_FROM.items()
    ]
    for process in jobs:
        process.start()
    live_sensors = {
        job: BacklogPhaseSensor(
            task_id=f"{job}_live", job_name=job, phase="live", for_checkpoints=2
        )
        for job in LIVE_FROM
    }
    fresh_sensors = {
        job: BacklogFreshnessSensor(task_id=f"{job}_fresh", job_name=job, within=30)
        for job in LIVE_FROM
    }
    answers: dict[str, dict] = {}
    polls = 0
    go.set()
    deadline = time.monotonic() + 120
    while len(answers) < len(LIVE_FROM) and time.monotonic() < deadline:
        for job, sensor in live_sensors.items():
            if job not in answers:
                answer = sensor.poke({})
                polls += 1
                if answer:
                    answers[job] = answer.xcom_value
                    assert fresh_sensors[job].poke({}), f"{job} is live but not fresh"
        time.sleep(0.05)
    for process in jobs:
        process.join(60)
        assert process.exitcode == 0, f"a job's writer failed: {process}"
    assert polls > 4 * len(LIVE_FROM), "the sensors polled while the jobs wrote"

    engine = make_engine(shared_database)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(
                backlog_checkpoints.c.job_name,
                backlog_checkpoints.c.batch_id,
                backlog_checkpoints.c.committed_at,
                backlog_checkpoints.c.is_backlog,
            ).order_by(backlog_checkpoints.c.id)
        ).all()
        transitions = connection.execute(
            sa.select(backlog_transitions.c.job_name, backlog_transitions.c.is_backlog)
        ).all()
    engine.dispose()
    for job, live_from in LIVE_FROM.items():
        batches = [row for row in rows if row.job_name == job]
        assert [row.batch_id for row in batches] == list(range(BATCHES)), f"{job}: rows lost"
        assert [row.is_backlog for row in batches] == [b < live_from for b in range(BATCHES)]
        # The sensor answered once the job had two live checkpoints, not before.
        answer = answers.get(job)
        assert answer is not None, f"the sensor never saw {job} live"
        assert (answer["run_id"], answer["phase"]) == (f"{job}-run", "live")
        seen = next(
            row.batch_id
            for row in batches
            if row.committed_at.isoformat() == answer["last_committed_at"]
        )
        assert seen >= live_from + 1, f"{job}: live after batch {seen}, but live from {live_from}"
    assert sorted(transitions) == sorted((job, False) for job in LIVE_FROM)
    # Every job let go of its lease: no sensor may take a stopped job for a running one.
    hook = BacklogMetricsHook()
    assert all(hook.live_run(job) is None for job in LIVE_FROM)


def explain(url: str, statement: str, parameters: Any = None) -> str:
    engine = make_engine(url)
    with engine.begin() as connection:
        # Small tables would be scanned anyway: is there an index that fits?
        connection.execute(sa.text("SET LOCAL enable_seqscan = off"))
        plan = connection.exec_driver_sql(f"EXPLAIN {statement}", parameters or {})
        lines = plan.scalars().all()
    engine.dispose()
    return "\n".join(lines)


@contextmanager
def statements_run() -> Iterator[list[tuple[str, Any]]]:
    """Every statement sent to a database meanwhile, as the driver got it."""
    seen: list[tuple[str, Any]] = []

    def record(_connection, _cursor, statement, parameters, _context, executemany):
        if not executemany:
            seen.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def on_our_tables(statement: str) -> bool:
    words = " ".join(statement.split()).upper()
    return words.startswith(("SELECT", "UPDATE", "DELETE")) and " BACKLOG_" in words


def test_what_sensors_launcher_poller_and_lease_ask_is_answered_from_an_index(shared_database):
    """The statements the hook, the control protocol, the lease and a starting run really
    send, as compiled for PostgreSQL: none scans a table or sorts."""
    with statements_run() as seen:
        hook = BacklogMetricsHook()
        read_job(hook, "orders", checkpoints=2)
        hook.run_start("orders", "orders-run")
        hook.live_run("orders")
        hook.run_released("orders", None, wait_s=0, poll_s=0.1)
        hook.release("orders", "orders-run")
        store = LeaseStore(shared_database)
        held = store.acquire("orders", "file:///checkpoints/orders", "orders-run", 30.0).lease
        store.renew(held, 30.0)
        store.release(held)
        store.close()
        engine = make_engine(shared_database)
        with engine.begin() as connection:
            request = control.send(connection, "orders", STOP, None, "orders-run")
            control.pending(connection, "orders")
            control.claim(connection, request, "orders-run")
            control.answer(connection, request, APPLIED, "stopping")
            control.status_of(connection, request)
            control.withdraw(connection, request)
            control.answer_orphans(connection, "orders", "orders-run")
            history.last_sources(connection, "orders")
            history.commit_times(connection, "orders", [1, 2, 3])
        engine.dispose()
    statements = [(text, parameters) for text, parameters in seen if on_our_tables(text)]
    assert len(statements) >= 15, [text for text, _ in statements]
    for text, parameters in statements:
        plan = explain(shared_database, text, parameters)
        assert "Seq Scan" not in plan and "Sort" not in plan, f"{text}\n{plan}"


def test_the_retention_deletes_are_answered_from_indexes(shared_database):
    dialect = make_engine(shared_database).dialect
    for statement in retention_deletes("orders", datetime.now(UTC)):
        compiled = statement.compile(dialect=dialect)
        plan = explain(shared_database, str(compiled), compiled.params)
        assert "Seq Scan" not in plan, plan
