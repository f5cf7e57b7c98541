"""Streaming query progress, parsed from the JSON Spark hands its listeners.

Kept free of pyspark so recorded progress events can be replayed in fast tests.
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
        lag = latest.get("lag", {}) if latest.get("child") == end.get("child") else {}
        return SourceStatus(
            name=str(end["source"]),
            is_backlog=bool(end["backlog"]),
            finished=bool(end.get("finished", False)),
            phase=str(end.get("phase")),
            lag={k: v for k, v in lag.items() if isinstance(v, int | float)},
            rule="hybrid-phase",
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

    @property
    def committed_at(self) -> datetime:
        return self.started_at + timedelta(milliseconds=self.duration_ms)

    @classmethod
    def from_json(cls, text: str) -> BatchProgress:
        data = json.loads(text)
        watermark = parse_time(data.get("eventTime", {}).get("watermark"))
        started_at = parse_time(data["timestamp"])
        assert started_at is not None
        return cls(
            query_id=data["id"],
            run_id=data["runId"],
            name=data.get("name"),
            batch_id=int(data["batchId"]),
            started_at=started_at,
            duration_ms=int(data.get("durationMs", {}).get("triggerExecution", 0)),
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
        )
