"""The operator graph read from a real query plan, FLIP-327 propagation over it, and the
batch-row cap shared by the sources it names."""

import json
import logging

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from pyspark.sql import functions as F

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.graph import OperatorKind
from spark_jobs.backlog.status import BacklogModel, SourceStatus
from spark_jobs.coordinator.plan_graph import operator_graph
from spark_jobs.coordinator.runtime import STOPPED_AT_TIMEOUT, BacklogRuntime
from spark_jobs.coordinator.spark_logging import TRIGGER_LOGGER
from spark_jobs.metrics.schema import backlog_checkpoints, backlog_transitions, make_engine
from spark_jobs.sources.gate import PlanChannel
from spark_jobs.sources.hybrid import HybridDataSource


def hybrid(spark, tmp_path, name: str, runtime: BacklogRuntime | None = None):
    """A hybrid source over the JSON files in ``tmp_path/name``, gated by ``runtime``."""
    spark.dataSource.register(HybridDataSource)
    children = [{"name": "files", "kind": "files", "path": str(tmp_path / name), "format": "json"}]
    return (
        spark.readStream.format("hybrid")
        .schema("id BIGINT, key STRING")
        .options(**(runtime.source_options() if runtime else {}))
        .option("name", name)
        .option("sources", json.dumps(children))
        .option("stateLocation", str(tmp_path / "checkpoint" / "state" / name))
        .load()
    )


def test_union_and_join_of_two_hybrid_sources(spark, tmp_path):
    history = hybrid(spark, tmp_path, "history")
    live = hybrid(spark, tmp_path, "live")
    union = history.union(live).groupBy("key").count()
    join = history.join(live.withColumnRenamed("id", "other"), "key")

    union_graph = operator_graph(union)
    kinds = {op.kind for op in union_graph.operators}
    assert OperatorKind.UNION in kinds and OperatorKind.JOIN not in kinds
    assert sorted(union_graph.source_names()) == ["history", "live"]
    join_graph = operator_graph(join)
    assert OperatorKind.JOIN in {op.kind for op in join_graph.operators}

    model = BacklogModel()
    model.report(SourceStatus("history", is_backlog=True))
    model.report(SourceStatus("live", is_backlog=False))
    assert union_graph.propagate(model)[root(union_graph)] is False
    assert join_graph.propagate(model)[root(join_graph)] is True


def root(graph):
    """The sink side: inputs come before their consumers, so the root comes last."""
    return graph.operators[-1].id


def test_two_hybrid_sources_with_one_name_are_refused(spark, tmp_path):
    first = hybrid(spark, tmp_path, "events")
    second = hybrid(spark, tmp_path / "elsewhere", "events")
    with pytest.raises(ValueError, match=r"hybrid sources named \['events'\] are read more"):
        operator_graph(first.union(second))


def write_files(directory, first_id: int, files: int, rows: int) -> list[int]:
    directory.mkdir(parents=True)
    ids = []
    for index in range(files):
        batch = range(first_id + index * rows, first_id + (index + 1) * rows)
        lines = [json.dumps({"id": i, "key": f"k{i % 7}"}) for i in batch]
        (directory / f"part-{index:03d}.json").write_text("\n".join(lines) + "\n")
        ids.extend(batch)
    return ids


def gated_runtime(spark, tmp_path, job: str, conf: dict[str, str] | None = None):
    """A runtime holding the lease of ``tmp_path/checkpoint``, its metrics in SQLite there."""
    config = BacklogConfig.from_spark_conf(
        {
            "spark.backlog.job-name": job,
            "spark.backlog.metrics.url": f"sqlite:///{tmp_path}/metrics.db",
            "spark.backlog.checkpointing.interval": "1s",
            "spark.backlog.checkpointing.interval-during-backlog": "1min",
            **(conf or {}),
        }
    )
    runtime = BacklogRuntime(spark, config)
    runtime.hold_lease(str(tmp_path / "checkpoint"))
    return runtime


def run_until_idle(runtime, df, tmp_path) -> None:
    """Start ``df`` gated, without naming its operator graph, into parquet until idle."""
    writer = (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "output"))
        .option("checkpointLocation", str(tmp_path / "checkpoint" / "spark"))
    )
    try:
        runtime.start_gated(writer)
        runtime.await_termination(stop_when_idle_s=2, timeout_s=240)
    finally:
        runtime.close()


