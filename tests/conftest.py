"""Airflow reads its configuration when first imported: point it at a throwaway home, with
SQLite and no example DAGs, before any test module imports it. The JVMs the tests start
(Spark's drivers, a standalone cluster) live for seconds to minutes: the client compiler and,
for the tests marked ``spark``, a class-data archive cut the CPU they spend starting
(``tests/support/jvm_archive.py``, docs/testing.md)."""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jvm_archive import BASE_OPTIONS
from tests.support.postgres import PostgresServer

if "PYTEST_XDIST_WORKER" in os.environ or "AIRFLOW_HOME" not in os.environ:
    # A worker of a run side by side inherits the home its controller made: one SQLite
    # database for all of them would see their migrations race.
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="airflow-home-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("JAVA_TOOL_OPTIONS", BASE_OPTIONS)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server on loopback, shared by the session (skips without one)."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def jvm_archive() -> Path:
    """The driver's class-data archive, made on first use, in every JVM started from here on
    (unless the environment brought JAVA_TOOL_OPTIONS of its own)."""
    from tests.support.jvm_archive import ensure_archive, java_options

    path = ensure_archive()
    if os.environ["JAVA_TOOL_OPTIONS"] == BASE_OPTIONS:
        os.environ["JAVA_TOOL_OPTIONS"] = java_options(path)
    return path


@pytest.fixture(autouse=True)
def _archive_for_spark_tests(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("spark"):
        request.getfixturevalue("jvm_archive")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests (marked ``spark``) first, in their order: run side by side, the long ones
    start at once and the short ones fill in around them, instead of one long test ending
    the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("spark") is None)
