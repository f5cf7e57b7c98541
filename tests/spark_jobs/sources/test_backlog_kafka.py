import re

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.sources.backlog_kafka import BacklogKafkaDataSource, child_spec
from spark_jobs.sources.hybrid import HybridOptionError
from spark_jobs.sources.kafka import RAW_SCHEMA_DDL, KafkaChild
from spark_jobs.sources.kafka_ranges import RECORD_COLUMNS
from tests.spark_jobs.sources.conftest import SPARK_SCHEMA

RAW_STRUCT = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
    ]
)
JSON_STRUCT = StructType([*SPARK_SCHEMA.fields, StructField("kafka_offset", LongType())])
REQUIRED = {"kafka.bootstrap.servers": "b1:9092,b2:9092", "subscribe": "events,audit"}


def reader(schema: StructType = RAW_STRUCT, **options):
    """The stream reader Spark would build from ``.option(...)`` calls."""
    return BacklogKafkaDataSource({**REQUIRED, **options}).streamReader(schema)


# --- child_spec ------------------------------------------------------------------------------


def test_child_spec_maps_every_option_exactly():
    # Spark hands the data source its options with lower-case keys.
    options = {
        **REQUIRED,
        "name": "live",
        "startingoffsets": '{"events": {"0": 5}}',
        "valueformat": "json",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "maxoffsetspertrigger": "100",
        "statelocation": "/checkpoints/state",
        "outagetimeout": "30s",
    }
    assert child_spec(options) == {
        "name": "live",
        "kind": "kafka",
        "bootstrapServers": "b1:9092,b2:9092",
        "topics": "events,audit",
        "startingOffsets": '{"events": {"0": 5}}',
        "valueFormat": "json",
        "outageTimeout": "30s",
        "properties": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
    }


def test_child_spec_defaults():
    assert child_spec(dict(REQUIRED)) == {
        "name": "kafka",
        "kind": "kafka",
        "bootstrapServers": "b1:9092,b2:9092",
        "topics": "events,audit",
        "startingOffsets": "latest",
        "valueFormat": "raw",
        "outageTimeout": "2min",
        "properties": {},
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "events"}, "option 'kafka.bootstrap.servers' is required, e.g. host:9092"),
        (
            {"kafka.bootstrap.servers": "", "subscribe": "events"},
            "option 'kafka.bootstrap.servers' is required",
        ),
        ({"kafka.bootstrap.servers": "b:9092"}, "option 'subscribe' is required: comma-separated"),
        ({"kafka.bootstrap.servers": "b:9092", "subscribe": ""}, "option 'subscribe' is required"),
        ({}, "option 'kafka.bootstrap.servers' is required"),
    ],
    ids=["no-servers", "empty-servers", "no-subscribe", "empty-subscribe", "nothing"],
)
def test_child_spec_refuses_missing_options(options, message):
    with pytest.raises(HybridOptionError, match=re.escape(message)):
        child_spec(options)


# --- the data source -------------------------------------------------------------------------


def test_the_data_source_is_named_and_its_default_schema_is_the_record_columns():
    assert BacklogKafkaDataSource.name() == "backlog_kafka"
    assert BacklogKafkaDataSource({}).schema() == RAW_SCHEMA_DDL
    ddl = [tuple(column.split()) for column in RAW_SCHEMA_DDL.split(", ")]
    assert ddl == [(f.name, f.dataType.simpleString().upper()) for f in RAW_STRUCT]
    assert ddl[-1] == ("timestamp", "TIMESTAMP")
    assert to_arrow_schema(RAW_STRUCT, timezone="UTC") == RECORD_COLUMNS


def test_spark_style_options_reach_the_kafka_child(tmp_path):
    source = reader(
        JSON_STRUCT,
        name="live",
        startingOffsets='{"audit": {"1": -2}}',
        valueFormat="json",
        maxOffsetsPerTrigger="500",
        rowsPerPartition="1000",
        stateLocation=str(tmp_path / "state"),
        **{"kafka.security.protocol": "SSL", "kafka.client.id": "Reader-1"},
    )
    (child,) = source.children
    assert isinstance(child, KafkaChild)
    assert source.source_name == "live"
    assert source.max_rows == 500
    assert child.name == "live"
    assert child.bootstrap_servers == "b1:9092,b2:9092"
    assert child.topics == ["events", "audit"]
    assert child.starting == {"audit": {"1": -2}}
    assert child.value_format == "json"
    assert child.properties == {"security.protocol": "SSL", "client.id": "Reader-1"}
    assert child.rows_per_partition == 1000
    assert child.schema == to_arrow_schema(JSON_STRUCT, timezone="UTC")
    assert child.state.location == f"file://{tmp_path}/state/live"


def test_option_keys_are_case_insensitive():
    source = reader(
        STARTINGOFFSETS="earliest",
        ValueFormat="raw",
        MAXOFFSETSPERTRIGGER="7",
        STATELOCATION="/checkpoints/state",
    )
    (child,) = source.children
    assert (child.starting, child.value_format, source.max_rows) == ("earliest", "raw", 7)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": ""}, "option 'subscribe' is required"),
        (
            {"startingOffsets": "latest"},
            "child source 'kafka': startingOffsets 'latest' is resolved against the brokers "
            "once and kept",
        ),
        (
            {"startingOffsets": "earliest", "valueFormat": "avro"},
            "child source 'kafka': field 'valueFormat' = 'avro' must be one of",
        ),
        (
            {"startingOffsets": "newest"},
            "child source 'kafka': startingOffsets = 'newest' must be",
        ),
        (
            {"startingOffsets": "earliest", "name": "my source"},
            "option 'name' = 'my source' must be 1-100 letters",
        ),
    ],
    ids=["empty-subscribe", "latest-without-state", "value-format", "starting", "name"],
)
def test_bad_options_are_refused_as_option_errors(options, message):
    with pytest.raises(HybridOptionError, match=re.escape(message)):
        reader(**options)


def test_json_mode_reads_event_fields_and_raw_mode_refuses_them():
    explicit = '{"events": {"0": 0}, "audit": {"0": 0}}'
    assert reader(SPARK_SCHEMA, startingOffsets=explicit, valueFormat="json").children
    with pytest.raises(HybridOptionError, match=re.escape("columns ['event_id', 'account'")):
        reader(SPARK_SCHEMA, startingOffsets=explicit)


@pytest.mark.parametrize(
    "option", ["assign", "startingOffsetsByTimestamp", "failOnDataLoss", "endingOffsets"]
)
def test_options_of_sparks_own_kafka_source_it_does_not_support_are_refused(option):
    with pytest.raises(HybridOptionError) as raised:
        reader(**{option: "x"})
    assert str(raised.value).startswith(
        f"options [{option.lower()!r}] are not supported by backlog_kafka; it takes "
    )


def test_client_properties_the_source_owns_are_refused():
    with pytest.raises(HybridOptionError) as raised:
        reader(**{"kafka.group.id": "mine", "kafka.auto.offset.reset": "latest"})
    assert str(raised.value).startswith(
        "child source 'kafka': client properties ['auto.offset.reset', 'group.id'] are set "
        "by the source"
    )


def test_a_bad_max_offsets_per_trigger_is_refused_under_its_own_name():
    with pytest.raises(HybridOptionError, match=re.escape("'maxOffsetsPerTrigger' = 'lots'")):
        reader(startingOffsets="earliest", maxOffsetsPerTrigger="lots")