def test_max_batch_rows_bounds_a_batch_of_two_sources_in_backlog(spark, tmp_path):
    """Two sources in backlog, read by one query: the cap holds for the whole batch,
    shared between them, not for each (which would double it)."""
    ids = write_files(tmp_path / "orders", 0, 8, 2_000)
    ids += write_files(tmp_path / "refunds", 100_000, 8, 2_000)
    cap = {"spark.backlog.checkpointing.max-batch-rows": "5000"}
    log4j = spark._jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(TRIGGER_LOGGER, log4j.Level.WARN)  # as by default
    runtime = gated_runtime(spark, tmp_path, "two-sources", cap)
    both = hybrid(spark, tmp_path, "orders", runtime).union(
        hybrid(spark, tmp_path, "refunds", runtime)
    )
    run_until_idle(runtime, both, tmp_path)

    url = f"sqlite:///{tmp_path}/metrics.db"
    rows = [r["num_input_rows"] for r in checkpoint_rows(url)]
    assert sum(rows) == len(ids)
    assert max(rows) <= 5_000, rows
    assert len(rows) >= len(ids) // 5_000, "batches are as large as the cap allows"
    written = committed_output_ids(tmp_path / "output")
    assert sorted(written) == sorted(ids)
    # Its trigger is the gate's tick, which every batch outlasts: Spark's warning that the
    # batch is falling behind would be a false alarm after nearly every batch.
    assert log4j.LogManager.getLogger(TRIGGER_LOGGER).getLevel().toString() == "ERROR"
    # Started without a graph, the runtime read it from the query's plan: the first
    # batch was shared, and the transition records each operator's status.
    [transition] = transition_rows(url)
    assert json.loads(transition["operators"]) == [
        {
            "id": "StreamingRelationV2#1",
            "kind": "source",
            "source": "orders",
            "inputs": [],
            "is_backlog": False,
        },
        {
            "id": "StreamingRelationV2#2",
            "kind": "source",
            "source": "refunds",
            "inputs": [],
            "is_backlog": False,
        },
        {
            "id": "Union#0",
            "kind": "union",
            "source": None,
            "inputs": ["StreamingRelationV2#1", "StreamingRelationV2#2"],
            "is_backlog": False,
        },
    ]


def test_a_plan_too_deep_to_read_costs_the_job_its_operator_statuses_only(spark, tmp_path, caplog):
    """The operator graph is read by recursion over the analyzed plan: a plan deeper than
    Python's recursion limit cannot be read, and the job runs on without it."""
    ids = write_files(tmp_path / "orders", 0, 2, 100)
    runtime = gated_runtime(spark, tmp_path, "deep")
    deep = hybrid(spark, tmp_path, "orders", runtime)
    for bound in range(600):
        deep = deep.filter(F.col("id") >= -bound)
    with caplog.at_level(logging.WARNING, logger="spark_jobs.coordinator.runtime"):
        run_until_idle(runtime, deep, tmp_path)

    assert "cannot read the query's operator graph (RecursionError: " in caplog.text
    assert STOPPED_AT_TIMEOUT not in caplog.text  # it stopped because it was idle
    url = f"sqlite:///{tmp_path}/metrics.db"
    assert sum(r["num_input_rows"] for r in checkpoint_rows(url)) == len(ids)
    assert [t["operators"] for t in transition_rows(url)] == [None]
    assert sorted(committed_output_ids(tmp_path / "output")) == ids


def checkpoint_rows(url: str) -> list[dict]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(backlog_checkpoints).order_by(backlog_checkpoints.c.batch_id)
        )
        result = [dict(r._mapping) for r in rows]
    engine.dispose()
    return result


def transition_rows(url: str) -> list[dict]:
    engine = make_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(sa.select(backlog_transitions).order_by(backlog_transitions.c.id))
        result = [dict(r._mapping) for r in rows]
    engine.dispose()
    return result


def committed_output_ids(output) -> list[int]:
    files = {
        json.loads(line)["path"].removeprefix("file://")
        for log in sorted((output / "_spark_metadata").glob("[0-9]*"))
        for line in log.read_text().splitlines()[1:]
    }
    return ds.dataset(sorted(files), format="parquet").to_table().column("id").to_pylist()


def test_a_run_stopping_when_idle_holds_its_gated_sources_before_the_last_batch_ends(
    spark, tmp_path, monkeypatch
):
    """The stop holds the gate first, so a trigger starting during the last batch plans
    nothing: every offset Spark logged has its commit."""
    held: list[bool] = []
    hold = PlanChannel.hold

    def recorded_hold(channel: PlanChannel) -> None:
        held.append(runtime.query.isActive)
        hold(channel)

    monkeypatch.setattr(PlanChannel, "hold", recorded_hold)
    ids = write_files(tmp_path / "orders", 0, 4, 500)
    runtime = gated_runtime(spark, tmp_path, "held-at-stop")
    run_until_idle(runtime, hybrid(spark, tmp_path, "orders", runtime), tmp_path)

    assert held[:1] == [True], "the gate is held while the query still runs, before stop()"
    spark_log = tmp_path / "checkpoint" / "spark"
    offsets = sorted(int(p.name) for p in (spark_log / "offsets").glob("[0-9]*"))
    commits = sorted(int(p.name) for p in (spark_log / "commits").glob("[0-9]*"))
    assert offsets == commits and offsets
    assert sorted(committed_output_ids(tmp_path / "output")) == sorted(ids)


def test_a_run_stopped_by_its_timeout_says_so(spark, tmp_path, caplog):
    """A run its timeout stopped ended short of idle: its log says which, so no one takes
    what it committed for all there was."""
    write_files(tmp_path / "orders", 0, 2, 100)
    runtime = gated_runtime(spark, tmp_path, "timed-out")
    writer = (
        hybrid(spark, tmp_path, "orders", runtime)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "output"))
        .option("checkpointLocation", str(tmp_path / "checkpoint" / "spark"))
    )
    try:
        runtime.start_gated(writer)
        with caplog.at_level(logging.WARNING, logger="spark_jobs.coordinator.runtime"):
            runtime.await_termination(stop_when_idle_s=60, timeout_s=0)
        assert not runtime.query.isActive
    finally:
        runtime.close()
    assert STOPPED_AT_TIMEOUT in caplog.text
