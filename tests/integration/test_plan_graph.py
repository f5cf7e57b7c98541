"""The operator graph read from a real query plan, and FLIP-327 propagation over it."""

import json

import pytest

from spark_jobs.backlog.graph import OperatorKind
from spark_jobs.backlog.status import BacklogModel, SourceStatus
from spark_jobs.coordinator.plan_graph import operator_graph
from spark_jobs.sources.hybrid import HybridDataSource


def hybrid(spark, tmp_path, name):
    spark.dataSource.register(HybridDataSource)
    children = [{"name": "files", "kind": "files", "path": str(tmp_path / name)}]
    return (
        spark.readStream.format("hybrid")
        .schema("id BIGINT, key STRING")
        .option("name", name)
        .option("sources", json.dumps(children))
        .option("stateLocation", str(tmp_path / "state" / name))
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
