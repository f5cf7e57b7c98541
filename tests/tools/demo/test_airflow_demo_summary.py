"""What ``scripts/demo`` prints of the job's runs, and how long it follows the live one:
the steady live freshness beside each run's live interval, read from the checkpoints."""

import sqlalchemy as sa

from tools import REPOSITORY
from tools.demo.airflow_demo import DAG_ID, LIVE_RUN_S, Follower, live_run_followed, run_lines
from tools.pipelines.report import Checkpoint


def batch(
    run_id: str, batch_id: int, start: float, interval_s: float | None, age_s: float
) -> Checkpoint:
    """A 1 s batch of ``run_id``, live at ``interval_s`` (None: in backlog), whose events
    were all ``age_s`` old at its commit; 100,000 rows in backlog, 4,000 live."""
    committed = start + 1
    backlog = interval_s is None
    return Checkpoint(
        batch_id,
        start,
        committed,
        backlog,
        100_000 if backlog else 4000,
        0,
        (committed - age_s,),
        run_id=run_id,
        interval_ms=None if backlog else round(interval_s * 1000),
    )


def relaunched_job() -> list[Checkpoint]:
    """A backlog run live at 5 s from 15 s on, then a relaunched run live at 2 s whose first
    batches serve the events that piled up while it took over (8 s, then 6 s old)."""
    first = [
        batch("launch.1.a", 0, 0, None, 900),
        *(batch("launch.1.a", i, 10 + 5 * i, 5, 4) for i in range(1, 5)),
    ]
    ages = [8, 6, 3, 2.5, 2.5, 2, 2.5, 2.5]
    second = [batch("relaunch.1.b", 5 + i, 40 + 2 * i, 2, age) for i, age in enumerate(ages)]
    return first + second


def test_each_run_shows_its_steady_live_freshness_beside_its_live_interval():
    assert run_lines(relaunched_job()) == [
        "run                                  checkpoints  in backlog        rows  live interval  "
        "steady live freshness p50, p95",
        "launch.1.a                                     5           1     116,000  5 s            "
        "4.0 s, 4.0 s (2 checkpoints)",
        "relaunch.1.b                                   8           0      32,000  2 s            "
        "2.5 s, 2.5 s (4 checkpoints)",
    ]


def test_a_run_that_never_turned_live_has_no_steady_freshness():
    (_, line) = run_lines([batch("launch.1.a", 0, 0, None, 900)])
    assert line.endswith("  -              -")


def test_the_live_run_is_followed_from_its_own_first_checkpoint():
    job = relaunched_job()  # the relaunched run's first checkpoint commits at 41
    assert not live_run_followed(job, now=41 + 35.9, seconds=36)
    assert live_run_followed(job, now=41 + 36, seconds=36)
    assert live_run_followed([], now=0, seconds=36)


def test_the_running_page_quotes_the_runs_table_and_how_long_the_live_run_is_followed():
    page = (REPOSITORY / "docs" / "running.md").read_text(encoding="utf-8")
    assert f"\n      {run_lines([])[0]}\n" in page
    assert f"the live profile's run has run {LIVE_RUN_S:g} s" in page


def test_a_second_demo_in_a_workspace_follows_only_its_own_dag_run(tmp_path):
    """The workspace keeps Airflow's database: the previous demo's run is not this one's."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'airflow.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE dag_run (dag_id TEXT, run_id TEXT)")
        connection.exec_driver_sql(
            "CREATE TABLE task_instance (dag_id TEXT, run_id TEXT, task_id TEXT, state TEXT, "
            "start_date TEXT)"
        )
        connection.exec_driver_sql(f"INSERT INTO dag_run VALUES ('{DAG_ID}', 'manual__1')")
        for task in ("launch", "wait_live", "relaunch"):
            connection.exec_driver_sql(
                "INSERT INTO task_instance VALUES (?, 'manual__1', ?, 'failed', '2026-11-27')",
                (DAG_ID, task),
            )
    follower = Follower(tmp_path, f"sqlite:///{tmp_path / 'metrics.db'}")
    assert follower.task_states() == {}
    with engine.begin() as connection:
        connection.exec_driver_sql(f"INSERT INTO dag_run VALUES ('{DAG_ID}', 'manual__2')")
        connection.exec_driver_sql(
            "INSERT INTO task_instance VALUES (?, 'manual__2', 'launch', 'running', '2026-11-28')",
            (DAG_ID,),
        )
    engine.dispose()
    assert follower.task_states() == {"launch": "running"}
