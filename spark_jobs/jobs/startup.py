"""What every entry point does before Spark starts: Java check, Python for workers, logging."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping


class JavaMissing(RuntimeError):
    pass


def require_java(minimum: int = 17) -> None:
    """Fail with a clear message now instead of a Py4J gateway error later.

    Under spark-submit the JVM is already running, so there is nothing to check.
    """
    if under_spark_submit():
        return
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    advice = "install one (Debian: apt-get install -y openjdk-17-jre-headless) and set JAVA_HOME"
    if not java or not os.path.exists(java):
        raise JavaMissing(f"Spark 4 needs Java {minimum} or newer, but no java was found; {advice}")
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', banner)
    if not match or int(match.group(1)) < minimum:
        found = match.group(1) if match else "unknown"
        raise JavaMissing(f"Spark 4 needs Java {minimum} or newer, but {java} is {found}; {advice}")


def under_spark_submit() -> bool:
    """Whether this driver was started by spark-submit, whose JVM it talks to."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def job_environment() -> dict[str, str]:
    """The environment for a job started from this interpreter, on a local or standalone
    master: Spark on loopback unless told otherwise, Python workers that have this project
    installed, and Spark's Python processes importing compiled PySpark (``spark_home``)."""
    from spark_jobs.jobs.spark_home import with_compiled_home

    environment = {
        **os.environ,
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    return with_compiled_home(environment, master=None)


def spark_submit_command(entry_file: str, conf: Mapping[str, str], *args: str) -> list[str]:
    """``spark-submit`` from this interpreter's environment, as Airflow would run it."""
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    pairs = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    return [spark_submit, *pairs, entry_file, *args]


def prepare_driver_environment() -> None:
    """Executors' Python workers must run the interpreter that has this project installed."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
