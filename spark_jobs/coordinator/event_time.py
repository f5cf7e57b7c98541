"""Observing a query's event time, so the coordinator measures its freshness by it.

A freshness target (``spark.backlog.checkpointing.freshness-target``) judges each live
batch by its oldest row; without this observation the coordinator can only bound a row's
age by the batch before it, which overstates it when data arrives late in an interval.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.backlog.freshness import EVENT_TIME_OBSERVATION, OLDEST_EVENT_MS


def observe_event_time(frame: DataFrame, column: str, *more: Column) -> DataFrame:
    """``frame`` observed under the name the coordinator reads: the oldest ``column`` value
    (a timestamp) of each batch, with any ``more`` aggregates beside it."""
    oldest = F.min(F.unix_millis(column)).alias(OLDEST_EVENT_MS)
    return frame.observe(EVENT_TIME_OBSERVATION, oldest, *more)
