import pytest

from airflow_provider_backlog.hooks.metrics_reads import JobSummary
from airflow_provider_backlog.ui.summary import JobRow, job_row
from tests.airflow_provider_backlog.ui.build import at, checkpoint, lease, transition

NOW = at(100)


def summary(recent, phase_since, started, latest, held, database_now=NOW) -> JobSummary:
    """Job ``orders``'s summary, its lease read at ``database_now`` by the database's clock."""
    return JobSummary("orders", recent, phase_since, started, latest, held, database_now)


RECENT = (
    checkpoint("r1", 0, 0, backlog=True),
    checkpoint("r1", 1, 10),
    checkpoint("r1", 2, 20),
    checkpoint("r2", 3, 50),
    checkpoint("r2", 4, 55),
    checkpoint("r2", 5, 80),
)


def test_a_job_is_in_its_latest_phase_since_its_transition_into_it():
    held = lease("r2", 45, 130, ui="http://driver:4040")
    into_live = transition("r2", 52, False, "offset-lag: events is live (kafka)")
    row = job_row(summary(RECENT, into_live, at(50), into_live, held), NOW)
    assert row == JobRow(
        job_name="orders",
        lease=held,
        lease_state="running",
        phase="live",
        since=at(52),
        reason="offset-lag: events is live (kafka)",
        run_id="r2",
        last_checkpoint_at=at(80),
        age_s=20.0,
        # 10 s in r1 and 5 s, 25 s in r2; not from backlog, nor across runs (30 s)
        live_gap_s=25.0,
        interval_ms=10_000,
        sources=RECENT[-1].sources,
    )
    assert row.spark_ui_url == "http://driver:4040"


def test_a_run_that_started_in_its_phase_is_in_it_since_its_first_checkpoint():
    row = job_row(summary(RECENT[:1], None, at(0), None, None), NOW)
    assert (row.phase, row.since, row.reason, row.live_gap_s) == ("backlog", at(0), None, None)
    assert (row.lease, row.lease_state, row.spark_ui_url) == (None, None, None)


@pytest.mark.parametrize(
    ("expires", "released", "state", "ui"),
    [
        (130, None, "running", "http://driver:4040"),
        (90, None, "died", None),
        (130, 70, "ended", None),
    ],
)
def test_a_lease_past_its_expiry_and_never_released_is_a_dead_driver(expires, released, state, ui):
    held = lease("r2", 45, expires, released, ui="http://driver:4040")
    row = job_row(summary(RECENT, None, at(50), None, held), NOW)
    assert (row.lease_state, row.spark_ui_url) == (state, ui)


@pytest.mark.parametrize(("database_now", "state"), [(129, "running"), (130, "died")])
def test_a_lease_expires_by_the_database_clock_not_the_api_servers(database_now, state):
    """The api-server's clock (``now``) may be far off the database's, which drivers renew
    their leases by: only the database's time read with the lease decides."""
    held = lease("r2", 45, 130)
    for api_server_now in (at(0), at(100), at(10_000)):
        row = job_row(summary(RECENT, None, at(50), None, held, at(database_now)), api_server_now)
        assert row.lease_state == state


def test_only_a_web_address_is_linked_as_the_spark_ui():
    held = lease("r2", 45, 130, ui="javascript:alert(1)")
    assert job_row(summary(RECENT, None, at(50), None, held), NOW).spark_ui_url is None


def test_a_job_with_a_lease_but_no_checkpoint_yet():
    held = lease("r1", 90, 130)
    row = job_row(summary((), None, None, None, held), NOW)
    assert row == JobRow("orders", held, "running")
