"""The operator graph of a streaming DataFrame, read from Spark's analyzed logical plan.

Only the shape matters for FLIP-327 propagation: unions, joins, one-input operators and
the source relations at the leaves. Hybrid sources are named by their ``name`` option,
as in their offsets, so their statuses land on the right leaves.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from spark_jobs.backlog.graph import Operator, OperatorGraph, OperatorKind

_KINDS = {"Union": OperatorKind.UNION, "Join": OperatorKind.JOIN}


def _children(node: Any) -> list[Any]:
    seq = node.children()
    return [seq.apply(i) for i in range(seq.size())]


#: Our sources and the name each takes when its ``name`` option is not given.
_GATED_DEFAULT_NAMES = {
    "hybrid": "hybrid",
    "backlog_kafka": "kafka",
    "postgres-cdc": "postgres-cdc",
}


def _source_name(node: Any, fallback: str) -> str:
    """Our source's ``name`` option (as in its offsets); other leaves keep ``fallback``."""
    try:
        default = _GATED_DEFAULT_NAMES.get(str(node.sourceName()))
        if default is not None:
            return str(node.extraOptions().get("name") or default)
    except Exception:  # not a DataSource V2 streaming relation
        pass
    return fallback


class SharedSourceName(ValueError):
    """Hybrid sources of one query share a name: their statuses would overwrite each other."""


def operator_graph(df: DataFrame) -> OperatorGraph:
    operators: list[Operator] = []

    def visit(node: Any) -> str:
        op_id = f"{node.nodeName()}#{len(operators)}"
        operators.append(Operator(op_id, OperatorKind.ONE_INPUT))  # placeholder keeps ids unique
        slot = len(operators) - 1
        inputs = tuple(visit(child) for child in _children(node))
        if not inputs:
            operators[slot] = Operator(op_id, OperatorKind.SOURCE, source=_source_name(node, op_id))
        elif len(inputs) == 1:
            operators[slot] = Operator(op_id, OperatorKind.ONE_INPUT, inputs)
        else:
            kind = _KINDS.get(str(node.nodeName()), OperatorKind.JOIN)
            operators[slot] = Operator(op_id, kind, inputs)
        return op_id

    visit(df._jdf.queryExecution().analyzed())
    names = [op.source for op in operators if op.kind is OperatorKind.SOURCE]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SharedSourceName(
            f"hybrid sources named {twice} are read more than once in this query; their "
            "statuses would overwrite each other: give each its own 'name' option"
        )
    return OperatorGraph(operators)
