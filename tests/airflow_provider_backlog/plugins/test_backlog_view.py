"""The plugin as Airflow finds it: through the provider's entry point, with its views and
app, and light to import, since every task process imports it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from airflow_provider_backlog.plugins.backlog_view import BacklogViewPlugin


def test_the_entry_point_resolves_to_the_plugin() -> None:
    (entry,) = [e for e in entry_points(group="airflow.plugins") if e.name == "backlog"]
    assert entry.load() is BacklogViewPlugin


def test_airflow_loads_its_views_and_app() -> None:
    from airflow import plugins_manager

    (info,) = [p for p in plugins_manager.get_plugin_info() if p["name"] == "backlog"]
    assert info["fastapi_apps"] == [
        {"app": "fastapi.applications.FastAPI", "url_prefix": "/backlog", "name": "Backlog"}
    ]
    views = {view["destination"]: view for view in info["external_views"]}
    assert (views["nav"]["href"], views["nav"]["category"]) == ("backlog/", "browse")
    assert views["dag"]["href"] == "backlog/dags/{DAG_ID}"  # relative: works below a sub-path
    assert all(view["url_route"] for view in views.values())  # shown in an iframe


PROBE = """
import sys
import sqlalchemy.event, sqlalchemy.pool

connects = []
sqlalchemy.event.listen(sqlalchemy.pool.Pool, "connect", lambda *args: connects.append(1))
from airflow_provider_backlog.plugins.backlog_view import BacklogViewPlugin

plugin = BacklogViewPlugin()  # as Airflow instantiates it
plugin.external_views
heavy = {"pyspark", "fastapi", "airflow_provider_backlog.ui.app"} & set(sys.modules)
print(len(connects), sorted(heavy))
"""


def test_importing_the_plugin_opens_no_database_and_loads_no_spark_or_web_app(
    tmp_path: Path,
) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert probe.stdout.split("\n")[-2] == "0 []", probe.stdout + probe.stderr
