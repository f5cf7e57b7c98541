"""How fresh live data stays while a job is relaunched: the relaunch protocols side by side.

For each protocol the events pipeline runs live from a landing directory (a small file
backlog first, then ``--live-events-per-s`` arriving), launched by ``BacklogLaunchOperator``
exactly as a DAG launches it (Airflow's connections from the environment). Once it has
followed live data for ``--live-before``, ``BacklogRelaunchOperator`` relaunches it with
the same live interval:

- break-before-make: stop the running run, wait until its driver has ended, launch again;
- make-before-break: launch the next run first; it warms up and stands by, then the
  running one is stopped and the standby takes over at once.

``--live-after`` later the producer stops and the job is stopped. Reported per protocol,
over the checkpoints committed from the relaunch's start until ``--live-after`` after the
new run's first: the largest and p95 live freshness (seconds from an event to the commit
of its batch, from each batch's event-time quantiles), the gap from the old run's last
checkpoint to the new run's first, and whether every event landed exactly once (the sink
against a recomputation over the input). The target: the largest freshness at most twice
the live interval plus 2 s. A chart of freshness over time around the relaunch goes to
``<workdir>/relaunch-freshness.png``. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import sqlalchemy as sa

import spark_jobs.jobs.events_pipeline as events_pipeline
from spark_jobs.backlog.values import duration_argument, format_duration
from spark_jobs.jobs.startup import JavaMissing
from spark_jobs.metrics.schema import backlog_checkpoints, make_engine
from tools.data.events import LiveProducer
from tools.data.verify import Inputs, all_input, committed_output, compare
from tools.pipelines.report import (
    Checkpoint,
    caught_up,
    freshness_s,
    load,
    save_chart,
    weighted_percentile,
)
from tools.pipelines.runs import add_workspace_arguments, prepare_workspace, say

JOB = "events"
PROTOCOLS = ("break-before-make", "make-before-break")
#: The pipeline's window (its default): the recomputation groups events the same way.
WINDOW_S = 10.0


@dataclass(frozen=True)
class Result:
    protocol: str
    old_run_id: str
    new_run_id: str
    relaunch_s: float
    gap_s: float
    freshness_max_s: float
    freshness_p95_s: float
    events: int
    lost: int
    duplicated: int

    @property
    def exactly_once(self) -> bool:
        return self.lost == self.duplicated == 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/relaunch-benchmark",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_workspace_arguments(parser, "var/relaunch-benchmark", events=20_000)
    parser.add_argument("--interval", type=duration_argument, default=1.0, help="live interval")
    parser.add_argument(
        "--live-before", type=duration_argument, default=15.0, help="live time before relaunching"
    )
    parser.add_argument(
        "--live-after",
        type=duration_argument,
        default=20.0,
        help="live time measured after the new run's first checkpoint",
    )
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    return parser.parse_args(argv)


def connect_airflow(root: Path, metrics_url: str) -> None:
    """Airflow's home and the operators' connections, before Airflow is imported."""
    os.environ["AIRFLOW_HOME"] = str(root / "airflow")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
        {"conn_type": "spark", "host": "local[2]"}
    )
    os.environ["AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT"] = json.dumps(
        {"conn_type": "backlog_metrics", "extra": {"url": metrics_url}}
    )
    bin_dir = os.path.dirname(sys.executable)  # spark-submit next to this interpreter
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def run_ids(metrics_url: str) -> dict[int, str]:
    """Each checkpoint's run, by batch."""
    table = backlog_checkpoints
    engine = make_engine(metrics_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(table.c.batch_id, table.c.run_id).where(table.c.job_name == JOB)
            ).all()
    finally:
        engine.dispose()
    return {row.batch_id: row.run_id for row in rows}


def wait_until(what: str, condition, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.5)


