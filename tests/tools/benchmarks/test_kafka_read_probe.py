"""The Kafka read probe on the embedded broker: both ways read every record produced."""

import json

import pytest

from tools.benchmarks.kafka_read_probe import main, parse_args


def test_both_ways_read_every_record_and_report_their_ratio(capsys):
    assert main(["--records", "2003", "--partitions", "3", "--repeats", "2"]) == 0

    printed = capsys.readouterr().out.splitlines()
    summary = json.loads(printed[-1])
    assert [line.split(",")[0] for line in printed[:-1]] == ["round 1/2", "round 2/2"]
    assert (summary["records"], summary["partitions"]) == (2003, 3)
    assert set(summary["records_per_s"]) == {"client", "task"}
    assert summary["task_vs_client"] == pytest.approx(
        summary["records_per_s"]["task"] / summary["records_per_s"]["client"], rel=0.01
    )


@pytest.mark.parametrize("flag", ["--records", "--partitions", "--repeats"])
def test_counts_below_one_are_refused_by_name(flag, capsys):
    with pytest.raises(SystemExit):
        parse_args([flag, "0"])
    assert f"{flag} must be at least 1" in capsys.readouterr().err
