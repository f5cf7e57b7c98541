"""The randomized CDC test's short run (``tools/faults/cdc_random``): tables drawn from
seeds, copied while concurrent writers change them, faults at random points, each copy
compared with its table value by value, or the job failed by name for a reason
docs/limits.md lists.

The campaign (``scripts/chaos --kinds cdc-random``) draws new seeds; a seed that found a
defect of the copy joins ``FOUND`` and runs here from then on, in the driver that found it:
the model's through the campaign's own entry point, the job's as tests of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer
from tools.faults.cdc_random.trial import SOURCE_SETTINGS, Servers, run_job_trial, run_model_trial
from tools.pipelines.runs import local_spark_conf

REPO = Path(__file__).resolve().parents[2]

#: Seeds that found a defect of the copy, with what they found.
FOUND = {
    # A query started again after its table's key changed read its chunks with the new
    # shape before any check (int('bba ')).
    210: "model",
    # The last refresh a busy table's batch could make ran the batch on past rows written
    # meanwhile, which went out without their TOASTed values (a merge failing by key).
    1331: "model",
    # A narrowed type of a partitioned table, altered while the source read its catalog:
    # the read locked the partitions before the table and deadlocked with the ALTER.
    936144273: "model",
    # A new key made while the job's first start read the table and before its first plan:
    # the target took the old key and left the new column out, without a word (when the
    # kill lands before the slot is made; the check is timing-free in test_cdc_pipeline).
    1148477084: "job",
}
#: Seeds of no finding: the short run's spread of shapes (keys, identities, partitions,
#: generated columns, both targets, a change of shape refused by name). A job trial costs
#: two JVMs (about 20 s), so the job's one here is the seed it found; the campaign's long
#: run makes one trial in five as the job.
SPREAD = {20: "model", 206: "model", 274: "model"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    with (
        PostgresServer(database="shop", settings=SOURCE_SETTINGS) as source,
        PostgresServer(database="warehouse") as target,
    ):
        yield Servers(source.url, target.url, tmp_path_factory.mktemp("cdc-random"))


def run(seed: int, driver: str, servers: Servers, workdir: Path):  # type: ignore[no-untyped-def]
    if driver == "model":
        return run_model_trial(seed, servers)
    name = f"cdc-random-{seed}"
    return run_job_trial(seed, servers, local_spark_conf(name, f"sqlite:///{workdir}/m.db", {}))


def found_by(driver: str) -> list[int]:
    return sorted(seed for seed, by in FOUND.items() if by == driver)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("seed", "driver"), sorted({**SPREAD, **dict.fromkeys(found_by("job"), "job")}.items())
)
def test_a_random_workload_is_copied_exactly_or_refused_by_name(seed, driver, servers, tmp_path):
    result = run(seed, driver, servers, tmp_path)
    print(result.line())
    assert result.passed, (result.line(), result.examples)
    assert result.rows > 0 or result.failed_by_name is not None
    assert result.transactions > 0


def test_the_campaign_runs_the_seeds_the_model_found_again_and_reports_its_figures(tmp_path):
    """``scripts/chaos --kinds cdc-random --cdc-seeds``: the long run's entry point, whose
    last line is the JSON docs/faults.md takes its figures from."""
    seeds = found_by("model")
    found = subprocess.run(
        [sys.executable, "-m", "tools.faults.chaos", "--kinds", "cdc-random",
         "--cdc-driver", "model", "--cdc-seeds", ",".join(map(str, seeds)),
         "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stdout[-3000:] + found.stderr[-3000:]
    figures = json.loads(found.stdout.splitlines()[-1])["cdc-random"]
    assert figures["trials"] == len(seeds) and figures["broken_seeds"] == []
    assert figures["lost"] == figures["wrong"] == figures["extra"] == 0
    assert figures["transactions"] > 0 and figures["rows_compared"] > 0
    for seed in seeds:
        assert f"seed {seed} (model, " in found.stdout
