import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.graph import Operator, OperatorGraph, OperatorKind
from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.appliers import SourceGatedApplier
from spark_jobs.coordinator.coordinator import BacklogCoordinator, Seed
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.metrics.schema import (
    as_utc,
    backlog_checkpoints,
    backlog_interval_changes,
    backlog_transitions,
    make_engine,
)
from spark_jobs.metrics.writer import MetricsWriter
from spark_jobs.sources.gate import PlanChannel
from tests.spark_jobs.backlog.simulation import FakeClock
from tests.spark_jobs.coordinator.conftest import recorded

CONF = {
    "spark.backlog.job-name": "orders",
    "spark.backlog.run-id": "run-1",
    "spark.backlog.checkpointing.interval": "2s",
    "spark.backlog.checkpointing.interval-during-backlog": "30s",
}


@pytest.fixture
def make_parts(tmp_path):
    """Builds a coordinator from Spark conf, with its plan channel, metrics and clock."""
    writers = []

    def make(conf, probes=()):
        config = BacklogConfig.from_spark_conf(conf)
        url = f"sqlite:///{tmp_path}/metrics.db"
        writer = MetricsWriter(url)
        writers.append(writer)
        channel = PlanChannel(tmp_path / "channel")
        clock = FakeClock(1_795_261_800.0)
        coordinator = BacklogCoordinator(
            config, SourceGatedApplier(channel, config), writer, clock=clock, probes=probes
        )
        return coordinator, channel, writer, make_engine(url), clock

    yield make
    for writer in writers:
        writer.close()


@pytest.fixture
def parts(make_parts):
    return make_parts(CONF)


def rows(engine, table):
    with engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(sa.select(table).order_by(table.c.id))]


def test_start_publishes_a_first_plan_for_one_batch_up_to_the_row_cap(parts):
    coordinator, channel, *_ = parts
    coordinator.start()
    plan = channel.read()
    assert plan is not None
    assert (plan.seq, plan.max_rows, plan.starts, plan.standing) == (1, 1_000_000, None, False)


def test_backlog_then_live_is_decided_published_and_recorded(parts):
    coordinator, channel, writer, engine, clock = parts
    coordinator.start()
    backlog = BatchProgress.from_json(recorded("hybrid_backlog"))
    coordinator.on_progress(backlog)
    plan = channel.read()
    # a run's first batch measures warm-up too: its rate (30000 rows in 9.803 s) is only a
    # pessimistic stand-in for 30 s, and the next batch waits for its own decision
    assert coordinator.decider.decision.is_backlog and not plan.standing
    assert plan.max_rows == 91_809
    assert plan.starts == {"events": backlog.sources[0].end_offset}
    assert coordinator.job_is_backlog is True

    handoff = BatchProgress.from_json(recorded("hybrid_handoff"))
    clock.now = handoff.committed_at.timestamp()
    decision = coordinator.on_progress(handoff)
    plan = channel.read()
    assert not decision.is_backlog and not plan.standing
    # one interval from the batch's start, or at once since it took longer than that
    expected_due = max(handoff.started_at.timestamp() + 2, handoff.committed_at.timestamp())
    assert plan.due_at == decision.due_at == expected_due
    assert plan.starts == {"events": handoff.sources[0].end_offset}

    live = BatchProgress.from_json(recorded("hybrid_live"))
    coordinator.on_progress(live)
    assert writer.flush()

    checkpoints = rows(engine, backlog_checkpoints)
    assert [(r["batch_id"], r["is_backlog"], r["effective_interval_ms"]) for r in checkpoints] == [
        (0, True, 30000),
        (1, False, 2000),
        (3, False, 2000),
    ]
    first = checkpoints[0]
    assert (first["job_name"], first["run_id"]) == ("orders", "run-1")
    assert as_utc(first["committed_at"]) == backlog.committed_at
    assert (first["num_input_rows"], first["batch_duration_ms"]) == (30000, 9803)
    assert first["watermark"] is None
    assert as_utc(checkpoints[2]["watermark"]) == live.watermark
    assert json.loads(first["sources"]) == [
        {
            "name": "events",
            "is_backlog": True,
            "finished": False,
            "phase": "history",
            "lag": {"files_behind": 0},
            "rule": "hybrid-phase",
            "lag_state": {"in_backlog": True, "released_by": None, "rules": {}},
        }
    ]
    assert json.loads(first["observed_metrics"])["event_time"]["rows"] == 30000

    # The job's first status is its first transition.
    started, transition = rows(engine, backlog_transitions)
    assert (started["is_backlog"], started["reason"]) == (
        True,
        "hybrid-phase: events is in backlog (history)",
    )
    assert as_utc(started["at"]) == backlog.committed_at
    assert started["operators"] is None  # no operator graph
    assert transition["is_backlog"] is False
    assert transition["reason"] == "hybrid-phase: events is live (landing)"
    assert as_utc(transition["at"]) == handoff.committed_at


