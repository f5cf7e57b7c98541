import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tools.services.broker import LIST_OFFSETS, BrokerError, EmbeddedBroker, MockCluster, main

REPO = Path(__file__).resolve().parents[3]


def served_topics(servers: str) -> dict[str, int]:
    """Topic -> partition count, as a separate client sees them."""
    metadata = AdminClient({"bootstrap.servers": servers}).list_topics(timeout=10)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


def accepts_connections(servers: str) -> bool:
    host, port = servers.split(",")[0].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(path: Path, process: subprocess.Popen, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, f"exited with {process.returncode}"
        assert time.monotonic() < deadline, f"no {path} after {timeout_s} s"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_the_embedded_broker_serves_its_topics_until_stopped(tmp_path):
    broker = EmbeddedBroker(tmp_path, {"events": 4, "audit": 1, "big.topic_2": 8}).start()
    try:
        ready = json.loads((tmp_path / "broker.json").read_text())
        assert ready["bootstrap_servers"] == broker.bootstrap_servers
        assert ready["pid"] != os.getpid() and is_running(ready["pid"])
        assert served_topics(broker.bootstrap_servers) == {
            "events": 4,
            "audit": 1,
            "big.topic_2": 8,
        }
    finally:
        broker.stop()
    assert not is_running(ready["pid"])
    assert not accepts_connections(broker.bootstrap_servers)
    broker.stop()  # stopping twice is harmless


def test_each_start_is_a_fresh_broker_and_the_context_manager_stops_it(tmp_path):
    with EmbeddedBroker(tmp_path / "a", {"events": 2}) as first:
        with EmbeddedBroker(tmp_path / "b", {"other": 3}) as second:
            assert first.bootstrap_servers != second.bootstrap_servers
            assert served_topics(first.bootstrap_servers) == {"events": 2}
            assert served_topics(second.bootstrap_servers) == {"other": 3}
        assert not accepts_connections(second.bootstrap_servers)
        assert accepts_connections(first.bootstrap_servers)
    assert not accepts_connections(first.bootstrap_servers)


def test_a_broker_that_cannot_start_raises_and_leaves_no_ready_file(tmp_path):
    broker = EmbeddedBroker(tmp_path, {"events": 0})
    with pytest.raises(
        BrokerError, match=r"the embedded broker did not start: .* --topic events:0"
    ):
        broker.start()
    assert not (tmp_path / "broker.json").exists()


def test_the_command_line_broker_writes_its_ready_file_and_exits_cleanly_on_sigterm(tmp_path):
    ready_file = tmp_path / "ready" / "broker.json"
    ready_file.parent.mkdir()
    command = [sys.executable, "-m", "tools.services.broker", "--topic", "solo"]
    command += ["--topic", "events:3", "--ready-file", str(ready_file)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        ready = wait_for(ready_file, process)
        assert ready["pid"] == process.pid
        assert served_topics(ready["bootstrap_servers"]) == {"solo": 1, "events": 3}
        assert not ready_file.with_suffix(".tmp").exists()
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert process.returncode == 0
    assert output == (
        f"scripts/broker: serving {{'solo': 1, 'events': 3}} at {ready['bootstrap_servers']}\n"
    )


@pytest.mark.parametrize("topic", ["events:0", "events:-1", "events:x", ":3", "events:1.5"])
def test_a_bad_topic_argument_is_refused(topic, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--topic", "ok:2", "--topic", topic])
    assert exited.value.code == 2
    assert (
        f"argument --topic: {topic!r}: expected TOPIC or TOPIC:PARTITIONS (>= 1)"
        in capsys.readouterr().err
    )


def test_the_topic_argument_is_required(capsys):
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "the following arguments are required: --topic" in capsys.readouterr().err


def test_the_mock_cluster_runs_in_process_and_closes_once():
    cluster = MockCluster({"events": 2, "audit": 5})
    try:
        assert served_topics(cluster.bootstrap_servers) == {"events": 2, "audit": 5}
    finally:
        cluster.close()
    assert not accepts_connections(cluster.bootstrap_servers)
    cluster.close()


# --- faults ----------------------------------------------------------------------------------


def leaders(servers: str, topic: str) -> dict[int, int]:
    metadata = AdminClient({"bootstrap.servers": servers}).list_topics(topic, timeout=10)
    return {p: described.leader for p, described in metadata.topics[topic].partitions.items()}


def offsets(servers: str, topic: str, partition: int) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "faults", "log_level": 0})
    try:
        return consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
    finally:
        consumer.close()


def test_a_cluster_taken_down_refuses_connections_and_comes_back_with_its_records(tmp_path):
    with EmbeddedBroker(tmp_path, {"events": 2}, brokers=3) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for i in range(10):
            producer.produce("events", b"%d" % i, partition=i % 2)
        assert producer.flush(10) == 0
        broker.take_down()
        assert not any(
            accepts_connections(server) for server in broker.bootstrap_servers.split(",")
        )
        broker.bring_up()
        assert all(accepts_connections(server) for server in broker.bootstrap_servers.split(","))
        assert offsets(broker.bootstrap_servers, "events", 1) == (0, 5)


def test_a_moved_leader_is_what_clients_are_told(tmp_path):
    with EmbeddedBroker(tmp_path, {"events": 2}, brokers=3) as broker:
        before = leaders(broker.bootstrap_servers, "events")
        target = next(b for b in (1, 2, 3) if b != before[0])
        broker.move_leader("events", 0, target)
        assert leaders(broker.bootstrap_servers, "events") == {**before, 0: target}


def test_pushed_request_errors_answer_the_next_requests(tmp_path):
    with EmbeddedBroker(tmp_path, {"events": 1}) as broker:
        # Each lookup sends two requests, not always both of them to the cluster queue.
        broker.fail_requests(LIST_OFFSETS, [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 4)
        answers = []
        while len(answers) < 8 and answers[-1:] != [(0, 0)]:
            try:
                answers.append(offsets(broker.bootstrap_servers, "events", 0))
            except KafkaException as error:
                answers.append(error.args[0].name())
        assert answers[0] == "TOPIC_AUTHORIZATION_FAILED"
        assert answers[-1] == (0, 0)


def test_a_fault_the_cluster_cannot_apply_is_refused_by_name(tmp_path):
    with EmbeddedBroker(tmp_path, {"events": 1}) as broker:
        with pytest.raises(BrokerError, match=r"take_down \{'broker': 7\}: .*broker 7"):
            broker.take_down(7)
        broker.take_down()  # the broker process still serves faults after a refusal
        broker.bring_up()
