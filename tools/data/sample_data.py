"""Sample data for a deployed stack: history files in the data directory and events in a
Kafka topic, as the phased DAG reads them.

    sample-data --data-dir /var/lib/backlog --history-events 1000000 --files 100 \\
        --bootstrap-servers kafka:9092 --topic events --backlog-events 300000 --live-rate 2000

The stack runs it as its sample-data service (``docker compose run --rm sample-data ARGS``),
a checkout as ``scripts/sample-data ARGS``: both call it sample-data.

Writes the history (event ids 0 to N-1, event times over the two hours that end ten minutes
ago) as parquet files into DATA_DIR/history, then sends the backlog events to the topic (the
next ids, stamped now, spread over its partitions) and, with --live-rate, goes on sending
live events until --live-for has passed or it is stopped (Ctrl-C, SIGTERM). The defaults of
--data-dir, --bootstrap-servers and --topic come from BACKLOG_DATA_DIR,
BACKLOG_KAFKA_BOOTSTRAP_SERVERS and BACKLOG_KAFKA_TOPIC, as the stack sets them.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from spark_jobs.backlog.values import count_argument, duration_argument, format_duration
from tools.data.events import KafkaProducerThread, history_range, write_history

PROG = "sample-data"
#: How long the broker may take to describe the topic before the tool gives up.
METADATA_TIMEOUT_S = 15.0
#: Backlog events are built and sent this many at a time, with a progress line each.
BACKLOG_SLICE = 100_000
#: Seconds between progress lines while live events are sent.
LIVE_PROGRESS_EVERY_S = 10.0


class SampleDataError(RuntimeError):
    """The data cannot be written as asked; the message says why."""


def say(message: str) -> None:
    print(message, flush=True)


def event_count_argument(text: str) -> int:
    """``type=`` for a number of events that may be 0."""
    return 0 if text.strip() == "0" else count_argument(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog="Durations are written as 90s, 10min, 2h; --live-for 0 sends until stopped.",
    )
    data_dir = os.environ.get("BACKLOG_DATA_DIR")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(data_dir) if data_dir else None,
        help="gets history/ (default: $BACKLOG_DATA_DIR)",
    )
    parser.add_argument(
        "--history-events", type=count_argument, default=1_000_000, help="default 1,000,000"
    )
    parser.add_argument(
        "--files", type=count_argument, default=100, help="parquet files (default 100)"
    )
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("BACKLOG_KAFKA_BOOTSTRAP_SERVERS"),
        help="default: $BACKLOG_KAFKA_BOOTSTRAP_SERVERS",
    )
    parser.add_argument(
        "--topic",
        default=os.environ.get("BACKLOG_KAFKA_TOPIC") or "events",
        help="an existing topic (default: $BACKLOG_KAFKA_TOPIC, else events)",
    )
    parser.add_argument(
        "--backlog-events",
        type=event_count_argument,
        default=300_000,
        help="events waiting in the topic before any live one (default 300,000)",
    )
    parser.add_argument(
        "--live-rate",
        type=count_argument,
        metavar="EVENTS_PER_S",
        help="then keep sending this many live events per second",
    )
    parser.add_argument(
        "--live-for",
        type=duration_argument,
        default=0.0,
        metavar="DURATION",
        help="how long to send live events (default 0: until stopped)",
    )
    args = parser.parse_args(argv)
    if args.data_dir is None:
        parser.error("--data-dir is required (or set BACKLOG_DATA_DIR)")
    if args.files > args.history_events:
        parser.error(
            f"--files {args.files} is more than --history-events {args.history_events}: "
            "every file needs at least one event"
        )
    if args.live_for and args.live_rate is None:
        parser.error("--live-for needs --live-rate")
    if uses_kafka(args) and not args.bootstrap_servers:
        parser.error("--bootstrap-servers is required (or set BACKLOG_KAFKA_BOOTSTRAP_SERVERS)")
    history = args.data_dir / "history"
    if history.exists() and not history.is_dir():
        parser.error(f"{history} is not a directory")
    if history.is_dir() and (held := sorted(path.name for path in history.iterdir())):
        more = f" and {len(held) - 3} more" if len(held) > 3 else ""
        parser.error(
            f"{history} already holds files ({', '.join(held[:3])}{more}): a job admits "
            "history files once and reads them by name, so move them away or give another "
            "--data-dir"
        )
    return args


def uses_kafka(args: argparse.Namespace) -> bool:
    return args.backlog_events > 0 or args.live_rate is not None


def topic_partitions(bootstrap_servers: str, topic: str) -> int:
    """The topic's partition count, as the broker describes it."""
    # Quiet: a broker that cannot be reached is reported once, below, not at every retry.
    client = Producer({"bootstrap.servers": bootstrap_servers, "log_level": 2})
    try:
        metadata = client.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException as error:
        raise SampleDataError(
            f"the broker at {bootstrap_servers} did not answer within "
            f"{format_duration(METADATA_TIMEOUT_S)} ({error.args[0].str()})"
        ) from None
    finally:
        client.close()
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        raise SampleDataError(
            f"topic {topic!r} does not exist at {bootstrap_servers}: create it first (in the "
            "stack, the kafka-init service creates it)"
        )
    return len(described.partitions)


