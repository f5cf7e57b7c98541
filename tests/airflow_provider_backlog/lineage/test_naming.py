"""The datasets a launch names from the job's arguments, by OpenLineage's naming conventions:
files (local, S3, HDFS), Kafka topics, PostgreSQL tables; never a credential."""

from __future__ import annotations

import pytest

from airflow_provider_backlog.lineage.naming import (
    DatasetName,
    JobDatasets,
    file_dataset,
    job_datasets,
    kafka_dataset,
    postgres_dataset,
)
from spark_jobs.jobs import cdc_pipeline, events_pipeline

WORKING_DIR = "/srv/airflow"


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/data/events/history", ("file", "/data/events/history")),
        ("/data/events/output/", ("file", "/data/events/output")),
        ("history", ("file", "/srv/airflow/history")),
        ("../data/./out", ("file", "/srv/data/out")),
        ("file:/data/out", ("file", "/data/out")),  # Hadoop's spelling
        ("file:///data/out", ("file", "/data/out")),
        ("file://nas-1/exports/out", ("file://nas-1", "/exports/out")),
        ('/data/my events/it\'s "here"', ("file", '/data/my events/it\'s "here"')),
        ("s3://bucket/jobs/events/out", ("s3://bucket", "jobs/events/out")),
        ("s3a://bucket/jobs/events/out/", ("s3://bucket", "jobs/events/out")),
        ("s3n://bucket", ("s3://bucket", "/")),
        ("S3A://bucket/my dir/x", ("s3://bucket", "my dir/x")),
        ("gs://bucket/events", ("gs://bucket", "events")),
        ("hdfs://namenode:8020/data/events", ("hdfs://namenode:8020", "/data/events")),
        ("hdfs://namenode/data/events", ("hdfs://namenode", "/data/events")),
        (
            "abfss://lake@account.dfs.core.windows.net/events",
            ("abfss://lake@account.dfs.core.windows.net", "/events"),
        ),
    ],
)
def test_files_are_named_by_their_file_system_and_path(location, expected):
    assert file_dataset(location, WORKING_DIR) == DatasetName(*expected)


def test_credentials_in_a_file_systems_address_are_left_out():
    assert file_dataset("s3a://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/out", WORKING_DIR) == (
        DatasetName("s3://bucket", "out")
    )
    assert file_dataset("hdfs://hdfs:s3cret@namenode:8020/out", WORKING_DIR) == (
        DatasetName("hdfs://namenode:8020", "/out")
    )


def test_a_remote_location_on_the_default_file_system_is_not_named():
    """``hdfs:///data`` is on Hadoop's ``fs.defaultFS``, which only its configuration names."""
    assert file_dataset("hdfs:///data/events", WORKING_DIR) is None


@pytest.mark.parametrize(
    ("bootstrap_servers", "namespace"),
    [
        ("broker-1:9092", "kafka://broker-1:9092"),
        ("broker-1:9092,broker-2:9092,broker-3:9092", "kafka://broker-1:9092"),
        (" broker-1:9092 , broker-2:9092", "kafka://broker-1:9092"),
        ("SASL_SSL://broker-1:9093,SASL_SSL://broker-2:9093", "kafka://broker-1:9093"),
        ("[::1]:9092", "kafka://[::1]:9092"),
        ("client:s3cret@broker-1:9092", "kafka://broker-1:9092"),
    ],
)
def test_a_topic_is_named_by_the_first_bootstrap_server(bootstrap_servers, namespace):
    assert kafka_dataset(bootstrap_servers, "events") == DatasetName(namespace, "events")


@pytest.mark.parametrize(
    ("url", "table", "expected"),
    [
        (
            "postgresql://reader:s3cret@db.example.com:6543/shop",
            "accounts",
            ("postgres://db.example.com:6543", "shop.public.accounts"),
        ),
        (
            "postgresql+psycopg2://reader@db.example.com/shop",
            "sales.accounts",
            ("postgres://db.example.com:5432", "shop.sales.accounts"),
        ),
        (
            "postgres://reader:pw@db/shop",
            "accounts",
            ("postgres://db:5432", "shop.public.accounts"),
        ),
        ("postgresql:///shop", "accounts", ("postgres://localhost:5432", "shop.public.accounts")),
        (
            "postgresql://reader:p%40ss:word@[::1]:5433/shop",
            "accounts",
            ("postgres://[::1]:5433", "shop.public.accounts"),
        ),
        (
            "postgresql://reader@db/Shop Floor",
            'Sales."Order Items"',
            ("postgres://db:5432", 'Shop Floor.Sales."Order Items"'),
        ),
        (
            "postgresql://reader@db/shop",
            "it's a table",
            ("postgres://db:5432", "shop.public.it's a table"),
        ),
    ],
)
def test_a_postgres_table_is_named_by_host_port_database_schema_and_table(url, table, expected):
    named = postgres_dataset(url, table)
    assert named == DatasetName(*expected)
    assert "reader" not in named.namespace + named.name
    assert "s3cret" not in named.namespace + named.name


@pytest.mark.parametrize(
    "url", ["sqlite:////data/copy.db", "postgresql://reader@db", "not a url", "postgresql://db:x/a"]
)
def test_a_database_without_a_naming_convention_or_a_database_is_not_named(url):
    assert postgres_dataset(url, "accounts") is None


