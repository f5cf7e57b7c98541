"""``scripts/job-demo --live postgres-cdc`` on a small table: the snapshot as backlog, then
the changelog live, once; the copy equal to the table; the server gone afterwards."""

from __future__ import annotations

import pytest

from tests.support.prerequisites import missing
from tools.demo import job_demo as demo
from tools.services.postgres import find_bin_dir


def test_the_cdc_phase_keeps_the_demos_intervals_but_not_its_event_lag_thresholds():
    assert demo.CDC_CONF == {
        "spark.backlog.checkpointing.interval": "2s",
        "spark.backlog.checkpointing.interval-during-backlog": "1min",
        "spark.backlog.checkpointing.max-batch-rows": "100000",
    }


@pytest.mark.spark  # a local Spark job on a throwaway PostgreSQL: about 40 s
def test_a_small_table_is_copied_through_backlog_then_live_exactly(tmp_path, monkeypatch, capsys):
    if find_bin_dir() is None:
        missing("PostgreSQL server binaries are needed for the CDC demo")
    servers = []

    def recorded(make):
        def make_and_record():
            servers.append(make())
            return servers[-1]

        return make_and_record

    monkeypatch.setattr(demo, "cdc_server", recorded(demo.cdc_server))
    monkeypatch.setattr(demo, "target_server", recorded(demo.target_server))
    argv = ["--live", "postgres-cdc", "--cdc-rows", "5000", "--live-seconds", "1"]
    assert demo.main([*argv, "--workdir", str(tmp_path / "demo")]) == 0
    lines = capsys.readouterr().out.splitlines()

    header = lines.index("period                checkpoints        rows      rows/s   decided by")
    periods = [line.split()[0] for line in lines[header + 1 : lines.index("", header)]]
    assert periods == ["backlog", "live"]
    transitions = lines[lines.index("transitions:") + 1 :]
    assert [t.split()[2] for t in transitions[:2]] == ["backlog", "live"]
    assert transitions[2].startswith("real time, once caught up")
    # The writer inserted and deleted meanwhile: the table no longer holds 20,000 rows.
    assert lines[-1].startswith("copy of the table: exact: the copy equals the source table (")
    assert (tmp_path / "demo" / "timeline.png").stat().st_size > 0
    assert not (tmp_path / "demo" / "cdc" / "checkpoint").exists()
    assert len(servers) == 2 and not any(server.running for server in servers)
