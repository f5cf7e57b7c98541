"""An embedded Kafka-protocol broker on loopback, for the demo and the tests.

It is librdkafka's mock cluster, which ships inside the ``confluent-kafka`` wheel: real
Kafka protocol on a real TCP port, reachable from other processes (Spark's planner and
executors, producers), nothing to install. Its limits shape how it is used: it keeps data
in memory only, takes a new port at every start, keeps only about 5 MiB per partition
(older records are dropped, which the Kafka source reports as data loss), and cannot
create topics over the protocol, so they are created when it starts.

    scripts/broker --topic events:8 --ready-file /tmp/broker.json   # until SIGTERM/Ctrl-C

Faults are injected for real through the mock cluster's own controls: a broker taken
down (its connections closed and refused) and brought up, a partition's leader moved to
another broker, requests answered with errors. ``EmbeddedBroker`` sends them to its child
over stdin (``--control-stdin``), one JSON object per line.

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
from tools import child_environment

_RD_KAFKA_PRODUCER = 0
#: Kafka protocol request types, for ``fail_requests``.
FETCH, LIST_OFFSETS, METADATA = 1, 2, 3


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
    for switch in (lib.rd_kafka_mock_broker_set_down, lib.rd_kafka_mock_broker_set_up):
        switch.restype = ctypes.c_int
        switch.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.rd_kafka_mock_partition_set_leader.restype = ctypes.c_int
    lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.rd_kafka_mock_partition_set_leader.argtypes += [ctypes.c_int32, ctypes.c_int32]
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [ctypes.c_void_p, ctypes.c_int16]
    lib.rd_kafka_mock_push_request_errors_array.argtypes += [
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_int),
    ]
    return lib


class MockCluster:
    """The cluster inside this process; it lives as long as the object is not closed."""

    def __init__(self, topics: dict[str, int], brokers: int = 1):
        self.brokers = brokers
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

    # --- faults (broker ids are 1..brokers) ---------------------------------------------

    def take_down(self, broker: int) -> None:
        """Close the broker's connections and refuse new ones, keeping its data."""
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster, broker), broker)

    def bring_up(self, broker: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster, broker), broker)

    def move_leader(self, topic: str, partition: int, broker: int) -> None:
        code = self._lib.rd_kafka_mock_partition_set_leader(
            self._cluster, topic.encode(), partition, broker
        )
        self._check(code, f"{broker} for {topic}/{partition}")

    def fail_requests(self, api_key: int, errors: Sequence[int]) -> None:
        """Answer the next ``len(errors)`` requests of this type with these error codes."""
        codes = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(
            self._cluster, api_key, len(errors), codes
        )

    def _check(self, code: int, target: object) -> None:
        if code != 0:
            raise BrokerError(f"the mock cluster refused the fault for broker {target} ({code})")

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
    parser = argparse.ArgumentParser(prog="scripts/broker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", type=_topic, action="append", required=True)
    parser.add_argument("--brokers", type=count_argument, default=1)
    parser.add_argument("--ready-file", type=Path, help="where to write the bootstrap servers")
    parser.add_argument(
        "--control-stdin",
        action="store_true",
        help="take faults as JSON lines on stdin, answer each on stdout; end at its end",
    )
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        cluster = MockCluster(dict(args.topic), args.brokers)
    except BrokerError as error:
        print(f"scripts/broker: {error}", file=sys.stderr)
        return 2
    try:
        ready = {"bootstrap_servers": cluster.bootstrap_servers, "pid": os.getpid()}
        if args.ready_file:
            temporary = args.ready_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(ready))
            temporary.replace(args.ready_file)
        print(f"scripts/broker: serving {dict(args.topic)} at {cluster.bootstrap_servers}")
        sys.stdout.flush()
        if args.control_stdin:
            threading.Thread(target=_serve_faults, args=(cluster, stop), daemon=True).start()
        stop.wait()
    finally:
        cluster.close()
    return 0


def _serve_faults(cluster: MockCluster, stop: threading.Event) -> None:
    """Apply each fault read from stdin and answer it; the parent gone ends the broker."""
    actions = {
        "take_down": cluster.take_down,
        "bring_up": cluster.bring_up,
        "move_leader": cluster.move_leader,
        "fail_requests": cluster.fail_requests,
    }
    for line in sys.stdin:
        try:
            request = json.loads(line)
            actions[request.pop("fault")](**request)
            answer: dict[str, object] = {"ok": True}
        except (BrokerError, KeyError, TypeError, ValueError) as error:
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    stop.set()


class EmbeddedBroker:
    """Runs ``scripts/broker`` in a child process: ``with EmbeddedBroker(...) as broker:``."""

    def __init__(
        self,
        workdir: Path,
        topics: dict[str, int],
        start_timeout_s: float = 30.0,
        brokers: int = 1,
    ):
        self._ready = workdir / "broker.json"
        self._topics = topics
        self.brokers = brokers
        self._timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self.bootstrap_servers = ""

    def start(self) -> EmbeddedBroker:
        self._ready.parent.mkdir(parents=True, exist_ok=True)
        self._ready.unlink(missing_ok=True)
        command = [sys.executable, "-m", "tools.services.broker"]
        command += [arg for t, n in self._topics.items() for arg in ("--topic", f"{t}:{n}")]
        command += ["--brokers", str(self.brokers), "--ready-file", str(self._ready)]
        command += ["--control-stdin"]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_environment(),  # imports tools.services.broker from any working directory
        )
        deadline = time.monotonic() + self._timeout_s
        while not self._ready.exists():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the embedded broker did not start: {' '.join(command)}")
            time.sleep(0.05)
        self.bootstrap_servers = json.loads(self._ready.read_text())["bootstrap_servers"]
        return self

    # --- faults, applied by the broker process ----------------------------------------------

    def take_down(self, broker: int | None = None) -> None:
        """Take one broker down, or every one: clients then cannot reach the cluster."""
        for each in [broker] if broker else range(1, self.brokers + 1):
            self._fault("take_down", broker=each)

    def bring_up(self, broker: int | None = None) -> None:
        for each in [broker] if broker else range(1, self.brokers + 1):
            self._fault("bring_up", broker=each)

    def move_leader(self, topic: str, partition: int, broker: int) -> None:
        self._fault("move_leader", topic=topic, partition=partition, broker=broker)

    def fail_requests(self, api_key: int, errors: Sequence[int]) -> None:
        self._fault("fail_requests", api_key=api_key, errors=list(errors))

    def _fault(self, fault: str, **arguments: object) -> None:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise BrokerError(f"cannot inject {fault}: the embedded broker is not running")
        process.stdin.write(json.dumps({"fault": fault, **arguments}) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        while line and not line.startswith("{"):  # the serving line
            line = process.stdout.readline()
        answer = json.loads(line) if line else {"error": "the broker process ended"}
        if "error" in answer:
            raise BrokerError(f"{fault} {arguments}: {answer['error']}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
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
