"""Reading the metrics tables' rows into ``metrics_values``' types.

The JSON columns are parsed here, once, and leniently: a row written by an older or newer
release still reads, and what cannot be read is left out rather than guessed.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

from airflow_provider_backlog.hooks.metrics_values import (
    Checkpoint,
    ControlRequest,
    IntervalChange,
    OperatorStatus,
    SourceReport,
    Transition,
)
from spark_jobs.metrics.schema import as_utc

T = TypeVar("T")


def _json_list(text: str | None) -> list[dict[str, Any]] | None:
    """The JSON list of objects in ``text``; None when there is none or it is unreadable."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    return [item for item in value if isinstance(item, dict)]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _lag(value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        return ()
    return tuple(
        (str(key), float(number))
        for key, number in sorted(value.items())
        if isinstance(number, int | float) and not isinstance(number, bool)
    )


def _health(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        return ()
    return tuple((str(key), str(word)) for key, word in sorted(value.items()))


def source_reports(text: str | None) -> tuple[SourceReport, ...]:
    """The entries of a ``sources`` column that name a source."""
    return tuple(
        SourceReport(
            name=str(item["name"]),
            is_backlog=bool(item.get("is_backlog")),
            rule=_text(item.get("rule")),
            lag=_lag(item.get("lag")),
            health=_health(item.get("health")),
        )
        for item in _json_list(text) or []
        if item.get("name")
    )


def operator_statuses(text: str | None) -> tuple[OperatorStatus, ...] | None:
    """An ``operators`` column; None when the job reported no operator graph."""
    items = _json_list(text)
    if items is None:
        return None
    return tuple(
        OperatorStatus(
            id=str(item["id"]),
            kind=str(item.get("kind", "")),
            source=_text(item.get("source")),
            inputs=tuple(str(i) for i in item.get("inputs") or () if isinstance(i, str)),
            is_backlog=bool(item.get("is_backlog")),
        )
        for item in items
        if item.get("id")
    )


def _utc(value: object) -> datetime:
    at = as_utc(value)  # type: ignore[arg-type]
    assert at is not None
    return at


def _read(kind: type[T], row: sa.RowMapping, **read: object) -> T:
    """A ``kind`` from the columns of ``row`` named as its fields, ``read`` taking their place
    where a column needs reading."""
    return kind(**{name: row[name] for name in kind.__dataclass_fields__} | read)  # type: ignore[attr-defined]


def checkpoint(row: sa.RowMapping) -> Checkpoint:
    """A ``backlog_checkpoints`` row as read with ``CHECKPOINT_COLUMNS``."""
    return _read(
        Checkpoint,
        row,
        committed_at=_utc(row["committed_at"]),
        is_backlog=bool(row["is_backlog"]),
        recovered=bool(row["recovered"]),
        sources=source_reports(row["sources"]),
    )


def transition(row: sa.RowMapping) -> Transition:
    return _read(
        Transition,
        row,
        at=_utc(row["at"]),
        is_backlog=bool(row["is_backlog"]),
        operators=operator_statuses(row["operators"]),
    )


def interval_change(row: sa.RowMapping) -> IntervalChange:
    return _read(IntervalChange, row, at=_utc(row["at"]))


def control_request(row: sa.RowMapping) -> ControlRequest:
    return _read(ControlRequest, row, requested_at=_utc(row["requested_at"]))


#: The ``backlog_checkpoints`` columns a ``Checkpoint`` is read from.
CHECKPOINT_COLUMNS = tuple(Checkpoint.__dataclass_fields__)