ROCKSDB_COMMIT_MS = {
    "rocksdbCommitCheckpointLatency": 63,
    "rocksdbCommitCompactLatency": 0,
    "rocksdbCommitFileSyncLatencyMs": 214,
    "rocksdbCommitFlushLatency": 13,
}
COST_COLUMNS = (
    "batch_duration_ms",
    "latest_offset_ms",
    "get_batch_ms",
    "query_planning_ms",
    "add_batch_ms",
    "wal_commit_ms",
    "commit_offsets_ms",
    "sink_output_rows",
    "sink_commit_ms",
)
STATE_COLUMNS = (
    "state_rows_total",
    "state_rows_updated",
    "state_memory_bytes",
    "state_disk_bytes",
    "state_commit_ms",
)


def test_a_checkpoint_records_where_its_time_went_and_the_state_it_carries(parts):
    coordinator, _, writer, engine, _ = parts
    coordinator.on_progress(BatchProgress.from_json(recorded("file_source")))
    coordinator.on_progress(BatchProgress.from_json(recorded("rocksdb_memory_sink")))
    assert writer.flush()

    stateless, stateful = rows(engine, backlog_checkpoints)
    assert [stateless[c] for c in COST_COLUMNS] == [3683, 73, 106, 621, 2613, 131, 104, None, None]
    assert [stateless[c] for c in (*STATE_COLUMNS, "state_operators")] == [None] * 6
    assert [stateful[c] for c in COST_COLUMNS] == [1503, 41, 19, 108, 1180, 63, 82, 5, None]
    assert [stateful[c] for c in STATE_COLUMNS] == [5, 5, 11156, 3915, 299]
    assert json.loads(stateful["state_operators"]) == [
        {
            "name": "stateStoreSave",
            "rows_total": 5,
            "rows_updated": 5,
            "memory_bytes": 11156,
            "disk_bytes": 3915,
            "commit_ms": 299,
            "rocksdb_commit_ms": ROCKSDB_COMMIT_MS,
        }
    ]


def test_the_driver_keeps_how_long_each_batch_took_it(parts):
    coordinator, *_ = parts
    batches = [
        BatchProgress.from_json(recorded(name))
        for name in ("file_source", "rocksdb_memory_sink", "hybrid_backlog")
    ]
    for batch in batches:
        coordinator.on_progress(batch)
    kept = list(coordinator.handling_ms)
    assert [batch_id for batch_id, _ in kept] == [batch.batch_id for batch in batches]
    assert all(ms > 0 for _, ms in kept)
    assert coordinator.handling_ms.maxlen == coordinator.HANDLING_KEPT


def test_state_totals_add_up_the_operators_and_a_size_one_leaves_unknown(parts):
    coordinator, _, writer, engine, _ = parts
    [save] = json.loads(recorded("rocksdb_memory_sink"))["stateOperators"]
    dedupe = save | {
        "operatorName": "dedupe",
        "numRowsTotal": 100,
        "numRowsUpdated": 40,
        "memoryUsedBytes": 2000,
        "commitTimeMs": 50,
        "customMetrics": {"rocksdbSstFileSize": 85, "rocksdbCommitFlushLatency": 7},
    }
    unsized = dedupe | {"operatorName": "unsized", "customMetrics": {}}
    for batch_id, operators in ((1, [save, dedupe]), (2, [save, unsized])):
        coordinator.on_progress(
            BatchProgress.from_json(
                recorded("rocksdb_memory_sink", batchId=batch_id, stateOperators=operators)
            )
        )
    assert writer.flush()

    both, one_unsized = rows(engine, backlog_checkpoints)
    assert [both[c] for c in STATE_COLUMNS] == [105, 45, 13156, 4000, 349]
    assert [op["disk_bytes"] for op in json.loads(both["state_operators"])] == [3915, 85]
    assert [one_unsized[c] for c in STATE_COLUMNS] == [105, 45, 13156, None, 349]
    assert json.loads(one_unsized["state_operators"])[1] == {
        "name": "unsized",
        "rows_total": 100,
        "rows_updated": 40,
        "memory_bytes": 2000,
        "disk_bytes": None,
        "commit_ms": 50,
        "rocksdb_commit_ms": {},
    }


