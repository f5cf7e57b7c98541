"""Streaming query progress, parsed from the JSON Spark hands its listeners.

Kept free of pyspark so recorded progress events can be replayed in fast tests. Besides
what the coordinator decides on, it reads where a batch's time went and the state it
carries: the numbers a user tunes a checkpoint interval by.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from spark_jobs.backlog.status import SourceStatus

_NO_WATERMARK = datetime(1970, 1, 1, tzinfo=UTC)

#: A native Kafka partition: (topic, partition).
PartitionKey = tuple[str, int]


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _offset(value: Any) -> Any:
    """Offsets arrive as JSON objects, or as JSON text inside a string for some sources."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _partition_offsets(value: Any) -> dict[PartitionKey, int] | None:
    """A native Kafka offset, ``{"events": {"0": 1200}}`` (topic, partition, next offset),
    keyed by topic and partition; None for any other source's offset."""
    if not isinstance(value, dict) or not value:
        return None
    try:
        return {
            (topic, int(partition)): int(offset)
            for topic, partitions in value.items()
            for partition, offset in partitions.items()
        }
    except (AttributeError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class KafkaLag:
    """How far a native Kafka batch ended behind the newest offsets Spark had seen.

    One offset is one record, so these count records still to read. ``per_partition`` is
    empty when only the source's metrics told the lag.
    """

    offsets_behind_latest: int
    max_offsets_behind_latest: int
    per_partition: Mapping[PartitionKey, int]


@dataclass(frozen=True)
class SourceProgress:
    description: str
    start_offset: Any
    end_offset: Any
    latest_offset: Any
    num_input_rows: int
    metrics: Mapping[str, str] = field(default_factory=dict)

    def hybrid_status(self) -> SourceStatus | None:
        """The status a hybrid source carries in its end offset, if this is one."""
        end = self.end_offset
        if not isinstance(end, dict) or "backlog" not in end or "source" not in end:
            return None
        latest = self.latest_offset if isinstance(self.latest_offset, dict) else {}
        same_child = latest.get("child") == end.get("child")
        lag = latest.get("lag", {}) if same_child else {}
        health = latest.get("health", {}) if same_child else {}
        return SourceStatus(
            name=str(end["source"]),
            is_backlog=bool(end["backlog"]),
            finished=bool(end.get("finished", False)),
            phase=str(end.get("phase")),
            lag={k: v for k, v in lag.items() if isinstance(v, int | float)},
            rule="hybrid-phase",
            health={str(k): str(v) for k, v in health.items()},
        )

    def kafka_lag(self) -> KafkaLag | None:
        """The lag, if this is a native Kafka source that reported one.

        From ``latestOffset - endOffset`` per partition (what Spark's own metrics are
        computed from); without latest offsets, from the metrics: the average times the
        partitions read.
        """
        end = _partition_offsets(self.end_offset)
        if end is None:
            return None
        latest = _partition_offsets(self.latest_offset) or {}
        behind = {tp: latest[tp] - offset for tp, offset in end.items() if tp in latest}
        reported_max = self.metrics.get("maxOffsetsBehindLatest")
        if behind:
            total = sum(behind.values())
            largest = max(behind.values()) if reported_max is None else int(reported_max)
        else:
            average = self.metrics.get("avgOffsetsBehindLatest")
            if average is None or reported_max is None:
                return None
            total, largest = round(float(average) * len(end)), int(reported_max)
        return KafkaLag(total, largest, behind)


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class BatchCost:
    """Where a batch's time went, Spark's ``durationMs`` parts (None: Spark did not time it).

    ``add_batch_ms`` is the data work (read, process, update state, write to the sink);
    the rest is the checkpoint's fixed cost: finding the sources' latest offsets, getting
    and planning the batch, writing the offset log before it and the commit log after it.
    Their sum falls short of the batch's duration by Spark's own bookkeeping between them.
    """

    latest_offset_ms: int | None
    get_batch_ms: int | None
    query_planning_ms: int | None
    add_batch_ms: int | None
    wal_commit_ms: int | None
    commit_offsets_ms: int | None

    @classmethod
    def from_duration_ms(cls, parts: Mapping[str, Any]) -> BatchCost:
        return cls(
            latest_offset_ms=_count(parts.get("latestOffset")),
            get_batch_ms=_count(parts.get("getBatch")),
            query_planning_ms=_count(parts.get("queryPlanning")),
            add_batch_ms=_count(parts.get("addBatch")),
            wal_commit_ms=_count(parts.get("walCommit")),
            commit_offsets_ms=_count(parts.get("commitOffsets")),
        )


#: The state's size on disk, as each state store provider reports it: RocksDB's SST files,
#: the HDFS-backed provider's current version.
_DISK_BYTES_METRICS = ("rocksdbSstFileSize", "stateOnCurrentVersionSizeBytes")
_ROCKSDB_COMMIT = "rocksdbCommit"


@dataclass(frozen=True)
class StateOperatorProgress:
    """One stateful operator's state after the batch. Times and sizes are summed over its
    state store instances (one per shuffle partition), so a commit time can exceed the
    batch's wall time when partitions commit in parallel."""

    name: str
    rows_total: int
    rows_updated: int
    memory_bytes: int
    #: None: the state store reports no size on disk.
    disk_bytes: int | None
    commit_ms: int
    #: RocksDB's commit latencies by Spark's metric name (``rocksdbCommitFlushLatency``...);
    #: empty for any other state store.
    rocksdb_commit_ms: Mapping[str, int]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateOperatorProgress:
        custom = data.get("customMetrics") or {}
        disk = next((custom[name] for name in _DISK_BYTES_METRICS if name in custom), None)
        return cls(
            name=str(data.get("operatorName", "")),
            rows_total=int(data.get("numRowsTotal", 0)),
            rows_updated=int(data.get("numRowsUpdated", 0)),
            memory_bytes=int(data.get("memoryUsedBytes", 0)),
            disk_bytes=_count(disk),
            commit_ms=int(data.get("commitTimeMs", 0)),
            rocksdb_commit_ms={
                name: int(value)
                for name, value in sorted(custom.items())
                if name.startswith(_ROCKSDB_COMMIT)
            },
        )

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "rows_total": self.rows_total,
            "rows_updated": self.rows_updated,
            "memory_bytes": self.memory_bytes,
            "disk_bytes": self.disk_bytes,
            "commit_ms": self.commit_ms,
            "rocksdb_commit_ms": dict(self.rocksdb_commit_ms),
        }


