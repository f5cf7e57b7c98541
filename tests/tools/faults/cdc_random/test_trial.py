"""The randomized trial's judgement: a failure by name counts only for the change of shape
that was made, and for the reason that change fails the job for."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from tools.faults.cdc_random.table import TableSpec
from tools.faults.cdc_random.trial import (
    PUBLICATION_CHANGED,
    TABLE_CHANGED,
    TrialResult,
    _failed,
    _finish,
    caused_by,
)
from tools.faults.cdc_random.workload import DDL

TABLE_ERROR = "TableChangedError: table public.orders_1 changed since the copy began: its key"
PUBLICATION_ERROR = "SlotError: publication 'backlog_x' on db changed since the copy began"


def judged(ddl: str, error: str, shape_changed: bool) -> TrialResult:
    result = TrialResult(1, "model", TableSpec.draw(random.Random(1), 1), "postgresql", 4, ddl)
    _failed(result, error)
    counts = SimpleNamespace(transactions=10, aborted=0)
    workload = SimpleNamespace(
        counts=counts, errors=[], shape_changed=shape_changed, copy_had_begun=True
    )
    _finish(result, workload, None, "", "", None)  # type: ignore[arg-type]
    return result


def test_every_change_of_shape_has_the_reason_it_fails_the_job_for():
    assert {ddl: caused_by(ddl) for ddl in DDL} == {
        "publish-insert-only": PUBLICATION_CHANGED,
        "table-dropped-from-publication": PUBLICATION_CHANGED,
        "replica-identity-changed": TABLE_CHANGED,
        "narrowed-type": TABLE_CHANGED,
        "new-key": TABLE_CHANGED,
    }


@pytest.mark.parametrize(
    "ddl, error, shape_changed, passed",
    [
        ("new-key", TABLE_ERROR, True, True),
        ("publish-insert-only", PUBLICATION_ERROR, True, True),
        # The server refused the narrowing: nothing changed, yet the job said it had.
        ("narrowed-type", TABLE_ERROR, False, False),
        # The identity changed, and the job named the publication, which did not.
        ("replica-identity-changed", PUBLICATION_ERROR, True, False),
    ],
)
def test_a_failure_by_name_passes_only_for_the_change_made(ddl, error, shape_changed, passed):
    result = judged(ddl, error, shape_changed)
    assert result.passed is passed, result.line()
