"""The driver's class-data archive (spark_jobs.jobs.jvm_archive) for every JVM the tests
start: the suite starts dozens of drivers on two cores, and with the archive the
malformed-file test's two launches used about a quarter less CPU (docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.jobs import jvm_archive

#: Options for every JVM of the suite, which live for seconds to minutes on two cores: the
#: client compiler alone (about 30% less CPU), on one compiler thread, the serial collector
#: (no concurrent marking or refinement threads) and no performance-data file: fewer
#: threads competing for the cores (docs/testing.md has the measured pairs).
BASE_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC -XX:-UsePerfData"


def ensure_archive() -> Path:
    return jvm_archive.ensure_archive(base=BASE_OPTIONS)


def java_options(archive: Path) -> str:
    return jvm_archive.java_options(archive, BASE_OPTIONS)
