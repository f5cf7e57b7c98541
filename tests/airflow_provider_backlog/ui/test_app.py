"""The Backlog view's app as Airflow mounts it (its own init_plugins, from the entry point)
with SimpleAuthManager signing users in through /auth/token: who may see what, and how bad
input and unreadable databases are answered."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response

from spark_jobs.metrics.schema import create_tables, make_engine
from tests.airflow_provider_backlog.conftest import add_checkpoints
from tests.airflow_provider_backlog.ui.conftest import store_dags
from tests.airflow_provider_backlog.ui.markup import marked

#: SimpleAuthManager's roles: a viewer may read every DAG but no connection, an op both;
#: ``outsider`` has no role, and so no access at all.
USERS = "viewer:viewer,op:op,outsider:"
PASSWORD = "s3cret-in-a-url"
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
DAGS = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_provider_backlog.sensors.metrics import BacklogPhaseSensor

with DAG("watches_events", schedule=None):
    BacklogPhaseSensor(task_id="live", job_name="events", phase="live")

with DAG("runs_no_job", schedule=None):
    EmptyOperator(task_id="nothing")

with DAG("templated_jobs", schedule=None, params={"job": "events"}):
    BacklogPhaseSensor(task_id="from_params", job_name="{{ params.job }}", phase="live")
    BacklogPhaseSensor(task_id="by_date", job_name="daily-{{ ds }}", phase="live")
"""
ROUTES = ["/backlog/", "/backlog/jobs/events", "/backlog/dags/watches_events"]


def connection(**fields: object) -> str:
    return json.dumps({"conn_type": "backlog_metrics", **fields})


@pytest.fixture(scope="module")
def client(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """Airflow's auth manager and the plugin's app, mounted as the api-server mounts them,
    with a metrics database holding job ``events`` and connections good and bad."""
    from airflow.api_fastapi.app import init_auth_manager, init_plugins, purge_cached_app

    root = tmp_path_factory.mktemp("view")
    metrics_url = f"sqlite:///{root}/metrics.db"
    engine = make_engine(metrics_url)
    create_tables(engine)
    engine.dispose()
    add_checkpoints(metrics_url, "events", "run-1", T0, "bbbll")
    add_checkpoints(metrics_url, "unnamed", "run-u", T0, "ll")
    store_dags(DAGS, root / "dags")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", USERS)
        env.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(root / "users.json"))
        env.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_urlsafe(64))
        env.setenv("AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT", connection(host=f"{root}/metrics.db"))
        env.setenv("AIRFLOW_CONN_UNREADABLE", connection(host="/proc/none/metrics.db"))
        env.setenv(
            "AIRFLOW_CONN_BAD_URL", connection(extra={"url": f"postgresql://u:{PASSWORD}@db:x/m"})
        )
        env.setenv(
            "AIRFLOW_CONN_WAREHOUSE",
            json.dumps({"conn_type": "postgres", "host": "db", "password": PASSWORD}),
        )
        app = FastAPI()
        init_plugins(app)
        init_auth_manager(app)
        yield TestClient(app)
        purge_cached_app()


