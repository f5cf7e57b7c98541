"""A small fault campaign, as `scripts/chaos` runs it: one trial of each kind, faults
injected for real, and nothing lost or duplicated."""

import json
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
}


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
            "kills,database,skew,broker,malformed",
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
        timeout=1500,
    )
    output = campaign.stdout
    assert campaign.returncode == 0, output[-4000:] + campaign.stderr[-4000:]
    faults = json.loads(output.splitlines()[-1])
    assert set(faults) == FAULTS
    for fault, counts in faults.items():
        assert counts == {"trials": 1, "lost": 0, "duplicated": 0, "recovered": 1}, fault
    # The table a person reads holds the same numbers.
    assert "sigkill-kafka-backlog" in output and "recovered" in output
