"""The Backlog view in Airflow's UI: an entry "Backlog" in the navigation, and a "Backlog"
tab on every DAG's page, both rendered in an iframe from the web app ui/app.py builds.

Airflow imports plugins in the scheduler, the DAG processor and every task process, which
never serve the view: this module imports only the plugin base class, and the app (FastAPI,
Airflow's auth, the metrics hook) is built when the api-server first asks for it.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.providers.common.compat.sdk import AirflowPlugin

#: Where the app is mounted, below Airflow's own root.
URL_PREFIX = "/backlog"
#: The UI pages that show it: ``plugin/<route>`` and ``dags/<dag_id>/plugin/<route>``.
NAV_ROUTE = "backlog"
DAG_ROUTE = "backlog-dag"


class BacklogViewPlugin(AirflowPlugin):
    """The jobs of the metrics database, their timelines and runs, and each DAG's jobs."""

    name = "backlog"
    # Relative hrefs: the iframe resolves them against Airflow's base URL, so the view also
    # works when Airflow is served below a sub-path. In 3.3 a DAG tab shows on every DAG;
    # the tab's page says when a DAG runs no streaming job.
    external_views = [  # noqa: RUF012 - the base class declares these as class-level lists
        {
            "name": "Backlog",
            "href": f"{URL_PREFIX.strip('/')}/",
            "destination": "nav",
            "category": "browse",
            "url_route": NAV_ROUTE,
        },
        {
            "name": "Backlog",
            "href": f"{URL_PREFIX.strip('/')}/dags/{{DAG_ID}}",
            "destination": "dag",
            "url_route": DAG_ROUTE,
        },
    ]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        from airflow_provider_backlog.ui.app import create_app

        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Backlog"}]
