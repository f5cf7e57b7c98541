"""The Backlog view end to end: a real ``airflow api-server`` (SQLite, SimpleAuthManager, this
provider's plugin found through its entry point) over the metrics of a real run of the
events job. Requests sign in through the auth manager's /auth/token; Debian's chromium signs
in through Airflow's own pages and reads the view in the iframe Airflow shows it in.

Airflow runs in multi-team mode, SimpleAuthManager's way of letting a user read some DAGs
and not others: team ``team_a``'s DAG bundle has the DAG that watches the job, team
``team_b``'s one that watches job ``other``, and no DAG names job ``orphan``."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.airflow_provider_backlog.conftest import add_checkpoints
from tests.integration.jobs import (
    JobDirs,
    backlog_then_live,
    base_conf,
    checkpoints,
    console_job,
    finish,
    kill_hard,
    transitions,
    wait_for,
)
from tests.support.api_server import stop, wait_until_healthy
from tests.support.prerequisites import missing
from tools.data.events import LiveProducer
from tools.demo.airflow_demo import airflow
from tools.services.ports import free_port

JOB = "events"
#: Jobs whose rows the test writes beside the run's: one a DAG of team_b names, one no DAG.
OTHER, ORPHAN = "other", "orphan"
#: Live checkpoints the run makes before its landing files stop arriving.
LIVE_CHECKPOINTS = 6
#: SimpleAuthManager's roles: a viewer may read DAGs (of their teams), an op connections
#: too, an admin everything; ``outsider`` has no role, and so no access at all.
USERS = "admin:admin,viewer_a:viewer:team_a,viewer_b:viewer:team_b,op_a:op:team_a,outsider:"
ROUTES = ["/backlog/", f"/backlog/jobs/{JOB}", "/backlog/dags/watches_events"]
#: A second connection to the same metrics database.
ELSEWHERE = "metrics_elsewhere"
#: Where to keep a copy of the browser's screenshot (docs/images/backlog-view.png).
SCREENSHOT_COPY = "BACKLOG_VIEW_SCREENSHOT"
#: The browser's window, and so the widest frame the view is shown in.
WIDTH = 1200
IMPORTS = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_provider_backlog.sensors.metrics import BacklogPhaseSensor
"""
#: Each team's DAG bundle.
BUNDLES = {
    "team_a": f"""{IMPORTS}
with DAG("watches_events", schedule=None):
    BacklogPhaseSensor(task_id="wait_until_live", job_name="{JOB}", phase="live")

with DAG("runs_no_job", schedule=None):
    EmptyOperator(task_id="nothing")
""",
    "team_b": f"""{IMPORTS}
with DAG("watches_other", schedule=None):
    BacklogPhaseSensor(task_id="wait_until_live", job_name="{OTHER}", phase="live")
""",
}

# One job's metrics and one api-server serve every test here: keep them on one worker.
pytestmark = pytest.mark.xdist_group("backlog_view")


