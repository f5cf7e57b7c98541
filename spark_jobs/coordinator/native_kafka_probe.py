"""The lag of Spark's native Kafka source (``format("kafka")``), read from its progress.

The source knows how many records it is behind the newest offsets, not whether that is
backlog: the coordinator's lag rules decide, so this probe reports lag and never backlog.
In restart-based mode its backlog batches are capped with ``maxOffsetsPerTrigger``.
"""

from __future__ import annotations

from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.backlog.status import SourceStatus
from spark_jobs.coordinator.progress import BatchProgress, KafkaLag, SourceProgress

#: How the description of Spark's native Kafka source starts: ``KafkaV2[Subscribe[events]]``.
KAFKA_V2 = "KafkaV2["


class NativeKafkaProbe:
    """The lag of one native Kafka source: at ``source_index`` in the progress, or else the
    first source Spark describes as ``KafkaV2[...]``."""

    def __init__(self, name: str, *, source_index: int | None = None):
        self.name = name
        self._source_index = source_index
        self._lag: KafkaLag | None = None

    def _source(self, progress: BatchProgress) -> SourceProgress | None:
        sources = progress.sources
        if self._source_index is not None:
            return sources[self._source_index] if self._source_index < len(sources) else None
        return next((s for s in sources if s.description.startswith(KAFKA_V2)), None)

    def observe(self, progress: BatchProgress) -> None:
        """Keep the newest lag; a batch that told none leaves the last one standing."""
        source = self._source(progress)
        lag = None if source is None else source.kafka_lag()
        if lag is not None:
            self._lag = lag

    def status(self) -> SourceStatus:
        """Lag only, none before the first batch: the coordinator's lag rules judge it."""
        lag: dict[str, float] = {}
        if self._lag is not None:
            lag[OFFSETS_BEHIND_LATEST] = self._lag.offsets_behind_latest
            lag["max_offsets_behind_latest"] = self._lag.max_offsets_behind_latest
        return SourceStatus(name=self.name, is_backlog=False, phase="kafka", lag=lag, rule=None)

    def limit_options(self, max_rows: int) -> dict[str, str]:
        """One offset is one record, so a batch of about ``max_rows`` rows is that many offsets."""
        return {"maxOffsetsPerTrigger": str(max_rows)}
