import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from tools.data import sample_data
from tools.data.events import EVENT_ARROW_SCHEMA
from tools.services.broker import EmbeddedBroker

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = {"events": 8, "audit": 2}


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(tmp_path / "broker", PARTITIONS) as running:
        yield running.bootstrap_servers


@pytest.fixture(autouse=True)
def no_stack_environment(monkeypatch):
    for name in ("BACKLOG_DATA_DIR", "BACKLOG_KAFKA_BOOTSTRAP_SERVERS", "BACKLOG_KAFKA_TOPIC"):
        monkeypatch.delenv(name, raising=False)


def consume(servers: str, topic: str) -> list[tuple[int, dict]]:
    """Every record of the topic as (partition, decoded value), by event id."""
    consumer = Consumer(
        {"bootstrap.servers": servers, "group.id": "test", "enable.auto.commit": False}
    )
    try:
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS[topic])]
        expected = 0
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(partition, timeout=10)
            expected += high - low
        consumer.assign(partitions)
        records: list[tuple[int, dict]] = []
        deadline = time.monotonic() + 30
        while len(records) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append((message.partition(), json.loads(message.value())))
    finally:
        consumer.close()
    assert len(records) == expected, f"read {len(records)} of {expected} records"
    return sorted(records, key=lambda record: record[1]["event_id"])


def history(directory: Path) -> tuple[list[str], list[int], list[int]]:
    """File names, rows per file and all event ids, in file order."""
    files = sorted(directory.iterdir())
    tables = [pq.read_table(path) for path in files]
    for table in tables:
        assert table.schema == EVENT_ARROW_SCHEMA
    ids = [i for table in tables for i in table.column("event_id").to_pylist()]
    return [path.name for path in files], [table.num_rows for table in tables], ids


def test_history_files_then_the_backlog_in_the_topic_with_ids_following_on(
    tmp_path, broker, capsys
):
    started = datetime.now(UTC)
    argv = ["--data-dir", str(tmp_path / "data"), "--bootstrap-servers", broker]
    argv += ["--history-events", "1_000", "--files", "4", "--topic", "events"]
    argv += ["--backlog-events", "500"]
    code = sample_data.main(argv)
    assert code == 0
    names, rows, ids = history(tmp_path / "data" / "history")
    assert names == [f"history-0000{i}.parquet" for i in range(4)]
    assert rows == [250, 250, 250, 250]
    assert ids == list(range(1_000))
    last_file = pq.read_table(tmp_path / "data" / "history" / names[-1])
    assert last_file.column("event_time").to_pylist()[-1] < started - timedelta(minutes=9)

    records = consume(broker, "events")
    assert [event["event_id"] for _, event in records] == list(range(1_000, 1_500))
    assert all(partition == event["event_id"] % 8 for partition, event in records)
    times = {event["event_time"] for _, event in records}
    assert all(datetime.fromisoformat(t) >= started - timedelta(seconds=1) for t in times)

    output = capsys.readouterr().out
    assert "writing 1,000 history events into 4 files in " in output
    assert "history: event ids 0 to 999\n" in output
    assert "sending 500 backlog events to topic 'events' (8 partitions)" in output
    assert "topic 'events': event ids 1,000 to 1,499\n" in output


def test_live_events_follow_the_backlog_at_the_rate_for_the_time_given(tmp_path, broker, capsys):
    started = time.monotonic()
    argv = ["--data-dir", str(tmp_path), "--bootstrap-servers", broker, "--topic", "audit"]
    argv += ["--history-events", "10", "--files", "1", "--backlog-events", "20"]
    argv += ["--live-rate", "200", "--live-for", "1500ms"]
    code = sample_data.main(argv)
    assert code == 0
    assert 1.5 <= time.monotonic() - started < 10
    ids = [event["event_id"] for _, event in consume(broker, "audit")]
    assert ids == list(range(10, 10 + len(ids)))
    live = len(ids) - 20
    assert 200 <= live <= 400, f"{live} live events in 1.5 s at 200/s"
    assert "sending 200 live events/s for 1.5s" in capsys.readouterr().out


def test_sigterm_ends_live_events_that_run_until_stopped(tmp_path, broker):
    command = [sys.executable, "-m", "tools.data.sample_data", "--data-dir", str(tmp_path)]
    command += ["--history-events", "10", "--files", "1", "--bootstrap-servers", broker]
    command += ["--backlog-events", "0", "--live-rate", "100"]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for line in process.stdout:
            if line.startswith("sending 100 live events/s until stopped"):
                break
        time.sleep(1)
        process.send_signal(signal.SIGTERM)
        output, errors = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, errors
    ids = [event["event_id"] for _, event in consume(broker, "events")]
    assert len(ids) >= 50
    assert ids == list(range(10, 10 + len(ids)))
    assert f"topic 'events': event ids 10 to {9 + len(ids)}\n" in output


