import json
import subprocess
import sys

import pytest
from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import TriggerPlan
from spark_jobs.sources.children import ChildSpecError, spec_field
from spark_jobs.sources.gate import PlanChannel
from spark_jobs.sources.hybrid import (
    CHILD_KINDS,
    HybridDataSource,
    HybridOptionError,
    HybridStreamReader,
    child_class,
)
from tests.spark_jobs.sources.conftest import SPARK_SCHEMA, land, write_file
from tools.services.broker import EmbeddedBroker


def children(tmp_path, **overrides):
    specs = [
        {"name": "history", "kind": "files", "path": str(tmp_path / "history")},
        {"name": "landing", "kind": "landing", "path": str(tmp_path / "landing"), "format": "json"},
    ]
    for spec in specs:
        spec.update(overrides.get(spec["name"], {}))
    return json.dumps(specs)


def reader(tmp_path, **options) -> HybridStreamReader:
    base = {"sources": children(tmp_path), "stateLocation": str(tmp_path / "state")}
    return HybridStreamReader({**base, "name": "events", **options}, SPARK_SCHEMA)


def ids(source: HybridStreamReader, start, end) -> list[int]:
    out = []
    for partition in source.partitions(start, end):
        for batch in source.read(partition):
            out.extend(batch.column("event_id").to_pylist())
    return out


@pytest.fixture
def data(tmp_path):
    write_file(tmp_path / "history", "h0.parquet", "parquet", 0, 60)
    write_file(tmp_path / "history", "h1.parquet", "parquet", 60, 40)
    land(tmp_path / "landing", "l0.json", "json", 100, 5, mtime=10)
    return tmp_path


def test_offsets_carry_source_phase_and_backlog_status(data):
    source = reader(data)
    start = source.initialOffset()
    assert start == {
        "source": "events",
        "child": 0,
        "phase": "history",
        "backlog": True,
        "position": {"file": 0, "row": 0},
    }
    end = source.latestOffset(start, ReadMaxRows(70))
    assert (end["position"], end["rows"]) == ({"file": 1, "row": 10}, 70)
    assert source.reportLatestOffset() == {
        "source": "events",
        "child": 0,
        "phase": "history",
        "backlog": True,
        "rows": 70,
        "lag": {"files_behind": 1, "rows_behind": 30},
    }
    assert json.loads(json.dumps(end)) == end  # what Spark stores in its offset log


def test_history_then_landing_with_every_row_once(data):
    source = reader(data)
    offset, seen, phases = source.initialOffset(), [], []
    for _ in range(6):
        end = source.latestOffset(offset, ReadMaxRows(45))
        if end == offset:
            break
        seen.extend(ids(source, offset, end))
        phases.append((end["phase"], end["backlog"]))
        offset = end
    assert seen == list(range(105))
    assert phases == [("history", True), ("history", True), ("history", True), ("landing", False)]
    land(data / "landing", "l1.json", "json", 105, 3, mtime=11)
    end = source.latestOffset(offset, ReadAllAvailable())
    assert ids(source, offset, end) == [105, 106, 107]


def test_the_handoff_batch_records_the_switch_even_without_live_data(tmp_path):
    write_file(tmp_path / "history", "h0.parquet", "parquet", 0, 10)
    (tmp_path / "landing").mkdir()
    source = reader(tmp_path)
    first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
    assert first["backlog"]
    handoff = source.latestOffset(first, ReadAllAvailable())
    assert handoff["phase"] == "landing" and not handoff["backlog"]
    assert ids(source, first, handoff) == []
    assert source.latestOffset(handoff, ReadAllAvailable()) == handoff


def test_a_hybrid_of_bounded_children_finishes(tmp_path):
    write_file(tmp_path / "a", "x.parquet", "parquet", 0, 3)
    write_file(tmp_path / "b", "x.parquet", "parquet", 3, 3)
    specs = json.dumps(
        [
            {"name": "a", "kind": "files", "path": str(tmp_path / "a")},
            {"name": "b", "kind": "files", "path": str(tmp_path / "b")},
        ]
    )
    source = HybridStreamReader(
        {"sources": specs, "stateLocation": str(tmp_path / "s")}, SPARK_SCHEMA
    )
    first = source.latestOffset(source.initialOffset(), ReadAllAvailable())
    assert "finished" not in first
    last = source.latestOffset(first, ReadAllAvailable())
    assert last["finished"] is True and last["backlog"] is False
    assert ids(source, first, last) == [3, 4, 5]