def test_the_events_pipeline_from_files_and_a_landing_directory():
    args = [
        "--history",
        "history",
        "--landing=/data/landing",
        "--output",
        "s3a://bucket/events/out",
        "--bad-records-path",
        "/data/quarantine",
        "--checkpoint",
        "/data/checkpoint",
        "--window",
        "30s",
        "--stop-when-idle",
        "1min",
        "--conf",
        "spark.sql.shuffle.partitions=4",
    ]
    assert job_datasets(args, WORKING_DIR) == JobDatasets(
        inputs=(
            DatasetName("file", "/srv/airflow/history"),
            DatasetName("file", "/data/landing"),
        ),
        outputs=(
            DatasetName("s3://bucket", "events/out"),
            DatasetName("file", "/data/quarantine"),
        ),
        checkpoint=DatasetName("file", "/data/checkpoint"),
    )


def test_the_events_pipeline_from_files_and_a_topic_its_last_value_winning():
    args = [
        "--history",
        "/data/history",
        "--kafka-bootstrap-servers",
        "broker-1:9092,broker-2:9092",
        "--kafka-starting-offsets",
        '{"orders": {"0": 5}}',
        "--output",
        "/data/first",
        "--output",
        "/data/out",
        "--checkpoint",
        "hdfs://namenode:8020/checkpoints/events",
    ]
    assert job_datasets(args, WORKING_DIR) == JobDatasets(
        inputs=(
            DatasetName("file", "/data/history"),
            DatasetName("kafka://broker-1:9092", "events"),
        ),
        outputs=(DatasetName("file", "/data/out"),),
        checkpoint=DatasetName("hdfs://namenode:8020", "/checkpoints/events"),
    )
    topic = job_datasets([*args, "--kafka-topic", "orders"], WORKING_DIR).inputs[1]
    assert topic == DatasetName("kafka://broker-1:9092", "orders")


def test_the_cdc_pipeline_into_a_postgres_table_and_change_files():
    args = [
        "--connection",
        "postgresql://reader@db.example.com:5432/shop",
        "--table",
        "sales.accounts",
        "--target",
        "postgresql://writer:s3cret@warehouse:5433/copy",
        "--changes-output",
        "/data/changes",
        "--checkpoint",
        "/data/cdc checkpoint",
    ]
    assert job_datasets(args, WORKING_DIR) == JobDatasets(
        inputs=(DatasetName("postgres://db.example.com:5432", "shop.sales.accounts"),),
        outputs=(
            DatasetName("postgres://warehouse:5433", "copy.public.accounts"),
            DatasetName("file", "/data/changes"),
        ),
        checkpoint=DatasetName("file", "/data/cdc checkpoint"),
    )
    renamed = job_datasets([*args, "--target-table", "archive.accounts_copy"], WORKING_DIR)
    assert renamed.outputs[0] == DatasetName(
        "postgres://warehouse:5433", "copy.archive.accounts_copy"
    )


def test_an_sqlite_target_is_left_out_and_other_jobs_name_nothing():
    args = ["--connection", "postgresql://reader@db/shop", "--table", "accounts"]
    sqlite = job_datasets([*args, "--target", "sqlite:////data/copy.db"], WORKING_DIR)
    assert sqlite.outputs == ()
    assert job_datasets(["--input", "/data/in", "--verbose"], WORKING_DIR) == JobDatasets(
        (), (), None
    )


def test_the_flags_read_are_the_jobs_own():
    """The jobs' parsers take the same arguments and read the same locations from them: a
    flag renamed in a job fails here, not silently in lineage."""
    events = [
        "--history=/data/history",
        "--kafka-bootstrap-servers",
        "broker:9092",
        "--kafka-topic",
        "orders",
        "--output",
        "/data/out",
        "--bad-records-path",
        "/data/bad",
        "--checkpoint",
        "/data/checkpoint",
    ]
    parsed = events_pipeline.parse_args(events)
    named = job_datasets(events, WORKING_DIR)
    assert named.inputs == (
        file_dataset(parsed.history, WORKING_DIR),
        kafka_dataset(parsed.kafka_bootstrap_servers, parsed.kafka_topic),
    )
    assert named.outputs == (
        file_dataset(parsed.output, WORKING_DIR),
        file_dataset(parsed.bad_records_path, WORKING_DIR),
    )
    assert named.checkpoint == file_dataset(parsed.checkpoint, WORKING_DIR)
    landing = [
        "--history",
        "/h",
        "--landing",
        "/data/landing",
        "--output",
        "/o",
        "--checkpoint",
        "/c",
    ]
    assert job_datasets(landing, WORKING_DIR).inputs[1] == file_dataset(
        events_pipeline.parse_args(landing).landing, WORKING_DIR
    )

    cdc = [
        "--connection",
        "postgresql://reader@db/shop",
        "--table",
        "sales.accounts",
        "--target",
        "postgresql://writer@warehouse/copy",
        "--target-table",
        "accounts_copy",
        "--changes-output",
        "/data/changes",
        "--checkpoint",
        "/data/checkpoint",
    ]
    parsed = cdc_pipeline.parse_args(cdc)
    named = job_datasets(cdc, WORKING_DIR)
    assert named.inputs == (postgres_dataset(parsed.connection, parsed.table),)
    assert named.outputs == (
        postgres_dataset(parsed.target, parsed.target_table),
        file_dataset(parsed.changes_output, WORKING_DIR),
    )
    assert named.checkpoint == file_dataset(parsed.checkpoint, WORKING_DIR)
