"""What the pipelines' console commands share: how a run is paced and stopped, its Spark
session, and what each way of ending means as an exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from spark_jobs.backlog.config import ConfigError
from spark_jobs.backlog.secrets import SPARK_REDACTION_REGEX
from spark_jobs.backlog.values import count_argument, duration_argument
from spark_jobs.jobs.spark_home import use_compiled_home
from spark_jobs.jobs.startup import (
    JavaMissing,
    prepare_driver_environment,
    require_java,
    under_spark_submit,
)
from spark_jobs.jobs.worker_daemon import DAEMON_CONF
from spark_jobs.metrics.lease import LeaseHeld, LeaseLost

#: Exit codes: refused before anything ran, the query failed, the lease was lost.
REFUSED, FAILED, LEASE_LOST = 2, 1, 3


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The baseline trigger, when to stop, and Spark conf for the console command."""
    parser.add_argument(
        "--static-trigger",
        type=duration_argument,
        help="run with this fixed trigger instead of backlog-aware checkpointing (a baseline)",
    )
    parser.add_argument(
        "--static-max-rows", type=count_argument, help="per-batch row limit for --static-trigger"
    )
    parser.add_argument(
        "--stop-when-idle", type=duration_argument, help="stop once live and without data this long"
    )
    parser.add_argument(
        "--timeout", type=duration_argument, help="stop after this long in any case"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark conf for the console command (spark-submit takes its own --conf)",
    )


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.static_max_rows and args.static_trigger is None:
        parser.error("--static-max-rows needs --static-trigger")
    for item in args.conf:
        if "=" not in item:
            parser.error(f"--conf {item!r}: expected KEY=VALUE")


def spark_session(app_name: str, args: argparse.Namespace) -> SparkSession:
    """The session, with ``--conf`` applied; Spark's UI and event log hide our secrets too
    (a password inside a URL). A console command's Python workers start from our daemon
    unless ``--conf`` names another; under spark-submit, whatever submits the job says
    (the launch operator and the tools pass ``DAEMON_CONF``), since conf set here would
    override spark-submit's."""
    builder = SparkSession.builder.appName(app_name).config(
        "spark.redaction.regex", SPARK_REDACTION_REGEX
    )
    if not under_spark_submit():
        builder = builder.config(*DAEMON_CONF)
        conf = launch_conf(app_name, args)
        if conf is not None:  # else its master is out of sight
            use_compiled_home(conf.get("spark.master"))
    for item in args.conf:
        builder = builder.config(*item.split("=", 1))
    return builder.getOrCreate()


def launch_conf(app_name: str, args: argparse.Namespace) -> dict[str, str] | None:
    """The conf ``spark_session`` starts a session with, read without starting one: under
    spark-submit through its JVM, which is up already; for the console command its
    ``--conf``. None when part of it is out of sight: a console command's
    ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS`` take a JVM to read."""
    conf: dict[str, str] = {}
    if under_spark_submit():
        SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts nothing
        conf |= dict(SparkConf().getAll())
    elif os.environ.get("PYSPARK_SUBMIT_ARGS") or any(p.is_file() for p in _spark_defaults()):
        return None
    conf["spark.app.name"] = app_name
    return conf | dict(item.split("=", 1) for item in args.conf)


def _spark_defaults() -> list[Path]:
    """Where the console command's JVM would find ``spark-defaults.conf``."""
    homes = [os.environ.get("SPARK_HOME"), str(Path(pyspark.__file__).parent)]
    directories = [os.environ.get("SPARK_CONF_DIR"), *(f"{h}/conf" for h in homes if h)]
    return [Path(d) / "spark-defaults.conf" for d in directories if d]


def run_command(
    prog: str, run: Callable[[], None], refusals: tuple[type[Exception], ...] = ()
) -> int:
    """Run a pipeline after the driver's checks; its ending as an exit code, with the
    reason on stderr."""
    prepare_driver_environment()
    try:
        require_java()
        run()
    except (ConfigError, JavaMissing, LeaseHeld, *refusals) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return REFUSED
    except StreamingQueryException as error:
        print(f"{prog}: the query failed: {error}", file=sys.stderr)
        return FAILED
    except LeaseLost as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return LEASE_LOST
    return 0
