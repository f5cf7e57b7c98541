"""A small fault campaign, as `scripts/chaos` runs it: one trial of each kind, faults
injected for real, and nothing lost or duplicated; for the CDC pipeline's trial, the merged
copy and the replayed change stream equal the source table.

Each kind runs as a campaign of its own, so that the trials, which share nothing, can run
side by side. The kills trial is also the suite's files-then-Kafka run killed in each phase
(the file phase, the lag-held backlog on the topic, live), the malformed trial its
quarantine of bad files and topic values, and the cdc trial its CDC pipeline killed in the
snapshot, at the switch and in the changelog: their workspaces are read here for the job's
transitions and what was set aside."""

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAULTS = {
    "kills": {"sigkill-files", "sigkill-kafka-backlog", "sigkill-live"},
    "database": {"database-away", "database-away-at-shutdown"},
    "skew": {"skewed-second-driver"},
    "broker": {"brokers-down", "leaders-moved", "request-errors"},
    "malformed": {"malformed-files", "malformed-records"},
    "cdc": {
        "cdc-sigkill-snapshot",
        "cdc-sigkill-switch",
        "cdc-sigkill-changelog",
        "cdc-source-restart",
        "cdc-target-away",
    },
}
COMPARED = re.compile(
    r"^\s+([\d,]+) of ([\d,]+) events compared: lost (\d+), duplicated (\d+), "
    r"wrong amounts (\d+), final watermark (-?\d+) s before the last event, recovered$"
)
CDC_COMPARED = re.compile(
    r"^\s+([\d,]+) rows and ([\d,]+) versions compared: lost (\d+) versions, duplicated "
    r"(\d+) changes, copy or stream differs in (\d+) keys, recovered$"
)


def sqlite_rows(database: Path, query: str) -> list[tuple]:
    connection = sqlite3.connect(database)
    try:
        return connection.execute(query).fetchall()
    finally:
        connection.close()


