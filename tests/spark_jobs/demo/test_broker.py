import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from spark_jobs.demo.broker import BrokerError, EmbeddedBroker, MockCluster, main

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
    command = [sys.executable, "-m", "spark_jobs.demo.broker", "--topic", "solo"]
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
        f"backlog-broker: serving {{'solo': 1, 'events': 3}} at {ready['bootstrap_servers']}\n"
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