def two_sources(history: dict, live_backlog: bool = False) -> BatchProgress:
    """A recorded batch, with a second hybrid source named ``history`` beside ``events``."""
    data = json.loads(recorded("hybrid_live"))
    extra = json.loads(json.dumps(data["sources"][0]))
    extra["endOffset"].update({"source": "history", **history})
    data["sources"][0]["endOffset"]["backlog"] = live_backlog
    data["sources"].append(extra)
    return BatchProgress.from_json(json.dumps(data))


def test_a_finished_backlog_source_beside_a_live_one_does_not_keep_the_job_in_backlog(parts):
    coordinator, *_ = parts
    coordinator.on_progress(two_sources({"backlog": True, "phase": "history"}))
    assert coordinator.job_is_backlog is True
    coordinator.on_progress(two_sources({"backlog": True, "phase": "history", "finished": True}))
    assert coordinator.job_is_backlog is False


def test_transitions_name_each_source_that_changed(parts):
    coordinator, _, writer, engine, _ = parts
    coordinator.on_progress(two_sources({"backlog": False, "phase": "tail"}))
    coordinator.on_progress(two_sources({"backlog": True, "phase": "replay"}, live_backlog=True))
    assert writer.flush()
    started, transition = rows(engine, backlog_transitions)
    assert started["reason"] == (
        "hybrid-phase: events is live (landing); hybrid-phase: history is live (tail)"
    )
    assert transition["reason"] == (
        "hybrid-phase: events is in backlog (landing); hybrid-phase: history is in backlog (replay)"
    )


def test_operator_statuses_are_logged_and_recorded_at_transitions(tmp_path, caplog):
    config = BacklogConfig.from_spark_conf(CONF)
    graph = OperatorGraph(
        [
            Operator("scan-events", OperatorKind.SOURCE, source="events"),
            Operator("scan-history", OperatorKind.SOURCE, source="history"),
            Operator("union", OperatorKind.UNION, ("scan-events", "scan-history")),
        ]
    )
    with MetricsWriter(f"sqlite:///{tmp_path}/m.db") as writer:
        coordinator = BacklogCoordinator(
            config, SourceGatedApplier(PlanChannel(tmp_path), config), writer, graph=graph
        )
        coordinator.on_progress(two_sources({"backlog": False, "phase": "tail"}))
        with caplog.at_level("INFO"):
            coordinator.on_progress(two_sources({"backlog": True, "phase": "replay"}))
    assert (
        "operators: scan-events[events]=live, scan-history[history]=backlog, union=live"
        in caplog.text
    )
    started, transition = rows(make_engine(f"sqlite:///{tmp_path}/m.db"), backlog_transitions)
    assert [op["is_backlog"] for op in json.loads(started["operators"])] == [False] * 3
    assert json.loads(transition["operators"]) == [
        {
            "id": "scan-events",
            "kind": "source",
            "source": "events",
            "inputs": [],
            "is_backlog": False,
        },
        {
            "id": "scan-history",
            "kind": "source",
            "source": "history",
            "inputs": [],
            "is_backlog": True,
        },
        {
            "id": "union",
            "kind": "union",
            "source": None,
            "inputs": ["scan-events", "scan-history"],
            "is_backlog": False,
        },
    ]


OFFSET_LAG = {
    "spark.backlog.lag.offsets.enter-threshold": "1000",
    "spark.backlog.lag.offsets.leave-threshold": "100",
}


def behind(name: str, offsets: int, **changes) -> BatchProgress:
    """A recorded batch whose hybrid source reports ``offsets`` behind the latest."""
    data = json.loads(recorded(name, **changes))
    data["sources"][0]["latestOffset"]["lag"]["offsets_behind_latest"] = offsets
    return BatchProgress.from_json(json.dumps(data))


def transitions(engine) -> list[tuple[object, bool, str]]:
    return [
        (as_utc(r["at"]), r["is_backlog"], r["reason"]) for r in rows(engine, backlog_transitions)
    ]


