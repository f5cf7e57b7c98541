import pytest

from spark_jobs.backlog.graph import Operator, OperatorGraph, OperatorKind
from spark_jobs.backlog.status import BacklogModel, SourceStatus

SOURCE, ONE, JOIN, UNION = (
    OperatorKind.SOURCE,
    OperatorKind.ONE_INPUT,
    OperatorKind.JOIN,
    OperatorKind.UNION,
)


def two_sources(history_backlog: bool, live_backlog: bool, finished: bool = False) -> BacklogModel:
    model = BacklogModel()
    model.report(SourceStatus("history", is_backlog=history_backlog, finished=finished))
    model.report(SourceStatus("live", is_backlog=live_backlog))
    return model


def graph_with(kind: OperatorKind) -> OperatorGraph:
    return OperatorGraph(
        [
            Operator("scan-h", SOURCE, source="history"),
            Operator("scan-l", SOURCE, source="live"),
            Operator("parse-h", ONE, ("scan-h",)),
            Operator("combine", kind, ("parse-h", "scan-l")),
            Operator("aggregate", ONE, ("combine",)),
        ]
    )


def test_one_input_operators_pass_their_input_status():
    statuses = graph_with(UNION).propagate(two_sources(True, False))
    assert statuses["scan-h"] and statuses["parse-h"]
    assert not statuses["scan-l"]


@pytest.mark.parametrize(
    ("history", "live", "expected"),
    [(True, True, True), (True, False, True), (False, True, True), (False, False, False)],
)
def test_a_join_is_in_backlog_if_any_input_is(history, live, expected):
    statuses = graph_with(JOIN).propagate(two_sources(history, live))
    assert statuses["combine"] is expected
    assert statuses["aggregate"] is expected


@pytest.mark.parametrize(
    ("history", "live", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
def test_a_union_is_in_backlog_only_if_all_inputs_are(history, live, expected):
    statuses = graph_with(UNION).propagate(two_sources(history, live))
    assert statuses["combine"] is expected
    assert statuses["aggregate"] is expected


def test_a_finished_source_propagates_as_not_in_backlog():
    statuses = graph_with(JOIN).propagate(two_sources(True, False, finished=True))
    assert not statuses["scan-h"]
    assert not statuses["aggregate"]


def test_job_status_and_union_status_differ_as_flip_309_and_327_say():
    model = two_sources(True, False)
    assert model.job_is_backlog()  # FLIP-309: any source
    assert not graph_with(UNION).propagate(model)["aggregate"]  # FLIP-327: union needs all


def test_describe_lists_operators_inputs_first():
    text = graph_with(JOIN).describe(two_sources(True, False))
    assert text == (
        "scan-h[history]=backlog, scan-l[live]=live, parse-h=backlog, combine=backlog, "
        "aggregate=backlog"
    )
    assert graph_with(JOIN).source_names() == ["history", "live"]


@pytest.mark.parametrize(
    ("operators", "message"),
    [
        ([Operator("a", ONE, ())], "has 0 inputs; allowed: 1"),
        ([Operator("s", SOURCE, source="x"), Operator("u", UNION, ("s",))], "at least 2"),
        ([Operator("s", SOURCE)], "must name its source"),
        ([Operator("a", ONE, ("missing",))], "unknown operator 'missing'"),
        ([Operator("a", ONE, ("b",)), Operator("b", ONE, ("a",))], "cycle"),
    ],
)
def test_invalid_graphs_are_refused(operators, message):
    with pytest.raises(ValueError, match=message):
        OperatorGraph(operators)
