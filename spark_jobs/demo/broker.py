"""An embedded Kafka-protocol broker on loopback, for the demo and the tests.

It is librdkafka's mock cluster, which ships inside the ``confluent-kafka`` wheel: real
Kafka protocol on a real TCP port, reachable from other processes (Spark's planner and
executors, producers), nothing to install. Its limits shape how it is used: it keeps data
in memory only, takes a new port at every start, keeps only about 5 MiB per partition
(older records are dropped, which the Kafka source reports as data loss), and cannot
create topics over the protocol, so they are created when it starts.

    backlog-broker --topic events:8 --ready-file /tmp/broker.json   # until SIGTERM/Ctrl-C

Production jobs point the Kafka source at their cluster's bootstrap servers instead.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import confluent_kafka

from spark_jobs.backlog.values import count_argument

_RD_KAFKA_PRODUCER = 0


class BrokerError(RuntimeError):
    """The embedded broker could not start."""


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka the wheel bundles (the mock cluster is part of its C API only)."""
    package = Path(confluent_kafka.__file__).parent
    libraries = sorted((package.parent / "confluent_kafka.libs").glob("librdkafka*.so*"))
    if not libraries:
        raise BrokerError(
            f"no bundled librdkafka next to {package}: the embedded broker needs the "
            "manylinux confluent-kafka wheel from PyPI"
        )
    lib = ctypes.CDLL(str(libraries[0]))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.rd_kafka_conf_set.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
    lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.rd_kafka_mock_topic_create.argtypes += [ctypes.c_int, ctypes.c_int]
    return lib


class MockCluster:
    """The cluster inside this process; it lives as long as the object is not closed."""

    def __init__(self, topics: dict[str, int], brokers: int = 1):
        self._lib = _librdkafka()
        error = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        # The handle owning the cluster never connects anywhere; keep it quiet.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", error, len(error))
        self._handle = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, error, len(error))
        if not self._handle:
            raise BrokerError(f"librdkafka refused a client handle: {error.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        if not self._cluster:
            raise BrokerError("librdkafka could not start its mock cluster")
        self.bootstrap_servers = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()
        for topic, partitions in topics.items():
            code = self._lib.rd_kafka_mock_topic_create(
                self._cluster, topic.encode(), partitions, 1
            )
            if code != 0:
                raise BrokerError(f"could not create topic {topic!r} ({partitions} partitions)")

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._handle)
            self._cluster = self._handle = None


def _topic(text: str) -> tuple[str, int]:
    name, _, partitions = text.partition(":")
    if not name or not (partitions or "1").isdigit() or int(partitions or "1") < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TOPIC or TOPIC:PARTITIONS (>= 1)")
    return name, int(partitions or "1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backlog-broker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", type=_topic, action="append", required=True)
    parser.add_argument("--brokers", type=count_argument, default=1)
    parser.add_argument("--ready-file", type=Path, help="where to write the bootstrap servers")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        cluster = MockCluster(dict(args.topic), args.brokers)
    except BrokerError as error:
        print(f"backlog-broker: {error}", file=sys.stderr)
        return 2
    try:
        ready = {"bootstrap_servers": cluster.bootstrap_servers, "pid": os.getpid()}
        if args.ready_file:
            temporary = args.ready_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(ready))
            temporary.replace(args.ready_file)
        print(f"backlog-broker: serving {dict(args.topic)} at {cluster.bootstrap_servers}")
        sys.stdout.flush()
        stop.wait()
    finally:
        cluster.close()
    return 0


class EmbeddedBroker:
    """Runs ``backlog-broker`` in a child process: ``with EmbeddedBroker(...) as broker:``."""

    def __init__(self, workdir: Path, topics: dict[str, int], start_timeout_s: float = 30.0):
        self._ready = workdir / "broker.json"
        self._topics = topics
        self._timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self.bootstrap_servers = ""

    def start(self) -> EmbeddedBroker:
        self._ready.parent.mkdir(parents=True, exist_ok=True)
        self._ready.unlink(missing_ok=True)
        command = [sys.executable, "-m", "spark_jobs.demo.broker"]
        command += [arg for t, n in self._topics.items() for arg in ("--topic", f"{t}:{n}")]
        command += ["--ready-file", str(self._ready)]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + self._timeout_s
        while not self._ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the embedded broker did not start: {' '.join(command)}")
            time.sleep(0.05)
        self.bootstrap_servers = json.loads(self._ready.read_text())["bootstrap_servers"]
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