@dataclass(frozen=True)
class Airflow:
    """The running api-server, and the job whose metrics it shows."""

    url: str
    home: Path
    job: JobDirs

    def password(self, user: str) -> str:
        """As the auth manager generated it when the server started."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(path.read_text())[user]

    def token(self, user: str) -> str:
        answer = httpx.post(
            f"{self.url}/auth/token",
            json={"username": user, "password": self.password(user)},
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        return answer.json()["access_token"]

    def get(self, path: str, user: str | None = None, **headers: str) -> httpx.Response:
        if user:
            headers["Authorization"] = f"Bearer {self.token(user)}"
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=60)


def start_job(dirs: JobDirs) -> tuple[subprocess.Popen, LiveProducer]:
    """A short run: a file backlog read in capped batches, then landing files read live as
    they arrive; it stops once they stop arriving."""
    producer = backlog_then_live(dirs, 20_000, 4, events_per_s=200, file_every_s=0.5)
    conf = base_conf(dirs, JOB, interval="1s", interval_during_backlog="1min")
    conf["spark.backlog.checkpointing.max-batch-rows"] = "5000"
    return console_job(dirs, conf, "--stop-when-idle", "2s", "--timeout", "150s"), producer


def start_server(root: Path, metrics_db: Path, port: int) -> subprocess.Popen:
    """Airflow on SQLite in ``root``, in multi-team mode with a DAG bundle per team, its
    DAGs serialized, serving on loopback."""
    bundles = []
    for team, source in BUNDLES.items():
        folder = root / "dags" / team
        folder.mkdir(parents=True)
        (folder / "dags.py").write_text(source, encoding="utf-8")
        local = "airflow.dag_processing.bundles.local.LocalDagBundle"
        bundles.append(
            {"name": team, "classpath": local, "kwargs": {"path": str(folder)}, "team_name": team}
        )
    metrics = json.dumps({"conn_type": "backlog_metrics", "host": str(metrics_db)})
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env |= {
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        "AIRFLOW_CONN_BACKLOG_METRICS_DEFAULT": metrics,
        f"AIRFLOW_CONN_{ELSEWHERE.upper()}": metrics,
    }
    for command in (("db", "migrate"), ("teams", "sync"), ("dags", "reserialize")):
        subprocess.run(airflow(*command), env=env, check=True, capture_output=True, timeout=180)
    with (root / "api-server.log").open("w") as log:
        return subprocess.Popen(
            airflow("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, jvm_archive: Path) -> Iterator[Airflow]:
    """The job runs while Airflow migrates its database and starts."""
    root = tmp_path_factory.mktemp("backlog-view")
    dirs = JobDirs(root / "job")
    job, producer = start_job(dirs)
    server = None
    try:
        port = free_port()
        server = start_server(root / "airflow", dirs.metrics_dir / "metrics.db", port)
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(server, url, root / "airflow" / "api-server.log", 120)
        wait_for(
            lambda: sum(not r["is_backlog"] for r in checkpoints(dirs)) >= LIVE_CHECKPOINTS,
            f"{LIVE_CHECKPOINTS} live checkpoints",
            150,
            job,
        )
        producer.stop()
        finish(job, 120)
        metrics_url = f"sqlite:///{dirs.metrics_dir / 'metrics.db'}"
        for name in (OTHER, ORPHAN):
            add_checkpoints(metrics_url, name, f"{name}-run", datetime.now(UTC), "bl")
        yield Airflow(url, root / "airflow" / "home", dirs)
    finally:
        producer.stop()
        if job.poll() is None:
            kill_hard(job)
        if server is not None:
            stop(server)


def job_tables(dirs: JobDirs) -> tuple[int, int, int]:
    """Checkpoints, transitions and runs of the job, as its metrics tables hold them."""
    rows = [r for r in checkpoints(dirs) if r["job_name"] == JOB]
    changes = [t for t in transitions(dirs) if t["job_name"] == JOB]
    return len(rows), len(changes), len({r["run_id"] for r in rows})


def svg(page: str, chart_id: str) -> ElementTree.Element:
    """An inline chart of the page, parsed as the XML it is."""
    match = re.search(rf'<svg[^>]*\bid="{chart_id}".*?</svg>', page, re.DOTALL)
    assert match, f"no chart {chart_id!r}"
    return ElementTree.fromstring(match.group(0))


def marked(chart: ElementTree.Element, attribute: str) -> list[ElementTree.Element]:
    return [element for element in chart.iter() if attribute in element.attrib]


@pytest.mark.parametrize("path", ROUTES)
def test_401_without_a_token_403_without_access_200_with(deployment: Airflow, path: str):
    assert deployment.get(path).status_code == 401
    forbidden = deployment.get(path, "outsider")
    assert (forbidden.status_code, forbidden.json()) == (403, {"detail": "Forbidden"})
    assert deployment.get(path, "viewer_a").status_code == 200


def test_the_jobs_page_lists_the_job(deployment: Airflow):
    page = deployment.get("/backlog/", "viewer_a").text
    assert f'<tr data-job="{JOB}">' in page
    assert f'href="/backlog/jobs/{JOB}?conn_id=backlog_metrics_default"' in page


def test_the_job_page_draws_what_the_tables_hold(deployment: Airflow):
    """Every checkpoint and transition of the run is a mark of the timeline, and each run
    a row of the runs table, with its checkpoints counted."""
    page = deployment.get(f"/backlog/jobs/{JOB}", "viewer_a").text
    checkpoint_rows, transition_rows, run_count = job_tables(deployment.job)
    assert (transition_rows, run_count) == (2, 1)  # into backlog, then live
    assert checkpoint_rows > LIVE_CHECKPOINTS
    timeline = svg(page, "timeline")
    assert len(marked(timeline, "data-checkpoint")) == checkpoint_rows
    assert len(marked(timeline, "data-transition")) == transition_rows
    assert len(re.findall(r"<li data-transition=", page)) == transition_rows
    runs = re.findall(r'<tr data-run="([^"]+)">(.*?)</tr>', page, re.DOTALL)
    assert len(runs) == run_count
    counted = re.findall(r'<td class="number">(\d+)</td>', runs[0][1])
    assert counted[0] == str(checkpoint_rows)


def test_the_dag_tab_lists_the_jobs_of_the_dag_or_says_there_are_none(deployment: Airflow):
    watching = deployment.get("/backlog/dags/watches_events", "viewer_a").text
    assert f'<tr data-job="{JOB}">' in watching
    idle = deployment.get("/backlog/dags/runs_no_job", "viewer_a").text
    assert "launches or watches no streaming job" in idle


def listed(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)">', page)


@pytest.mark.parametrize(
    ("user", "shown"),
    [
        ("admin", [JOB, ORPHAN, OTHER]),
        ("viewer_a", [JOB]),
        ("viewer_b", [OTHER]),
        ("op_a", [JOB, ORPHAN]),
    ],
)
def test_a_user_sees_the_jobs_of_the_dags_they_may_read(
    deployment: Airflow, user: str, shown: list[str]
):
    """And the jobs no DAG names when they may read the connection; nothing of the rest."""
    page = deployment.get("/backlog/", user)
    assert page.status_code == 200
    assert listed(page.text) == shown
    for hidden in {JOB, OTHER, ORPHAN} - set(shown):
        assert f"/backlog/jobs/{hidden}?" not in page.text and f"{hidden}-run" not in page.text


def refused_without_a_dag(job: str) -> str:
    return (
        f"job {job!r} is named by no DAG you may read, and only users who may read "
        "connection 'backlog_metrics_default' see the jobs no DAG names"
    )


@pytest.mark.parametrize(
    ("user", "job", "detail"),
    [
        ("viewer_a", OTHER, refused_without_a_dag(OTHER)),
        ("viewer_a", ORPHAN, refused_without_a_dag(ORPHAN)),
        ("viewer_a", "never-ran", refused_without_a_dag("never-ran")),
        ("viewer_b", JOB, refused_without_a_dag(JOB)),
        ("op_a", OTHER, f"job {OTHER!r} is named by DAGs you may not read"),
    ],
)
def test_a_job_a_user_may_not_see_is_403_with_nothing_of_it(
    deployment: Airflow, user: str, job: str, detail: str
):
    answer = deployment.get(f"/backlog/jobs/{job}", user)
    assert (answer.status_code, answer.json()) == (403, {"detail": detail})
    page = deployment.get(f"/backlog/jobs/{job}?run_id={job}-run", user, Accept="text/html")
    assert page.status_code == 403 and 'id="sign-in"' in page.text
    assert "<table" not in page.text and "<svg" not in page.text


@pytest.mark.parametrize(
    ("user", "job"), [("viewer_b", OTHER), ("op_a", ORPHAN), ("admin", OTHER), ("admin", ORPHAN)]
)
def test_a_job_page_is_shown_to_a_user_who_may_see_the_job(
    deployment: Airflow, user: str, job: str
):
    answer = deployment.get(f"/backlog/jobs/{job}", user)
    assert answer.status_code == 200, answer.text
    assert f'<tr data-run="{job}-run">' in answer.text


def test_the_dag_tab_of_a_dag_a_user_may_not_read_is_403(deployment: Airflow):
    refused = deployment.get("/backlog/dags/watches_events", "viewer_b")
    assert (refused.status_code, refused.json()) == (403, {"detail": "Forbidden"})
    assert listed(deployment.get("/backlog/dags/watches_other", "viewer_b").text) == [OTHER]


@pytest.mark.parametrize("path", ROUTES)
def test_another_connection_needs_read_access_to_it(deployment: Airflow, path: str):
    """The default one needs none: the pages' own links name it."""
    assert deployment.get(f"{path}?conn_id=backlog_metrics_default", "viewer_a").status_code == 200
    refused = deployment.get(f"{path}?conn_id={ELSEWHERE}", "viewer_a")
    assert (refused.status_code, refused.json()) == (
        403,
        {
            "detail": f"reading the metrics of connection {ELSEWHERE!r} needs read access to "
            "that connection; without it the view reads 'backlog_metrics_default'"
        },
    )
    answer = deployment.get(f"{path}?conn_id={ELSEWHERE}", "op_a")
    assert answer.status_code == 200, answer.text
    assert f"conn_id={ELSEWHERE}" in answer.text


