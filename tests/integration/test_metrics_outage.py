"""The metrics database away for longer than the lease's time to live: the driver cannot
confirm its lease, so it starts no batch (another driver could take the checkpoint over);
once the database is back it goes on, and the rows it journaled meanwhile arrive."""

import time

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    backlog_then_live,
    base_conf,
    checkpoints,
    console_job,
    finish,
    log_of,
    wait_for,
)

TTL_S = 3.0
AWAY_S = 12.0


def commit_times(dirs: JobDirs) -> list[float]:
    """When Spark committed each batch (its commit log, which needs no database)."""
    commits = dirs.checkpoint / "spark" / "commits"
    return sorted(p.stat().st_mtime for p in commits.iterdir() if p.name.isdigit())


def test_a_driver_that_cannot_renew_its_lease_starts_no_batch_until_it_can(tmp_path):
    dirs = JobDirs(tmp_path)
    producer = backlog_then_live(dirs, 10_000, 2, events_per_s=300, file_every_s=0.5)
    conf = base_conf(dirs, "fenced", interval="1s", interval_during_backlog="1min") | {
        "spark.backlog.lease.ttl": f"{TTL_S:g}s"
    }
    away = tmp_path / "metrics-away"
    try:
        job = console_job(dirs, conf, "--stop-when-idle", "3s", "--timeout", "300s")
        wait_for(lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= 3, "live", 180, job)
        # The database goes away: a plain file in its directory's place, so nothing can
        # create a fresh one meanwhile.
        dirs.metrics_dir.rename(away)
        dirs.metrics_dir.write_text("moved away\n")
        gone_at = time.time()
        time.sleep(AWAY_S)
        back_at = time.time()
        dirs.metrics_dir.unlink()
        away.rename(dirs.metrics_dir)
        wait_for(
            lambda: sum(at > back_at for at in commit_times(dirs)) >= 3,
            "batches after the database came back",
            120,
            job,
        )
    finally:
        producer.stop()
    finish(job, 120)

    # Renewals stop at once; the last confirmed lease is trusted for less than one TTL (its
    # fence). A batch released before the fence may still commit after it, however long a
    # loaded machine makes it take; batches run one after another, so at most that one
    # does. Any other would have started after the fence. (At a 1 s interval, a gate that
    # ignored the fence would commit about ten.)
    fenced = [at for at in commit_times(dirs) if gone_at + TTL_S <= at <= back_at]
    assert len(fenced) <= 1, f"batches committed while the lease was not confirmed: {fenced}"
    assert "no batch starts" in log_of(job)
    # The rows of batches committed before the fence, journaled while the database was
    # away, were delivered: every committed batch has its row.
    assert_exactly_once(dirs, window_s=10)
