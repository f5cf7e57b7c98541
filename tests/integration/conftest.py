import os
import sys

import pytest

# Spark binds to loopback and runs executors' Python with this interpreter.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark(jvm_archive):
    from pyspark.sql import SparkSession

    from spark_jobs.jobs.spark_home import use_compiled_home
    from spark_jobs.jobs.worker_daemon import DAEMON_CONF

    use_compiled_home("local[2]")

    session = (
        SparkSession.builder.master("local[2]")
        .appName("integration-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config(*DAEMON_CONF)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in item.nodeid:
            item.add_marker(pytest.mark.spark)


@pytest.fixture
def broker(tmp_path):
    """A Kafka-protocol broker on loopback in its own process, with the events topic."""
    from tests.integration.jobs import KAFKA_PARTITIONS, KAFKA_TOPIC
    from tools.services.broker import EmbeddedBroker

    with EmbeddedBroker(tmp_path / "broker", {KAFKA_TOPIC: KAFKA_PARTITIONS}) as running:
        yield running