def test_a_user_who_may_read_another_connection_sees_its_jobs(deployment: Airflow):
    page = deployment.get(f"/backlog/?conn_id={ELSEWHERE}", "op_a").text
    assert listed(page) == [JOB, ORPHAN]
    assert f'href="/backlog/jobs/{JOB}?conn_id={ELSEWHERE}"' in page


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless chromium, driven through Debian's chromedriver at a fixed window size."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        missing("chromium and chromium-driver are not installed (scripts/install-test-tools)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        chrome.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": 800, "deviceScaleFactor": 1, "mobile": False},
        )
        yield chrome
    finally:
        chrome.quit()


def sign_in(page: WebDriver, user: str, password: str) -> None:
    """Fill in the auth manager's sign-in form, wherever it shows."""
    fields = wait(page, lambda: page.find_elements(By.CSS_SELECTOR, "input"), "the sign-in form")
    fields[0].send_keys(user)
    fields[1].send_keys(password)
    page.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def wait(page: WebDriver, found: Callable[[], list], what: str, timeout_s: float = 30) -> list:
    """What ``found`` finds, once it finds anything."""
    return WebDriverWait(page, timeout_s).until(lambda _: found(), f"waiting for {what}")


def widths(page: WebDriver) -> tuple[int, int]:
    """The document's width and the width it is shown in: wider, it scrolls sideways."""
    return tuple(
        page.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
    )


