"""The driver's class-data archive (spark_jobs.jobs.jvm_archive) for every JVM the tests
start: the suite starts dozens of drivers on two cores, and with the archive the
malformed-file test's two launches used about a quarter less CPU (docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

from spark_jobs.jobs import jvm_archive

#: Options for every JVM of the suite. The client compiler alone spends about 30% less CPU
#: on JVMs that live for seconds to minutes.
BASE_OPTIONS = "-XX:TieredStopAtLevel=1"


def ensure_archive() -> Path:
    return jvm_archive.ensure_archive(base=BASE_OPTIONS)


def java_options(archive: Path) -> str:
    return jvm_archive.java_options(archive, BASE_OPTIONS)
