import json
import time
from datetime import UTC, datetime, timedelta

import pyarrow.dataset as ds

from tools.data.events import EVENT_ARROW_SCHEMA, LiveProducer, write_history, write_landing_file

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def test_history_is_unique_ids_in_event_time_order(tmp_path):
    progress = []
    first_free = write_history(
        tmp_path, 1000, 7, T0, T0 + timedelta(minutes=10), lambda d, t: progress.append((d, t))
    )
    assert first_free == 1000
    assert progress[-1] == (7, 7)
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) == 7
    table = ds.dataset([str(f) for f in files], format="parquet").to_table()
    assert table.schema == EVENT_ARROW_SCHEMA
    assert table.column("event_id").to_pylist() == list(range(1000))
    times = table.column("event_time").to_pylist()
    assert times == sorted(times)
    assert times[0] == T0 and times[-1] < T0 + timedelta(minutes=10)


def test_a_landing_file_appears_whole_under_its_final_name(tmp_path):
    write_landing_file(tmp_path, "live-1.json", 50, 3, T0)
    assert [p.name for p in tmp_path.iterdir()] == ["live-1.json"]
    rows = [json.loads(line) for line in (tmp_path / "live-1.json").read_text().splitlines()]
    assert [r["event_id"] for r in rows] == [50, 51, 52]
    assert rows[0]["event_time"] == "2026-11-21T10:00:00Z"


def test_the_live_producer_writes_consecutive_ids_until_stopped(tmp_path):
    producer = LiveProducer(tmp_path, first_id=500, events_per_s=400, file_every_s=0.05)
    producer.start()
    while producer.stats.files < 3:
        time.sleep(0.01)
    producer.stop()
    files = sorted(tmp_path.glob("live-*.json"))
    ids = [json.loads(line)["event_id"] for f in files for line in f.read_text().splitlines()]
    assert ids == list(range(500, 500 + producer.stats.events))
    assert producer.stats.events == 20 * producer.stats.files
