"""The Kafka child's read speed in one task, beside confluent-kafka's own consumer.

An embedded broker (``scripts/broker``) holds ``--records`` JSON events spread over
``--partitions`` partitions of one topic. Each of ``--repeats`` rounds reads them all two
ways, alternating:

- ``client``: one confluent-kafka consumer assigned every partition from offset 0, counting
  records until it has them all: the library's limit, no decoding;
- ``task``: the batch's offset ranges in one Spark task (``KafkaRangesPartition.read``, as an
  executor runs it), decoded from JSON into Arrow record batches.

Reports records/s per way (median over the rounds), the ratio task/client, and the load
average; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from spark_jobs.sources.kafka_ranges import KafkaRangePartition, KafkaRangesPartition
from tools.data.events import KafkaProducerThread
from tools.services.broker import EmbeddedBroker

TOPIC = "events"
WAYS = ("client", "task")
#: The events' fields and the record columns a job asks for, as the events pipeline reads.
SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("account", pa.string()),
        ("amount", pa.float64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("kafka_offset", pa.int64()),
        ("kafka_partition", pa.int32()),
    ]
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/kafka-read-benchmark", description=__doc__)
    parser.add_argument("--records", type=int, default=200_000, help="records (200,000)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (4)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both ways (3)")
    args = parser.parse_args(argv)
    for name in ("records", "partitions", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def fill(servers: str, records: int, partitions: int) -> dict[int, int]:
    """``records`` events round-robin over the partitions; each partition's end offset."""
    producer = KafkaProducerThread(servers, TOPIC, partitions, 0, 0)
    producer.burst(records)
    return {p: records // partitions + (p < records % partitions) for p in range(partitions)}


def read_with_client(servers: str, ends: dict[int, int]) -> int:
    """Every record through a bare consumer assigned all partitions: records read."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
        wanted, read = sum(ends.values()), 0
        while read < wanted:
            read += sum(1 for m in consumer.consume(10_000, timeout=1.0) if m.error() is None)
        return read
    finally:
        consumer.close()


def read_as_task(servers: str, ends: dict[int, int]) -> int:
    """Every record as one Spark task of the Kafka child reads it: rows read."""
    ranges = [
        KafkaRangePartition(servers, {}, TOPIC, p, 0, stop, "json", 60.0)
        for p, stop in ends.items()
    ]
    return sum(batch.num_rows for batch in KafkaRangesPartition(ranges).read(SCHEMA))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    speeds: dict[str, list[float]] = {way: [] for way in WAYS}
    ways = {"client": read_with_client, "task": read_as_task}
    with (
        tempfile.TemporaryDirectory(prefix="kafka-read-probe-") as scratch,
        EmbeddedBroker(Path(scratch), {TOPIC: args.partitions}) as broker,
    ):
        ends = fill(broker.bootstrap_servers, args.records, args.partitions)
        for round_ in range(args.repeats):
            for way, read in ways.items():
                started = time.perf_counter()
                count = read(broker.bootstrap_servers, ends)
                if count != args.records:
                    raise RuntimeError(f"{way} read {count} records of {args.records}")
                speeds[way].append(count / (time.perf_counter() - started))
            done = ", ".join(f"{way} {speeds[way][-1]:,.0f}" for way in WAYS)
            print(
                f"round {round_ + 1}/{args.repeats}, records/s: {done} "
                f"(load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    medians = {way: statistics.median(values) for way, values in speeds.items()}
    summary = {
        "records": args.records,
        "partitions": args.partitions,
        "records_per_s": {way: round(value) for way, value in medians.items()},
        "task_vs_client": round(medians["task"] / medians["client"], 3),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
