"""The randomized CDC trials of the fault campaign (``scripts/chaos --kinds cdc-random``): one
source and one target server for all, a trial per seed, its line as it ends, and the figures
docs/faults.md reports: seeds, transactions, rows compared, lost, wrong, extra, failures by
name per reason, and the trials that broke (each with the seed that reproduces it).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.faults.cdc_random.trial import (
    SOURCE_SETTINGS,
    Servers,
    TrialResult,
    run_job_trial,
    run_model_trial,
)
from tools.pipelines.runs import local_spark_conf, say
from tools.services.postgres import PostgresServer

DRIVERS = ("model", "job", "both")
#: Of ``both``: one trial in this many runs the job itself, the others the model.
JOB_EVERY = 5


@dataclass(frozen=True)
class Summary:
    trials: int
    transactions: int
    rows: int
    lost: int
    wrong: int
    extra: int
    kills: int
    failed_by_name: dict[str, int]
    broken: list[int]

    @classmethod
    def of(cls, results: Sequence[TrialResult]) -> Summary:
        return cls(
            trials=len(results),
            transactions=sum(r.transactions for r in results),
            rows=sum(r.rows for r in results),
            lost=sum(r.lost for r in results),
            wrong=sum(r.wrong for r in results),
            extra=sum(r.extra for r in results),
            kills=sum(r.kills for r in results),
            failed_by_name=dict(Counter(r.failed_by_name for r in results if r.failed_by_name)),
            broken=[r.seed for r in results if not r.passed],
        )

    def as_json(self) -> dict[str, object]:
        return {
            "trials": self.trials,
            "transactions": self.transactions,
            "rows_compared": self.rows,
            "lost": self.lost,
            "wrong": self.wrong,
            "extra": self.extra,
            "kills": self.kills,
            "failed_by_name": self.failed_by_name,
            "broken_seeds": self.broken,
        }


def driver_of(driver: str, index: int) -> str:
    if driver != "both":
        return driver
    return "job" if index % JOB_EVERY == JOB_EVERY - 1 else "model"


def run(
    trials: int,
    rng: random.Random,
    workdir: Path,
    driver: str = "both",
    seeds: Sequence[int] = (),
    on_result: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """``trials`` trials on seeds drawn from ``rng`` (or ``seeds``, given), each printed."""
    chosen = list(seeds) or [rng.randrange(2**31) for _ in range(trials)]
    results = []
    with (
        PostgresServer(database="shop", settings=SOURCE_SETTINGS) as source,
        PostgresServer(database="warehouse") as target,
    ):
        servers = Servers(source.url, target.url, workdir)
        for index, seed in enumerate(chosen):
            which = driver_of(driver, index)
            if which == "model":
                result = run_model_trial(seed, servers)
            else:
                name = f"cdc-random-{seed}"
                conf = local_spark_conf(name, f"sqlite:///{workdir / f'{name}.db'}", {})
                result = run_job_trial(seed, servers, conf)
            say(f"  [{index + 1}/{len(chosen)}] {result.line()}")
            for example in result.examples:
                say(f"      {example}")
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def table(summary: Summary) -> list[str]:
    named = ", ".join(f"{reason}: {n}" for reason, n in sorted(summary.failed_by_name.items()))
    return [
        f"cdc-random: {summary.trials} seeds, {summary.transactions:,} transactions, "
        f"{summary.kills} kills, {summary.rows:,} rows compared",
        f"  lost {summary.lost}, wrong {summary.wrong}, extra {summary.extra}",
        f"  failed by name: {named or 'none'}",
        f"  broken: {', '.join(map(str, summary.broken)) or 'none'}",
    ]