def campaign(kind: str, workdir: Path, postgres_url: str) -> str:
    """One trial of ``kind`` through ``tools.faults.chaos``: every fault of the kind injected once,
    nothing lost or duplicated and recovered, as the campaign's JSON summary says. Returns
    what the campaign printed."""
    run = subprocess.run(
        [
            *(sys.executable, "-m", "tools.faults.chaos", "--trials", "1", "--kinds", kind),
            *("--events", "20000", "--seed", "11", "--workdir", str(workdir)),
            *("--postgres-url", postgres_url),
        ],
        cwd=REPO,  # python -m tools.faults.chaos imports the tools from the checkout
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = run.stdout
    assert run.returncode == 0, output[-4000:] + run.stderr[-4000:]
    faults = json.loads(output.splitlines()[-1])
    assert set(faults) == FAULTS[kind]
    for fault, counts in faults.items():
        assert counts == {"trials": 1, "lost": 0, "duplicated": 0, "recovered": 1}, fault
    # The table a person reads holds the same numbers.
    assert all(fault in output for fault in FAULTS[kind]) and "recovered" in output
    return output


def compared(output: str, pattern: re.Pattern[str]) -> tuple[int, ...]:
    """The numbers of the trial's line that ``pattern`` matches."""
    [found] = [m.groups() for line in output.splitlines() if (m := pattern.match(line))]
    return tuple(int(group.replace(",", "")) for group in found)


@pytest.mark.parametrize("kind", ["kills", "database", "skew", "broker", "malformed"])
def test_one_trial_of_each_events_kind_loses_and_duplicates_nothing(
    kind, tmp_path, postgres_server
):
    """Each trial's sink equals the batch recomputation, sums of amounts included; for the
    kills and the malformed input, over at least half of what was produced, with the final
    watermark near the last event (a job stuck early would compare nearly nothing)."""
    postgres_server.start()
    output = campaign(kind, tmp_path, postgres_server.url)
    events, produced, lost, duplicated, wrong, behind_s = compared(output, COMPARED)
    assert (lost, duplicated, wrong) == (0, 0, 0)
    if kind in ("kills", "malformed"):
        assert events >= 0.5 * produced, (events, produced)
        assert behind_s <= 60, behind_s
    if kind == "kills":
        check_kills_phases(tmp_path / "kills-0" / "metrics" / "metrics.db")
    if kind == "malformed":
        check_set_aside(tmp_path / "malformed-0" / "bad")


def check_kills_phases(metrics: Path) -> None:
    """Killed in the file phase, in the topic's backlog and live: four runs of one job. The
    first records the job's first status; the restarts continue it, so the next change is
    the switch to live, whichever run made it. The topic piles up while a killed run
    restarts: the job may re-enter backlog by its lag then, and leave it again."""
    check_four_runs_recorded_once(metrics)
    reasons = sqlite_rows(metrics, "SELECT is_backlog, reason FROM backlog_transitions ORDER BY at")
    assert reasons[:2] == [
        (1, "hybrid-phase: events is in backlog (history)"),
        (0, "offset-lag: events is live (kafka)"),
    ]
    assert reasons[2:] == [
        (1, "offset-lag: events is in backlog (kafka)"),
        (0, "offset-lag: events is live (kafka)"),
    ] * (len(reasons[2:]) // 2)


def check_four_runs_recorded_once(metrics: Path) -> None:
    """A job killed three times ran four times, and recorded each batch once."""
    [(runs,)] = sqlite_rows(metrics, "SELECT COUNT(DISTINCT run_id) FROM backlog_checkpoints")
    assert runs == 4
    twice = "SELECT batch_id FROM backlog_checkpoints GROUP BY batch_id HAVING COUNT(*) > 1"
    assert sqlite_rows(metrics, twice) == [], "a batch was recorded twice"


def check_set_aside(bad: Path) -> None:
    """The two broken history files and the four topic values that are no event, each set
    aside with its reason (the trial checks that the metrics count all six)."""
    set_aside = sorted(bad.rglob("*.jsonl"))
    reasons = [json.loads(line)["reason"] for p in set_aside for line in p.read_text().splitlines()]
    assert len(reasons) == 6, reasons
    assert any("amount is string, not double" in reason for reason in reasons), reasons


def test_the_cdc_trial_loses_and_duplicates_nothing(tmp_path, postgres_server):
    """A table of 20,000 rows and the writer's changes on top, through three SIGKILLs, the
    source server restarted and the target away: every version once in the raw change
    stream, in order, which replays to the table, as the merged copy equals it. The slot
    was never past Spark's last commit at a kill (the trial checks it); the restarts
    continue the job's phase: four runs, each batch recorded once, the snapshot's batches
    backlog and the rest live, one transition. The slot is dropped at the end."""
    postgres_server.start()
    output = campaign("cdc", tmp_path, postgres_server.url)
    rows, versions, lost, duplicated, differs = compared(output, CDC_COMPARED)
    assert (lost, duplicated, differs) == (0, 0, 0)
    assert rows >= 20_000 and versions > rows, (rows, versions)
    for kind in ("snapshot", "insert", "update", "delete", "pairs"):
        assert re.search(rf"'{kind}': [1-9]", output), (kind, output)
    assert "teardown: dropped replication slot" in output

    metrics = tmp_path / "cdc-0" / "metrics.db"
    check_four_runs_recorded_once(metrics)
    query = "SELECT is_backlog FROM backlog_checkpoints ORDER BY batch_id"
    phases = [is_backlog for (is_backlog,) in sqlite_rows(metrics, query)]
    backlog = phases.count(1)
    assert backlog and phases == [1] * backlog + [0] * (len(phases) - backlog), phases
    transitions = sqlite_rows(metrics, "SELECT is_backlog FROM backlog_transitions ORDER BY at")
    assert transitions == [(1,), (0,)]
