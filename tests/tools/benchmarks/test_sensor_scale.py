"""The pure parts of scripts/sensor-scale: its latency percentile and how it reads when each
sensor's trigger fired from Airflow's logs (the trigger's own file, or the triggerer's
console before the file is open)."""

import json
from datetime import datetime

import pytest

from tools.benchmarks.sensor_scale import fire_times, job_names, log_field, percentile


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert percentile(values, 0.5) == 10.0
    assert percentile(values, 0.95) == 19.0
    assert percentile(values, 1.0) == 20.0
    assert percentile([3.0], 0.95) == 3.0


def test_job_names_sort_as_they_count():
    assert job_names(3) == ["job000", "job001", "job002"]


def test_log_field_names_what_is_missing():
    line = (
        "2026-11-25T20:00:01.5+00:00 [info] Trigger fired event dag_id=scale_job001 task_id=live_3"
    )
    assert log_field(line, "task_id") == "live_3"
    with pytest.raises(ValueError, match="no run_id"):
        log_field(line, "run_id")


def test_fire_times_read_the_trigger_files_and_the_triggerers_console(tmp_path):
    task_dir = tmp_path / "logs/dag_id=scale_job000/run_id=r1/task_id=fresh_0"
    task_dir.mkdir(parents=True)
    record = {
        "timestamp": "2026-11-25T20:00:02.250000+00:00",
        "event": "Trigger fired event",
        "result": "TriggerEvent<{'status': 'success', 'snapshot': {}}>",
    }
    (task_dir / "attempt=1.log.trigger.7.log").write_text(
        json.dumps({"timestamp": "2026-11-25T20:00:00+00:00", "event": "starting"})
        + "\n"
        + json.dumps(record)
        + "\n"
    )
    (tmp_path / "triggerer.log").write_text(
        "2026-11-25T20:00:03.000000+00:00 [info] Trigger fired event "
        "name=x result=TriggerEvent<{'status': 'error', 'message': 'died'}> "
        "dag_id=scale_job001 task_id=live_1\n"
        "2026-11-25T20:00:04.000000+00:00 [info] some other line dag_id=a task_id=b\n"
    )
    assert fire_times(tmp_path) == {
        ("scale_job000", "fresh_0"): (datetime.fromisoformat(record["timestamp"]), True),
        ("scale_job001", "live_1"): (
            datetime.fromisoformat("2026-11-25T20:00:03+00:00"),
            False,
        ),
    }
