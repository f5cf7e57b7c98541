from spark_jobs.coordinator.runtime import BacklogRuntime
from spark_jobs.metrics.schema import METRICS_PASSWORD_ENV

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
