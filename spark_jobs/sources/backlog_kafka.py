"""``spark.readStream.format("backlog_kafka")``: the Kafka child on its own.

Options follow Spark's own Kafka source where they mean the same (keys are case-insensitive):
- ``kafka.bootstrap.servers`` (required), ``subscribe`` (comma-separated topics);
  any other ``kafka.<property>`` goes to the client (security, SASL...);
- ``startingOffsets``: ``earliest``, ``latest`` (the default) or JSON
  ``{"topic": {"partition": offset}}`` with -2 for earliest and -1 for latest;
- ``maxOffsetsPerTrigger``: a static per-batch limit (one offset is one row);
- ``valueFormat``: ``raw`` (the default; the columns of ``RAW_SCHEMA_DDL``) or ``json``
  (the schema's fields from the JSON value, record columns as ``kafka_<column>``);
- ``outageTimeout``: how long unreachable brokers are ridden out (default ``2min``);
- ``name``, ``stateLocation``, ``rowsPerPartition``, ``backlogChannel``,
  ``badRecordsPath``: as for ``hybrid``.

Offsets have the hybrid source's shape with one child, so the coordinator, the lag rules
and the metrics treat both alike.
"""

from __future__ import annotations

import json

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from spark_jobs.backlog.values import parse_count
from spark_jobs.sources.children import ChildSpecError
from spark_jobs.sources.hybrid import HybridOptionError, HybridStreamReader
from spark_jobs.sources.kafka import DEFAULT_OUTAGE_TIMEOUT, RAW_SCHEMA_DDL, KafkaChild

CLIENT_PREFIX = "kafka."
#: Options of the hybrid reader that pass through unchanged.
READER_OPTIONS = (
    "name",
    "statelocation",
    "rowsperpartition",
    "backlogchannel",
    "badrecordspath",
)
OWN_OPTIONS = (
    "subscribe",
    "startingoffsets",
    "valueformat",
    "maxoffsetspertrigger",
    "outagetimeout",
)


def child_spec(options: dict[str, str]) -> dict[str, object]:
    """The one child's spec, from Spark-style options; options of Spark's own Kafka source
    that this one does not support (``assign``, ``startingOffsetsByTimestamp``...) are
    refused rather than ignored."""
    unknown = sorted(
        key
        for key in options
        if not key.startswith(CLIENT_PREFIX) and key not in (*READER_OPTIONS, *OWN_OPTIONS)
    )
    if unknown:
        raise HybridOptionError(
            f"options {unknown} are not supported by backlog_kafka; it takes "
            "kafka.bootstrap.servers, subscribe, startingOffsets, maxOffsetsPerTrigger, "
            "valueFormat, outageTimeout, name, stateLocation, rowsPerPartition, "
            "badRecordsPath and kafka.<client property>"
        )
    servers = options.get("kafka.bootstrap.servers")
    if not servers:
        raise HybridOptionError("option 'kafka.bootstrap.servers' is required, e.g. host:9092")
    topics = options.get("subscribe")
    if not topics:
        raise HybridOptionError("option 'subscribe' is required: comma-separated topic names")
    return {
        "name": options.get("name", "kafka"),
        "kind": KafkaChild.kind,
        "bootstrapServers": servers,
        "topics": topics,
        "startingOffsets": options.get("startingoffsets", "latest"),
        "valueFormat": options.get("valueformat", "raw"),
        "outageTimeout": options.get("outagetimeout", DEFAULT_OUTAGE_TIMEOUT),
        "properties": {
            key[len(CLIENT_PREFIX) :]: value
            for key, value in options.items()
            if key.startswith(CLIENT_PREFIX) and key != "kafka.bootstrap.servers"
        },
    }


class BacklogKafkaDataSource(DataSource):
    """Register with ``spark.dataSource.register(BacklogKafkaDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return "backlog_kafka"

    def schema(self) -> str:
        return RAW_SCHEMA_DDL

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = {key.lower(): value for key, value in self.options.items()}
        reader_options = {key: options[key] for key in READER_OPTIONS if key in options}
        if "maxoffsetspertrigger" in options:
            value = options["maxoffsetspertrigger"]
            try:
                parse_count(value)
            except ValueError as error:
                raise HybridOptionError(
                    f"option 'maxOffsetsPerTrigger' = {value!r}: {error}"
                ) from None
            reader_options["maxRowsPerTrigger"] = value
        reader_options["sources"] = json.dumps([child_spec(options)])
        try:
            return HybridStreamReader(reader_options, schema)
        except ChildSpecError as error:
            raise HybridOptionError(str(error)) from None
