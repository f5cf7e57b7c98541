import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.sources.hybrid import HybridOptionError
from spark_jobs.sources.postgres_cdc import PostgresCdcDataSource, child_spec


def test_a_driver_that_reads_no_cdc_source_loads_none_of_the_copy_s_modules():
    """Every driver registers the CDC source: its import took pandas and the copy's modules
    into every events job's driver and planner processes, about 0.45 CPU-seconds each."""
    script = (
        "import sys, spark_jobs.jobs.events_pipeline, spark_jobs.sources.postgres_cdc\n"
        "print(sorted(m for m in ('pandas', 'spark_jobs.sources.cdc.child', "
        "'spark_jobs.sources.cdc.connection') if m in sys.modules))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert found.stdout.strip() == "[]"


def test_the_options_still_make_the_child_spec_and_name_what_is_missing():
    spec = child_spec({"Connection": "postgresql://u@h/db", "TABLE": "t", "chunkRows": "5"})
    assert spec == {
        "name": "postgres-cdc",
        "kind": "postgres-cdc",
        "connection": "postgresql://u@h/db",
        "table": "t",
        "chunkRows": 5,
    }
    with pytest.raises(HybridOptionError, match=r"option 'table' is required"):
        PostgresCdcDataSource({"connection": "postgresql://u@h/db"}).schema()