def test_offset_lag_holds_a_live_phase_in_backlog_and_brings_the_job_back_after_a_burst(make_parts):
    coordinator, _, writer, engine, clock = make_parts({**CONF, **OFFSET_LAG})
    # History; the handoff to the live child while far behind it and between the
    # thresholds: still in backlog; caught up; a burst: back to backlog; caught up again.
    batches = burst_batches()
    decisions = []
    for batch in batches:
        clock.now = batch.committed_at.timestamp()
        decisions.append(coordinator.on_progress(batch).is_backlog)
    assert writer.flush()

    assert decisions == [True, True, True, False, True, True, False]
    checkpoints = rows(engine, backlog_checkpoints)
    assert [(r["batch_id"], r["is_backlog"]) for r in checkpoints] == [
        (0, True),
        (1, True),
        (3, True),
        (4, False),
        (5, True),
        (6, True),
        (7, False),
    ]
    assert json.loads(checkpoints[1]["sources"]) == [
        {
            "name": "events",
            "is_backlog": True,
            "finished": False,
            "phase": "landing",
            "lag": {"files_behind": 0, "offsets_behind_latest": 5000},
            "rule": "offset-lag",
            "lag_state": {
                "in_backlog": True,
                "released_by": None,
                "rules": {
                    "offset-lag": {"in_backlog": True, "since": batches[1].committed_at.timestamp()}
                },
            },
        }
    ]
    assert transitions(engine) == [
        (batches[0].committed_at, True, "hybrid-phase: events is in backlog (history)"),
        (batches[3].committed_at, False, "offset-lag: events is live (landing)"),
        (batches[4].committed_at, True, "offset-lag: events is in backlog (landing)"),
        (batches[6].committed_at, False, "offset-lag: events is live (landing)"),
    ]


def test_a_hybrid_handoff_below_the_lag_threshold_is_still_named_by_its_phase(make_parts):
    coordinator, _, writer, engine, _ = make_parts({**CONF, **OFFSET_LAG})
    backlog = BatchProgress.from_json(recorded("hybrid_backlog"))
    handoff = behind("hybrid_handoff", 20)
    coordinator.on_progress(backlog)
    coordinator.on_progress(handoff)
    assert writer.flush()
    assert transitions(engine) == [
        (backlog.committed_at, True, "hybrid-phase: events is in backlog (history)"),
        (handoff.committed_at, False, "hybrid-phase: events is live (landing)"),
    ]


def test_watermark_lag_counts_only_batches_that_read_rows(make_parts):
    conf = {
        **CONF,
        "spark.backlog.lag.watermark.enter-threshold": "1min",
        "spark.backlog.lag.watermark.leave-threshold": "10s",
    }
    coordinator, _, writer, engine, clock = make_parts(conf)
    batches = [
        # 13.4 s behind: live
        BatchProgress.from_json(recorded("hybrid_live")),
        # idle for 5 minutes: the watermark stands still and says nothing about lag
        BatchProgress.from_json(
            recorded("hybrid_live", batchId=4, timestamp="2026-11-21T11:55:00.000Z", numInputRows=0)
        ),
        # after an outage the query reads rows 8 minutes behind
        BatchProgress.from_json(
            recorded("hybrid_live", batchId=5, timestamp="2026-11-21T11:58:00.000Z")
        ),
        # caught up, the watermark 6.2 s behind: live
        BatchProgress.from_json(
            recorded(
                "hybrid_live",
                batchId=6,
                timestamp="2026-11-21T11:59:00.000Z",
                eventTime={"watermark": "2026-11-21T11:58:55.000Z"},
            )
        ),
    ]
    decisions = []
    for batch in batches:
        clock.now = batch.committed_at.timestamp()
        decisions.append(coordinator.on_progress(batch).is_backlog)
    assert writer.flush()
    assert decisions == [False, False, True, False]
    assert transitions(engine) == [
        (batches[0].committed_at, False, "hybrid-phase: events is live (landing)"),
        (batches[2].committed_at, True, "watermark-lag: events is in backlog (landing)"),
        (batches[3].committed_at, False, "watermark-lag: events is live (landing)"),
    ]