def test_spark_s_commit_reaches_the_child_it_ended_in(data):
    source = reader(data)
    landing = source.children[1]
    assert landing.name == "landing"
    source.commit({"child": 0, "position": {"file": 1, "row": 0}})
    assert landing._committed_files == 0
    source.commit({"child": 1, "position": {"file": 3, "row": 0}})
    assert landing._committed_files == 3
    source.commit({"child": 1, "position": {"file": 2, "row": 0}})  # never backwards
    assert landing._committed_files == 3


def test_a_child_may_override_its_backlog_status(data):
    source = reader(data, sources=children(data, landing={"backlog": True}))
    offset = source.initialOffset()
    offset = source.latestOffset(offset, ReadAllAvailable())
    offset = source.latestOffset(offset, ReadAllAvailable())
    assert offset["phase"] == "landing" and offset["backlog"] is True


def test_static_per_trigger_limits_become_the_default_read_limit(data):
    assert reader(data).getDefaultReadLimit() == ReadAllAvailable()
    assert reader(data, maxRowsPerTrigger="500").getDefaultReadLimit() == ReadMaxRows(500)
    assert reader(data, maxFilesPerTrigger="1").getDefaultReadLimit() == ReadMaxFiles(1)
    source = reader(data, maxFilesPerTrigger="1")
    end = source.latestOffset(source.initialOffset(), ReadMaxFiles(1))
    assert end["position"] == {"file": 1, "row": 0}


def publish(channel_dir, due_at, max_rows, standing=False, starts=None, seq=1):
    decision = Decision(
        is_backlog=standing, interval_s=1.0, due_at=due_at, max_rows=max_rows, standing=standing
    )
    PlanChannel(channel_dir).publish(TriggerPlan.from_decision(seq, decision, 60, starts))


def test_a_gated_source_waits_for_the_due_time_and_takes_the_decided_rows(data):
    channel = data / "channel"
    publish(channel, due_at=4_000_000_000, max_rows=30)
    source = reader(data, backlogChannel=str(channel))
    start = source.initialOffset()
    assert source.latestOffset(start, ReadAllAvailable()) == start
    publish(channel, due_at=0, max_rows=30, seq=2)
    end = source.latestOffset(start, ReadMaxRows(1000))
    assert end["position"] == {"file": 0, "row": 30}
    # one batch per plan: the next waits for a plan that follows this batch
    assert source.latestOffset(end, ReadAllAvailable()) == end
    publish(channel, due_at=0, max_rows=20, starts={"events": end}, seq=3)
    assert source.latestOffset(end, ReadAllAvailable())["position"] == {"file": 0, "row": 50}


def test_a_standing_backlog_plan_runs_batches_back_to_back(data):
    channel = data / "channel"
    publish(channel, due_at=0, max_rows=40, standing=True)
    source = reader(data, backlogChannel=str(channel))
    offset, sizes = source.initialOffset(), []
    while offset["backlog"]:
        end = source.latestOffset(offset, ReadAllAvailable())
        sizes.append(len(ids(source, offset, end)))
        offset = end
    assert sizes == [40, 40, 20, 5]  # the last one is the handoff to the live child
    assert source.latestOffset(offset, ReadAllAvailable()) == offset  # live: needs a plan


def test_a_gated_source_without_a_plan_says_where_it_looked(data):
    source = reader(data, backlogChannel=str(data / "nowhere"))
    with pytest.raises(RuntimeError, match=r"no trigger plan in .*nowhere.*backlogChannel"):
        source.latestOffset(source.initialOffset(), ReadAllAvailable())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sources": None}, "option 'sources' is required"),
        ({"sources": "[{"}, "option 'sources' is not valid JSON"),
        ({"sources": "[]"}, "must be a non-empty JSON list of objects"),
        ({"sources": '[{"kind": "files", "path": "x"}]'}, "field 'name' is required"),
        ({"sources": '[{"name": "a b", "kind": "files"}]'}, "name 'a b' must be 1-100"),
        ({"sources": '[{"name": "a", "kind": "tape"}]'}, "kind 'tape' is not one of"),
        (
            {"sources": '[{"name": "a", "kind": "files", "path": "x", "format": "xml"}]'},
            "field 'format' = 'xml' must be one of",
        ),
        (
            {"sources": '[{"name": "a", "kind": "files", "path": 5}]'},
            "field 'path' = 5 must be a str",
        ),
        (
            {"sources": '[{"name": "a", "kind": "files", "path": "x", "backlog": "yes"}]'},
            "field 'backlog' = 'yes' must be true or false",
        ),
        (
            {
                "sources": '[{"name": "a", "kind": "landing", "path": "x"},'
                ' {"name": "b", "kind": "files", "path": "y"}]'
            },
            "never ends, so only the last child may be of that kind",
        ),
        (
            {
                "sources": '[{"name": "a", "kind": "files", "path": "x"}, {"name": "a", '
                '"kind": "landing", "path": "y"}]'
            },
            "names must be unique",
        ),
        (
            {"sources": '[{"name": "a", "kind": "landing", "path": "x", "maxFileAge": "0"}]'},
            "child source 'a': field 'maxFileAge' = '0': must be at least 1s",
        ),
        (
            {"sources": '[{"name": "a", "kind": "landing", "path": "x", "maxFileAge": "a week"}]'},
            "field 'maxFileAge' = 'a week': expected a number with a unit",
        ),
        ({"stateLocation": None}, "needs the option 'stateLocation'"),
        ({"maxRowsPerTrigger": "0"}, "'maxRowsPerTrigger' = '0': expected a whole number above 0"),
        ({"maxRowsPerTrigger": "5", "maxFilesPerTrigger": "1"}, "exclude each other"),
        ({"name": "my source"}, "option 'name' = 'my source'"),
    ],
)
def test_invalid_options_are_named(tmp_path, options, message):
    base = {"sources": children(tmp_path), "stateLocation": str(tmp_path / "s")}
    merged = {k: v for k, v in {**base, **options}.items() if v is not None}
    source = HybridDataSource(merged)
    with pytest.raises(HybridOptionError, match=message):
        source.streamReader(SPARK_SCHEMA)