def test_history_alone_needs_no_broker_and_defaults_come_from_the_environment(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("BACKLOG_DATA_DIR", str(tmp_path / "data"))
    assert (
        sample_data.main(["--history-events", "30", "--files", "3", "--backlog-events", "0"]) == 0
    )
    names, rows, ids = history(tmp_path / "data" / "history")
    assert (len(names), rows, ids) == (3, [10, 10, 10], list(range(30)))


def test_the_topic_and_broker_defaults_come_from_the_environment(tmp_path, broker, monkeypatch):
    monkeypatch.setenv("BACKLOG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BACKLOG_KAFKA_BOOTSTRAP_SERVERS", broker)
    monkeypatch.setenv("BACKLOG_KAFKA_TOPIC", "audit")
    assert sample_data.main(["--history-events", "5", "--files", "1", "--backlog-events", "6"]) == 0
    records = consume(broker, "audit")
    assert [(p, e["event_id"]) for p, e in records] == [(i % 2, i) for i in range(5, 11)]
    assert consume(broker, "events") == []


def test_a_history_directory_that_holds_files_is_refused_and_named(tmp_path, broker, capsys):
    directory = tmp_path / "history"
    directory.mkdir()
    (directory / "history-00000.parquet").write_bytes(b"old")
    with pytest.raises(SystemExit) as exited:
        sample_data.main(["--data-dir", str(tmp_path), "--bootstrap-servers", broker])
    assert exited.value.code == 2
    assert (
        f"error: {directory} already holds files (history-00000.parquet): a job admits "
        "history files once" in capsys.readouterr().err
    )
    assert [path.name for path in directory.iterdir()] == ["history-00000.parquet"]
    assert consume(broker, "events") == []


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--history-events", "0", "'0': expected a whole number above 0"),
        ("--files", "-3", "'-3': expected a whole number above 0"),
        ("--backlog-events", "lots", "'lots': expected a whole number above 0"),
        ("--live-rate", "1.5", "'1.5': expected a whole number above 0"),
        ("--live-for", "30", "'30': a unit is required"),
    ],
)
def test_a_bad_value_is_refused_by_name(tmp_path, option, value, message, capsys):
    with pytest.raises(SystemExit) as exited:
        sample_data.main(
            ["--data-dir", str(tmp_path), "--bootstrap-servers", "b:9092", option, value]
        )
    assert exited.value.code == 2
    assert f"argument {option}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "history").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backlog-events", "0"], "--data-dir is required (or set BACKLOG_DATA_DIR)"),
        (
            ["--data-dir", "d"],
            "--bootstrap-servers is required (or set BACKLOG_KAFKA_BOOTSTRAP_SERVERS)",
        ),
        (
            ["--data-dir", "d", "--history-events", "3", "--files", "4", "--backlog-events", "0"],
            "--files 4 is more than --history-events 3: every file needs at least one event",
        ),
        (
            ["--data-dir", "d", "--bootstrap-servers", "b:9092", "--live-for", "1min"],
            "--live-for needs --live-rate",
        ),
    ],
)
def test_missing_or_contradicting_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        sample_data.main(argv)
    assert exited.value.code == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_a_missing_topic_is_refused_before_any_file_is_written(tmp_path, monkeypatch, capsys):
    # The embedded broker creates any topic a client asks about; a broker with
    # auto.create.topics.enable=false (as in the stack) answers like this instead.
    class Client:
        def __init__(self, conf: dict):
            pass

        def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
            missing = SimpleNamespace(
                error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), partitions={}
            )
            return SimpleNamespace(topics={topic: missing})

        def close(self) -> None:
            pass

    monkeypatch.setattr(sample_data, "Producer", Client)
    code = sample_data.main(["--data-dir", str(tmp_path), "--bootstrap-servers", "kafka:9092"])
    assert code == 2
    assert capsys.readouterr().err == (
        "sample-data: topic 'events' does not exist at kafka:9092: create it first (in "
        "the stack, the kafka-init service creates it)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_broker_that_does_not_answer_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sample_data, "METADATA_TIMEOUT_S", 1.0)
    code = sample_data.main(["--data-dir", str(tmp_path), "--bootstrap-servers", "127.0.0.1:9"])
    assert code == 2
    assert capsys.readouterr().err.startswith(
        "sample-data: the broker at 127.0.0.1:9 did not answer within 1s ("
    )
    assert list(tmp_path.iterdir()) == []
