import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SPARK_SCHEMA = StructType(
    [
        StructField("event_id", LongType()),
        StructField("account", StringType()),
        StructField("amount", DoubleType()),
        StructField("event_time", TimestampType()),
    ]
)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def rows(first: int, count: int) -> list[dict]:
    return [
        {
            "event_id": i,
            "account": f"a{i % 3}",
            "amount": i / 10,
            "event_time": T0 + timedelta(seconds=i),
        }
        for i in range(first, first + count)
    ]


def arrow_table(first: int, count: int) -> pa.Table:
    data = rows(first, count)
    return pa.table(
        {
            "event_id": pa.array([r["event_id"] for r in data], pa.int64()),
            "account": pa.array([r["account"] for r in data]),
            "amount": pa.array([r["amount"] for r in data], pa.float64()),
            "event_time": pa.array([r["event_time"] for r in data], pa.timestamp("us", tz="UTC")),
        }
    )


def write_file(directory: Path, name: str, fmt: str, first: int, count: int, **kw) -> Path:
    """Write events ``first..first+count`` as one file; parquet row groups of ``row_group``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if fmt == "parquet":
        pq.write_table(arrow_table(first, count), path, row_group_size=kw.get("row_group", 1000))
    elif fmt == "json":
        lines = [
            json.dumps({**r, "event_time": r["event_time"].isoformat().replace("+00:00", "Z")})
            for r in rows(first, count)
        ]
        path.write_text("\n".join(lines) + "\n")
    else:
        table = arrow_table(first, count)
        naive = table.set_column(
            3, "event_time", table.column("event_time").cast(pa.timestamp("us"))
        )
        pa_csv.write_csv(naive, path)
    return path


def land(directory: Path, name: str, fmt: str, first: int, count: int, mtime: int) -> Path:
    path = write_file(directory, name, fmt, first, count)
    os.utime(path, ns=(mtime * 10**9, mtime * 10**9))
    return path


@pytest.fixture
def spark_schema() -> StructType:
    return SPARK_SCHEMA
