"""A small fault campaign, as `scripts/chaos` runs it: one trial of each kind, faults
injected for real, and nothing lost or duplicated; for the CDC pipeline's trial, the merged
copy and the replayed change stream equal the source table.

The kills trial is also the suite's files-then-Kafka run killed in each phase (the file
phase, the lag-held backlog on the topic, live), and the malformed trial its quarantine of
bad files and topic values: their workspaces are read here for the job's transitions and
what was set aside."""

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAULTS = {
    "sigkill-files",
    "sigkill-kafka-backlog",
    "sigkill-live",
    "database-away",
    "database-away-at-shutdown",
    "skewed-second-driver",
    "brokers-down",
    "leaders-moved",
    "request-errors",
    "malformed-files",
    "malformed-records",
    "cdc-sigkill-snapshot",
    "cdc-sigkill-switch",
    "cdc-sigkill-changelog",
    "cdc-source-restart",
    "cdc-target-away",
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


def comparisons(output: str, pattern: re.Pattern[str]) -> dict[str, tuple[int, ...]]:
    """Per kind of trial, the numbers of its line that ``pattern`` matches: for the events
    pipeline, events compared, produced, lost, duplicated, with wrong amounts, and how many
    seconds the final watermark stayed behind the last event; for cdc, the source table's
    rows, the versions in the change stream, versions lost, changes duplicated, and keys
    where the copy or the replayed stream differs."""
    found: dict[str, tuple[int, ...]] = {}
    kind = None
    for line in output.splitlines():
        if line.startswith("["):
            kind = line[1:].split()[0]
        elif (match := pattern.match(line)) and kind is not None:
            found[kind] = tuple(int(group.replace(",", "")) for group in match.groups())
    return found


def test_one_trial_of_each_kind_loses_and_duplicates_nothing(tmp_path, postgres_server):
    postgres_server.start()
    campaign = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.chaos",
            "--trials",
            "1",
            "--kinds",
            "kills,database,skew,broker,malformed,cdc",
            "--events",
            "20000",
            "--seed",
            "11",
            "--workdir",
            str(tmp_path),
            "--postgres-url",
            postgres_server.url,
        ],
        cwd=REPO,  # python -m tools.chaos imports the tools from the checkout
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = campaign.stdout
    assert campaign.returncode == 0, output[-4000:] + campaign.stderr[-4000:]
    faults = json.loads(output.splitlines()[-1])
    assert set(faults) == FAULTS
    for fault, counts in faults.items():
        assert counts == {"trials": 1, "lost": 0, "duplicated": 0, "recovered": 1}, fault
    # The table a person reads holds the same numbers.
    assert "sigkill-kafka-backlog" in output and "recovered" in output

    # Each trial's sink equals the batch recomputation, sums of amounts included; for the
    # kills and the malformed input, over at least half of what was produced, with the
    # final watermark near the last event (a job stuck early would compare nearly nothing).
    compared = comparisons(output, COMPARED)
    assert set(compared) == {"kills", "database", "skew", "broker", "malformed"}, output
    for kind, (events, produced, lost, duplicated, wrong, behind_s) in compared.items():
        assert (lost, duplicated, wrong) == (0, 0, 0), kind
        if kind in ("kills", "malformed"):
            assert events >= 0.5 * produced, (kind, events, produced)
            assert behind_s <= 60, (kind, behind_s)

    # The CDC trial: a table of 20,000 rows and the writer's changes on top, every version
    # once in the raw change stream, which replays to the table, as the merged copy equals
    # it; the slot is dropped at the end.
    [(rows, versions, lost, duplicated, differs)] = comparisons(output, CDC_COMPARED).values()
    assert (lost, duplicated, differs) == (0, 0, 0)
    assert rows >= 20_000 and versions > rows, (rows, versions)
    assert "teardown: dropped replication slot" in output

    # Killed in the file phase, in the topic's backlog and live: four runs of one job. The
    # first records the job's first status; the restarts continue it, so the next change
    # is the switch to live, whichever run made it. The topic piles up while a killed run
    # restarts: the job may re-enter backlog by its lag then, and leave it again.
    kills = tmp_path / "kills-0" / "metrics" / "metrics.db"
    [(runs,)] = sqlite_rows(kills, "SELECT COUNT(DISTINCT run_id) FROM backlog_checkpoints")
    assert runs == 4
    twice = "SELECT batch_id FROM backlog_checkpoints GROUP BY batch_id HAVING COUNT(*) > 1"
    assert sqlite_rows(kills, twice) == [], "a batch was recorded twice"
    reasons = sqlite_rows(kills, "SELECT is_backlog, reason FROM backlog_transitions ORDER BY at")
    assert reasons[:2] == [
        (1, "hybrid-phase: events is in backlog (history)"),
        (0, "offset-lag: events is live (kafka)"),
    ]
    assert reasons[2:] == [
        (1, "offset-lag: events is in backlog (kafka)"),
        (0, "offset-lag: events is live (kafka)"),
    ] * (len(reasons[2:]) // 2)

    # The two broken history files and the four topic values that are no event, each set
    # aside with its reason (the trial checks that the metrics count all six).
    set_aside = sorted((tmp_path / "malformed-0" / "bad").rglob("*.jsonl"))
    reasons = [json.loads(line)["reason"] for p in set_aside for line in p.read_text().splitlines()]
    assert len(reasons) == 6, reasons
    assert any("amount is string, not double" in reason for reason in reasons), reasons
