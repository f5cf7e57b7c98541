import json
import time
from datetime import UTC, datetime

import sqlalchemy as sa

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.coordinator.appliers import SourceGatedApplier
from spark_jobs.coordinator.control import ControlPoller
from spark_jobs.coordinator.coordinator import BacklogCoordinator
from spark_jobs.metrics.schema import backlog_control, create_tables, make_engine
from spark_jobs.metrics.writer import MetricsWriter
from spark_jobs.sources.gate import PlanChannel
from tests.spark_jobs.backlog.simulation import FakeClock

CONF = {
    "spark.backlog.job-name": "events",
    "spark.backlog.run-id": "run-7",
    "spark.backlog.checkpointing.interval": "30s",
    "spark.backlog.checkpointing.interval-during-backlog": "1min",
}


def request(
    url: str, job: str, settings: object, action: str = "reconfigure", for_run: str | None = None
) -> int:
    engine = make_engine(url)
    with engine.begin() as connection:
        create_tables(connection)
        text = settings if isinstance(settings, str) else json.dumps(settings)
        result = connection.execute(
            backlog_control.insert().values(
                job_name=job,
                requested_at=datetime.now(UTC),
                action=action,
                settings=text,
                status="pending",
                for_run_id=for_run,
            )
        )
    engine.dispose()
    return result.inserted_primary_key[0]


def answers(url: str) -> list[tuple]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(
                backlog_control.c.id,
                backlog_control.c.status,
                backlog_control.c.answer,
                backlog_control.c.answered_by_run,
            ).order_by(backlog_control.c.id)
        ).all()
    engine.dispose()
    return [tuple(row) for row in rows]


def test_requests_are_validated_applied_or_rejected_and_answered(tmp_path):
    url = f"sqlite:///{tmp_path}/metrics.db"
    conf = CONF | {"spark.backlog.metrics.url": url}
    config = BacklogConfig.from_spark_conf(conf)
    channel = PlanChannel(tmp_path / "channel")
    clock = FakeClock(1_795_261_800.0)
    writer = MetricsWriter(url)
    coordinator = BacklogCoordinator(
        config, SourceGatedApplier(channel, config), writer, clock=clock
    )
    coordinator.start()
    stopped = []
    poller = ControlPoller(config, conf, coordinator.reconfigure, lambda: stopped.append(True))

    good = request(url, "events", {"spark.backlog.checkpointing.interval": "5s"})
    too_long = request(url, "events", {"spark.backlog.checkpointing.interval": "5min"})
    restart_only = request(url, "events", {"spark.backlog.checkpointing.min-pause": "1s"})
    not_json = request(url, "events", "interval=5s")
    other_job = request(url, "orders", {"spark.backlog.checkpointing.interval": "1s"})
    stop = request(url, "events", {}, action="stop")
    assert stopped == []
    assert poller.poll_once() == 5
    assert stopped == [True]
    assert poller.poll_once() == 0  # each request is answered once
    poller.close()
    writer.close()

    assert coordinator.config.interval_s == 5.0
    assert channel.read().seq == 2  # the new decision was published at once
    assert answers(url) == [
        (
            good,
            "applied",
            "job=events run=run-7 interval=5s interval-during-backlog=1min min-pause=0 "
            "max-batch-rows=1000000",
            "run-7",
        ),
        (
            too_long,
            "rejected",
            "invalid backlog configuration:\n  spark.backlog.checkpointing.interval-during-backlog"
            " = '1min' is invalid: it must be 0 (no periodic checkpoint during backlog) or at "
            "least spark.backlog.checkpointing.interval (5min), because checkpoints during "
            "backlog may only be rarer",
            "run-7",
        ),
        (
            restart_only,
            "rejected",
            "invalid backlog configuration:\n  spark.backlog.checkpointing.min-pause = '1s' "
            "cannot change while the job runs; only spark.backlog.checkpointing.interval, "
            "spark.backlog.checkpointing.interval-during-backlog, "
            "spark.backlog.checkpointing.freshness-target can",
            "run-7",
        ),
        (
            not_json,
            "rejected",
            "invalid backlog configuration:\n  the request is not JSON (Expecting value: line 1 "
            "column 1 (char 0)): 'interval=5s'",
            "run-7",
        ),
        (other_job, "pending", None, None),
        (stop, "applied", "run run-7 stops after its next committed checkpoint", "run-7"),
    ]


def claimed_by(url: str, request_id: int, run_id: str) -> None:
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            backlog_control.update()
            .where(backlog_control.c.id == request_id)
            .values(status="claimed", answered_by_run=run_id)
        )
    engine.dispose()


def wait_for_answers(url: str, count: int, timeout_s: float = 20) -> list[tuple]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = answers(url)
        if sum(status in ("applied", "rejected") for _, status, *_ in rows) >= count:
            return rows
        time.sleep(0.05)
    raise AssertionError(f"not {count} answers in time: {answers(url)}")


def test_every_request_gets_an_answer_whatever_goes_wrong_and_the_poller_goes_on(tmp_path):
    url = f"sqlite:///{tmp_path}/metrics.db"
    conf = CONF | {"spark.backlog.metrics.url": url}
    config = BacklogConfig.from_spark_conf(conf)
    failures = iter([RuntimeError("the coordinator is confused")])

    def reconfigure(_config):
        failure = next(failures, None)
        if failure is not None:
            raise failure

    nested = "[" * 100_000 + "]" * 100_000
    too_deep = request(url, "events", nested)
    confused = request(url, "events", {"spark.backlog.checkpointing.interval": "10s"})
    unknown = request(url, "events", {}, action="pause")
    for_another = request(url, "events", {}, action="stop", for_run="run-6")
    orphan = request(url, "events", {}, action="stop")
    claimed_by(url, orphan, "run-5")  # a run that died between taking it and answering
    good = request(url, "events", {"spark.backlog.checkpointing.interval": "20s"})

    poller = ControlPoller(config, conf, reconfigure, lambda: None, every_s=0.05)
    poller.start()
    try:
        rows = {row[0]: row[1:] for row in wait_for_answers(url, 6)}
    finally:
        poller.close()
    status, answer, by = rows[too_deep]
    assert (status, by) == ("rejected", "run-7")
    assert answer.startswith(
        "invalid backlog configuration:\n  the request is not JSON (maximum recursion depth "
    )
    assert answer.endswith("[[[[[[[[...'")
    assert rows[confused] == (
        "rejected",
        "the job could not act on it: RuntimeError: the coordinator is confused",
        "run-7",
    )
    assert rows[unknown] == (
        "rejected",
        "unknown action 'pause': expected reconfigure or stop",
        "run-7",
    )
    assert rows[for_another] == (
        "rejected",
        "this request is for run run-6, but run run-7 runs job 'events' now",
        "run-7",
    )
    assert rows[orphan] == (
        "rejected",
        "run run-5 took this request but ended before answering it; run run-7 now runs the "
        "job: ask again if it still applies",
        "run-5",
    )
    assert rows[good][0] == "applied"