def test_a_browser_signs_in_and_reads_the_view_in_airflow(
    deployment: Airflow, browser: WebDriver, tmp_path: Path
):
    """From Airflow's sign-in page to the Backlog entry's page, whose iframe shows the
    jobs, then the run's timeline with a mark per checkpoint, without scrolling sideways
    in the frame Airflow gives it in a 1,200 px window; a screenshot is kept."""
    browser.get(f"{deployment.url}/api/v2/monitor/health")
    browser.delete_all_cookies()  # signed out, whatever ran before
    browser.get(f"{deployment.url}/plugin/backlog")
    sign_in(browser, "viewer_a", deployment.password("viewer_a"))
    frame = wait(browser, lambda: browser.find_elements(By.TAG_NAME, "iframe"), "the view")[0]
    browser.switch_to.frame(frame)
    run_link = wait(
        browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs a[href*='run_id=']"), JOB
    )
    run_link[0].click()
    marks = wait(
        browser,
        lambda: browser.find_elements(By.CSS_SELECTOR, "svg#timeline [data-checkpoint]"),
        "the run's timeline",
    )
    assert len(marks) == job_tables(deployment.job)[0]
    scroll_width, frame_width = widths(browser)
    assert scroll_width <= frame_width < WIDTH
    browser.execute_script("document.getElementById('timeline').scrollIntoView({block: 'end'})")
    browser.switch_to.default_content()
    assert browser.current_url.startswith(f"{deployment.url}/plugin/backlog/backlog/jobs/{JOB}")
    screenshot = tmp_path / "backlog-view.png"
    browser.save_screenshot(str(screenshot))
    print(f"screenshot: {screenshot}")
    if copy := os.environ.get(SCREENSHOT_COPY):
        shutil.copyfile(screenshot, copy)


