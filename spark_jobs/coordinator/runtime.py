"""Wiring a streaming query to its coordinator: the one object a backlog-aware job needs.

runtime = BacklogRuntime(spark)                    # reads and validates spark.backlog.*
events = (spark.readStream.format("hybrid").schema(schema)
          .options(**runtime.source_options()).option("sources", ...).load())
query = runtime.start_gated(result.writeStream.format("parquet")...)
runtime.await_termination()
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from spark_jobs.backlog.config import METRICS_URL, BacklogConfig
from spark_jobs.backlog.graph import OperatorGraph
from spark_jobs.backlog.values import processing_time
from spark_jobs.coordinator.appliers import (
    RecordOnlyApplier,
    RestartApplier,
    RestartProbe,
    SourceGatedApplier,
    TriggerSettings,
)
from spark_jobs.coordinator.control import ControlPoller
from spark_jobs.coordinator.coordinator import BacklogCoordinator, DecisionApplier, StatusProbe
from spark_jobs.coordinator.listener import ProgressListener
from spark_jobs.metrics.lease import LeaseKeeper, LeaseStore
from spark_jobs.metrics.schema import METRICS_PASSWORD_ENV, with_password
from spark_jobs.metrics.writer import MetricsWriter, Retention
from spark_jobs.sources.gate import PlanChannel
from spark_jobs.sources.hybrid import HybridDataSource
from spark_jobs.sources.kafka_source import BacklogKafkaDataSource

logger = logging.getLogger(__name__)

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


class QueryStart(NamedTuple):
    """One start of a restart-based query: its settings and when (epoch seconds)."""

    settings: TriggerSettings
    at: float


def trigger_tick_s(config: BacklogConfig) -> float:
    """How often Spark asks gated sources whether a batch is due: fine enough for the cadence."""
    return min(max(config.interval_s / 20, 0.05), 0.5)


def stop_gracefully(query: StreamingQuery, timeout_s: float = 60.0) -> None:
    """Stop between batches if one ends within ``timeout_s``, else interrupt it.

    Back-to-back batches leave no gap to stop in; an interrupted batch is redone from
    the offset log after the restart, so exactly-once holds either way.
    """
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)
    query.stop()


class BacklogRuntime:
    """Reads the configuration, registers the sources, and runs one query under a coordinator."""

    def __init__(
        self,
        spark: SparkSession,
        config: BacklogConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ):
        self.spark = spark
        # spark-submit --conf lands in the context; builder.config and spark.conf.set on a
        # running session only in the session's conf, which wins.
        conf = dict(spark.sparkContext.getConf().getAll()) | spark.conf.getAll
        if METRICS_URL in conf:
            conf[METRICS_URL] = with_password(
                conf[METRICS_URL], os.environ.get(METRICS_PASSWORD_ENV)
            )
        self._conf = conf
        self.config = config or BacklogConfig.from_spark_conf(conf, conf.get("spark.app.name"))
        self._clock = clock
        spark.dataSource.register(HybridDataSource)
        spark.dataSource.register(BacklogKafkaDataSource)
        # One spill file per job and database, so undelivered rows reach the right one.
        database = hashlib.sha256(self.config.metrics_url.encode()).hexdigest()[:12]
        spill_name = f"{self.config.job_name}-{database}.jsonl"
        spill = Path(tempfile.gettempdir(), "backlog-metrics-spill", spill_name)
        retention = self.config.metrics_retention_s
        self.recorder = MetricsWriter(
            self.config.metrics_url,
            spill_path=spill,
            retention=None if retention is None else Retention(self.config.job_name, retention),
        )
        self._channel_dir = Path(tempfile.mkdtemp(prefix=f"backlog-{self.config.job_name}-"))
        self._no_data_batches = conf.get(NO_DATA_BATCHES)
        self.coordinator: BacklogCoordinator | None = None
        self.query: StreamingQuery | None = None
        self._listener: ProgressListener | None = None
        self._control: ControlPoller | None = None
        self._lease: LeaseKeeper | None = None
        self._stop = threading.Event()
        self._cadence_s = self.config.interval_s
        self.started_with: list[QueryStart] = []
        logger.info("backlog-aware checkpointing: %s", self.config.describe())

    # --- starting --------------------------------------------------------------------------

    def hold_lease(self, checkpoint_location: str) -> None:
        """Become the one live driver of this job and checkpoint location, before the query
        starts. A lease left by a driver that died is taken over once it expires (within
        ``spark.backlog.lease.ttl``); one still renewed raises LeaseHeld. The run stops if
        the lease is lost (another driver took over after this one failed to renew)."""
        ttl_s = self.config.lease_ttl_s
        store = LeaseStore(self.config.metrics_url)
        lease = store.acquire(
            self.config.job_name,
            checkpoint_location,
            self.config.run_id,
            ttl_s,
            spark_ui_url=self.spark.sparkContext.uiWebUrl,
            wait_s=ttl_s * 1.2,
        )
        logger.info("holding the lease of %s until %s", checkpoint_location, lease.expires_at)
        self._lease = LeaseKeeper(store, lease, self.stop, ttl_s)
        self._lease.start()

    def source_options(self) -> dict[str, str]:
        """Options that put a hybrid source under this runtime's coordinator."""
        return {"backlogChannel": str(self._channel_dir)}

    def start_gated(
        self, writer: DataStreamWriter, graph: OperatorGraph | None = None
    ) -> StreamingQuery:
        """Start a query whose hybrid sources follow the coordinator, without restarts."""
        applier = SourceGatedApplier(PlanChannel(self._channel_dir), self.config)
        self._coordinate(applier, graph=graph).start()
        return self._start(
            writer.trigger(processingTime=processing_time(trigger_tick_s(self.config)))
        )

    def start_static(self, writer: DataStreamWriter, trigger_s: float) -> StreamingQuery:
        """Start with a fixed trigger the coordinator only records: the hand-set baseline."""
        self._coordinate(RecordOnlyApplier()).start()
        self._cadence_s = trigger_s
        return self._start(writer.trigger(processingTime=processing_time(trigger_s)))

    def run_restart_based(
        self,
        build: Callable[[TriggerSettings], DataStreamWriter],
        probe: RestartProbe,
        *,
        stop_when_idle_s: float | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Run a query on Spark's own sources, restarting it when the decision changes.

        ``build`` gets the trigger settings (use ``settings.source_options`` on the reader);
        the runtime sets the trigger and the query name and starts it.
        """
        applier = RestartApplier(self.config, probe)
        self._coordinate(applier, probes=[probe]).start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            settings = applier.take_restart()
            if settings is not None:
                if self.query is not None:
                    # Back to back there is no gap between batches to wait for.
                    running = self.started_with[-1].settings
                    stop_gracefully(self.query, timeout_s=running.processing_time_s)
                logger.info("starting query with %s", settings)
                self._start(build(settings).trigger(**settings.trigger))
                self.started_with.append(QueryStart(settings, self._clock()))
                self._cadence_s = settings.processing_time_s
            if self._wait_step(stop_when_idle_s, deadline):
                break

    def _coordinate(
        self,
        applier: DecisionApplier,
        *,
        probes: list[StatusProbe] | None = None,
        graph: OperatorGraph | None = None,
    ) -> BacklogCoordinator:
        if self.coordinator is not None:
            raise RuntimeError("a BacklogRuntime runs one query; create another for a second")
        self.coordinator = BacklogCoordinator(
            self.config, applier, self.recorder, clock=self._clock, probes=probes or (), graph=graph
        )
        self._listener = ProgressListener(self.config.job_name, self.coordinator.on_progress)
        self.spark.streams.addListener(self._listener)
        self._control = ControlPoller(
            self.config, self._conf, self.coordinator.reconfigure, self.stop
        )
        self._control.start()
        return self.coordinator

    def _start(self, writer: DataStreamWriter) -> StreamingQuery:
        """Start without no-data batches, unless the user asked for them: each would be one
        more checkpoint between the decided ones. The setting is this query's only."""
        if self._no_data_batches == "true":
            logger.warning(
                "%s=true: Spark adds a checkpoint after data batches to advance watermarks",
                NO_DATA_BATCHES,
            )
        if self._no_data_batches is not None:
            self.query = writer.queryName(self.config.job_name).start()
            return self.query
        self.spark.conf.set(NO_DATA_BATCHES, "false")
        try:
            self.query = writer.queryName(self.config.job_name).start()
        finally:
            self.spark.conf.unset(NO_DATA_BATCHES)
        return self.query

    # --- running and stopping --------------------------------------------------------------

    def await_termination(
        self, *, stop_when_idle_s: float | None = None, timeout_s: float | None = None
    ) -> None:
        """Block until the query ends, or stop it gracefully once live and idle, or at timeout.

        Raises the query's exception if it failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._wait_step(stop_when_idle_s, deadline):
            pass

    def _wait_step(self, stop_when_idle_s: float | None, deadline: float | None) -> bool:
        """One short wait; True when the run is over."""
        query = self.query
        if query is None:
            time.sleep(0.1)
            return self._stop.is_set()
        if query.awaitTermination(0.25):
            if query.exception() is not None:
                raise query.exception()  # type: ignore[misc]
            return True
        if self._stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            stop_gracefully(query)
            return True
        if stop_when_idle_s is not None and self._idle_for(query, stop_when_idle_s):
            logger.info("live and idle for %.0f s: stopping after a commit", stop_when_idle_s)
            stop_gracefully(query)
            return True
        return False

    def _idle_for(self, query: StreamingQuery, seconds: float) -> bool:
        """Live, no batch running, and none for ``seconds`` beyond when the next one would
        have come. (Progress reaches the coordinator late: a long batch can be running.)"""
        if query.status["isTriggerActive"]:
            return False
        coordinator = self.coordinator
        # Unknown (no source reported yet, as after a restart with only a replayed batch)
        # counts as live: a source that never reported is not in backlog.
        if coordinator is None or coordinator.job_is_backlog:
            return False
        last = coordinator.last_progress
        if last is None:
            return False
        return self._clock() - last.committed_at.timestamp() >= self._cadence_s + seconds

    def _drain_progress(self, timeout_s: float = 10.0) -> None:
        """Listener events arrive asynchronously: wait for the last committed batch's.

        An idle query also reports progress, with the next batch's id and no ``addBatch``
        time; that one goes to ``onQueryIdle``, never to the coordinator.
        """
        last = self.query.lastProgress if self.query is not None else None
        if last is None or self.coordinator is None or "addBatch" not in last["durationMs"]:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seen = self.coordinator.last_progress
            if seen is not None and seen.batch_id >= last["batchId"]:
                return
            time.sleep(0.05)
        logger.warning("the progress of batch %s did not reach the coordinator", last["batchId"])

    def stop(self) -> None:
        """Ask the run to end after the current batch commits."""
        self._stop.set()

    def close(self) -> None:
        """Stop listening, deliver the remaining metrics, remove the channel."""
        if self.query is not None and self.query.isActive:
            stop_gracefully(self.query)
        self._drain_progress()
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None
        self.recorder.close()
        shutil.rmtree(self._channel_dir, ignore_errors=True)
