import time
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from spark_jobs.coordinator.runtime import BacklogRuntime
from spark_jobs.metrics.schema import (
    METRICS_PASSWORD_ENV,
    backlog_checkpoints,
    make_engine,
    metadata,
)

CONF = {
    "spark.backlog.job-name": "password-check",
    "spark.backlog.metrics.url": "postgresql://metrics@127.0.0.1:9/metrics",
}


def test_the_driver_takes_the_metrics_password_from_its_environment(spark, monkeypatch):
    monkeypatch.setenv(METRICS_PASSWORD_ENV, "s3cret")
    for key, value in CONF.items():
        spark.conf.set(key, value)
    try:
        runtime = BacklogRuntime(spark)
        runtime.close()
    finally:
        for key in CONF:
            spark.conf.unset(key)
    assert runtime.config.metrics_url == "postgresql://metrics:s3cret@127.0.0.1:9/metrics"


def test_the_driver_deletes_its_jobs_rows_older_than_the_retention(spark, tmp_path):
    url = f"sqlite:///{tmp_path}/metrics.db"
    engine = make_engine(url)
    metadata.create_all(engine)
    old = datetime.now(UTC) - timedelta(days=3)
    rows = [
        {
            "job_name": job,
            "run_id": "earlier",
            "batch_id": batch_id,
            "committed_at": old + timedelta(seconds=batch_id),
            "is_backlog": True,
            "num_input_rows": 1,
            "batch_duration_ms": 1,
            "sources": "[]",
        }
        for job in ("retained", "other-job")
        for batch_id in range(3)
    ]
    with engine.begin() as connection:
        connection.execute(backlog_checkpoints.insert(), rows)
    conf = {
        "spark.backlog.job-name": "retained",
        "spark.backlog.metrics.url": url,
        "spark.backlog.metrics.retention": "2d",
    }
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        runtime = BacklogRuntime(spark)
        runtime.hold_lease(str(tmp_path / "checkpoint"))
        query = sa.select(backlog_checkpoints.c.job_name, backlog_checkpoints.c.batch_id)

        def remaining() -> list[tuple[str, int]]:
            with engine.connect() as connection:
                return sorted(tuple(row) for row in connection.execute(query))

        deadline = time.monotonic() + 10
        while len(remaining()) > 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        runtime.close()
    finally:
        for key in conf:
            spark.conf.unset(key)
    # The job's latest row stays as its last state; another job's rows are not its to delete.
    assert remaining() == [("other-job", 0), ("other-job", 1), ("other-job", 2), ("retained", 2)]
    engine.dispose()
