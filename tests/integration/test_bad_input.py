"""Bad input gets a clear error that names it, before work starts where possible, and a
repaired input continues exactly once."""

import json
import time
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer

from tests.integration.jobs import (
    KAFKA_TOPIC,
    JobDirs,
    assert_exactly_once,
    backlog_then_kafka,
    base_conf,
    checkpoints,
    console_job,
    finish,
    log_of,
    now,
    wait_for,
)
from tools.data import write_history, write_landing_file


def test_invalid_configuration_fails_before_any_query_starts(tmp_path):
    dirs = JobDirs(tmp_path)
    conf = base_conf(dirs, "bad-conf", interval="10s", interval_during_backlog="5s")
    conf["spark.backlog.checkpointing.max-batch-rows"] = "many"
    job = console_job(dirs, conf)
    assert job.wait(120) == 2
    log = log_of(job)
    assert (
        "spark.backlog.checkpointing.interval-during-backlog = '5s' is invalid: it must be 0 "
        "(no periodic checkpoint during backlog) or at least spark.backlog.checkpointing."
        "interval (10s)" in log
    )
    assert "spark.backlog.checkpointing.max-batch-rows = 'many' is invalid" in log
    assert not dirs.checkpoint.exists()
    assert not dirs.output.exists()


def test_a_malformed_file_is_named_and_after_repair_nothing_is_lost_or_doubled(tmp_path):
    dirs = JobDirs(tmp_path)
    start = now() - timedelta(hours=1)
    write_history(dirs.history, 5000, 5, start, start + timedelta(minutes=30))
    broken = dirs.history / "history-00002.parquet"
    good_bytes = broken.read_bytes()
    broken.write_bytes(b"PAR1 this is not a parquet file")
    dirs.landing.mkdir()
    conf = base_conf(dirs, "bad-file", interval="1s", max_batch_rows="1000")

    job = console_job(dirs, conf, "--timeout", "120s")
    assert job.wait(180) == 1
    log = log_of(job)
    assert f"cannot read parquet input file file://{broken}" in log
    # Only rows before the broken file were committed (a batch reaching into it failed whole).
    assert 0 < sum(r["num_input_rows"] for r in checkpoints(dirs)) <= 2000

    broken.write_bytes(good_bytes)  # repaired in place
    later = now()
    write_landing_file(dirs.landing, "live-0.json", 5000, 40, later)
    write_landing_file(dirs.landing, "live-1.json", 5040, 40, later + timedelta(seconds=30))
    job = console_job(dirs, conf, "--stop-when-idle", "2s", "--timeout", "120s")
    finish(job, 180)
    assert sum(r["num_input_rows"] for r in checkpoints(dirs)) == 5080
    # The live phase is two small files: no later batch records the watermark they moved,
    # so the comparison covers the history and stops short of them.
    assert_exactly_once(dirs, window_s=10, watermark_reaches_the_end=False)


def live_for_three(rows: list[dict]) -> bool:
    return len(rows) > 3 and not any(r["is_backlog"] for r in rows[-3:])


#: Topic values that are no event, one per partition of the topic.
BAD_VALUES = [b"[1, 2]", b"null", b"garbage", b'{"event_id": "seven"}']


def test_with_a_quarantine_bad_input_is_set_aside_and_the_rest_is_exactly_once(tmp_path, broker):
    dirs = JobDirs(tmp_path, broker.bootstrap_servers)
    producer = backlog_then_kafka(dirs, 20_000, 4, events_per_s=500)
    history = sorted(dirs.history.glob("*.parquet"))
    history[1].write_bytes(b"PAR1 this is not a parquet file")
    mistyped = pq.read_table(history[2])
    mistyped = mistyped.set_column(2, "amount", mistyped.column("amount").cast(pa.string()))
    pq.write_table(mistyped, history[2])
    bad_records = tmp_path / "bad"
    conf = base_conf(dirs, "quarantine", interval="1s", max_batch_rows="10000")
    try:
        job = console_job(
            dirs,
            conf,
            "--bad-records-path",
            str(bad_records),
            "--stop-when-idle",
            "3s",
            "--timeout",
            "300s",
        )
        wait_for(lambda: live_for_three(checkpoints(dirs)), "live data", 240, job)
        bad = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for partition, value in enumerate(BAD_VALUES):
            bad.produce(KAFKA_TOPIC, value=value, partition=partition)
        assert bad.flush(30) == 0
        time.sleep(5)
    finally:
        producer.stop()
    finish(job, 180)
    rows = checkpoints(dirs)
    assert sum(r["quarantined"] or 0 for r in rows) == 2 + len(BAD_VALUES)
    set_aside = sorted(p for p in bad_records.rglob("*.jsonl"))
    reasons = [json.loads(line)["reason"] for p in set_aside for line in p.read_text().splitlines()]
    assert len(reasons) == 2 + len(BAD_VALUES)
    assert any("amount is string, not double" in reason for reason in reasons)
    assert_exactly_once(dirs, window_s=10)
