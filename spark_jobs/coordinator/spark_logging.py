"""Spark's log lines that mislead under the coordinator.

A gated query's processing-time trigger is how often the sources ask the coordinator
whether a batch is due (a tick of 50-500 ms), not a cadence the batches should keep. Spark
warns "Current batch is falling behind" whenever a batch outlasts its trigger, so a gated
query would log that after nearly every batch: a false alarm, and at a batch a second the
one line a batch that still makes a WARN-level driver log grow.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

#: The logger of Spark's processing-time trigger, which warns of batches that outlast it.
TRIGGER_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"


def quiet_trigger_warnings(spark: SparkSession) -> None:
    """Log only the trigger's errors: its warnings speak of a cadence a gated query lacks."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a classic Spark session (not Spark Connect) runs the coordinator"
    level = jvm.org.apache.logging.log4j.Level.ERROR
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(TRIGGER_LOGGER, level)
