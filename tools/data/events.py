"""Synthetic events: a historical backlog in parquet files, and live producers of landing
files or Kafka records.

Events carry a unique ``event_id``; live events are stamped with the time they are
produced, so ``commit time - event_time`` is their freshness.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer

EVENT_ARROW_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("account", pa.string()),
        ("amount", pa.float64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
    ]
)
ACCOUNTS = 50


def _account(event_id: int) -> str:
    return f"acct-{(event_id * 7919) % ACCOUNTS:03d}"


def _amount(event_id: int) -> float:
    return round(((event_id * 104729) % 10_000) / 100, 2)


def write_history(
    directory: Path,
    events: int,
    files: int,
    start: datetime,
    end: datetime,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write ``events`` events over ``files`` parquet files, in event-time order; returns the
    first free event id."""
    directory.mkdir(parents=True, exist_ok=True)
    span_us = int((end - start).total_seconds() * 1_000_000)
    start_us = int(start.timestamp() * 1_000_000)
    per_file = -(-events // files)
    for index in range(files):
        first, last = index * per_file, min((index + 1) * per_file, events)
        ids = range(first, last)
        table = pa.table(
            {
                "event_id": pa.array(ids, pa.int64()),
                "account": pa.array([_account(i) for i in ids]),
                "amount": pa.array([_amount(i) for i in ids], pa.float64()),
                "event_time": pa.array(
                    [start_us + span_us * i // events for i in ids], pa.timestamp("us", tz="UTC")
                ),
            },
            schema=EVENT_ARROW_SCHEMA,
        )
        pq.write_table(table, directory / f"history-{index:05d}.parquet")
        if progress:
            progress(index + 1, files)
    return events


def event_json(event_id: int, at: datetime) -> str:
    """One live event as the JSON a landing file line or a Kafka record value holds."""
    return json.dumps(
        {
            "event_id": event_id,
            "account": _account(event_id),
            "amount": _amount(event_id),
            "event_time": at.isoformat().replace("+00:00", "Z"),
        }
    )


def write_landing_file(directory: Path, name: str, first_id: int, count: int, at: datetime) -> None:
    """One JSON-lines file, written under a hidden name and moved in, so readers see it whole."""
    lines = [event_json(event_id, at) for event_id in range(first_id, first_id + count)]
    temporary = directory / f".{name}.tmp"
    temporary.write_text("\n".join(lines) + "\n")
    os.replace(temporary, directory / name)


@dataclass
class ProducerStats:
    files: int = 0
    events: int = 0


class LiveProducer(threading.Thread):
    """Writes ``events_per_s`` live events as a landing file every ``file_every_s`` seconds."""

    def __init__(self, directory: Path, first_id: int, events_per_s: int, file_every_s: float):
        super().__init__(name="live-producer", daemon=True)
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.next_id = first_id
        self.file_every_s = file_every_s
        self.per_file = 1
        self.set_rate(events_per_s)
        self.stats = ProducerStats()
        self._stop_event = threading.Event()

    def set_rate(self, events_per_s: int) -> None:
        """From the next file on, ``events_per_s`` events a second."""
        self.per_file = max(1, round(events_per_s * self.file_every_s))

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stop_event.is_set():
            now = datetime.now(UTC)
            write_landing_file(
                self.directory,
                f"live-{self.stats.files:06d}.json",
                self.next_id,
                self.per_file,
                now,
            )
            self.next_id += self.per_file
            self.stats.files += 1
            self.stats.events += self.per_file
            next_at += self.file_every_s
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def history_range(now: datetime, hours: float = 2.0) -> tuple[datetime, datetime]:
    """A backlog that ends well before the live events start."""
    return now - timedelta(hours=hours), now - timedelta(minutes=10)


class KafkaProducerThread(threading.Thread):
    """Sends ``events_per_s`` live events to a topic, spread over its partitions, in small
    slices ten times a second; ``burst`` adds a pile of events at once.

    Values are compressed (lz4), so the embedded broker's per-partition memory holds more.
    """

    SLICES_PER_S = 10

    def __init__(
        self, bootstrap_servers: str, topic: str, partitions: int, first_id: int, events_per_s: int
    ):
        super().__init__(name="kafka-producer", daemon=True)
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "compression.type": "lz4",
                "linger.ms": 20,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        self._bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.partitions = partitions
        self.next_id = first_id
        self.events_per_s = events_per_s
        self.stats = ProducerStats()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def send(self, count: int) -> float:
        """``count`` events stamped now, round-robin over the partitions; returns when (epoch
        seconds) the first was handed to the client. The client is thread-safe: only the
        ids are reserved under the lock, so a burst does not hold up the steady stream."""
        with self._lock:
            first = self.next_id
            self.next_id += count
            self.stats.events += count
        at = datetime.now(UTC)
        values = [event_json(i, at).encode() for i in range(first, first + count)]
        sent_at = time.time()
        for offset, value in enumerate(values):
            self._producer.produce(self.topic, value, partition=(first + offset) % self.partitions)
            if offset % 10_000 == 9_999:
                self._producer.poll(0)
        self._producer.poll(0)
        return sent_at

    def burst(self, count: int) -> float:
        """A pile-up arriving at once: built first, then sent as fast as the client can;
        returns when it started to arrive."""
        sent_at = self.send(count)
        self._producer.flush(60)
        return sent_at

    def set_rate(self, events_per_s: int) -> None:
        """From the next slice on, ``events_per_s`` events a second."""
        self.events_per_s = events_per_s

    def run(self) -> None:
        next_at, owed = time.monotonic(), 0.0
        while not self._stop_event.is_set():
            owed += self.events_per_s / self.SLICES_PER_S
            self.send(int(owed))
            owed -= int(owed)
            next_at += 1 / self.SLICES_PER_S
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    def successor(self) -> KafkaProducerThread:
        """A new producer (not started) that goes on where this stopped one left off."""
        return KafkaProducerThread(
            self._bootstrap_servers, self.topic, self.partitions, self.next_id, self.events_per_s
        )

    def stop(self) -> None:
        """Stop sending and deliver what was sent; once (later calls do nothing)."""
        if self._stop_event.is_set():
            return
        self._stop_event.set()
        if self.is_alive():
            self.join()
        remaining = self._producer.flush(30)
        # Closed now, not when collected: it would keep reconnecting to a broker gone by then.
        self._producer.close()
        if remaining:
            raise RuntimeError(f"{remaining} events were not delivered to {self.topic!r}")
