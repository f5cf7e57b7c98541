"""The watermark-lag rule end to end: delayed data read after the history keeps the job in
backlog although the source's phase is live, until fresh events bring the watermark near."""

from datetime import timedelta

from tests.integration.jobs import (
    JobDirs,
    assert_exactly_once,
    base_conf,
    checkpoints,
    console_job,
    finish,
    now,
    transitions,
    wait_for,
)
from tools.data.events import LiveProducer, write_history, write_landing_file

WATERMARK_LAG = {
    "spark.backlog.lag.watermark.enter-threshold": "10min",
    "spark.backlog.lag.watermark.leave-threshold": "1min",
}


def held_by_the_watermark(dirs: JobDirs) -> bool:
    return any(r["is_backlog"] and '"phase": "landing"' in r["sources"] for r in checkpoints(dirs))


def test_delayed_data_holds_the_job_in_backlog_until_the_watermark_catches_up(tmp_path):
    dirs = JobDirs(tmp_path)
    started = now()
    next_id = write_history(
        dirs.history, 5_000, 2, started - timedelta(hours=3), started - timedelta(hours=2)
    )
    dirs.landing.mkdir(parents=True)
    for index in range(3):
        write_landing_file(
            dirs.landing, f"delayed-{index}.json", next_id, 500, started - timedelta(minutes=90)
        )
        next_id += 500
    conf = base_conf(dirs, "watermark-lag", interval="1s", interval_during_backlog="1min")
    job = console_job(dirs, conf | WATERMARK_LAG, "--stop-when-idle", "3s", "--timeout", "240s")
    wait_for(lambda: held_by_the_watermark(dirs), "a landing batch held in backlog", 180, job)
    producer = LiveProducer(dirs.landing, next_id, events_per_s=300, file_every_s=0.5)
    producer.start()
    try:
        wait_for(
            lambda: [t["is_backlog"] for t in transitions(dirs)] == [True, False],
            "the switch to live",
            120,
            job,
        )
        wait_for(lambda: not checkpoints(dirs)[-1]["is_backlog"], "a live checkpoint", 60, job)
    finally:
        producer.stop()
    finish(job, 120)

    assert [(t["is_backlog"], t["reason"]) for t in transitions(dirs)] == [
        (True, "hybrid-phase: events is in backlog (history)"),
        (False, "watermark-lag: events is live (landing)"),
    ]
    # The landing phase began in backlog: the watermark, not the phase, held it there.
    held = [r for r in checkpoints(dirs) if r["is_backlog"] and '"landing"' in r["sources"]]
    assert held and all('"rule": "watermark-lag"' in r["sources"] for r in held)
    assert_exactly_once(dirs, window_s=10, compared_at_least=0.3)
