from datetime import UTC, datetime, timedelta

from spark_jobs.metrics import history
from spark_jobs.metrics.schema import CheckpointRow, backlog_checkpoints, make_engine, metadata

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def row(
    job: str, batch_id: int, at: datetime, sources: str, recovered=None, run_id="run-2"
) -> dict:
    return CheckpointRow(
        job, run_id, batch_id, at, True, None, 1, 1, None, sources, None, recovered
    ).__dict__


def test_a_run_reads_the_last_recorded_sources_and_when_batches_were_recorded(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/metrics.db")
    metadata.create_all(engine)
    with engine.begin() as connection:
        assert history.last_sources(connection, "events") is None
        connection.execute(
            backlog_checkpoints.insert(),
            [
                row("events", 1, T0, '[{"name": "a"}]'),
                row("events", 2, T0 + timedelta(seconds=1), '[{"name": "b"}]'),
                # A recovered row knows no statuses: it is not where a run picks up.
                row("events", 3, T0 + timedelta(seconds=2), "[]", recovered=True),
                row("other", 2, T0 + timedelta(seconds=3), '[{"name": "c"}]'),
                row("events", 2, T0 - timedelta(days=1), "[]", run_id="run-1"),
            ],
        )
        assert history.last_sources(connection, "events") == '[{"name": "b"}]'
        times = history.commit_times(connection, "events", [2, 3, 9])
    assert {batch: sorted(at) for batch, at in times.items()} == {
        2: [T0 - timedelta(days=1), T0 + timedelta(seconds=1)],
        3: [T0 + timedelta(seconds=2)],
    }
    engine.dispose()
