"""Launching a phased job with spark-submit, through the Spark provider's ``SparkSubmitHook``.

The Spark connection says where the job runs (master, deploy mode, spark-submit binary); a
``PhaseProfile`` says how: its checkpoint intervals and its resources. spark-submit runs in
a process group of its own, led by a small process that writes its output to a file rotated
at a bounded size (``driver_log``). In client mode (local and standalone masters, or YARN
and Kubernetes when asked) the driver is that process group, and it must outlive
a task that returns after the first checkpoint; ending it ends its whole process tree (the
JVM, the Python driver, Python workers), so nothing of it survives. In cluster mode (YARN
and Kubernetes) the driver runs in the cluster: spark-submit returns once it has submitted
it, and ending it means asking the cluster to kill the application.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException
from sqlalchemy import make_url

from airflow_provider_backlog.hooks import driver_log
from airflow_provider_backlog.hooks.spark_submit_adapter import SparkSubmitAdapter
from airflow_provider_backlog.profiles import PhaseProfile
from spark_jobs.backlog.config import (
    BacklogConfig,
)
from spark_jobs.backlog.secrets import SPARK_REDACTION_REGEX
from spark_jobs.jobs.spark_home import with_compiled_home
from spark_jobs.jobs.worker_daemon import DAEMON_CONF
from spark_jobs.metrics.schema import METRICS_PASSWORD_ENV, split_password

logger = logging.getLogger(__name__)

#: How spark-submit names what it submitted: YARN's application id, Kubernetes' submission
#: id (``namespace:driver-pod``) or, in older releases, the driver pod alone.
_YARN_APPLICATION = re.compile(r"application_\d+_\d+")
_K8S_SUBMISSION = re.compile(r"submission ID (\S+:\S+-driver)")
_K8S_DRIVER_POD = re.compile(r"pod name: (\S+-driver)\s*$", re.MULTILINE)
#: Hosts a driver in the cluster cannot reach the metrics database at.
_LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")
#: This host's interpreters, which mean nothing to a driver in the cluster.
_LOCAL_PYTHON = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
#: Spark's log level in the drivers we launch, unless the profile or conf sets ``spark.log.level``.
DRIVER_LOG_LEVEL = "WARN"

#: The worker's variables the driver does not get: Airflow's configuration (its database
#: URL, Fernet key, JWT secret...), its connections and variables, and its internals.
_AIRFLOW_ONLY = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_", "_AIRFLOW_")
#: Where a driver in a Kubernetes cluster gets the metrics password from a secret.
K8S_PASSWORD_SECRET = f"spark.kubernetes.driver.secretKeyRef.{METRICS_PASSWORD_ENV}"


@dataclass
class DriverProcess:
    """A spark-submit started by ``BacklogSubmitHook.start``: the process that leads its
    process group (the log rotator, ending as spark-submit did) and its log.

    ``submits_only``: it submits a driver to the cluster and returns (cluster mode, not
    waiting for the application), so its ending with exit code 0 is no sign of the job's.

    :param process: The process that leads the process group: the ``driver_log`` rotator.
    :param log_path: The driver's log file; its rotated files are ``<log_path>.1`` and on.
    :param submits_only: As above; False by default.
    """

    process: subprocess.Popen[bytes]
    log_path: Path
    submits_only: bool = False

    @classmethod
    def start(
        cls,
        command: list[str],
        log_path: Path,
        *,
        env: Mapping[str, str],
        max_bytes: int = driver_log.MAX_BYTES,
        backups: int = driver_log.BACKUPS,
        submits_only: bool = False,
    ) -> DriverProcess:
        """Start ``command`` in a new session, its output rotated into ``log_path`` by a
        ``driver_log`` process that leads the session: ending the group ends both, and in
        detached mode both outlive the task."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()  # followed and tailed at once, before the rotator opens it
        rotator = [
            sys.executable,
            "-m",
            driver_log.__name__,
            f"--max-bytes={max_bytes}",
            f"--backups={backups}",
            str(log_path),
            "--",
            *command,
        ]
        process = subprocess.Popen(
            rotator,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
        return cls(process, log_path, submits_only=submits_only)

    @property
    def failed(self) -> bool:
        """The driver has ended (or never started): spark-submit ended, and not just after
        submitting the driver to the cluster."""
        code = self.exit_code
        return code is not None and (code != 0 or not self.submits_only)

    @property
    def pid(self) -> int:
        """The process group's leader, whose id the group has."""
        return self.process.pid

    @property
    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.process.poll()

    def wait(self, timeout_s: float) -> int | None:
        """The exit code once it has ended within ``timeout_s``, else None."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 40) -> str:
        """The log's last lines, from before its last rotation too if need be."""
        return "\n".join(driver_log.tail(self.log_path, lines))

    def tree(self) -> list[psutil.Process]:
        """The driver and every process it started, while they run."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def end(self, timeout_s: float = 2.0) -> None:
        """End the driver at once: SIGTERM to its process group and to every process it
        started (Python workers may sit in groups of their own), SIGKILL to whatever is
        left after ``timeout_s``. Quick, because Airflow kills a task ``on_kill`` has not
        finished within 5 s of its SIGTERM."""
        if self.exit_code is not None:
            # Reaped: its pid may belong to another process by now. Only the group it led
            # can hold what it left (a client-mode driver's Python); a submit-only
            # spark-submit left nothing here.
            if not self.submits_only:
                _signal_group(self.pid, signal.SIGKILL)
            return
        tree = self.tree()
        _signal_group(self.pid, signal.SIGTERM)
        _signal(tree, psutil.Process.terminate)
        # The group's leader is reaped through its Popen, the rest by psutil.
        self.wait(timeout_s)
        _, alive = psutil.wait_procs(tree[1:], timeout=timeout_s)
        if self.exit_code is None or alive:
            logger.warning("killing what ignored SIGTERM: %s", alive or tree[:1])
            _signal_group(self.pid, signal.SIGKILL)
            _signal(alive, psutil.Process.kill)
            self.wait(1.0)
            psutil.wait_procs(alive, timeout=1.0)

    def follow(self) -> Iterator[str]:
        """The log's lines as they are written, until the driver has ended. After a
        rotation the old file is read to its end, then the new one (a log that rotates
        more than twice a second loses lines here, not in its files)."""
        log = self.log_path.open(errors="replace")
        try:
            while True:
                ended = self.exit_code is not None
                rotated = _replaced(log, self.log_path)
                while line := log.readline():
                    yield line.rstrip("\n")
                if rotated:
                    log.close()
                    log = self.log_path.open(errors="replace")
                elif ended:
                    return
                else:
                    self.wait(0.5)
        finally:
            log.close()


class BacklogSubmitHook(SparkSubmitAdapter):
    """``SparkSubmitHook`` for one run of a backlog-aware job in one ``PhaseProfile``.

    Unlike the plain hook, it refuses a Spark connection that does not exist (the plain hook
    silently submits to YARN then), finds spark-submit next to this interpreter when it is
    not on PATH (a virtual environment that is not activated), and starts spark-submit in a
    process group of its own so that a client-mode driver can run on after the task and be
    ended as a whole. Cluster mode is taken on YARN and Kubernetes (a standalone master does
    not run Python applications in cluster mode); with ``detach`` spark-submit then returns
    once the application is submitted. Other keyword arguments go to ``SparkSubmitHook``
    (e.g. ``py_files``, ``jars``, ``verbose``).

    :param job_name: The job's name (``spark.backlog.job-name`` and spark-submit's
        ``--name``): 1-200 printable characters.
    :param run_id: This run's id (``spark.backlog.run-id``): 1-200 printable characters.
    :param profile: The ``PhaseProfile`` to run in: its intervals, resources and Spark conf.
    :param metrics_url: The metrics database's SQLAlchemy URL (``spark.backlog.metrics.url``).
        Its password is kept off the command line and out of the conf: a driver running here
        gets it in its environment. In cluster mode the database must be one the cluster
        can reach (not SQLite, not a loopback host), and its password, if any, must reach
        the driver through ``env_vars`` (``BACKLOG_METRICS_PASSWORD``) or, on Kubernetes, a
        secret named in the profile's conf.
    :param conn_id: The Spark connection: master, deploy mode, spark-submit binary; default
        ``spark_default``. It must exist, and a ``k8s://`` master needs
        ``apache-airflow-providers-cncf-kubernetes`` installed.
    :param application_args: Arguments for the application; none by default.
    :param env_vars: Environment variables for spark-submit and the driver, over this
        worker's own environment (which it gets without Airflow's ``AIRFLOW__*``,
        ``AIRFLOW_CONN_*``, ``AIRFLOW_VAR_*`` and ``_AIRFLOW_*`` variables); none by default.
    :param detach: In cluster mode, have spark-submit return once the application is
        submitted instead of waiting for it to end (True, the default), unless the profile's
        conf sets ``waitAppCompletion`` itself. No effect in client mode.
    :param extra_conf: Spark conf for this run only, over the profile's (a relaunch's
        ``spark.backlog.lease.wait-for-handover``); none by default.
    """

    def __init__(
        self,
        *,
        job_name: str,
        run_id: str,
        profile: PhaseProfile,
        metrics_url: str,
        conn_id: str = "spark_default",
        application_args: list[str] | None = None,
        env_vars: dict[str, str] | None = None,
        detach: bool = True,
        extra_conf: Mapping[str, str] | None = None,
        **kwargs: Any,
    ):
        try:
            connection = self.get_connection(conn_id)
        except AirflowNotFoundException:
            raise AirflowException(
                f"Spark connection {conn_id!r} is not defined, and without it spark-submit "
                "would submit to YARN: define it with the master as host, e.g. "
                'AIRFLOW_CONN_SPARK_DEFAULT=\'{"conn_type": "spark", "host": "local[2]"}\' '
                "or spark://master.example.com:7077"
            ) from None
        self.spark_conn_id = conn_id
        master = connection.host or ""
        if master.startswith("k8s://") and not _kubernetes_provider_installed():
            raise AirflowException(
                f"Spark connection {conn_id!r} has the Kubernetes master {master!r}, for which "
                "SparkSubmitHook needs apache-airflow-providers-cncf-kubernetes: install "
                "airflow-provider-backlog[kubernetes]"
            )
        # The password goes to the local driver's environment (client mode), neither onto
        # its command line nor into conf the hook would add for a YARN or Kubernetes master.
        metrics_url, self._metrics_password = split_password(metrics_url)
        conf = {**profile.spark_conf(job_name, run_id, metrics_url), **(extra_conf or {})}
        BacklogConfig.from_spark_conf(conf)  # a templated job name is known only now
        super().__init__(
            conf=conf,
            conn_id=conn_id,
            name=job_name,
            application_args=application_args,
            env_vars=env_vars,
            **profile.resources(),
            **kwargs,
        )
        # Our keys in Spark's UI and event log: the user's own rule stands.
        self.spark_conf.setdefault("spark.redaction.regex", SPARK_REDACTION_REGEX)
        # At INFO a live driver logs ~45 KiB a batch (state store, scheduler, progress JSON
        # the metrics tables hold anyway): at a batch a second, 160 MiB an hour.
        self.spark_conf.setdefault("spark.log.level", DRIVER_LOG_LEVEL)
        # Python workers that import compiled PySpark, not the zip copy Spark puts first.
        self.spark_conf.setdefault(*DAEMON_CONF)
        self.cluster_mode = self.deploy_mode == "cluster"
        self.submits_only = False
        if self.cluster_mode:
            self._check_cluster_mode(conn_id, metrics_url, env_vars or {})
            wait_key = (
                "spark.yarn.submit.waitAppCompletion"
                if self.is_yarn
                else "spark.kubernetes.submission.waitAppCompletion"
            )
            if detach:  # spark-submit returns once submitted; the metrics tell the rest
                self.spark_conf.setdefault(wait_key, "false")
            self.submits_only = str(self.spark_conf.get(wait_key, "true")).lower() == "false"

    def _check_cluster_mode(
        self, conn_id: str, metrics_url: str, env_vars: Mapping[str, str]
    ) -> None:
        """The driver will run in the cluster: it needs a master that runs Python drivers
        there, a metrics database it can reach, and the password from the cluster."""
        master = self.master
        if not (self.is_yarn or self.is_kubernetes):
            raise AirflowException(
                f"Spark connection {conn_id!r} asks for deploy mode 'cluster' on master "
                f"{master!r}; cluster mode runs Python applications on YARN and Kubernetes "
                "only: use deploy mode 'client' there (the default)"
            )
        url = make_url(metrics_url)
        if url.get_backend_name() == "sqlite" or (url.host or "") in _LOOPBACK_HOSTS:
            raise AirflowException(
                f"metrics database {url.render_as_string()!r} cannot be reached from a driver "
                "in the cluster (deploy mode 'cluster'): use a PostgreSQL host the cluster "
                "can reach"
            )
        if self._metrics_password is None or METRICS_PASSWORD_ENV in env_vars:
            return
        if self.is_kubernetes and K8S_PASSWORD_SECRET in self.spark_conf:
            return
        raise AirflowException(
            "the metrics connection has a password, which a driver in the cluster cannot get "
            "from this worker: give it to the driver through the cluster, with the profile's "
            f"conf {K8S_PASSWORD_SECRET}=<secret>:<key> on Kubernetes, or "
            f"env_vars={{{METRICS_PASSWORD_ENV!r}: '{{{{ conn.<id>.password }}}}'}} (sent as "
            "driver environment conf: masked in task logs and redacted in Spark's UI, but on "
            "spark-submit's command line and in the application's launch context)"
        )

    def spark_binary_path(self) -> list[str]:
        binary = self.spark_binary
        beside_python = os.path.dirname(sys.executable)
        found = shutil.which(binary) or shutil.which(binary, path=beside_python)
        if found is None:
            searched = os.environ.get("PATH", os.defpath)
            raise AirflowException(
                spark_submit_missing(binary, self.spark_conn_id, searched, beside_python)
            )
        return [found]

    def start(
        self,
        application: str,
        log_path: Path,
        *,
        max_bytes: int = driver_log.MAX_BYTES,
        backups: int = driver_log.BACKUPS,
    ) -> DriverProcess:
        """Start spark-submit in its own process group, its output going to ``log_path``,
        rotated at ``max_bytes`` with ``backups`` older files kept."""
        driver = DriverProcess.start(
            self.submit_command(application),
            log_path,
            env=self.submit_environment(),
            max_bytes=max_bytes,
            backups=backups,
            submits_only=self.submits_only,
        )
        self.log.info("spark-submit started (process group %s), its log: %s", driver.pid, log_path)
        return driver

    def submit_environment(self) -> dict[str, str]:
        """spark-submit's environment: this worker's, the ``env_vars``, and for a driver
        running here its Python and the metrics password.

        Of the worker's own variables the driver gets neither Airflow's configuration
        (``AIRFLOW__*``: its database URL, Fernet key, JWT secret), nor its connections
        (``AIRFLOW_CONN_*``) and variables (``AIRFLOW_VAR_*``), nor its internals
        (``_AIRFLOW_*``): the job needs none of them, and its code, its Spark UI and its
        logs are no place for Airflow's secrets. What ``env_vars`` names it gets even so;
        everything else (PATH, JAVA_HOME, SPARK_HOME, HADOOP_CONF_DIR, PYTHONPATH...) it
        gets as the worker has it.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith(_AIRFLOW_ONLY)}
        if self.cluster_mode:  # spark-submit would hand this host's interpreter to the cluster
            local = {k: v for k, v in env.items() if k not in _LOCAL_PYTHON}
            return {**local, **self.extra_env}
        env.update(self.extra_env)
        # Executors' Python workers need an interpreter with the job's code: this one,
        # unless the deployment says otherwise.
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        if self._metrics_password is not None:
            env[METRICS_PASSWORD_ENV] = self._metrics_password
        # The driver's Python processes import compiled PySpark (a pip installation's).
        return with_compiled_home(env, self.master)

    def cluster_kill_command(self, log_path: Path) -> list[str] | None:
        """In cluster mode, the command that kills the submitted application, named in
        spark-submit's log (YARN's application id, Kubernetes' submission id
        ``namespace:driver-pod``); None in client mode, or when the log names none yet."""
        if not self.cluster_mode:
            return None
        # Newest first: the status lines repeat the name, the rotated files hold the first.
        for file in driver_log.log_files(log_path):
            command = self._kill_command(file.read_text(errors="replace"))
            if command is not None:
                return command
        return None

    def start_cluster_kill(self, log_path: Path) -> subprocess.Popen[bytes] | None:
        """Start the kill of the application spark-submit submitted (``cluster_kill_command``),
        its output appended to ``log_path``, and leave it running: it starts a JVM and waits
        for the cluster, longer than Airflow's 5 s between SIGTERM and SIGKILL. None when
        the log names no application yet; raises OSError when the command cannot start."""
        command = self.cluster_kill_command(log_path)
        if command is None:
            return None
        self.log.info("asking the cluster to kill the application: %s", " ".join(command))
        with log_path.open("ab") as log:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.submit_environment(),
                start_new_session=True,
            )

    def _kill_command(self, text: str) -> list[str] | None:
        """The kill command for what spark-submit's output ``text`` names, if anything."""
        if self.is_yarn:
            found = _YARN_APPLICATION.search(text)
            return ["yarn", "application", "-kill", found.group(0)] if found else None
        submission = _K8S_SUBMISSION.search(text)
        if submission is None:
            pod = _K8S_DRIVER_POD.search(text)
            if pod is None:
                return None
            namespace = self.kubernetes_namespace or "default"
            target = f"{namespace}:{pod.group(1)}"
        else:
            target = submission.group(1)
        return [
            *self.spark_binary_path(),
            "--master",
            self.master,
            "--kill",
            target,
        ]


