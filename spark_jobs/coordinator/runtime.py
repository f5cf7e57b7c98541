"""Wiring a streaming query to its coordinator: the one object a backlog-aware job needs.

runtime = BacklogRuntime(spark)                    # reads and validates spark.backlog.*
runtime.hold_lease("s3a://bucket/checkpoints/events")   # before any query starts
events = (spark.readStream.format("hybrid").schema(schema)
          .options(**runtime.source_options()).option("sources", ...).load())
query = runtime.start_gated(result.writeStream.format("parquet")...)
runtime.await_termination()
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from sqlalchemy.exc import SQLAlchemyError

from spark_jobs.backlog.config import METRICS_URL, BacklogConfig, ConfigError
from spark_jobs.backlog.graph import OperatorGraph
from spark_jobs.backlog.values import format_duration, processing_time
from spark_jobs.coordinator import recovery
from spark_jobs.coordinator.appliers import (
    RecordOnlyApplier,
    RestartApplier,
    RestartProbe,
    SourceGatedApplier,
    TriggerSettings,
)
from spark_jobs.coordinator.control import ControlPoller
from spark_jobs.coordinator.coordinator import (
    BacklogCoordinator,
    DecisionApplier,
    Seed,
    StatusProbe,
)
from spark_jobs.coordinator.listener import ProgressListener
from spark_jobs.coordinator.plan_graph import SharedSourceName, operator_graph
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.coordinator.spark_logging import quiet_trigger_warnings
from spark_jobs.metrics import history
from spark_jobs.metrics.journal import MetricsJournal
from spark_jobs.metrics.lease import LeaseKeeper, LeaseLost, LeaseStore
from spark_jobs.metrics.schema import METRICS_PASSWORD_ENV, make_engine, with_password
from spark_jobs.metrics.writer import MetricsWriter, Retention
from spark_jobs.sources.backlog_kafka import BacklogKafkaDataSource
from spark_jobs.sources.gate import PlanChannel
from spark_jobs.sources.hybrid import HybridDataSource
from spark_jobs.sources.postgres_cdc import PostgresCdcDataSource
from spark_jobs.storage.files import normalize_location

logger = logging.getLogger(__name__)

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
#: Where, under the checkpoint location the lease is held on, metrics rows wait for the
#: database: durable storage the next run reads if this driver dies.
JOURNAL_DIRECTORY = "metrics-journal"
#: Logged when a run stops at its timeout rather than by itself (idle, done, failed).
STOPPED_AT_TIMEOUT = "the timeout has passed: stopping after a commit"


def with_metrics_password(conf: dict[str, str]) -> dict[str, str]:
    """Spark's conf with the metrics database's password, which only the environment holds
    (conf shows in Spark's UI and logs)."""
    if METRICS_URL in conf:
        conf[METRICS_URL] = with_password(conf[METRICS_URL], os.environ.get(METRICS_PASSWORD_ENV))
    return conf


def refuse_if_leased(conf: dict[str, str] | None, checkpoint_location: str) -> None:
    """Raise LeaseHeld, as ``hold_lease`` would, before a Spark session starts: the check
    needs only the database, and a refused launch should not start a JVM, its UI and its
    executors first. A standby (``wait-for-handover``) starts while the lease is held, so it
    is not checked. Conf out of sight (None), conf that names no metrics database (the
    default one would be created where the command runs) and a database that does not
    answer are left to ``hold_lease``."""
    if conf is None or METRICS_URL not in conf:
        return
    try:
        config = BacklogConfig.from_spark_conf(
            with_metrics_password(dict(conf)), conf.get("spark.app.name")
        )
    except ConfigError:
        return
    if config.lease_handover_wait_s is not None:
        return
    store = LeaseStore(config.metrics_url)
    try:
        ttl_s = config.lease_ttl_s
        location = normalize_location(checkpoint_location)
        store.check_free(config.job_name, location, ttl_s, wait_s=ttl_s * 1.2)
    except SQLAlchemyError:
        return
    finally:
        store.close()


class QueryStart(NamedTuple):
    """One start of a restart-based query: its settings and when (epoch seconds)."""

    settings: TriggerSettings
    at: float


def trigger_tick_s(config: BacklogConfig) -> float:
    """How often Spark asks gated sources whether a batch is due: fine enough for the cadence
    (a freshness target's chosen interval is at most the target)."""
    shortest = min(config.interval_s, config.freshness_target_s or config.interval_s)
    return min(max(shortest / 20, 0.05), 0.5)


def stop_gracefully(
    query: StreamingQuery, timeout_s: float = 60.0, hold: Callable[[], None] | None = None
) -> None:
    """Stop between batches if one ends within ``timeout_s``, else interrupt it.

    Back-to-back batches leave no gap to stop in; an interrupted batch is redone from
    the offset log after the restart, so exactly-once holds either way. ``hold`` keeps the
    gated sources from starting another batch first: a trigger that starts after the last
    look at the query would otherwise plan a batch for ``stop()`` to cut off.
    """
    if hold is not None:
        hold()
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
        conf = with_metrics_password(
            dict(spark.sparkContext.getConf().getAll()) | spark.conf.getAll
        )
        self._conf = conf
        self.config = config or BacklogConfig.from_spark_conf(conf, conf.get("spark.app.name"))
        self._clock = clock
        spark.dataSource.register(HybridDataSource)
        spark.dataSource.register(BacklogKafkaDataSource)
        spark.dataSource.register(PostgresCdcDataSource)
        self.recorder: MetricsWriter | None = None
        self._channel = PlanChannel(Path(tempfile.mkdtemp(prefix="backlog-channel-")))
        self._no_data_batches = conf.get(NO_DATA_BATCHES)
        self.coordinator: BacklogCoordinator | None = None
        self.query: StreamingQuery | None = None
        self._listener: ProgressListener | None = None
        self._control: ControlPoller | None = None
        self._lease: LeaseKeeper | None = None
        self._lease_lost: str | None = None
        self._previous_run_id: str | None = None
        self._seed: Seed | None = None
        self._first_batch: int | None = None
        self._stop = threading.Event()
        self._cadence_s = self.config.interval_s
        self._stops_when_fenced = False
        self._fenced_at = 0.0
        self.started_with: list[QueryStart] = []
        logger.info("backlog-aware checkpointing: %s", self.config.describe())

    # --- starting --------------------------------------------------------------------------

    def hold_lease(self, checkpoint_location: str) -> None:
        """Become the one live driver of this checkpoint location; required before a query
        starts. A lease left by a driver that died is taken over once it expires (within
        ``spark.backlog.lease.ttl``, by the database's clock); one still renewed raises
        LeaseHeld, as does a checkpoint of another job.

        While a renewal is overdue no batch starts (the gated sources read the fence; other
        modes stop the query), and a lease another run took over ends this run at once
        (``await_termination`` raises LeaseLost). Metrics rows are journaled under the
        checkpoint location; the job's last recorded status is where this run picks up.

        With ``spark.backlog.lease.wait-for-handover`` set, this run is a standby: it
        names itself on the live driver's lease row and takes the lease the moment that
        driver lets go, or raises LeaseHeld once that time has passed. Warm up first
        (``stands_by`` tells): whatever is done before this call shortens the gap.
        """
        if self._lease is not None:
            raise RuntimeError("this runtime already holds a lease")
        location = normalize_location(checkpoint_location)
        ttl_s = self.config.lease_ttl_s
        store = LeaseStore(self.config.metrics_url)
        handover_s = self.config.lease_handover_wait_s
        holder = (self.config.job_name, location, self.config.run_id, ttl_s)
        ui = self.spark.sparkContext.uiWebUrl
        try:
            if handover_s is None:
                acquired = store.acquire(*holder, spark_ui_url=ui, wait_s=ttl_s * 1.2)
            else:
                acquired = store.take_over(*holder, spark_ui_url=ui, wait_s=handover_s)
        except BaseException:
            store.close()
            raise
        logger.info("holding the lease of %s until %s", location, acquired.lease.expires_at)
        self._previous_run_id = acquired.previous_run_id
        self._lease = LeaseKeeper(
            store, acquired, ttl_s, self._channel.publish_fence, self._on_lease_lost
        )
        self._lease.start()
        retention = self.config.metrics_retention_s
        self.recorder = MetricsWriter(
            self.config.metrics_url,
            journal=MetricsJournal(f"{location}/{JOURNAL_DIRECTORY}"),
            retention=None if retention is None else Retention(self.config.job_name, retention),
        )
        # The previous run's journaled rows first: the seed and the recovery read them.
        if self.recorder.flush(timeout_s=max(30.0, ttl_s)):
            self._seed = self._read_seed()
        else:
            logger.warning(
                "metrics database unavailable: this run starts without the job's history"
            )

    @property
    def stands_by(self) -> bool:
        """This run waits for the live driver to hand the lease over (make-before-break)."""
        return self.config.lease_handover_wait_s is not None

    def _read_seed(self) -> Seed | None:
        engine = make_engine(self.config.metrics_url)
        try:
            with engine.connect() as connection:
                sources = history.last_sources(connection, self.config.job_name)
        finally:
            engine.dispose()
        return None if sources is None else Seed.from_sources_json(sources)

    def _on_lease_lost(self, message: str) -> None:
        """Another run holds the checkpoint now: end this one without another batch."""
        self._lease_lost = message
        self._stop.set()
        query = self.query
        if query is not None and query.isActive:
            query.stop()

    def source_options(self) -> dict[str, str]:
        """Options that put a hybrid source under this runtime's coordinator."""
        return {"backlogChannel": str(self._channel.directory)}

    def start_gated(self, writer: DataStreamWriter) -> StreamingQuery:
        """Start a query whose hybrid sources follow the coordinator, without restarts.
        Its operator graph, read from the query's plan, names its sources, so that the
        batch-row cap is shared between them from the first batch, and gives each
        transition every operator's status."""
        graph = _query_graph(writer)
        applier = SourceGatedApplier(self._channel, self.config, _gated_sources(graph))
        self._coordinate(applier, graph=graph).start()
        quiet_trigger_warnings(self.spark)
        return self._start(
            writer.trigger(processingTime=processing_time(trigger_tick_s(self.config)))
        )

    def start_static(self, writer: DataStreamWriter, trigger_s: float) -> StreamingQuery:
        """Start with a fixed trigger the coordinator only records: the hand-set baseline."""
        self._coordinate(RecordOnlyApplier()).start()
        self._cadence_s = trigger_s
        self._stops_when_fenced = True
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
        paused: TriggerSettings | None = None  # the query stopped while the lease was not confirmed
        while not self._stop.is_set():
            settings = applier.take_restart() or paused
            if self._fenced():
                if self.query is not None and self.query.isActive:
                    logger.warning("the lease is not confirmed: the query stops until it is")
                    self.query.stop()
                    settings = settings or self.started_with[-1].settings
                paused = settings
                time.sleep(0.1)
                continue
            paused = None
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
        if self.recorder is None:
            raise RuntimeError(
                "call hold_lease(checkpoint_location) before starting the query: a run must "
                "hold its checkpoint's lease, so that no other driver commits there"
            )
        self.coordinator = BacklogCoordinator(
            self.config,
            applier,
            self.recorder,
            clock=self._clock,
            probes=probes or (),
            graph=graph,
            seed=self._seed,
        )
        self._listener = ProgressListener(self.config.job_name, self._on_progress)
        self.spark.streams.addListener(self._listener)
        self._control = ControlPoller(
            self.config, self._conf, self.coordinator.reconfigure, self.stop
        )
        self._control.start()
        return self.coordinator

    def _on_progress(self, progress: BatchProgress) -> None:
        if self._first_batch is None:
            self._first_batch = progress.batch_id
            self._record_unrecorded_batches(progress.batch_id)
        assert self.coordinator is not None
        self.coordinator.on_progress(progress)

    def _record_unrecorded_batches(self, first_batch: int) -> None:
        """Rows for the batches before this run's first that a killed driver committed but
        did not record (see ``recovery``)."""
        query, recorder = self.query, self.recorder
        if query is None or recorder is None or first_batch == 0:
            return
        try:
            root = str(query._jsq.streamingQuery().resolvedCheckpointRoot())
            batches = recovery.committed_batches(root, before=first_batch)
            engine = make_engine(self.config.metrics_url)
            try:
                with engine.connect() as connection:
                    recorded = history.commit_times(
                        connection, self.config.job_name, (b.batch_id for b in batches)
                    )
            finally:
                engine.dispose()
        except Exception as error:  # the run goes on; the gap is reported
            logger.warning("could not check the previous run's last batches for rows: %s", error)
            return
        run_id = self._previous_run_id or self.config.run_id
        is_backlog = bool(self._seed and self._seed.backlog_sources)
        for batch in recovery.unrecorded(batches, recorded):
            logger.warning(
                "batch %s was committed at %s without its metrics row (its driver died): "
                "recording it from the checkpoint",
                batch.batch_id,
                batch.committed_at.isoformat(),
            )
            recorder.record_checkpoint(
                recovery.recovered_row(batch, self.config.job_name, run_id, is_backlog)
            )

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
        if self._lease_lost is not None:
            raise LeaseLost(self._lease_lost)
        if self._stops_when_fenced and self._fenced():
            query.stop()
            raise LeaseLost(
                f"run {self.config.run_id} could not confirm its lease in time; a query "
                "whose sources cannot pause stops rather than commit without it"
            )
        if query.awaitTermination(0.25):
            if self._lease_lost is not None:
                raise LeaseLost(self._lease_lost)
            if query.exception() is not None:
                raise query.exception()  # type: ignore[misc]
            return True
        if self._stop.is_set():
            stop_gracefully(query, hold=self._channel.hold)
            return True
        if deadline is not None and time.monotonic() >= deadline:
            logger.warning(STOPPED_AT_TIMEOUT)
            stop_gracefully(query, hold=self._channel.hold)
            return True
        if self._fenced():
            self._fenced_at = self._clock()
        if stop_when_idle_s is not None and self._idle_for(query, stop_when_idle_s):
            logger.info("live and idle for %.0f s: stopping after a commit", stop_when_idle_s)
            stop_gracefully(query, hold=self._channel.hold)
            return True
        return False

    def _fenced(self) -> bool:
        """The lease is not confirmed: no batch may start."""
        return self._lease is not None and not self._lease.confirmed()

    def _idle_for(self, query: StreamingQuery, seconds: float) -> bool:
        """Live, no batch running, and none for ``seconds`` beyond when the next one would
        have come."""
        if query.status["isTriggerActive"]:
            return False
        coordinator = self.coordinator
        # Unknown (no source reported yet, as after a restart with only a replayed batch)
        # counts as live: a source that never reported is not in backlog.
        if coordinator is None or coordinator.job_is_backlog:
            return False
        last = _last_commit(query)
        if last is None:
            return False
        # A pause while the lease was not confirmed is not idleness.
        quiet_since = max(last.timestamp(), self._fenced_at)
        return self._clock() - quiet_since >= self._cadence_s + seconds

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
        """Stop the query, deliver the remaining metrics, let go of the lease, remove the
        channel: each step runs even if one before it fails (an unreachable database must
        not keep the rows from the journal or the query from stopping)."""
        with ExitStack() as steps:  # run last-registered first
            steps.callback(shutil.rmtree, self._channel.directory, ignore_errors=True)
            if self._lease is not None:
                steps.callback(self._release_lease, self._lease)
            if self.recorder is not None:
                steps.callback(self.recorder.close)
            if self._listener is not None:
                steps.callback(self.spark.streams.removeListener, self._listener)
            if self._control is not None:
                steps.callback(self._control.close)
            steps.callback(self._drain_progress)
            if self.query is not None and self.query.isActive:
                steps.callback(stop_gracefully, self.query, hold=self._channel.hold)
        self._lease = self._listener = self._control = None

    def _release_lease(self, keeper: LeaseKeeper) -> None:
        if self._lease_lost is not None:
            keeper.stop()
            return
        try:
            keeper.release()
        except SQLAlchemyError as error:
            logger.warning(
                "could not release the lease of %s (%s): it expires by itself within %s",
                keeper.lease.checkpoint_location,
                " ".join(str(getattr(error, "orig", error)).split())[:300],
                format_duration(self.config.lease_ttl_s),
            )


def _query_graph(writer: DataStreamWriter) -> OperatorGraph | None:
    """The operator graph of the writer's DataFrame (pyspark's ``DataStreamWriter`` keeps it
    as ``_df``). A plan it cannot read costs the job its operator statuses and a first batch
    shared between its sources, not the job; sources sharing a name are the user's to fix."""
    try:
        return operator_graph(writer._df)
    except SharedSourceName:
        raise
    except Exception as error:
        logger.warning(
            "cannot read the query's operator graph (%s: %s): transitions record no "
            "operator statuses",
            type(error).__name__,
            error,
        )
        return None


def _gated_sources(graph: OperatorGraph | None) -> list[str]:
    """The sources of ``graph`` that follow the coordinator's plans (ours, named by their
    ``name`` option; other leaves are named by their operator)."""
    if graph is None:
        return []
    return [op.source for op in graph.operators if op.source and op.source != op.id]


def _last_commit(query: StreamingQuery) -> datetime | None:
    """When the query's last batch committed, from the query itself: the listener hears of
    a batch later, and a long batch just committed would look like a long quiet spell.
    Progress without ``addBatch`` reports an idle trigger, not a batch."""
    last = query.lastProgress
    recent = [last] if last is not None and "addBatch" in last["durationMs"] else []
    for progress in recent or reversed(query.recentProgress):
        if "addBatch" in progress["durationMs"]:
            return BatchProgress.from_json(progress.json).committed_at
    return None
