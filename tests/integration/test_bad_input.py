"""Bad input gets a clear error that names it, before work starts where possible, and a
repaired input continues exactly once. Bad input set aside by the quarantine is the malformed
trial of tests/integration/test_chaos.py."""

from datetime import timedelta

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    base_conf,
    checkpoints,
    console_job,
    finish,
    log_of,
    now,
)
from tools.data.events import write_history, write_landing_file


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

    # The timeout only bounds a job that never reaches the broken file.
    job = console_job(dirs, conf, "--timeout", "600s")
    code = job.wait(660)
    log = log_of(job)
    assert code == 1, log[-4000:]
    assert f"cannot read parquet input file file://{broken}" in log
    # Only rows before the broken file were committed (a batch reaching into it failed whole).
    assert 0 < sum(r["num_input_rows"] for r in checkpoints(dirs)) <= 2000

    broken.write_bytes(good_bytes)  # repaired in place
    later = now()
    write_landing_file(dirs.landing, "live-0.json", 5000, 40, later)
    write_landing_file(dirs.landing, "live-1.json", 5040, 40, later + timedelta(seconds=30))
    job = console_job(dirs, conf, "--stop-when-idle", "2s", "--timeout", "600s")
    finish(job, 660)
    assert sum(r["num_input_rows"] for r in checkpoints(dirs)) == 5080
    # The live phase is two small files: no later batch records the watermark they moved,
    # so the comparison covers the history and stops short of them.
    assert_exactly_once(dirs, window_s=10, watermark_reaches_the_end=False)
