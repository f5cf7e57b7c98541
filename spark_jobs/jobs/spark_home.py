"""A SPARK_HOME whose Python processes import the installed PySpark, compiled.

For a pip-installed PySpark, SPARK_HOME is the installed package, and Spark starts each of
its Python processes with ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``:
a second copy of PySpark, of source files only, that every process compiles again as it
imports it (``python_path``). Python workers take it off through our daemon
(``worker_daemon``), but the driver's planner processes (data source lookup, creation, read
planning) run PySpark's own daemon, and the streaming source's runner runs under none:
on a 2-core machine they spent 0.5-1.9 CPU-seconds each, one after another before the first
batch. A home that is the installed package's but for those zips makes them import compiled
PySpark: a launch then used about 3 CPU-seconds less and reached its first batch about 3 s
sooner (docs/tuning.md).

The home is a directory of links to the installed package's ``bin``, ``jars`` and the rest,
made once per installation beside it. It serves a driver on this machine with a local or a
standalone master, where SPARK_HOME is not set; YARN and Kubernetes ship ``pyspark.zip``
to their containers, so a submission there keeps the installed home, and a SPARK_HOME set
(a Spark distribution, or the installed package itself to do without the compiled home)
is used as it is.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

#: Where the home is made unless told otherwise: beside the installation it links to.
DEFAULT_DIRECTORY = Path(sys.prefix)


def installed_home() -> Path | None:
    """The installed PySpark package, which a pip installation's SPARK_HOME is; None where
    PySpark is not installed whole (no jars: Spark Connect's client alone, or none)."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).resolve().parent
    return home if (home / "jars").is_dir() else None


def serves(master: str | None) -> bool:
    """Whether a driver with ``master`` (None: Spark's default, local) may use the home."""
    return master is None or master.startswith(("local", "spark://"))


def compiled_home(installed: Path, directory: Path = DEFAULT_DIRECTORY) -> Path:
    """The home linking to ``installed``, made if missing (atomically: a driver starting
    beside another finds it whole or makes its own and keeps the first)."""
    key = hashlib.sha256(str(installed).encode()).hexdigest()[:12]
    home = directory / f"spark-home-{key}"
    if _links_to(home, installed):
        return home
    made = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=directory))
    for entry in installed.iterdir():
        if entry.name != "python":
            (made / entry.name).symlink_to(entry)
    (made / "python").mkdir()
    for entry in (installed / "python").iterdir():
        if entry.name != "lib":  # pyspark.zip and py4j's: the copies to leave out
            (made / "python" / entry.name).symlink_to(entry)
    try:
        made.rename(home)
    except OSError:  # made meanwhile by another driver: keep that one
        shutil.rmtree(made)
        if not _links_to(home, installed):
            raise
    return home


def _links_to(home: Path, installed: Path) -> bool:
    return (home / "jars").resolve() == installed / "jars" and (home / "bin").is_dir()


def with_compiled_home(
    environment: Mapping[str, str], master: str | None, directory: Path = DEFAULT_DIRECTORY
) -> dict[str, str]:
    """``environment`` with SPARK_HOME the compiled home, where it serves ``master`` and
    SPARK_HOME is not set; as it was otherwise, or when the home cannot be made (a
    read-only installation costs only speed)."""
    found = dict(environment)
    installed = installed_home()
    if installed is None or not serves(master) or found.get("SPARK_HOME"):
        return found
    try:
        found["SPARK_HOME"] = str(_home(installed, directory))
    except OSError as error:
        logger.info("Spark's Python processes compile PySpark at start: %s", error)
    return found


@functools.cache
def _home(installed: Path, directory: Path) -> Path:
    return compiled_home(installed, directory)


def use_compiled_home(master: str | None) -> None:
    """Set this process's SPARK_HOME to the compiled home, before it starts a session."""
    os.environ.update(with_compiled_home(os.environ, master))