def test_a_job_and_a_run_fit_a_1200_px_frame(
    deployment: Airflow, browser: WebDriver, tmp_path: Path
):
    """Each page on its own in a 1,200 px window, a screenshot of each kept whole."""
    with_token(browser, deployment)
    browser.get(f"{deployment.url}/backlog/jobs/{JOB}")
    run_page = wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#runs a"), "runs")
    pages = {"job": browser.current_url, "run": run_page[0].get_attribute("href")}
    for name, url in pages.items():
        browser.get(url)
        wait(browser, lambda: browser.find_elements(By.ID, "timeline"), f"the {name}'s page")
        scroll_width, page_width = widths(browser)
        assert scroll_width <= page_width <= WIDTH, name
        height = browser.execute_script("return document.documentElement.scrollHeight")
        screenshot = tmp_path / f"{name}-{WIDTH}px.png"
        whole = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", whole)
        browser.save_screenshot(str(screenshot))
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", whole | {"height": 800})
        print(f"screenshot: {screenshot}")


def with_token(browser: WebDriver, deployment: Airflow) -> None:
    """Signed in as the viewer, by the cookie Airflow's sign-in sets."""
    browser.get(f"{deployment.url}/api/v2/monitor/health")
    browser.add_cookie({"name": "_token", "value": deployment.token("viewer_a"), "path": "/"})


def view_frame(browser: WebDriver, page: str) -> None:
    """Open an Airflow page and switch into the Backlog view's iframe on it."""
    browser.get(page)
    frame = wait(browser, lambda: browser.find_elements(By.TAG_NAME, "iframe"), "the view")[0]
    browser.switch_to.frame(frame)


def test_the_dag_tab_shows_on_the_dags_page(deployment: Airflow, browser: WebDriver):
    """The tab's relative href, with the DAG's id put in by Airflow, reaches the app."""
    with_token(browser, deployment)
    view_frame(browser, f"{deployment.url}/dags/watches_events/plugin/backlog-dag")
    rows = wait(
        browser, lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{JOB}"]'), JOB
    )
    assert rows[0].is_displayed()
    browser.switch_to.default_content()


def test_a_browser_signed_out_signs_in_again_inside_the_view(
    deployment: Airflow, browser: WebDriver
):
    """A token gone while the view is open: the view's 401 page links to the sign-in page,
    which opens in the iframe (its sandbox blocks links to the whole window) and comes
    back to the view."""
    with_token(browser, deployment)
    view_frame(browser, f"{deployment.url}/plugin/backlog")
    links = wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs a"), "jobs")
    browser.delete_cookie("_token")
    links[0].click()
    wait(browser, lambda: browser.find_elements(By.ID, "sign-in"), "the sign-in link")[0].click()
    sign_in(browser, "viewer_a", deployment.password("viewer_a"))
    wait(browser, lambda: browser.find_elements(By.ID, "timeline"), "the job's page again")
    browser.switch_to.default_content()
    assert browser.find_elements(By.TAG_NAME, "iframe")