def _sink_output_rows(sink: Mapping[str, Any]) -> int | None:
    """Rows the sink wrote; Spark reports -1 for a sink that does not count them (files)."""
    rows = _count(sink.get("numOutputRows"))
    return None if rows is None or rows < 0 else rows


#: The commit time a sink may report among its ``metrics`` (``ReportsSinkMetrics``), under
#: the name Spark gives a state store's; Spark's file and memory sinks report no metrics.
SINK_COMMIT_METRIC = "commitTimeMs"


def _sink_commit_ms(sink: Mapping[str, Any]) -> int | None:
    """A sink's metrics arrive as text: one that is no number leaves the time unknown
    rather than the batch unparsed."""
    value = (sink.get("metrics") or {}).get(SINK_COMMIT_METRIC)
    try:
        return None if value is None else round(float(value))
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class BatchProgress:
    """One committed micro-batch as a progress event describes it."""

    query_id: str
    run_id: str
    name: str | None
    batch_id: int
    started_at: datetime
    duration_ms: int
    num_input_rows: int
    watermark: datetime | None
    sources: tuple[SourceProgress, ...]
    observed_metrics: Mapping[str, Any]
    cost: BatchCost
    sink_output_rows: int | None
    sink_commit_ms: int | None
    state_operators: tuple[StateOperatorProgress, ...]

    @property
    def committed_at(self) -> datetime:
        return self.started_at + timedelta(milliseconds=self.duration_ms)

    @classmethod
    def from_json(cls, text: str) -> BatchProgress:
        data = json.loads(text)
        durations = data.get("durationMs", {})
        sink = data.get("sink") or {}
        watermark = parse_time(data.get("eventTime", {}).get("watermark"))
        started_at = parse_time(data["timestamp"])
        assert started_at is not None
        return cls(
            query_id=data["id"],
            run_id=data["runId"],
            name=data.get("name"),
            batch_id=int(data["batchId"]),
            started_at=started_at,
            duration_ms=int(durations.get("triggerExecution", 0)),
            num_input_rows=int(data.get("numInputRows", 0)),
            watermark=None if watermark == _NO_WATERMARK else watermark,
            sources=tuple(
                SourceProgress(
                    description=s.get("description", ""),
                    start_offset=_offset(s.get("startOffset")),
                    end_offset=_offset(s.get("endOffset")),
                    latest_offset=_offset(s.get("latestOffset")),
                    num_input_rows=int(s.get("numInputRows", 0)),
                    metrics=s.get("metrics") or {},
                )
                for s in data.get("sources", [])
            ),
            observed_metrics=data.get("observedMetrics") or {},
            cost=BatchCost.from_duration_ms(durations),
            sink_output_rows=_sink_output_rows(sink),
            sink_commit_ms=_sink_commit_ms(sink),
            state_operators=tuple(
                StateOperatorProgress.from_json(op) for op in data.get("stateOperators") or ()
            ),
        )
