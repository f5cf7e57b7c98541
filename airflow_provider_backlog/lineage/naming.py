"""Which datasets a launched job reads and writes, named as OpenLineage names them.

The launch learns a job's sources and sinks only from the arguments it passes the job: the
events pipeline's ``--history``, ``--landing``, ``--kafka-bootstrap-servers`` and
``--kafka-topic``, ``--output`` and ``--bad-records-path``; the CDC pipeline's
``--connection`` and ``--table``, ``--target`` and ``--target-table``, ``--changes-output``;
both jobs' ``--checkpoint``. This module turns them into dataset names by OpenLineage's
conventions (https://openlineage.io/docs/spec/naming), so that a lineage backend joins
them with what other producers report of the same data: Spark's own OpenLineage listener,
a Kafka producer, an SQL task on the same PostgreSQL table.

It is pure (no Airflow, no OpenLineage, no I/O) so that the rules are tested on their own.
No credential reaches a name: a URL's user and password are left out of every namespace
(Azure's ``container@account`` names no user and stays), and a database URL gives only its
host, port and database.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

#: Hadoop's names for S3 (``s3a://``, ``s3n://``) and the stores whose names are object keys.
_OBJECT_STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs"}
#: Azure's schemes, whose ``container@account`` authority names no user.
_CONTAINER_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})
#: A table named without its schema is found on PostgreSQL's default search path.
DEFAULT_SCHEMA = "public"
DEFAULT_POSTGRES_PORT = 5432
#: The events pipeline's topic when ``--kafka-topic`` is not given.
DEFAULT_KAFKA_TOPIC = "events"
#: The jobs' arguments that name files or directories, as they spell them.
_FILE_FLAGS = (
    "--history",
    "--landing",
    "--output",
    "--bad-records-path",
    "--changes-output",
    "--checkpoint",
)
#: Every argument of theirs that names data.
_NAMING_FLAGS = frozenset(
    {
        *_FILE_FLAGS,
        "--kafka-bootstrap-servers",
        "--kafka-topic",
        "--connection",
        "--table",
        "--target",
        "--target-table",
    }
)


@dataclass(frozen=True)
class DatasetName:
    """A dataset's identity in OpenLineage: the data source, and the dataset within it.

    :param namespace: The data source, e.g. ``file``, ``s3://bucket``,
        ``kafka://broker:9092``, ``postgres://db:5432``.
    :param name: The dataset in it: a path, an object key, a topic, ``database.schema.table``.
    """

    namespace: str
    name: str


@dataclass(frozen=True)
class JobDatasets:
    """What one launch of a job reads, writes and keeps its progress in.

    :param inputs: The datasets it reads, in the order its arguments name them.
    :param outputs: The datasets it writes, in the order its arguments name them.
    :param checkpoint: Its checkpoint location, or None when its arguments name none.
    """

    inputs: tuple[DatasetName, ...]
    outputs: tuple[DatasetName, ...]
    checkpoint: DatasetName | None


def job_datasets(application_args: Sequence[str], working_dir: str) -> JobDatasets:
    """The datasets named by a job's ``application_args``; a relative path is taken against
    ``working_dir``, as a driver started there takes it. A location that names no dataset
    OpenLineage has a convention for (an SQLite target, ``hdfs:///`` with no namenode) is
    left out."""
    flags = _flag_values(application_args)
    files = {flag: file_dataset(flags[flag], working_dir) for flag in _FILE_FLAGS if flag in flags}
    topic = source = target = None
    if "--kafka-bootstrap-servers" in flags:
        name = flags.get("--kafka-topic", DEFAULT_KAFKA_TOPIC)
        topic = kafka_dataset(flags["--kafka-bootstrap-servers"], name)
    if "--table" in flags:
        table = flags["--table"]
        source = postgres_dataset(flags.get("--connection", ""), table)
        if "--target" in flags:
            target_table = flags.get("--target-table", table.split(".")[-1])
            target = postgres_dataset(flags["--target"], target_table)
    return JobDatasets(
        inputs=_named(files.get("--history"), files.get("--landing"), topic, source),
        outputs=_named(
            files.get("--output"),
            files.get("--bad-records-path"),
            target,
            files.get("--changes-output"),
        ),
        checkpoint=files.get("--checkpoint"),
    )


def file_dataset(location: str, working_dir: str) -> DatasetName | None:
    """A directory or file: ``file`` and its absolute path for a local one (a path, or
    ``file:`` without a host); ``s3://bucket`` (``s3a``, ``s3n`` too) or ``gs://bucket``
    and the object key; otherwise ``scheme://authority`` and the path, such as
    ``hdfs://namenode:8020`` and ``/data/events``. The path is kept as written, without
    decoding, as Hadoop takes it. None for a remote location without its authority
    (``hdfs:///data``, on Hadoop's default file system), which only Hadoop's
    configuration could name."""
    if "://" not in location:
        path = location.removeprefix("file:")
        return DatasetName("file", posixpath.normpath(posixpath.join(working_dir, path)))
    scheme, rest = location.split("://", 1)
    scheme = scheme.lower()
    authority, slash, path = rest.partition("/")
    if scheme not in _CONTAINER_SCHEMES:
        authority = _without_user(authority)
    path = posixpath.normpath(slash + path) if path else "/"
    if scheme == "file" and not authority:
        return DatasetName("file", path)
    if not authority:
        return None
    if scheme in _OBJECT_STORES:
        return DatasetName(f"{_OBJECT_STORES[scheme]}://{authority}", path.lstrip("/") or "/")
    return DatasetName(f"{scheme}://{authority}", path)


def kafka_dataset(bootstrap_servers: str, topic: str) -> DatasetName:
    """A topic: ``kafka://host:port`` of the first bootstrap server (without a listener
    prefix such as ``SASL_SSL://``), and the topic's name."""
    first = bootstrap_servers.split(",")[0].strip()
    server = first.split("://", 1)[-1]
    return DatasetName(f"kafka://{_without_user(server)}", topic)


def postgres_dataset(url: str, table: str) -> DatasetName | None:
    """A table of the PostgreSQL database at ``url`` (SQLAlchemy's or libpq's URL form):
    ``postgres://host:port`` and ``database.schema.table``, each part as written (the jobs
    do not fold case), the schema ``public`` unless ``table`` names one. None for a URL
    that is not PostgreSQL's or names no database."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # not a URL, or a port that is not a number
        return None
    if parsed.get_backend_name() != "postgresql" or not parsed.database:
        return None
    schema, _, name = table.rpartition(".")
    host = parsed.host or "localhost"
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, as URLs write it
    authority = f"{host}:{parsed.port or DEFAULT_POSTGRES_PORT}"
    return DatasetName(
        f"postgres://{authority}", f"{parsed.database}.{schema or DEFAULT_SCHEMA}.{name}"
    )


def _flag_values(args: Sequence[str]) -> Mapping[str, str]:
    """The values of the naming flags in ``args`` (``--flag value`` or ``--flag=value``),
    the last one winning, as argparse has it."""
    values: dict[str, str] = {}
    for index, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag not in _NAMING_FLAGS:
            continue
        if equals:
            values[flag] = value
        elif index + 1 < len(args):
            values[flag] = args[index + 1]
    return values


def _named(*names: DatasetName | None) -> tuple[DatasetName, ...]:
    return tuple(name for name in names if name is not None)


def _without_user(authority: str) -> str:
    """``host:port`` of an authority that may carry ``user:password@``."""
    return authority.rpartition("@")[2]
