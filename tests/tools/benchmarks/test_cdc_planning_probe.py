"""The planning probe on a real PostgreSQL server: both sources copy the table's chunks while
a writer changes it, and only the one whose batches are committed moves its slot."""

import json

import pytest

from tools.benchmarks.cdc_planning_probe import main, parse_args


def test_two_short_snapshots_side_by_side_report_and_chart_their_planning(tmp_path, capsys):
    chart = tmp_path / "planning.png"
    args = ["--minutes", "0.1", "--round-s", "1", "--chunk-rows", "200", "--chart", str(chart)]
    assert main(args) == 0

    printed = capsys.readouterr().out.splitlines()
    summary = json.loads(printed[-1])
    assert [line.split(",")[0] for line in printed if line.startswith("round")] == [
        f"round {i}/6" for i in range(1, 7)
    ]
    assert set(summary["planning_s"]) == {"follows", "stays"}
    assert summary["writer_transactions"] > 0
    # The slot that stays where the snapshot began decodes every change written since.
    wal = summary["slot_wal_bytes"]
    assert wal["stays"]["to_decode"] > wal["follows"]["to_decode"]
    assert chart.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("flag", ["--minutes", "--round-s", "--chunk-rows", "--changes-per-s"])
def test_values_not_above_zero_are_refused_by_name(flag, capsys):
    with pytest.raises(SystemExit):
        parse_args([flag, "0"])
    assert f"{flag} must be above 0" in capsys.readouterr().err
