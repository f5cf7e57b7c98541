import pytest

from airflow_provider_backlog.ui.runs import Boundary, RunRow, Span, boundaries, runs, spans
from tests.airflow_provider_backlog.ui.build import at, checkpoint, history, lease

#: r1 in backlog by its phase, then held by a lag rule, then live; r2 took over, launched
#: at 55 s and still holds its lease.
TAKEN_OVER = history(
    checkpoint("r1", 0, 10, backlog=True, rows=100),
    checkpoint("r1", 1, 15, backlog=True, rows=100),
    checkpoint("r1", 2, 20, backlog=True, rows=100, rule="offset-lag"),
    checkpoint("r1", 3, 30, rows=50),
    checkpoint("r2", 4, 60, backlog=True, rows=200, interval_ms=60_000, rule="offset-lag"),
    checkpoint("r2", 5, 70, rows=20, interval_ms=None),
    lease=lease("r2", 55, 130),
)


def test_consecutive_checkpoints_of_one_phase_and_rule_make_one_span():
    assert spans(TAKEN_OVER) == [
        # The first batch of a run ran for its duration (1 s) before its commit.
        Span("r1", at(9), at(15), True, False),
        Span("r1", at(15), at(20), True, True),
        Span("r1", at(20), at(30), False, False),
        Span("r2", at(59), at(60), True, True),
        Span("r2", at(60), at(70), False, False),
    ]


def test_a_run_followed_by_another_ends_at_its_last_checkpoint():
    rows = runs(TAKEN_OVER, spans(TAKEN_OVER))
    assert rows == [
        RunRow(
            run_id="r1",
            launch=Boundary("r1", at(10), "launch", "the first checkpoint of run r1"),
            end=Boundary(
                "r1", at(30), "takeover", "the last checkpoint of run r1; run r2 took over after it"
            ),
            checkpoints=4,
            backlog_checkpoints=3,
            backlog_time_share=11 / 21,
            rows=350,
            intervals=(("backlog", (10_000,)), ("live", (10_000,))),
        ),
        RunRow(
            run_id="r2",
            launch=Boundary("r2", at(55), "launch", "run r2 took its lease"),
            end=None,
            checkpoints=2,
            backlog_checkpoints=1,
            backlog_time_share=1 / 11,
            rows=220,
            intervals=(("backlog", (60_000,)), ("live", (None,))),
        ),
    ]
    assert [(b.run_id, b.kind, b.at) for b in boundaries(TAKEN_OVER, rows)] == [
        ("r1", "launch", at(10)),
        ("r1", "takeover", at(30)),
        ("r2", "launch", at(55)),
    ]


def test_a_run_from_before_the_period_whose_lease_expired_unreleased_died():
    died = history(
        checkpoint("r1", 7, 10),
        checkpoint("r1", 8, 20, interval_ms=None),
        run_before="r1",
        lease=lease("r1", -50, 40),
    )
    assert spans(died) == [Span("r1", at(0), at(20), False, False)]
    (row,) = runs(died, spans(died))
    assert (row.launch, row.intervals) == (None, (("live", (10_000, None)),))
    assert row.end == Boundary(
        "r1", at(40), "death", "run r1 died: its lease expired and was never released"
    )


@pytest.mark.parametrize(("database_now", "died"), [(129.9, False), (130, True)])
def test_a_lease_expires_by_the_clock_of_the_database_it_was_read_from(database_now, died):
    """Whatever the api-server's clock says: drivers renew their leases by the database's."""
    held = history(checkpoint("r1", 0, 10), lease=lease("r1", 5, 130), database_now=database_now)
    (row,) = runs(held, spans(held))
    death = "run r1 died: its lease expired and was never released"
    assert row.end == (Boundary("r1", at(130), "death", death) if died else None)


def test_an_end_after_the_period_is_listed_but_not_drawn():
    ended = history(checkpoint("r1", 0, 10), lease=lease("r1", 5, 200, released=150))
    (row,) = runs(ended, spans(ended))
    assert row.end == Boundary("r1", at(150), "end", "run r1 ended: it released its lease")
    assert [b.kind for b in boundaries(ended, [row])] == ["launch"]


def test_a_run_that_holds_its_lease_but_has_not_committed_yet():
    starting = history(lease=lease("r3", 50, 130))
    assert runs(starting, spans(starting)) == [
        RunRow(
            run_id="r3",
            launch=Boundary("r3", at(50), "launch", "run r3 took its lease"),
            end=None,
            checkpoints=0,
            backlog_checkpoints=0,
            backlog_time_share=None,
            rows=0,
            intervals=(),
        )
    ]
    assert runs(history(lease=lease("r3", 150, 230)), []) == [], "after the period"
