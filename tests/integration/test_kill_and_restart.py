"""SIGKILL in the middle of the backlog and again in real time: the output stays exactly-once."""

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    backlog_then_live,
    base_conf,
    checkpoints,
    console_job,
    finish,
    kill_hard,
    transitions,
    wait_for,
)


def test_killed_in_backlog_and_in_real_time_then_restarted(tmp_path):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, 200_000, 40, events_per_s=300, file_every_s=0.5)
    # Small backlog batches, so that a kill lands in the middle of the backlog.
    conf = base_conf(
        dirs, "restarts", interval="1s", interval_during_backlog="1min", max_batch_rows="15000"
    )
    try:
        job = console_job(dirs, conf)
        wait_for(
            lambda: sum(r["is_backlog"] for r in checkpoints(dirs)) >= 3,
            "3 backlog checkpoints",
            180,
            job,
        )
        kill_hard(job)
        killed_at = max(r["batch_id"] for r in checkpoints(dirs))
        assert any(r["is_backlog"] for r in checkpoints(dirs))

        job = console_job(dirs, conf)
        wait_for(
            lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= 4,
            "4 live checkpoints after the first restart",
            240,
            job,
        )
        kill_hard(job)

        job = console_job(dirs, conf, "--stop-when-idle", "3s", "--timeout", "240s")
        wait_for(lambda: len(checkpoints(dirs)) >= killed_at + 20, "more checkpoints", 120, job)
    finally:
        producer.stop()
    finish(job, 120)

    rows = checkpoints(dirs)
    batch_ids = [r["batch_id"] for r in rows]
    assert len(batch_ids) == len(set(batch_ids)), "a batch was committed twice"
    assert len({r["run_id"] for r in rows}) == 3
    assert [t["is_backlog"] for t in transitions(dirs)] == [False]
    assert_exactly_once(dirs, window_s=10)
