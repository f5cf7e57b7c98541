import json
from datetime import UTC, datetime

import pytest

from tools.data.cdc_data import Account
from tools.pipelines.cdc_runs import (
    batch_ends,
    compare,
    live_event_times,
    quantiles,
    with_freshness,
)
from tools.pipelines.report import Checkpoint, freshness_s

AT = datetime(2026, 1, 1, tzinfo=UTC)


def checkpoint(batch_id, is_backlog, committed_at=100.0):
    return Checkpoint(batch_id, committed_at - 1, committed_at, is_backlog, 10, 0, ())


def account(version, balance=5, note="n"):
    return Account(version, balance, note, AT)


def test_an_equal_copy_is_exact():
    rows = {1: account(1), 2: account(3, note=None)}
    found = compare(rows, dict(rows))
    assert found.exact
    assert found.verdict() == "exact: the copy equals the source table (2 rows)"


def test_a_copy_missing_a_row_holding_an_extra_one_or_an_old_version_is_not():
    found = compare(
        {1: account(1), 2: account(2), 3: account(1)}, {1: account(1), 2: account(1), 4: account(1)}
    )
    assert (found.missing, found.extra, found.different, found.exact) == (1, 1, 1, False)
    assert found.verdict() == (
        "NOT exact: of 3 source rows, 1 missing from the copy, 1 different; "
        "1 extra rows in the copy"
    )


def test_batch_ends_are_the_lsn_of_each_offset_logs_source_position(tmp_path):
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    header = 'v1\n{"batchWatermarkMs":0}\n'
    snapshot = {"phase": "snapshot", "lsn": "0/100", "chunks": 2, "after": None, "done": True}
    (offsets / "0").write_text(header + f'{{"source": "cdc", "position": {json.dumps(snapshot)}}}')
    changelog = {"phase": "changelog", "lsn": "1/0", "chunks": 2}
    (offsets / "1").write_text(header + f'{{"source": "cdc", "position": {json.dumps(changelog)}}}')
    (offsets / ".1.crc").write_text("ignored")
    assert batch_ends(offsets) == {0: 0x100, 1: 1 << 32}
    assert batch_ends(tmp_path / "none") == {}


def test_a_change_belongs_to_the_first_live_batch_that_read_past_it():
    checkpoints = [checkpoint(0, True), checkpoint(1, False), checkpoint(2, False)]
    ends = {0: 100, 1: 200, 2: 300}
    changes = [(50, 1.0), (100, 2.0), (150, 3.0), (200, 4.0), (201, 5.0), (300, 6.0), (301, 7.0)]
    # At or before the snapshot's position: the snapshot's; after the last batch: unread.
    assert live_event_times(checkpoints, ends, changes) == {1: [3.0, 4.0], 2: [5.0, 6.0]}
    assert live_event_times([checkpoint(0, True)], ends, changes) == {}


def test_quantiles_are_nearest_rank_and_empty_without_values():
    assert quantiles([], (0.5,)) == ()
    assert quantiles([3.0, 1.0, 2.0], (0.0, 0.5, 0.95)) == (1.0, 2.0, 3.0)


def test_freshness_comes_from_the_changes_each_live_batch_read():
    checkpoints = [checkpoint(0, True, 50.0), checkpoint(1, False, 100.0), checkpoint(2, False)]
    found = with_freshness(checkpoints, {1: [99.0, 98.0], 2: []})
    assert found[0] == checkpoints[0] and found[2] == checkpoints[2]
    assert found[1].event_time_quantiles_s[0] == 98.0
    samples = freshness_s(found)
    assert min(s for s, _ in samples) == pytest.approx(1.0)
    assert max(s for s, _ in samples) == pytest.approx(2.0)
