import subprocess
import sys

import pytest

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.options import KEYS, MAX_COUNT, OPTIONS, PREFIX, Count, render_page


def test_each_key_is_declared_once_in_lower_case_under_the_prefix():
    assert len(set(KEYS)) == len(KEYS)
    assert all(key.startswith(PREFIX) and key == key.lower() for key in KEYS)


@pytest.mark.parametrize(
    "option", [o for o in OPTIONS if o.default is not None], ids=lambda option: option.key
)
def test_each_default_is_a_value_its_option_accepts(option):
    option.kind.parse(option.default)


def test_every_declared_key_is_read():
    values = {
        "spark.backlog.checkpointing.interval": "1d",
        "spark.backlog.checkpointing.interval-during-backlog": "1d",
        "spark.backlog.checkpointing.freshness-target": "1d",
        "spark.backlog.checkpointing.min-pause": "12h",
        "spark.backlog.checkpointing.max-batch-rows": f"{MAX_COUNT}",
        "spark.backlog.job-name": "nightly orders",
        "spark.backlog.run-id": "run 1",
        "spark.backlog.metrics.url": "sqlite:////tmp/m.db",
        "spark.backlog.file-source.pending-files-threshold": f"{MAX_COUNT}",
        "spark.backlog.lag.offsets.enter-threshold": f"{MAX_COUNT}",
        "spark.backlog.lag.offsets.leave-threshold": "0",
        "spark.backlog.lag.watermark.enter-threshold": "30d",
        "spark.backlog.lag.watermark.leave-threshold": "0",
        "spark.backlog.lag.min-dwell": "1d",
        "spark.backlog.lease.ttl": "1d",
        "spark.backlog.lease.wait-for-handover": "1d",
        "spark.backlog.metrics.retention": "366d",
    }
    assert tuple(values) == KEYS
    config = BacklogConfig.from_spark_conf(values)
    assert config.describe() == (
        "job=nightly orders run=run 1 interval=1d interval-during-backlog=1d min-pause=12h "
        "max-batch-rows=1000000000000 freshness-target=1d offset-lag=enter>1000000000000,leave<=0 "
        "watermark-lag=enter>30d,leave<=0 lag-min-dwell=1d metrics-retention=366d "
        "wait-for-handover=1d"
    )


def test_the_page_has_one_row_per_option_saying_its_default_bounds_and_meaning():
    rows = [line for line in render_page().splitlines() if line.startswith("| `spark.")]
    assert [row.split("`")[1] for row in rows] == list(KEYS)
    assert rows[0] == (
        "| `spark.backlog.checkpointing.interval` | `30s` | duration from `1ms` to `1d` | yes "
        "| checkpoint interval in real time |"
    )
    assert rows[4] == (
        "| `spark.backlog.checkpointing.max-batch-rows` | `1000000` | whole number from 1 to "
        "1_000_000_000_000 | no | rows per batch at most, to bound memory |"
    )
    assert rows[5].startswith(
        "| `spark.backlog.job-name` | `spark.app.name` | 1-200 printable characters | no |"
    )


def test_counts_allow_zero_only_where_declared():
    assert Count(zero_allowed=True).parse("0") == 0
    with pytest.raises(ValueError, match="expected a whole number above 0"):
        Count().parse("0")


def test_the_module_prints_the_page():
    printed = subprocess.run(
        [sys.executable, "-m", "spark_jobs.backlog.options"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert printed == render_page()