@pytest.mark.parametrize(
    "sources",
    [
        # Not JSON, so its secrets cannot be found by key.
        '[{"name": "k", "kind": "kafka", "kafka.sasl.password": "hunter2", ',
        # JSON of the wrong shape.
        '{"name": "k", "kind": "kafka", "kafka.sasl.password": "hunter2"}',
    ],
)
def test_an_invalid_sources_option_is_shown_without_its_secrets(tmp_path, sources):
    source = HybridDataSource({"sources": sources, "stateLocation": str(tmp_path / "s")})
    with pytest.raises((HybridOptionError, ValueError)) as raised:
        source.streamReader(SPARK_SCHEMA)
    assert "hunter2" not in str(raised.value)
    assert "sasl.password" in str(raised.value)


def test_a_secret_field_of_the_wrong_type_is_named_but_not_shown():
    with pytest.raises(ChildSpecError) as raised:
        spec_field({"name": "k", "kafka.sasl.password": ["hunter2"]}, "kafka.sasl.password", str)
    assert str(raised.value) == (
        "child source 'k': field 'kafka.sasl.password' = ***** must be a str"
    )


def test_a_schema_is_required():
    with pytest.raises(HybridOptionError, match=r"needs a schema"):
        HybridDataSource({}).schema()


def test_a_topics_latest_offsets_are_taken_at_the_first_start_not_after_the_history(tmp_path):
    """Events produced while the history is read belong to the live phase: a topic's
    ``startingOffsets: latest`` is its end when the query first starts."""
    write_file(tmp_path / "history", "h0.parquet", "parquet", 0, 10)
    with EmbeddedBroker(tmp_path / "broker", {"events": 2}) as broker:
        live = {
            "name": "kafka",
            "kind": "kafka",
            "bootstrapServers": broker.bootstrap_servers,
            "topics": ["events"],
            "startingOffsets": "latest",
            "valueFormat": "json",
        }
        history = {"name": "history", "kind": "files", "path": str(tmp_path / "history")}
        options = {
            "sources": json.dumps([history, live]),
            "stateLocation": str(tmp_path / "state"),
            "name": "events",
        }
        source = HybridStreamReader(options, SPARK_SCHEMA)
        offset = source.initialOffset()
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        for event_id in range(10, 15):
            value = json.dumps({"event_id": event_id, "account": "a", "amount": 1.0})
            producer.produce("events", value.encode(), partition=event_id % 2)
        assert producer.flush(10) == 0
        # A restart before the first batch was logged resolves nothing anew either.
        source = HybridStreamReader(options, SPARK_SCHEMA)
        seen = []
        for _ in range(4):
            end = source.latestOffset(offset, ReadAllAvailable())
            seen.extend(ids(source, offset, end))
            offset = end
        source.stop()
    assert sorted(seen) == list(range(15))


def test_each_kind_names_its_class_and_a_job_imports_only_the_kinds_it_uses():
    assert {kind: child_class(kind).kind for kind in CHILD_KINDS} == {k: k for k in CHILD_KINDS}
    # What every Python process of a job imports first: no child's client library.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, spark_jobs.sources.hybrid; "
            "print(sorted(m for m in ('sqlalchemy', 'psycopg2', 'confluent_kafka') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