class LaggingProbe:
    """A probed source reporting the offsets it is behind, as the test sets them."""

    def __init__(self, offsets: int):
        self.offsets = offsets

    def observe(self, progress: BatchProgress) -> None:
        pass

    def status(self) -> SourceStatus:
        return SourceStatus(
            "orders", phase="tail", lag={"offsets_behind_latest": self.offsets}, rule="probe"
        )


def test_probed_statuses_pass_through_the_lag_rules_from_the_start(make_parts):
    probe = LaggingProbe(offsets=4000)
    coordinator, _, writer, engine, clock = make_parts({**CONF, **OFFSET_LAG}, probes=[probe])
    assert coordinator.start().is_backlog is True
    probe.offsets = 80
    batch = BatchProgress.from_json(recorded("file_source"))
    assert coordinator.on_progress(batch).is_backlog is False
    assert writer.flush()
    assert transitions(engine) == [
        (datetime.fromtimestamp(clock.now, UTC), True, "offset-lag: orders is in backlog (tail)"),
        (batch.committed_at, False, "offset-lag: orders is live (tail)"),
    ]


def test_a_batch_replayed_after_a_restart_tells_no_status(make_parts):
    """The first batch of a new run is replayed from the offset log without a latest offset,
    so without lag: it must not make a lagging topic look live for a moment."""
    coordinator, _, writer, engine, clock = make_parts({**CONF, **OFFSET_LAG})
    data = json.loads(recorded("hybrid_live"))
    data["sources"][0]["latestOffset"] = None
    replayed = BatchProgress.from_json(json.dumps(data))
    lagging = behind("hybrid_live", 5000, batchId=4, timestamp="2026-11-21T11:50:13.300Z")
    for batch in (replayed, lagging):
        clock.now = batch.committed_at.timestamp()
        coordinator.on_progress(batch)
    assert writer.flush()

    assert coordinator.model.sources() == [
        SourceStatus(
            "events",
            is_backlog=True,
            phase="landing",
            lag={"files_behind": 0, "offsets_behind_latest": 5000},
            rule="offset-lag",
        )
    ]
    # the lagging batch tells the job's first status, not a switch from a live one
    assert transitions(engine) == [
        (lagging.committed_at, True, "offset-lag: events is in backlog (landing)")
    ]
    assert [r["is_backlog"] for r in rows(engine, backlog_checkpoints)] == [False, True]


def burst_batches() -> list[BatchProgress]:
    return [
        BatchProgress.from_json(recorded("hybrid_backlog")),
        behind("hybrid_handoff", 5000),
        behind("hybrid_live", 500),
        behind("hybrid_live", 50, batchId=4, timestamp="2026-11-21T11:50:13.300Z"),
        behind("hybrid_live", 2000, batchId=5, timestamp="2026-11-21T11:50:15.500Z"),
        behind("hybrid_live", 999, batchId=6, timestamp="2026-11-21T11:50:17.700Z"),
        behind("hybrid_live", 0, batchId=7, timestamp="2026-11-21T11:50:19.900Z"),
    ]


def run_batches(tmp_path, name: str, batches, seed: Seed | None = None):
    """One run of the job over ``batches``: its transitions and its last checkpoint row."""
    config = BacklogConfig.from_spark_conf({**CONF, **OFFSET_LAG, "spark.backlog.run-id": name})
    url = f"sqlite:///{tmp_path}/{name}.db"
    clock = FakeClock(batches[0].committed_at.timestamp())
    with MetricsWriter(url) as writer:
        coordinator = BacklogCoordinator(
            config,
            SourceGatedApplier(PlanChannel(tmp_path / name), config),
            writer,
            clock=clock,
            seed=seed,
        )
        for batch in batches:
            clock.now = batch.committed_at.timestamp()
            coordinator.on_progress(batch)
        assert writer.flush()
    engine = make_engine(url)
    changes = [(at, is_backlog, reason) for at, is_backlog, reason in transitions(engine)]
    last = rows(engine, backlog_checkpoints)[-1]
    engine.dispose()
    return changes, last


@pytest.mark.parametrize("restart_after", range(1, 7))
def test_a_restarted_run_records_the_transitions_a_continuous_run_would(tmp_path, restart_after):
    """Seeded from the job's last recorded checkpoint, the second run neither repeats the
    status the first left nor forgets a lag rule that held the job in backlog."""
    batches = burst_batches()
    continuous, _ = run_batches(tmp_path, "continuous", batches)
    before, last = run_batches(tmp_path, "first", batches[:restart_after])
    after, _ = run_batches(
        tmp_path, "second", batches[restart_after:], Seed.from_sources_json(last["sources"])
    )
    assert before + after == continuous
    assert [change[1] for change in continuous] == [True, False, True, False]


