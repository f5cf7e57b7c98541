"""Launching a phased job, and launching it again with the next phase's profile."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.configuration import conf as airflow_conf
from airflow.sdk.exceptions import AirflowException

from airflow_provider_backlog.hooks import driver_log
from airflow_provider_backlog.hooks.metrics import (
    CLAIMED_ANSWER_S,
    BacklogMetricsHook,
    LiveRun,
    RunStart,
)
from airflow_provider_backlog.hooks.submit import BacklogSubmitHook, DriverProcess
from airflow_provider_backlog.lineage.spark import openlineage_spark_conf
from airflow_provider_backlog.links.spark_ui import SPARK_UI_XCOM_KEY, SparkUILink
from airflow_provider_backlog.profiles import PhaseProfile
from spark_jobs.backlog.options import LEASE_WAIT_FOR_HANDOVER
from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.schema import STOP

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage


def new_run_id(context: Any) -> str:
    """Unique per launch, and telling which task and try launched it."""
    suffix = uuid.uuid4().hex[:8]
    ti = context.get("ti") if isinstance(context, dict) else None
    return f"{ti.task_id}.{ti.try_number}.{suffix}" if ti is not None else suffix


class BacklogLaunchOperator(BaseOperator):
    """Launches ``application`` (a backlog-aware job, e.g. ``spark_jobs/jobs/events_pipeline.py``)
    with spark-submit through the Spark provider's ``SparkSubmitHook`` and connection
    ``spark_conn_id``, in the phase ``profile`` (checkpoint intervals and resources).

    The run gets a new ``spark.backlog.run-id`` and the metrics database of
    ``metrics_conn_id``. A launch is refused while a driver of ``job_name`` holds its lease
    (the driver itself refuses a second one on its checkpoint too). The task waits for the
    run's first committed checkpoint; then it returns while the job runs on
    (``detach=True``: watch it with the sensors, end it with ``BacklogStopOperator``), or
    follows the driver's log until the job ends (``detach=False``). Killing the task ends
    the driver's whole process tree at once and releases its lease; Spark redoes an
    interrupted batch from its offset log, so nothing is lost or doubled. Returns the
    run's id, Spark UI and first checkpoint time.

    The driver's output goes to ``<driver_log_dir>/<run id>-<hash>.log`` (the run id made
    safe as a file name), rotated at ``driver_log_max_bytes`` with ``driver_log_backups``
    older files kept, so that a job running for days cannot fill the log folder.

    With ``apache-airflow-providers-openlineage`` installed, the task reports the job's
    inputs, outputs and checkpoint, read from ``application_args``, to Airflow's
    OpenLineage integration (docs/lineage.md).

    :param job_name: The job's name in its metrics, its lease and spark-submit's ``--name``:
        1-200 printable characters. (templated)
    :param application: The job's Python file, as spark-submit takes it. (templated)
    :param profile: The ``PhaseProfile`` to run in: checkpoint intervals, resources, Spark
        conf. Anything else raises TypeError.
    :param application_args: Arguments for the application, each passed as a string; none
        by default. (templated)
    :param spark_conn_id: The Spark connection: master, deploy mode, spark-submit binary;
        default ``spark_default``. It must exist.
    :param metrics_conn_id: The ``backlog_metrics`` connection whose database the job writes
        to and the task reads; default ``backlog_metrics_default``.
    :param detach: True (the default): return once the run has committed its first
        checkpoint and leave the job running (in cluster mode, spark-submit also returns
        once it has submitted it). False: follow the driver's log into the task's log until
        the job ends; the task fails if the job does not end with exit code 0.
    :param startup_timeout: How long the run may take to commit its first checkpoint
        (default 10 minutes); past it the driver is ended and the task fails.
    :param env_vars: Environment variables for spark-submit and the driver, over the
        worker's own, which it gets without Airflow's ``AIRFLOW__*``, ``AIRFLOW_CONN_*``,
        ``AIRFLOW_VAR_*`` and ``_AIRFLOW_*`` variables unless named here; none by default.
        (templated)
    :param driver_log_dir: The folder of the drivers' logs; default ``backlog-drivers`` in
        Airflow's ``[logging] base_log_folder``.
    :param driver_log_max_bytes: The size in bytes at which the driver's log is rotated: at
        least 1024; default 100 MiB.
    :param driver_log_backups: How many rotated files are kept: at least 1; default 5.
    :param poll_interval_s: Seconds between checks for the run's first checkpoint; default 2.
    :param openlineage_inject_parent_job_info: Pass the task's OpenLineage run to Spark's
        OpenLineage listener as its parent (``spark.openlineage.parent*``); default
        ``[openlineage] spark_inject_parent_job_info``, as for ``SparkSubmitOperator``.
    :param openlineage_inject_transport_info: Pass Airflow's OpenLineage HTTP transport to
        Spark's OpenLineage listener (``spark.openlineage.transport.*``), its credentials
        masked in the task's log; default ``[openlineage] spark_inject_transport_info``.
    """

    template_fields = ("job_name", "application", "application_args", "env_vars")
    operator_extra_links = (SparkUILink(),)
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        job_name: str,
        application: str,
        profile: PhaseProfile,
        application_args: list[str] | None = None,
        spark_conn_id: str = "spark_default",
        metrics_conn_id: str = BacklogMetricsHook.default_conn_name,
        detach: bool = True,
        startup_timeout: timedelta = timedelta(minutes=10),
        env_vars: dict[str, str] | None = None,
        driver_log_dir: str | None = None,
        driver_log_max_bytes: int = driver_log.MAX_BYTES,
        driver_log_backups: int = driver_log.BACKUPS,
        poll_interval_s: float = 2.0,
        openlineage_inject_parent_job_info: bool = airflow_conf.getboolean(
            "openlineage", "spark_inject_parent_job_info", fallback=False
        ),
        openlineage_inject_transport_info: bool = airflow_conf.getboolean(
            "openlineage", "spark_inject_transport_info", fallback=False
        ),
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if not isinstance(profile, PhaseProfile):
            raise TypeError(f"profile must be a PhaseProfile, got {profile!r}")
        if driver_log_max_bytes < 1024 or driver_log_backups < 1:
            raise ValueError(
                f"driver_log_max_bytes = {driver_log_max_bytes!r} must be at least 1024 and "
                f"driver_log_backups = {driver_log_backups!r} at least 1"
            )
        self.job_name = job_name
        self.application = application
        self.profile = profile
        self.application_args = application_args or []
        self.spark_conn_id = spark_conn_id
        self.metrics_conn_id = metrics_conn_id
        self.detach = detach
        self.startup_timeout = startup_timeout
        self.env_vars = env_vars
        self.driver_log_dir = driver_log_dir
        self.driver_log_max_bytes = driver_log_max_bytes
        self.driver_log_backups = driver_log_backups
        self.poll_interval_s = poll_interval_s
        self.openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        self.openlineage_inject_transport_info = openlineage_inject_transport_info
        self._driver: DriverProcess | None = None
        self._submit: BacklogSubmitHook | None = None
        self._cluster_kill: subprocess.Popen[bytes] | None = None
        self._run_id: str | None = None
        self._driver_ended = False
        # Set by on_kill, which Airflow calls from a signal handler that does not raise:
        # execute checks it wherever it waits, so a killed task neither goes on nor succeeds.
        self._killed = threading.Event()

    @cached_property
    def metrics(self) -> BacklogMetricsHook:
        return BacklogMetricsHook(self.metrics_conn_id)

    def execute(self, context: Any) -> dict[str, Any]:
        running = self.metrics.live_run(self.job_name)
        if running is not None:
            raise AirflowException(
                f"job {self.job_name!r} is already running: {running.describe()}. Stop it "
                "first (BacklogStopOperator) or relaunch it (BacklogRelaunchOperator)"
            )
        return self._launch(context)

    def _launch(self, context: Any) -> dict[str, Any]:
        run_id, driver = self._start_driver(context)
        try:
            return self._watch(context, run_id, driver)
        except BaseException:
            # Whatever went wrong here (the metrics database, a kill, a timeout), the
            # driver must not run on unwatched, holding its lease.
            self._end_driver()
            raise

    def _start_driver(
        self, context: Any, extra_conf: dict[str, str] | None = None
    ) -> tuple[str, DriverProcess]:
        """spark-submit a new run of the job; its id and its driver."""
        run_id = new_run_id(context)
        lineage_conf = openlineage_spark_conf(
            context,
            {**self.profile.conf, **(extra_conf or {})},
            parent_job=self.openlineage_inject_parent_job_info,
            transport=self.openlineage_inject_transport_info,
        )
        submit = BacklogSubmitHook(
            job_name=self.job_name,
            run_id=run_id,
            profile=self.profile,
            metrics_url=self.metrics.get_uri(),
            conn_id=self.spark_conn_id,
            application_args=[str(arg) for arg in self.application_args],
            env_vars=self.env_vars,
            detach=self.detach,
            extra_conf={**(extra_conf or {}), **lineage_conf},
        )
        self._raise_if_killed("before launching")
        self.log.info(
            "launching run %s of job %s: %s", run_id, self.job_name, self.profile.describe()
        )
        self._run_id, self._submit = run_id, submit
        self._driver = driver = submit.start(
            self.application,
            self._log_dir() / driver_log.safe_file_name(run_id, ".log"),
            max_bytes=self.driver_log_max_bytes,
            backups=self.driver_log_backups,
        )
        return run_id, driver

    def _watch(self, context: Any, run_id: str, driver: DriverProcess) -> dict[str, Any]:
        """Wait for the run's first checkpoint, then return or follow it to its end."""
        start = self._await_start(run_id, driver)
        ti = context.get("ti") if isinstance(context, dict) else None
        if ti is not None and start.spark_ui_url:
            ti.xcom_push(key=SPARK_UI_XCOM_KEY, value=start.spark_ui_url)
        self.log.info(
            "run %s committed its first checkpoint at %s; Spark UI: %s",
            run_id,
            start.first_committed_at.isoformat(),
            start.spark_ui_url or "disabled",
        )
        result = {
            "job_name": self.job_name,
            "run_id": run_id,
            "spark_ui_url": start.spark_ui_url,
            "first_committed_at": start.first_committed_at.isoformat(),
            "profile": self.profile.describe(),
            "driver_log": str(driver.log_path),
        }
        if self.detach:
            self._raise_if_killed(f"while run {run_id} started")
            self.log.info("job %s runs on; driver log: %s", self.job_name, driver.log_path)
            return result
        for line in driver.follow():
            self.log.info("%s", line)
        self._raise_if_killed(f"while run {run_id} ran")
        if driver.exit_code != 0:
            raise AirflowException(
                f"run {run_id} of job {self.job_name!r} failed (exit code "
                f"{driver.exit_code}):\n{driver.log_tail()}"
            )
        return result

    def _await_start(self, run_id: str, driver: DriverProcess) -> RunStart:
        """Wait for the run's first committed checkpoint; fail if the driver ends first or
        does not get there within ``startup_timeout`` (it is ended then)."""
        deadline = time.monotonic() + self.startup_timeout.total_seconds()
        metrics = self.metrics
        while True:
            start = metrics.run_start(self.job_name, run_id)
            # After the read: on_kill may have ended the run while it found the checkpoint.
            self._raise_if_killed(f"while run {run_id} started")
            if start is not None:
                return start
            if driver.failed:
                raise AirflowException(
                    f"run {run_id} of job {self.job_name!r} ended (exit code {driver.exit_code}) "
                    f"before its first checkpoint:\n{driver.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise AirflowException(
                    f"run {run_id} of job {self.job_name!r} committed no checkpoint within "
                    f"{self.startup_timeout}; it was ended:\n{driver.log_tail()}"
                )
            self._killed.wait(self.poll_interval_s)

    def get_openlineage_facets_on_start(self) -> OperatorLineage:
        """The job's inputs, outputs and checkpoint, for Airflow's OpenLineage integration."""
        from airflow_provider_backlog.lineage.facets import operator_lineage

        return operator_lineage([str(arg) for arg in self.application_args])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        """The same as at the start: a launch reads and writes what its arguments name."""
        return self.get_openlineage_facets_on_start()

    def _raise_if_killed(self, when: str) -> None:
        if self._killed.is_set():
            raise AirflowException(
                f"the task was killed {when}; the driver of job {self.job_name!r} was ended"
            )

    def _log_dir(self) -> Path:
        if self.driver_log_dir:
            return Path(self.driver_log_dir)
        return Path(airflow_conf.get("logging", "base_log_folder"), "backlog-drivers")

    def on_kill(self) -> None:
        """End the driver this task started, and stop this task from going on."""
        self._killed.set()
        self._end_driver()

    def _end_driver(self) -> None:
        """End the driver and release its lease, so that a retry can take over at once
        instead of waiting for the lease to expire. In cluster mode the cluster is asked
        to kill the application and the lease is left to expire: the driver may run on
        for a while (a pod's grace period, YARN's container shutdown), and a second one
        must not start meanwhile."""
        driver, run_id, submit = self._driver, self._run_id, self._submit
        if driver is None or run_id is None or self._driver_ended:
            return
        # Once: on_kill and the failed launch it causes both end the driver.
        self._driver_ended = True
        driver.end()
        self.log.info("spark-submit of run %s ended (exit code %s)", run_id, driver.exit_code)
        if submit is not None and submit.cluster_mode:
            self._kill_in_cluster(submit, driver, run_id)
            return
        try:
            # A hook of its own: on_kill runs in a signal handler, which may have interrupted
            # the task's hook in the middle of its connection pool.
            released = BacklogMetricsHook(self.metrics_conn_id).release(self.job_name, run_id)
        except Exception as error:  # the database may be what failed the launch
            self.log.warning(
                "run %s: its lease was not released (%s); it expires within its time to live",
                run_id,
                redact_text(str(error)),
            )
            return
        if released:
            self.log.info("released the lease of run %s", run_id)

    def _kill_in_cluster(
        self, submit: BacklogSubmitHook, driver: DriverProcess, run_id: str
    ) -> None:
        try:
            self._cluster_kill = submit.start_cluster_kill(driver.log_path)
        except OSError as error:
            self.log.warning("run %s: the cluster's kill command failed: %s", run_id, error)
            return
        if self._cluster_kill is None:
            self.log.warning(
                "run %s: spark-submit's log names no application to kill; stop it in the "
                "cluster, its lease expires once its driver is gone",
                run_id,
            )
            return
        self.log.info(
            "run %s: asked the cluster to kill it (output in %s); its lease expires once "
            "its driver is gone",
            run_id,
            driver.log_path,
        )