def write_sample_history(args: argparse.Namespace) -> int:
    """The history files; returns the first event id they leave free."""
    directory = args.data_dir / "history"
    say(f"writing {args.history_events:,} history events into {args.files} files in {directory}")
    start, end = history_range(datetime.now(UTC))

    def progress(done: int, total: int) -> None:
        if done % max(1, total // 10) == 0 or done == total:
            say(f"  history: {done}/{total} files")

    return write_history(directory, args.history_events, args.files, start, end, progress)


def send_events(
    args: argparse.Namespace, partitions: int, first_id: int, stop: threading.Event
) -> int:
    """The backlog events, then live ones; returns how many were sent. Stopping the producer
    thread (which sends the live events, none without --live-rate) waits until the broker
    has every event, or raises."""
    producer = KafkaProducerThread(
        args.bootstrap_servers, args.topic, partitions, first_id, args.live_rate or 0
    )
    where = f"topic {args.topic!r} ({partitions} partitions) at {args.bootstrap_servers}"
    say(f"sending {args.backlog_events:,} backlog events to {where}")
    sent = 0
    while sent < args.backlog_events and not stop.is_set():
        batch = min(BACKLOG_SLICE, args.backlog_events - sent)
        producer.burst(batch)
        sent += batch
        say(f"  backlog: {sent:,}/{args.backlog_events:,} events")
    producer.start()
    try:
        if args.live_rate is not None and not stop.is_set():
            until = f"for {format_duration(args.live_for)}" if args.live_for else "until stopped"
            say(f"sending {args.live_rate:,} live events/s {until}")
            deadline = time.monotonic() + args.live_for if args.live_for else math.inf
            while (left := deadline - time.monotonic()) > 0:
                if stop.wait(min(LIVE_PROGRESS_EVERY_S, left)):
                    break
                say(f"  live: {producer.stats.events - sent:,} events")
    finally:
        producer.stop()
    return producer.stats.events


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        partitions = topic_partitions(args.bootstrap_servers, args.topic) if uses_kafka(args) else 0
        first_id = write_sample_history(args)
    except SampleDataError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted while writing the history", file=sys.stderr)
        return 130
    say(f"history: event ids 0 to {first_id - 1:,}")
    if not uses_kafka(args):
        return 0
    stop = threading.Event()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in handlers:
        signal.signal(signum, lambda *_: stop.set())
    try:
        sent = send_events(args, partitions, first_id, stop)
    except RuntimeError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if sent:
        say(f"topic {args.topic!r}: event ids {first_id:,} to {first_id + sent - 1:,}")
    if sent < args.backlog_events:
        print(f"{PROG}: stopped after {sent:,} of the backlog's events", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
