import json

from spark_jobs.sources.quarantine import (
    OFFSET_FIELD,
    BadInput,
    Quarantine,
    count_set_aside,
    file_key,
    range_key,
)
from spark_jobs.storage.files import resolve_uri


def offset(location, phase, position):
    return {"source": "events", "phase": phase, "position": position, OFFSET_FIELD: location}


def test_bad_input_is_written_once_with_its_position_reason_and_value(tmp_path):
    location = resolve_uri(str(tmp_path / "bad"))
    quarantine = Quarantine(location, "events", "live")
    record = BadInput({"topic": "t", "partition": 0, "offset": 7}, "not an object", b"[1]")
    quarantine.set_aside(range_key("t", 0, 5, 9), [record])
    # A replayed batch sets the same input aside again: the file stays as it was.
    quarantine.set_aside(range_key("t", 0, 5, 9), [record, record])
    written = tmp_path / "bad" / "events" / "live" / "kafka" / "t" / "0"
    (name,) = [p.name for p in written.iterdir()]
    assert name == f"{5:020d}-{9:020d}.jsonl"
    lines = (written / name).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "position": {"topic": "t", "partition": 0, "offset": 7},
            "reason": "not an object",
            "value_base64": "WzFd",
        }
    ]


def test_a_batch_counts_what_was_set_aside_between_its_offsets(tmp_path):
    location = resolve_uri(str(tmp_path / "bad"))
    files = Quarantine(location, "events", "history")
    for index in (1, 4):
        files.set_aside(file_key(index), [BadInput({"index": index}, "malformed")])
    kafka = Quarantine(location, "events", "live")
    kafka.set_aside(range_key("t", 0, 0, 10), [BadInput({"offset": 3}, "x")] * 2)
    kafka.set_aside(range_key("t", 0, 10, 20), [BadInput({"offset": 12}, "x")])
    kafka.set_aside(range_key("t", 1, 0, 10), [BadInput({"offset": 1}, "x")])

    def history(file):
        return offset(location, "history", {"file": file, "row": 0})

    def live(p0, p1):
        return offset(location, "live", {"t": {"0": p0, "1": p1}})

    assert count_set_aside(None, history(2)) == 1
    assert count_set_aside(history(2), history(5)) == 1
    assert count_set_aside(history(0), history(1)) == 0
    # Across the switch: the rest of the files, then the topic up to the end offset.
    assert count_set_aside(history(3), live(10, 0)) == 3
    assert count_set_aside(live(10, 0), live(20, 10)) == 2
    assert count_set_aside(live(10, 10), live(15, 10)) == 0  # the range is not read yet


def test_a_source_without_a_quarantine_counts_nothing(tmp_path):
    end = {"source": "events", "phase": "live", "position": {}}
    assert count_set_aside(None, end) is None