def test_a_seed_from_another_query_names_only_what_changed(make_parts, tmp_path):
    seed = Seed(backlog_sources=frozenset({"orders"}))
    config = BacklogConfig.from_spark_conf(CONF)
    with MetricsWriter(f"sqlite:///{tmp_path}/m.db") as writer:
        coordinator = BacklogCoordinator(
            config, SourceGatedApplier(PlanChannel(tmp_path), config), writer, seed=seed
        )
        assert coordinator.job_is_backlog is True
        coordinator.on_progress(BatchProgress.from_json(recorded("hybrid_live")))
        assert writer.flush()
        engine = make_engine(f"sqlite:///{tmp_path}/m.db")
        assert [r["reason"] for r in rows(engine, backlog_transitions)] == [
            "reported: orders is live"
        ]


def live_batch_at(batch_id: int, started_s: float, oldest_event_s: float) -> BatchProgress:
    """The recorded live batch, started ``started_s`` after its own start, its oldest event
    ``oldest_event_s`` before that; it takes 1.192 s."""
    live = BatchProgress.from_json(recorded("hybrid_live"))
    started_at = live.started_at + timedelta(seconds=started_s)
    oldest_ms = round((started_at.timestamp() - oldest_event_s) * 1000)
    return dataclasses.replace(
        live,
        batch_id=batch_id,
        started_at=started_at,
        observed_metrics={"event_time": {"min_ms": oldest_ms}},
    )


def test_a_freshness_target_chooses_the_live_interval_and_records_each_change(make_parts):
    target = {"spark.backlog.checkpointing.freshness-target": "5s"}
    coordinator, _, writer, engine, clock = make_parts(CONF | target)
    for n in range(5):  # every batch 2.5 s after the last; its oldest row 2.7 s old at start
        batch = live_batch_at(n, 2.5 * n, 2.7)
        clock.now = batch.committed_at.timestamp()
        coordinator.on_progress(batch)
    coordinator.reconfigure(
        BacklogConfig.from_spark_conf(
            CONF | target | {"spark.backlog.checkpointing.freshness-target": "3s"}
        )
    )
    assert writer.flush()

    changes = rows(engine, backlog_interval_changes)
    assert [(c["run_id"], c["interval_ms"]) for c in changes] == [
        ("run-1", 2000),  # half the target, at most the interval (2 s)
        ("run-1", 1053),  # 3.89 s old at 2 s: 0.89 s shorter, and 5% headroom
    ]
    assert [c["reason"] for c in changes] == [
        "freshness target 5s: 2.00s until 3 live batches are measured",
        "freshness target 3s: 1.05s keeps p95 freshness at 2.94s over the last 4 live batches",
    ]
    assert as_utc(changes[1]["at"]) == datetime.fromtimestamp(clock.now, UTC)
    # the checkpoints say the interval each was followed by
    intervals = [c["effective_interval_ms"] for c in rows(engine, backlog_checkpoints)]
    assert intervals == [2000] * 5


def test_with_room_under_the_target_the_interval_grows_and_each_step_is_recorded(make_parts):
    wide = {
        "spark.backlog.checkpointing.interval": "1min",
        "spark.backlog.checkpointing.interval-during-backlog": "1min",
        "spark.backlog.checkpointing.freshness-target": "10s",
    }
    coordinator, _, writer, engine, clock = make_parts(CONF | wide)
    started = 0.0
    for n in range(8):
        interval = coordinator.decider.decision.interval_s
        started += interval
        batch = live_batch_at(n, started, interval + 0.5)  # its rows waited one interval
        clock.now = batch.committed_at.timestamp()
        coordinator.on_progress(batch)
    assert writer.flush()
    changes = rows(engine, backlog_interval_changes)
    # 6.69 s old at 5 s; each second more adds 1.24 s (its rows' share of 1.19 s a batch):
    # 7.67 s would reach 10 s, and the interval aims 5% below
    assert [c["interval_ms"] for c in changes] == [5000, 7288]
    assert changes[1]["reason"] == (
        "freshness target 10s: 7.29s keeps p95 freshness at 9.52s over the last 3 live batches"
    )
