"""Files then Kafka: a burst makes the job re-enter backlog by the topic's lag and recover,
and an offset beyond the topic fails it naming the offset. SIGKILLs in the file phase, in the
topic's lag-held backlog and live are the kills trial of tests/integration/test_chaos.py."""

import json
from datetime import UTC, datetime, timedelta

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    backlog_then_kafka,
    base_conf,
    checkpoints,
    console_job,
    finish,
    log_of,
    now,
    transitions,
    wait_for,
    watermarks,
)
from tools.data.events import write_history

LAG = {
    "spark.backlog.lag.offsets.enter-threshold": "3000",
    "spark.backlog.lag.offsets.leave-threshold": "1000",
}


def kafka_conf(dirs: JobDirs, job: str) -> dict[str, str]:
    # Small batches, so the history and the topic's pile-up each take several.
    conf = base_conf(
        dirs, job, interval="1s", interval_during_backlog="1min", max_batch_rows="10000"
    )
    return conf | LAG


def phases(dirs: JobDirs) -> list[tuple[str, bool]]:
    """(running child, job in backlog) per checkpoint."""
    result = []
    for row in checkpoints(dirs):
        if row["recovered"]:  # rebuilt from the commit log: no source statuses
            continue
        (source,) = json.loads(row["sources"])
        result.append((source["phase"], row["is_backlog"]))
    return result


def test_a_burst_makes_the_job_reenter_backlog_and_recover(tmp_path, broker):
    dirs = JobDirs(tmp_path, broker.bootstrap_servers)
    producer = backlog_then_kafka(dirs, 20_000, 4, events_per_s=500)
    conf = kafka_conf(dirs, "kafka-burst")
    try:
        job = console_job(dirs, conf, "--stop-when-idle", "3s", "--timeout", "300s")
        wait_for(lambda: phases(dirs)[-3:] == [("kafka", False)] * 3, "live", 240, job)
        burst_at = datetime.fromtimestamp(producer.burst(40_000), UTC)
        wait_for(
            lambda: [t["is_backlog"] for t in transitions(dirs)][-2:] == [True, False],
            "re-entry into backlog and recovery",
            180,
            job,
        )
        # Live events go on until the watermark has closed the burst's window, so that the
        # comparison covers the burst, however fast it was drained.
        wait_for(
            lambda: max(watermarks(dirs), default=burst_at) > burst_at + timedelta(seconds=11),
            "the watermark past the burst's window",
            120,
            job,
        )
    finally:
        producer.stop()
    finish(job, 120)

    reasons = [(t["is_backlog"], t["reason"]) for t in transitions(dirs)]
    assert reasons[-2:] == [
        (True, "offset-lag: events is in backlog (kafka)"),
        (False, "offset-lag: events is live (kafka)"),
    ]
    reentry = transitions(dirs)[-2]["at"]
    after = [r for r in checkpoints(dirs) if r["committed_at"] > reentry]
    assert any(r["is_backlog"] for r in after) and not after[-1]["is_backlog"]
    # Only the last live events' windows stay open: the history, the live events before
    # the burst and the burst's 40,000 are compared.
    assert_exactly_once(dirs, window_s=10, compared_at_least=0.7)


def test_an_offset_out_of_range_fails_the_job_naming_it(tmp_path, broker):
    dirs = JobDirs(tmp_path, broker.bootstrap_servers)
    start = now() - timedelta(hours=1)
    write_history(dirs.history, 1000, 1, start, start + timedelta(minutes=30))
    beyond = json.dumps({"events": {"0": 999, "1": 0, "2": 0, "3": 0}})
    job = console_job(
        dirs, kafka_conf(dirs, "kafka-out-of-range"), "--kafka-starting-offsets", beyond
    )
    assert job.wait(180) == 1
    assert (
        "child source 'kafka': topic 'events' partition 0: offset 999 is out of range, beyond "
        "the latest offset 0" in log_of(job)
    )
    # The history before the topic was committed; nothing of the topic was.
    assert sum(r["num_input_rows"] for r in checkpoints(dirs)) == 1000