def probe(
    protocol: str, args: argparse.Namespace, history: Path, first_live_id: int
) -> tuple[Result, list[Checkpoint], float]:
    """One protocol's run; its result, its checkpoints and when the old run committed its
    last checkpoint."""
    from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook
    from airflow_provider_backlog.operators.launch import (
        BacklogLaunchOperator,
        BacklogRelaunchOperator,
    )
    from airflow_provider_backlog.profiles import PhaseProfile

    root = args.workdir.resolve() / protocol
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    metrics_url = f"sqlite:///{root / 'metrics.db'}"
    connect_airflow(root, metrics_url)
    landing = root / "landing"
    interval = format_duration(args.interval)
    common = {
        "job_name": JOB,
        "application": events_pipeline.__file__,
        "application_args": [
            *("--history", str(history), "--landing", str(landing)),
            *("--output", str(root / "output"), "--checkpoint", str(root / "checkpoint")),
        ],
        "driver_log_dir": str(root / "drivers"),
        "poll_interval_s": 0.5,
    }
    ui_off = {"spark.ui.enabled": "false"}
    producer = LiveProducer(landing, first_live_id, args.live_events_per_s, file_every_s=0.25)
    producer.start()
    metrics = BacklogMetricsHook()
    try:
        say(f"[{protocol}] launching the job (interval {interval} live, 30 s in backlog)")
        launched = BacklogLaunchOperator(
            task_id="launch",
            profile=PhaseProfile(interval, "30s", conf=ui_off),
            **common,
        ).execute({})
        wait_until(
            f"[{protocol}] live for {args.live_before:g} s",
            lambda: _live_for(load(metrics_url, JOB)[0], args.live_before),
            300,
        )
        say(f"[{protocol}] live for {args.live_before:g} s: relaunching")
        relaunch_at = time.time()
        relaunched = BacklogRelaunchOperator(
            task_id="relaunch",
            profile=PhaseProfile(interval, conf=ui_off),
            make_before_break=protocol == "make-before-break",
            **common,
        ).execute({})
        relaunch_s = time.time() - relaunch_at
        new_run = relaunched["run_id"]
        say(f"[{protocol}] relaunched in {relaunch_s:.1f} s as run {new_run}")
        time.sleep(args.live_after)
        say(f"[{protocol}] stopping the live producer, then the job")
        producer.stop()
        time.sleep(max(2.0, 3 * args.interval))  # the last landing files are taken
        metrics.stop(JOB, answer_timeout_s=60, stop_timeout_s=120, poll_s=0.5)
    finally:
        if producer.is_alive():
            producer.stop()
        if metrics.live_run(JOB) is not None:  # a failed relaunch: end whatever runs
            metrics.stop(JOB, answer_timeout_s=60, stop_timeout_s=120, poll_s=0.5)
    checkpoints = load(metrics_url, JOB)[0]
    runs = run_ids(metrics_url)
    old = [c for c in checkpoints if runs[c.batch_id] == launched["run_id"]]
    new = [c for c in checkpoints if runs[c.batch_id] == new_run]
    gap_s = new[0].committed_at - old[-1].committed_at
    until = new[0].committed_at + args.live_after
    around = [c for c in checkpoints if relaunch_at <= c.committed_at <= until and not c.is_backlog]
    samples = freshness_s(around)
    watermark = next(c.watermark for c in reversed(checkpoints) if c.watermark is not None)
    comparison = compare(
        committed_output(root / "output"),
        all_input(Inputs(history=history, landing=landing)),
        WINDOW_S,
        watermark,
    )
    result = Result(
        protocol=protocol,
        old_run_id=launched["run_id"],
        new_run_id=new_run,
        relaunch_s=round(relaunch_s, 2),
        gap_s=round(gap_s, 2),
        freshness_max_s=round(max(value for value, _ in samples), 2),
        freshness_p95_s=round(weighted_percentile(samples, 0.95), 2),
        events=comparison.produced,
        lost=comparison.lost,
        duplicated=comparison.duplicated + comparison.wrong_amounts,
    )
    return result, checkpoints, old[-1].committed_at


def _live_for(checkpoints: list[Checkpoint], seconds: float) -> bool:
    live = caught_up(checkpoints)
    return bool(live) and live[-1].committed_at - live[0].committed_at >= seconds


def plot_freshness(
    runs: Sequence[tuple[Result, list[Checkpoint], float]], target_s: float, path: Path
) -> Path:
    """Each live batch's largest and median freshness, by commit time from the old run's
    last checkpoint, one line per protocol; the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(11, 4.5))
    for (result, checkpoints, handover_at), colour in zip(
        runs, ("#b5651d", "#2b7bb9"), strict=False
    ):
        live = [c for c in checkpoints if not c.is_backlog and c.event_time_quantiles_s]
        at = [c.committed_at - handover_at for c in live]
        oldest = [c.committed_at - min(c.event_time_quantiles_s) for c in live]
        axis.plot(at, oldest, ".-", color=colour, lw=1, ms=4, label=f"{result.protocol}: largest")
        median_age = [
            c.committed_at - sorted(c.event_time_quantiles_s)[len(c.event_time_quantiles_s) // 2]
            for c in live
        ]
        axis.plot(at, median_age, ":", color=colour, lw=1, label=f"{result.protocol}: median")
    axis.axvline(0, color="#7a1fa2", lw=1, ls="--")
    axis.annotate(
        " the old run's last checkpoint", (0, 1), xycoords=("data", "axes fraction"), va="top"
    )
    axis.axhline(target_s, color="#555555", lw=1, ls="--", label=f"target {target_s:g} s")
    axis.set_xlim(-30, None)
    axis.set_xlabel("seconds from the old run's last checkpoint (commit time)")
    axis.set_ylabel("live freshness (s)")
    axis.set_title("Live freshness around a relaunch")
    axis.legend(fontsize="small")
    return save_chart(figure, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.files = min(args.files, 8)
    try:
        workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"relaunch-benchmark: {error}", file=sys.stderr)
        return 2
    target_s = 2 * args.interval + 2
    runs = [
        probe(protocol, args, workspace.root / "history", workspace.first_live_id)
        for protocol in args.protocols
    ]
    chart = plot_freshness(runs, target_s, workspace.root / "relaunch-freshness.png")
    say("")
    say(
        f"{'protocol':<18} {'relaunch (s)':>12} {'gap (s)':>8} {'max fresh (s)':>13} "
        f"{'p95 fresh (s)':>13} {'exactly once':>12}"
    )
    for result, _, _ in runs:
        say(
            f"{result.protocol:<18} {result.relaunch_s:>12.2f} {result.gap_s:>8.2f} "
            f"{result.freshness_max_s:>13.2f} {result.freshness_p95_s:>13.2f} "
            f"{'yes' if result.exactly_once else 'NO':>12}"
        )
    say(f"target: largest freshness at most {target_s:g} s (2 x interval + 2 s); chart: {chart}")
    summary = {
        "interval_s": args.interval,
        "live_events_per_s": args.live_events_per_s,
        "target_s": target_s,
        "chart": str(chart),
        "protocols": {
            r.protocol: {**asdict(r), "exactly_once": r.exactly_once, "met": False}
            for r, _, _ in runs
        },
    }
    for r, _, _ in runs:
        summary["protocols"][r.protocol]["met"] = r.freshness_max_s <= target_s and r.exactly_once
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
