import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.coordinator.runtime import refuse_if_leased
from spark_jobs.jobs.cli import launch_conf
from spark_jobs.jobs.events_pipeline import hybrid_children, parse_args
from spark_jobs.metrics.lease import LeaseHeld, LeaseStore
from spark_jobs.storage.files import normalize_location

REPO = Path(__file__).resolve().parents[3]

PATHS = ["--history", "/h", "--landing", "/l", "--output", "/o", "--checkpoint", "/c"]


def test_arguments_and_defaults():
    args = parse_args([*PATHS, "--window", "1min", "--stop-when-idle", "3s"])
    assert (args.window, args.watermark, args.stop_when_idle) == (60.0, 10.0, 3.0)
    assert args.static_trigger is None and args.shuffle_partitions == 4
    assert json.loads(hybrid_children(args)) == [
        {"name": "history", "kind": "files", "path": "/h", "format": "parquet"},
        {"name": "landing", "kind": "landing", "path": "/l", "format": "json"},
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--window", "10"], "argument --window: '10': a unit is required"),
        (["--shuffle-partitions", "0"], "'0': expected a whole number above 0"),
        (["--static-max-rows", "10"], "--static-max-rows needs --static-trigger"),
        (["--conf", "spark.x"], "--conf 'spark.x': expected KEY=VALUE"),
        (["--history-format", "xml"], "invalid choice: 'xml'"),
        (["--landing-max-file-age", "week"], "--landing-max-file-age: 'week': expected a number"),
    ],
)
def test_bad_arguments_are_refused_by_name(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args([*PATHS, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_landing_directory_s_max_file_age():
    args = parse_args([*PATHS, "--landing-max-file-age", "10min"])
    assert json.loads(hybrid_children(args))[1]["maxFileAge"] == "10min"


def test_a_kafka_topic_as_the_live_phase():
    args = parse_args(
        [*PATHS[:2], "--kafka-bootstrap-servers", "b:9092", *PATHS[4:], "--kafka-topic", "t"]
    )
    assert json.loads(hybrid_children(args))[1] == {
        "name": "kafka",
        "kind": "kafka",
        "bootstrapServers": "b:9092",
        "topics": ["t"],
        "startingOffsets": "earliest",
        "valueFormat": "json",
    }


def test_paths_are_required(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--history", "/h"])
    assert "the following arguments are required: --output, --checkpoint" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        parse_args([*PATHS[:2], *PATHS[4:]])
    assert "one of the arguments --landing --kafka-bootstrap-servers is required" in (
        capsys.readouterr().err
    )


def test_one_live_phase_only(capsys):
    with pytest.raises(SystemExit):
        parse_args([*PATHS, "--kafka-bootstrap-servers", "b:9092"])
    assert "argument --kafka-bootstrap-servers: not allowed with argument --landing" in (
        capsys.readouterr().err
    )


def test_a_launch_on_a_held_checkpoint_is_refused_before_a_jvm_starts(tmp_path):
    """The refusal needs only the database: no gateway, no session, no UI is started."""
    metrics = f"sqlite:///{tmp_path / 'metrics.db'}"
    checkpoint = tmp_path / "checkpoint"
    store = LeaseStore(metrics)
    try:
        store.acquire("events", normalize_location(str(checkpoint)), "run-1", 60)
        argv = [
            *["--history", str(tmp_path), "--landing", str(tmp_path)],
            *["--output", str(tmp_path / "out"), "--checkpoint", str(checkpoint)],
            *["--conf", f"spark.backlog.metrics.url={metrics}"],
            *["--conf", "spark.backlog.job-name=events", "--conf", "spark.backlog.lease.ttl=3s"],
        ]
        probe = (
            "import sys\n"
            "from pyspark import SparkContext\n"
            "from spark_jobs.jobs.events_pipeline import main\n"
            "code = main(sys.argv[1:])\n"
            "print('gateway started:', SparkContext._gateway is not None)\n"
            "sys.exit(code)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        store.close()
    assert done.returncode == 2, done.stderr
    assert "gateway started: False" in done.stdout
    assert f"job 'events' at checkpoint {normalize_location(str(checkpoint))}" in done.stderr
    assert "is already run by run-1" in done.stderr


def test_conf_a_console_launch_cannot_see_whole_leaves_the_lease_to_the_session(
    tmp_path, monkeypatch
):
    """A standby's wait, a longer lease or the metrics database itself may come from
    spark-defaults.conf, which only the JVM reads: the check before the session then
    refuses nothing and touches no database."""
    args = parse_args([*PATHS, "--conf", "spark.backlog.lease.ttl=3s"])
    assert launch_conf("backlog-events", args) == {
        "spark.app.name": "backlog-events",
        "spark.backlog.lease.ttl": "3s",
    }
    (tmp_path / "spark-defaults.conf").write_text("spark.backlog.lease.wait-for-handover 2min\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert launch_conf("backlog-events", args) is None
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.backlog.lease.ttl=2min pyspark-shell")
    assert launch_conf("backlog-events", args) is None

    metrics = f"sqlite:///{tmp_path / 'metrics.db'}"
    store = LeaseStore(metrics)
    try:
        store.acquire("backlog-events", normalize_location("/c"), "run-1", 60)
        refuse_if_leased(None, "/c")
        monkeypatch.chdir(tmp_path)
        refuse_if_leased({"spark.app.name": "backlog-events"}, "/c")  # no metrics database named
        assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.db", "spark-defaults.conf"]
        with pytest.raises(LeaseHeld, match="is already run by run-1"):
            conf = {"spark.backlog.metrics.url": metrics, "spark.backlog.lease.ttl": "3s"}
            refuse_if_leased({"spark.app.name": "backlog-events", **conf}, "/c")
    finally:
        store.close()
