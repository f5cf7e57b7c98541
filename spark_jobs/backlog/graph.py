"""FLIP-327 propagation of backlog status through a job's operator graph.

A one-input operator (map, filter, aggregate) has its input's status; a join is in backlog
if any input is (its output is fresh only when every side is); a union only if all inputs
are (it still emits fresh records from a live input). A finished source emits nothing
more, so it counts as not in backlog.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from spark_jobs.backlog.status import BacklogModel


class OperatorKind(StrEnum):
    SOURCE = "source"
    ONE_INPUT = "one-input"
    JOIN = "join"
    UNION = "union"


@dataclass(frozen=True)
class Operator:
    id: str
    kind: OperatorKind
    inputs: tuple[str, ...] = ()
    source: str | None = None

    @property
    def label(self) -> str:
        return f"{self.id}[{self.source}]" if self.source else self.id


class OperatorGraph:
    """A validated acyclic graph of operators whose leaves are named sources."""

    def __init__(self, operators: Iterable[Operator]):
        self._operators = {op.id: op for op in operators}
        for op in self._operators.values():
            self._check(op)
        self._order = self._topological_order()

    def _check(self, op: Operator) -> None:
        wanted = {OperatorKind.SOURCE: (0, 0), OperatorKind.ONE_INPUT: (1, 1)}
        low, high = wanted.get(op.kind, (2, 10**9))
        if not low <= len(op.inputs) <= high:
            raise ValueError(
                f"operator {op.id!r} of kind {op.kind} has {len(op.inputs)} inputs; "
                f"allowed: {low if low == high else f'at least {low}'}"
            )
        if op.kind is OperatorKind.SOURCE and not op.source:
            raise ValueError(f"source operator {op.id!r} must name its source")
        for upstream in op.inputs:
            if upstream not in self._operators:
                raise ValueError(f"operator {op.id!r} reads from unknown operator {upstream!r}")

    def _topological_order(self) -> list[Operator]:
        order: list[Operator] = []
        state: dict[str, str] = {}

        def visit(op_id: str) -> None:
            if state.get(op_id) == "done":
                return
            if state.get(op_id) == "visiting":
                raise ValueError(f"operator graph has a cycle through {op_id!r}")
            state[op_id] = "visiting"
            for upstream in self._operators[op_id].inputs:
                visit(upstream)
            state[op_id] = "done"
            order.append(self._operators[op_id])

        for op_id in self._operators:
            visit(op_id)
        return order

    @property
    def operators(self) -> list[Operator]:
        """Operators with every input before its consumers."""
        return list(self._order)

    def source_names(self) -> list[str]:
        return [op.source for op in self._order if op.source]

    def propagate(self, model: BacklogModel) -> dict[str, bool]:
        """Each operator's backlog status, given the sources' current statuses."""
        result: dict[str, bool] = {}
        for op in self._order:
            inputs = [result[upstream] for upstream in op.inputs]
            if op.kind is OperatorKind.SOURCE:
                result[op.id] = model.status(op.source or "").counts_as_backlog
            elif op.kind is OperatorKind.UNION:
                result[op.id] = all(inputs)
            else:
                result[op.id] = any(inputs)
        return result

    def statuses(self, model: BacklogModel) -> list[dict[str, object]]:
        """Each operator, inputs before their consumers, with its backlog status: what a
        transition records."""
        backlog = self.propagate(model)
        return [
            {
                "id": op.id,
                "kind": op.kind.value,
                "source": op.source,
                "inputs": list(op.inputs),
                "is_backlog": backlog[op.id],
            }
            for op in self._order
        ]

    def describe(self, model: BacklogModel) -> str:
        statuses = self.propagate(model)
        return ", ".join(
            f"{op.label}={'backlog' if statuses[op.id] else 'live'}" for op in self._order
        )