@pytest.fixture(scope="module")
def tokens(client: TestClient) -> dict[str, str]:
    """Each user's token, from the auth manager's own endpoint."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

    passwords = SimpleAuthManager.get_passwords()
    issued = {}
    for user in ("viewer", "op", "outsider"):
        answer = client.post("/auth/token", json={"username": user, "password": passwords[user]})
        assert answer.status_code == 201, answer.text
        issued[user] = answer.json()["access_token"]
    return issued


@pytest.fixture
def as_user(client: TestClient, tokens: dict[str, str]) -> Callable[..., Response]:
    def get(user: str, path: str, **headers: str) -> Response:
        return client.get(path, headers={"Authorization": f"Bearer {tokens[user]}", **headers})

    return get


@pytest.mark.parametrize("path", ROUTES)
def test_without_a_token_every_route_is_401(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert (answer.status_code, answer.json()) == (401, {"detail": "Not authenticated"})


@pytest.mark.parametrize("path", ["/backlog/jobs/events?run_id=run-1", ROUTES[2]])
def test_a_browser_without_a_token_gets_a_sign_in_link(client: TestClient, path: str) -> None:
    """The iframe shows a page, not JSON, with a link to sign in where the page is (the
    iframe's sandbox blocks links to the whole window) and come back to it."""
    answer = client.get(path, headers={"Accept": "text/html,application/xhtml+xml"})
    assert answer.status_code == 401
    assert answer.headers["content-type"].startswith("text/html")
    link = f'<a id="sign-in" href="/auth/login?{urlencode({"next": path})}">'
    assert link.replace("&", "&amp;") in answer.text


@pytest.mark.parametrize("path", ROUTES)
def test_a_user_without_a_role_is_forbidden_everywhere(as_user, path: str) -> None:
    answer = as_user("outsider", path)
    assert (answer.status_code, answer.json()) == (403, {"detail": "Forbidden"})
    in_a_browser = as_user("outsider", path, Accept="text/html")
    assert in_a_browser.status_code == 403
    assert 'id="sign-in"' in in_a_browser.text
    assert "<table" not in in_a_browser.text and "<svg" not in in_a_browser.text


def test_a_token_the_auth_manager_did_not_sign_is_refused(client: TestClient) -> None:
    answer = client.get("/backlog/", headers={"Authorization": "Bearer not.a.token"})
    assert answer.status_code == 403


def test_a_viewer_sees_the_jobs_of_dags_with_links_below_the_mount(as_user) -> None:
    """A DAG names ``events``; no DAG names ``unnamed``, which a user who may not read the
    connection does not see."""
    answer = as_user("viewer", "/backlog/")
    assert answer.status_code == 200, answer.text
    assert marked(answer.text, "data-job", "jobs") == ["events"]
    assert 'href="/backlog/jobs/events' in answer.text and "unnamed" not in answer.text


def test_a_user_who_may_read_the_connection_also_sees_the_jobs_no_dag_names(as_user) -> None:
    answer = as_user("op", "/backlog/")
    assert marked(answer.text, "data-job", "jobs") == ["events", "unnamed"]
    assert as_user("op", "/backlog/jobs/unnamed").status_code == 200


@pytest.mark.parametrize("job", ["unnamed", "never-ran"])
def test_a_job_no_dag_names_is_403_to_a_user_who_may_not_read_the_connection(
    as_user, job: str
) -> None:
    """The same answer whether the job exists or not, and nothing of it."""
    answer = as_user("viewer", f"/backlog/jobs/{job}?run_id=run-u")
    assert (answer.status_code, answer.json()) == (
        403,
        {
            "detail": f"job {job!r} is named by no DAG you may read, and only users who may "
            "read connection 'backlog_metrics_default' see the jobs no DAG names"
        },
    )
    in_a_browser = as_user("viewer", f"/backlog/jobs/{job}", Accept="text/html")
    assert in_a_browser.status_code == 403 and 'id="sign-in"' in in_a_browser.text
    assert "run-u" not in in_a_browser.text and "<svg" not in in_a_browser.text


@pytest.mark.parametrize("conn_id", ["warehouse", "nowhere", "unreadable"])
def test_another_connection_is_403_to_a_user_who_may_not_read_it(as_user, conn_id: str) -> None:
    """Before anything is read of it: whether it exists, its type, its database."""
    for path in ROUTES:
        answer = as_user("viewer", f"{path}?conn_id={conn_id}")
        assert (answer.status_code, answer.json()) == (
            403,
            {
                "detail": f"reading the metrics of connection {conn_id!r} needs read access "
                "to that connection; without it the view reads 'backlog_metrics_default'"
            },
        )


def test_the_default_connection_named_in_the_query_needs_no_connection_access(as_user) -> None:
    """The pages' own links name it."""
    answer = as_user("viewer", "/backlog/jobs/events?conn_id=backlog_metrics_default")
    assert answer.status_code == 200, answer.text


def test_the_token_cookie_signs_in_as_in_the_iframe(client: TestClient, tokens) -> None:
    browser = TestClient(client.app, cookies={"_token": tokens["viewer"]})
    answer = browser.get("/backlog/jobs/events")
    assert answer.status_code == 200, answer.text
    assert 'id="timeline"' in answer.text


@pytest.mark.parametrize(
    ("conn_id", "says"),
    [
        ("warehouse", "'warehouse' is of type 'postgres'"),
        ("nowhere", "there is no connection 'nowhere'"),
        (f"postgresql://u:{PASSWORD}@db/m", "what was given is no connection id"),
    ],
)
def test_conn_id_must_name_a_metrics_connection(as_user, conn_id: str, says: str) -> None:
    answer = as_user("op", f"/backlog/?{urlencode({'conn_id': conn_id})}")
    assert answer.status_code == 400
    detail = answer.json()["detail"]
    assert "conn_id must name a connection of type 'backlog_metrics'" in detail
    assert says in detail and PASSWORD not in answer.text


def test_a_connection_whose_url_does_not_parse_is_400_without_the_url(as_user) -> None:
    answer = as_user("op", "/backlog/?conn_id=bad_url")
    assert answer.status_code == 400
    assert "'bad_url' has a URL SQLAlchemy cannot read" in answer.json()["detail"]
    assert PASSWORD not in answer.text


def test_a_database_that_cannot_be_read_is_503_with_details_left_to_the_log(
    as_user, caplog: pytest.LogCaptureFixture
) -> None:
    answer = as_user("op", "/backlog/?conn_id=unreadable", Accept="text/html")
    assert answer.status_code == 503
    assert "connection &#x27;unreadable&#x27; cannot be read now" in answer.text
    assert "/proc/none" not in answer.text
    assert "unreadable" in caplog.text


def test_times_must_be_iso_8601(as_user) -> None:
    answer = as_user("viewer", "/backlog/jobs/events?start=yesterday")
    assert answer.status_code == 400
    assert "start = 'yesterday' is no ISO 8601 time" in answer.json()["detail"]


def test_a_job_without_metrics_is_404_to_a_user_who_may_see_it(as_user) -> None:
    answer = as_user("op", "/backlog/jobs/never-ran")
    assert answer.status_code == 404
    assert answer.json()["detail"].startswith("job 'never-ran' has no checkpoint and no lease")


def test_the_dag_tab_shows_the_jobs_of_the_dag(as_user) -> None:
    answer = as_user("viewer", "/backlog/dags/watches_events")
    assert answer.status_code == 200, answer.text
    assert 'data-job="events"' in answer.text and 'id="templates"' not in answer.text


def test_the_dag_tab_says_what_templates_leave_open(as_user) -> None:
    """A template of the DAG's params is rendered with their defaults, and says so; one
    only a run renders is named, not listed as a job."""
    answer = as_user("viewer", "/backlog/dags/templated_jobs")
    assert answer.status_code == 200, answer.text
    assert 'data-job="events"' in answer.text and 'data-job="daily' not in answer.text
    note = answer.text.split('id="templates"')[1].split("</div>")[0]
    assert "<code>{{ params.job }}</code> is <code>events</code> with the DAG's default" in note
    assert "<code>daily-{{ ds }}</code> is known only to a run" in note


def test_the_dag_tab_of_a_dag_without_jobs_says_so(as_user) -> None:
    answer = as_user("viewer", "/backlog/dags/runs_no_job")
    assert answer.status_code == 200
    assert "launches or watches no streaming job" in answer.text


def test_the_dag_tab_of_an_unknown_dag_is_404(as_user) -> None:
    answer = as_user("viewer", "/backlog/dags/never_parsed")
    assert answer.status_code == 404
    assert "no DAG 'never_parsed'" in answer.json()["detail"]