def spark_submit_missing(binary: str, conn_id: str, searched: str, beside_python: str) -> str:
    """Why a launch cannot start on this worker: the ``binary`` the Spark connection
    ``conn_id`` names (its ``spark-binary``, spark-submit by default) is neither on the PATH
    ``searched`` nor in ``beside_python``; and what brings it. The provider installs without
    pyspark, whose wheel is what puts spark-submit beside a virtual environment's Python."""
    return (
        f"{binary} not found: Spark connection {conn_id!r} runs {binary!r} (its spark-binary "
        f"extra, spark-submit by default), which is neither on PATH ({searched}) nor in "
        f"{beside_python}, beside this worker's Python. spark-submit comes with pyspark: "
        "install this provider with its spark extra, pip install "
        "'airflow-provider-backlog[spark]' (with the project's constraints.txt), or put a "
        "Spark distribution's bin directory on PATH (the connection's spark-binary extra "
        "picks spark-submit, spark2-submit or spark3-submit there)"
    )


def _kubernetes_provider_installed() -> bool:
    try:
        import airflow.providers.cncf.kubernetes  # noqa: F401
    except ImportError:
        return False
    return True


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    """Signal the process group the driver leads (``start`` gave it a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _replaced(log: IO[str], path: Path) -> bool:
    """Whether ``path`` names another file than the open ``log`` now: it was rotated."""
    try:
        return os.stat(path).st_ino != os.fstat(log.fileno()).st_ino
    except FileNotFoundError:  # between the rotation's rename and the new file
        return False


def _signal(processes: list[psutil.Process], send: Any) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            send(process)