class BacklogRelaunchOperator(BacklogLaunchOperator):
    """Relaunches ``job_name`` with the next phase's ``profile``, from the same checkpoint
    (the same ``application_args``). Without a running run it just launches. It takes every
    argument of ``BacklogLaunchOperator`` too.

    Make-before-break (the default): the next run starts first, warms up and stands by
    (``spark.backlog.lease.wait-for-handover``) while the running one serves on; once it
    stands by, the running run is asked to stop after a commit, and the next one takes the
    lease the moment it is let go. If the next run fails or does not stand by within
    ``startup_timeout``, it is ended and the running run was never asked to stop. With
    ``make_before_break=False``: stop the running run, wait until its driver has ended,
    then launch.

    :param answer_timeout: How long a run of the job has to take the stop request (default
        2 minutes); if none does, the request is withdrawn and the task fails.
    :param stop_timeout: How long its driver may take, once it has agreed to stop, to end and
        let go of its lease (default 5 minutes); past it the task fails (the standby gives
        up too, or nothing is launched).
    :param make_before_break: Start the next run before stopping the running one (True,
        the default), or after it has ended.
    """

    def __init__(
        self,
        *,
        answer_timeout: timedelta = timedelta(minutes=2),
        stop_timeout: timedelta = timedelta(minutes=5),
        make_before_break: bool = True,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.answer_timeout = answer_timeout
        self.stop_timeout = stop_timeout
        self.make_before_break = make_before_break

    def execute(self, context: Any) -> dict[str, Any]:
        running = self.metrics.live_run(self.job_name)
        if running is None:
            self.log.info("no run of job %s is running: launching it", self.job_name)
            return {**self._launch(context), "stopped_run_id": None}
        if self.make_before_break:
            return {**self._hand_over(context, running), "stopped_run_id": running.run_id}
        self.log.info("stopping %s", running.describe())
        answer = self.metrics.stop(
            self.job_name,
            answer_timeout_s=self.answer_timeout.total_seconds(),
            stop_timeout_s=self.stop_timeout.total_seconds(),
            poll_s=min(self.poll_interval_s, 1.0),
        )
        self.log.info("job %s: %s", self.job_name, answer)
        return {**self._launch(context), "stopped_run_id": running.run_id}

    def handover_wait(self) -> timedelta:
        """How long the standby waits for the lease once it has warmed up: as long as this
        task waits for the running run to take the stop request, answer and end."""
        return self.answer_timeout + self.stop_timeout + timedelta(seconds=CLAIMED_ANSWER_S)

    def _hand_over(self, context: Any, running: LiveRun) -> dict[str, Any]:
        wait = f"{self.handover_wait().total_seconds():g}s"
        run_id, driver = self._start_driver(context, {LEASE_WAIT_FOR_HANDOVER.key: wait})
        try:
            if self._await_standby(run_id, driver, running):
                self.log.info("run %s stands by: stopping %s", run_id, running.describe())
                answer = self.metrics.ask(
                    self.job_name,
                    STOP,
                    timeout_s=self.answer_timeout.total_seconds(),
                    poll_s=min(self.poll_interval_s, 0.5),
                    run_id=running.run_id,
                )
                self.log.info("job %s: %s", self.job_name, answer)
            return self._watch(context, run_id, driver)
        except BaseException:
            self._end_driver()
            raise

    def _await_standby(self, run_id: str, driver: DriverProcess, running: LiveRun) -> bool:
        """Wait until the new run stands by; False if it already holds the lease (the
        running one ended meanwhile). Raises, with the running run left alone, if the new
        one ends first or does not get there within ``startup_timeout``."""
        deadline = time.monotonic() + self.startup_timeout.total_seconds()
        metrics = self.metrics
        while True:
            self._raise_if_killed(f"while run {run_id} warmed up")
            if metrics.standing_by(self.job_name, run_id):
                return True
            live = metrics.live_run(self.job_name)
            if live is not None and live.run_id == run_id:
                return False
            if driver.failed:
                raise AirflowException(
                    f"run {run_id} of job {self.job_name!r} ended (exit code {driver.exit_code}) "
                    f"before it stood by; run {running.run_id} was not stopped and serves on:\n"
                    f"{driver.log_tail()}"
                )
            if time.monotonic() >= deadline:
                raise AirflowException(
                    f"run {run_id} of job {self.job_name!r} did not stand by within "
                    f"{self.startup_timeout}; it was ended, and run {running.run_id} was not "
                    f"stopped and serves on:\n{driver.log_tail()}"
                )
            self._killed.wait(min(self.poll_interval_s, 0.5))
